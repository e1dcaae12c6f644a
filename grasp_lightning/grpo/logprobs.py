"""Per-token log-probs and entropies from the final hidden states, the LM head run over token chunks.

The plain scoring path (:func:`grasp_lightning.grpo.scoring.logps_and_entropy`) takes the model's
``(N, Lc, V)`` logits: at K = 8 x 1,024 completion tokens and Qwen's V = 151,669 that is 1.24 G
logits (2.5 GB in bf16), plus the float32 rows of the softmax and, in the backward, a gradient of
the same size. Here the model returns its final hidden states ``(N, Lc, D)`` instead
(:func:`hidden_states_as_logits` makes the LM head the identity for one forward), and
:func:`chunked_logps_and_entropy` applies the head, the temperature and the selective log-softmax
to ``chunk_size`` tokens at a time. With gradients on, each chunk runs under
``torch.utils.checkpoint`` (non-reentrant), which keeps only the chunk's hidden states and
recomputes its logits in the backward: at most one chunk's ``(chunk_size, V)`` logits exist at any
time, forward or backward. This is TRL's chunked log-prob and the pure-torch form of Liger-Kernel's
fused linear losses (``LigerFusedLinearGRPOLoss``), which fuse the same per-chunk head, softmax and
gradient on a GPU.

The result equals the full-logits path to float rounding (the head's matmul over a chunk of rows
may sum in a different order), for log-probs, entropies and gradients, on both model families and
through LoRA (``tests/unit/grpo/test_logprobs.py``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from grasp_lightning.errors import GraspConfigError


def output_head(model) -> torch.nn.Module:
    """The LM head of ``model`` (``get_output_embeddings``; looks through a peft wrapper).

    Raises:
        GraspConfigError: the model has no output embeddings.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise GraspConfigError(f"{type(model).__name__} has no LM head (get_output_embeddings); "
                               "set model.task.init_args.compute.logprob_chunk_size: null")
    return head


@contextlib.contextmanager
def hidden_states_as_logits(model):
    """For the duration, the LM head returns its input: the model's ``logits`` are its final hidden states.

    Transformers' ``*ForCausalLM``/``*ForConditionalGeneration`` forwards end with
    ``self.lm_head(hidden_states[:, slice])`` (``logits_to_keep`` slices first), so the ``logits``
    field then holds the ``(B, L_keep, D)`` hidden states the head would have seen. Yields the head
    module, to apply after the block (:func:`chunked_logps_and_entropy`): its own ``forward`` is restored
    on exit, so the head's hooks (peft, DeepSpeed) run as usual then.
    """
    head = output_head(model)
    head.forward = lambda hidden, *args, **kwargs: hidden
    try:
        yield head
    finally:
        del head.forward


def _chunk_logps(hidden: torch.Tensor, ids: torch.Tensor, head, temperature: float,
                 entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (differentiable) and entropies (differentiable with ``entropy_grad``, else no grad) of ``T``
    tokens from their ``(T, D)`` hidden states."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, -1)
    logp = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    if entropy_grad:  # H = lse - sum p * logits, kept in the graph (the entropy bonus)
        return logp, lse - torch.linalg.vecdot((logits - lse.unsqueeze(-1)).exp(), logits)
    with torch.no_grad():  # the same, with one (T, V) temporary (p, exponentiated in place)
        probs = (logits - lse.unsqueeze(-1)).exp_()
        entropy = lse - torch.linalg.vecdot(probs, logits)
    return logp, entropy


def chunked_logps_and_entropy(hidden: torch.Tensor, head, completion_ids: torch.Tensor, temperature: float,
                              chunk_size: int, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies ``(N, Lc)`` float32 from hidden states, ``chunk_size`` tokens at a time.

    Args:
        hidden: ``(N, Lc, D)`` final hidden states aligned with the tokens they predict (position
            ``j`` predicts ``completion_ids[:, j]``).
        head: the LM head (maps ``(T, D)`` to ``(T, V)`` logits; any float dtype).
        completion_ids: ``(N, Lc)`` int64 token ids.
        temperature: sampling temperature (logits are divided by it, TRL), > 0.
        chunk_size: tokens per chunk (rows of ``N*Lc`` flattened), >= 1.
        entropy_grad: the entropies differentiable too (the entropy bonus of ``loss.entropy_coef``).

    Returns:
        ``(logp, entropy)``: log-probs differentiable w.r.t. ``hidden`` and the head's parameters
        (each chunk recomputed in the backward), entropies without grad unless ``entropy_grad``; equal to
        :func:`grasp_lightning.grpo.scoring.logps_and_entropy` on ``head(hidden)`` within float rounding.

    Raises:
        GraspConfigError: ``temperature <= 0`` or ``chunk_size < 1``. ValueError: shapes do not match.
    """
    if temperature <= 0:
        raise GraspConfigError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise GraspConfigError(f"model.task.init_args.compute.logprob_chunk_size must be >= 1 or null, got {chunk_size}")
    if hidden.dim() != 3 or completion_ids.shape != hidden.shape[:2]:
        raise ValueError(f"hidden (N, Lc, D) and completion_ids (N, Lc) expected, got {tuple(hidden.shape)} "
                         f"and {tuple(completion_ids.shape)}")
    n, lc, d = hidden.shape
    flat, ids = hidden.reshape(n * lc, d), completion_ids.reshape(n * lc)
    params_need_grad = isinstance(head, torch.nn.Module) and any(p.requires_grad for p in head.parameters())
    recompute = torch.is_grad_enabled() and (flat.requires_grad or params_need_grad)
    logps, entropies = [], []
    for start in range(0, n * lc, chunk_size):
        h, t = flat[start:start + chunk_size], ids[start:start + chunk_size]
        if recompute:
            lp, ent = checkpoint(_chunk_logps, h, t, head, temperature, entropy_grad, use_reentrant=False)
        else:
            lp, ent = _chunk_logps(h, t, head, temperature, entropy_grad)
        logps.append(lp)
        entropies.append(ent if entropy_grad else ent.detach())
    if not logps:
        empty = hidden.new_zeros((n, lc), dtype=torch.float32)
        return empty, empty
    return torch.cat(logps).reshape(n, lc), torch.cat(entropies).reshape(n, lc)
