"""GRPO maths on tensors: group advantages, per-token log-probabilities, the k3 KL and the clipped loss.

Pure functions, mirroring TRL 1.16's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``:
``_generate_and_score_completions`` for advantages, ``_compute_loss`` for the loss) so results can be
checked side by side (``tests/unit/grpo/test_objective.py``), plus the released GRASP variant of the
advantage (each reward term centred within its group, then weighted).

Layout: ``N = G * K`` rows, where the ``K`` rollouts of one prompt are consecutive rows, and ``L``
completion tokens per row (right-padded; ``mask`` marks real tokens).

Gradient accumulation, and how our normalisers relate to TRL's
--------------------------------------------------------------
TRL sets ``loss_is_scaled_for_ga = True`` and scales in ``_compute_loss`` itself, with ``A`` =
``current_gradient_accumulation_steps`` (micro-batches per optimizer step), ``W`` = number of processes
and ``S`` = ``steps_per_generation`` (defaults to ``A``):

* ``grpo``, ``bnpo``, ``dr_grpo``: TRL returns ``loss_mb / A`` where ``loss_mb`` is the micro-batch
  value :func:`grpo_loss` returns (TRL logs it as ``policy_loss``). The optimizer step thus sees the
  mean of the micro-batch losses. In Lightning, automatic optimisation with
  ``accumulate_grad_batches=A`` divides the returned loss by ``A`` itself, so return our loss as is.
* ``dapo``: TRL divides the masked token sum by ``num_items_in_batch / W * A / S``, where
  ``num_items_in_batch`` is the number of loss tokens gathered over all processes for the whole
  generation batch; it does **not** divide by ``A`` again. With ``S == A`` that is
  ``tokens_global / W``: summed over the ``A`` micro-batches and averaged over ``W`` ranks by DDP /
  DeepSpeed it gives exactly ``Σ token losses / tokens_global``, independent of how the batch is split.
  :func:`grpo_loss` divides by the ``num_items_in_batch`` it is given. To match TRL, pass
  ``tokens_global / W`` and, under Lightning's automatic accumulation (which divides by ``A`` again),
  multiply the returned loss by ``A`` (or pass ``tokens_global / (W * A)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from grasp_lightning.errors import GraspConfigError

__all__ = [
    "LOG_RATIO_CLAMP",
    "LOSS_TYPES",
    "clip_advantages",
    "group_advantages",
    "grpo_loss",
    "k3_kl",
    "overlong_penalty",
    "released_advantages",
    "reward_moments",
    "std_from_moments",
    "selective_log_softmax",
    "zero_variance_groups",
]

#: Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp`` (e^20 ≈ 4.9e8 fits bf16).
LOG_RATIO_CLAMP = 20.0
#: Token aggregations supported by :func:`grpo_loss` (names as in TRL's ``GRPOConfig.loss_type``).
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dapo", "dr_grpo")


def _grouped(values: Tensor, group_size: int) -> Tensor:
    """View ``(N, ...)`` as ``(G, K, ...)``; raises GraspConfigError/ValueError on a bad size."""
    if group_size < 1:
        raise GraspConfigError(f"group_size must be >= 1, got {group_size}")
    if values.shape[0] % group_size != 0:
        raise ValueError(f"{values.shape[0]} rows do not split into groups of {group_size}")
    return values.reshape(values.shape[0] // group_size, group_size, *values.shape[1:])


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Which groups have all rewards equal (no learning signal; TRL logs their share as ``frac_reward_zero_std``).

    Args:
        rewards: ``(N,)`` float rewards, ``N = G * group_size``.
        group_size: ``K``, rollouts per prompt.

    Returns:
        ``(G,)`` bool tensor, True where every reward of the group is exactly equal.

    Raises:
        GraspConfigError: ``group_size < 1``. ValueError: ``N`` not divisible by ``group_size``.
    """
    grouped = _grouped(rewards, group_size)
    return grouped.amax(dim=1) == grouped.amin(dim=1)


def group_advantages(rewards: Tensor, group_size: int, scale: str = "group", eps: float = 1e-4,
                     batch_std: Tensor | float | None = None) -> Tensor:
    """Group-relative advantages of GRPO: reward minus its group mean, optionally divided by a std.

    ``scale="group"``: ``(r - mean_g) / (std_g + eps)`` with the unbiased group std, exactly TRL 1.16's
    ``scale_rewards="group"``; ``"batch"``: divided by the unbiased std over all ``N`` rewards (TRL's
    ``"batch"``, still centred per group); ``"none"``: centred only (Dr. GRPO). A group whose rewards are
    all equal gets exactly 0 (never NaN), also when ``K == 1`` (TRL uses a zero std there).

    Args:
        rewards: ``(N,)`` total reward per rollout (float), ``N = G * group_size``.
        group_size: ``K``, rollouts per prompt (consecutive rows).
        scale: ``"group"``, ``"batch"`` or ``"none"``.
        eps: added to the std before dividing (TRL uses 1e-4).
        batch_std: for ``scale="batch"``, the std to divide by, e.g. over every rank's rewards of the
            accumulation window (:func:`std_from_moments`; TRL gathers the rewards of all processes);
            ``None`` uses the unbiased std of ``rewards``.

    Returns:
        ``(N,)`` advantages, same dtype as ``rewards``.

    Raises:
        GraspConfigError: unknown ``scale`` or ``group_size < 1``. ValueError: ``rewards`` not 1-D or
        ``N`` not divisible by ``group_size``.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if scale not in ("group", "batch", "none"):
        raise GraspConfigError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    elif scale == "batch":
        if batch_std is None:
            std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        else:
            std = torch.as_tensor(batch_std, dtype=rewards.dtype, device=rewards.device)
        centred = centred / (std + eps)
    flat = zero_variance_groups(rewards, group_size).repeat_interleave(group_size)
    return torch.where(flat, torch.zeros_like(rewards), centred.reshape(-1))


def reward_moments(rewards: Tensor) -> Tensor:
    """``(3,)`` float64 ``[count, Σ r, Σ r²]`` of ``rewards`` (any shape), to be summed over ranks.

    An empty tensor gives zeros, so a rank whose batch was skipped still contributes (and joins the
    collective). See :func:`std_from_moments`.
    """
    r = rewards.detach().double().reshape(-1)
    return torch.stack([r.new_tensor(float(r.numel())), r.sum(), (r * r).sum()])


def std_from_moments(moments: Tensor) -> Tensor:
    """Unbiased std from ``[n, Σ r, Σ r²]`` (:func:`reward_moments` summed over ranks), float64 scalar.

    ``sqrt((Σ r² - (Σ r)² / n) / (n - 1))``, the same value as ``torch.std`` of all the rewards
    (TRL 1.16 ``scale_rewards="batch"`` over the gathered rewards); 0 when ``n < 2``. Negative
    round-off is clamped to 0.
    """
    n, s, ss = moments.double().unbind()
    if n < 2:
        return moments.new_zeros((), dtype=torch.float64)
    return ((ss - s * s / n) / (n - 1)).clamp(min=0.0).sqrt()


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int | None, penalty: float = 1.0) -> Tensor:
    """Soft overlong penalty ``(N,)`` float32, ≤ 0, for completion lengths in tokens (DAPO Eq. 13).

    ``-penalty * clamp((L - (max_new_tokens - buffer)) / buffer, 0, 1)``: 0 up to the buffer's start,
    linear to ``-penalty`` at the budget. The released GRASP code computes the same value
    (``overlong_buffer_len``, ``overlong_penalty_factor``). ``buffer`` ``None`` or 0: zeros.

    Raises:
        GraspConfigError: ``buffer`` is negative or larger than ``max_new_tokens``.
    """
    if not buffer:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if buffer < 0 or buffer > max_new_tokens:
        raise GraspConfigError(f"overlong_buffer={buffer} must be in 1 … max_new_tokens={max_new_tokens}")
    start = max_new_tokens - buffer
    return -penalty * ((lengths.float() - start) / buffer).clamp(0, 1)


def released_advantages(term_rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
    """Released GRASP advantage: each reward term mean-centred within its group, then weighted and summed.

    ``A_i = Σ_t w_t (r_{i,t} - mean_{j in group(i)} r_{j,t})``; no std division. A term that is equal
    across a group contributes exactly 0. Clip the result with :func:`clip_advantages` (±5 in the
    released recipe).

    Args:
        term_rewards: ``(N, T)`` per-term rewards, ``N = G * group_size``.
        weights: ``(T,)`` term weights (1.0, 0.1, 0.05, 0.2 in the GRASP recipe).
        group_size: ``K``, rollouts per prompt.

    Returns:
        ``(N,)`` advantages, dtype of ``term_rewards``.

    Raises:
        ValueError: shapes do not match or ``N`` not divisible by ``group_size``.
        GraspConfigError: ``group_size < 1``.
    """
    if term_rewards.dim() != 2 or weights.shape != (term_rewards.shape[1],):
        raise ValueError(f"term_rewards (N, T) and weights (T,) expected, got {tuple(term_rewards.shape)} "
                         f"and {tuple(weights.shape)}")
    grouped = _grouped(term_rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return (centred.reshape(term_rewards.shape) * weights.to(term_rewards.dtype)).sum(dim=1)


def clip_advantages(adv: Tensor, bound: float | None) -> Tensor:
    """Clamp advantages to ``[-bound, bound]``; ``None`` returns ``adv`` unchanged (released GRASP code: 5).

    Args:
        adv: advantages of any shape.
        bound: positive bound or ``None``.

    Raises:
        GraspConfigError: ``bound <= 0``.
    """
    if bound is None:
        return adv
    if bound <= 0:
        raise GraspConfigError(f"advantage clip bound must be > 0 or None, got {bound}")
    return adv.clamp(-bound, bound)


def selective_log_softmax(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``, computed in float32.

    One row at a time, so only an ``(L, V)`` float32 copy exists at once (never the full ``(N, L, V)``
    log-softmax). Mirrors TRL's ``selective_log_softmax`` (logits divided by the sampling temperature).

    Args:
        logits: ``(N, L, V)`` logits (any float dtype) aligned with the tokens they predict.
        token_ids: ``(N, L)`` int64 token ids.
        temperature: sampling temperature, > 0.

    Returns:
        ``(N, L)`` float32 log-probs; differentiable w.r.t. ``logits``.

    Raises:
        GraspConfigError: ``temperature <= 0``. ValueError: shapes do not match.
    """
    if temperature <= 0:
        raise GraspConfigError(f"temperature must be > 0, got {temperature}")
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits (N, L, V) and token_ids (N, L) expected, got {tuple(logits.shape)} "
                         f"and {tuple(token_ids.shape)}")
    rows = []
    for row_logits, row_ids in zip(logits, token_ids):
        row = row_logits.float() / temperature
        chosen = row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        rows.append(chosen - torch.logsumexp(row, dim=-1))
    if not rows:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.stack(rows)


def k3_kl(logp: Tensor, ref_logp: Tensor, clamp: float | None = None) -> Tensor:
    """Per-token k3 KL estimator ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (Schulman; TRL's ``per_token_kl``).

    ``d`` is clamped to ``[-20, 20]`` so ``exp`` cannot overflow in bf16/fp32 (e^20 ≈ 4.9e8); the
    clamp has zero gradient outside that range. TRL does not clamp; values agree whenever
    ``|d| <= 20``.

    Args:
        logp: ``(N, L)`` policy log-probs.
        ref_logp: ``(N, L)`` reference-model log-probs.
        clamp: ``None``: as above. A number ``c``: each estimate is then clamped to ``[-c, c]`` (zero
            gradient beyond): the released GRASP code clamps to ±10 (``socialmllm/train/reasoning/trainer.py:196``;
            its ``d`` is clamped to ±20 first, at ``:195``, as here).

    Returns:
        ``(N, L)`` non-negative estimates, dtype of the inputs.
    """
    d = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = torch.exp(d) - d - 1
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the masked tokens (0 when the mask is empty); detached."""
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).detach()


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: float | Tensor | None = None,
    token_weights: Tensor | None = None,
    kl_clamp: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped GRPO objective with an optional k3 KL penalty, as in TRL 1.16 ``GRPOTrainer._compute_loss``.

    Per token: ``ratio = exp(clamp(logp - old_logp, -20, 20))``,
    ``loss = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A) + beta * k3_kl(logp, ref_logp)``
    (KL only when ``beta != 0``). Computed in float32. Aggregation over the masked tokens:

    * ``"grpo"``: mean over each sequence's tokens, then mean over sequences;
    * ``"bnpo"``: sum over all tokens / number of tokens in this micro-batch;
    * ``"dapo"``: sum / ``num_items_in_batch`` when given, else as ``"bnpo"``;
    * ``"dr_grpo"``: sum / (``N * max_completion_length``).

    The value is one micro-batch's loss, not divided by the accumulation factor; see the module
    docstring for how it relates to TRL's scaling under gradient accumulation.

    Args:
        logp: ``(N, L)`` policy log-probs of the completion tokens (with grad; any float dtype).
        old_logp: ``(N, L)`` log-probs of the sampling policy, or ``None`` (on-policy: ``logp.detach()``).
        ref_logp: ``(N, L)`` reference-model log-probs, or ``None`` (required when ``beta != 0``).
        advantages: ``(N,)`` one advantage per rollout.
        mask: ``(N, L)`` 1 for completion tokens that count, 0 for padding (bool, int or float).
        epsilon: lower clip range ``ε_low``; also the upper one when ``epsilon_high`` is None.
        epsilon_high: upper clip range (DAPO's clip-higher), or ``None``.
        beta: KL coefficient (0.05 in the released GRASP recipe, 0.0 in TRL by default).
        loss_type: one of :data:`LOSS_TYPES`.
        max_completion_length: the generation budget in tokens; required for ``"dr_grpo"``.
        num_items_in_batch: ``dapo`` normaliser, the number of loss tokens it should average over.
        token_weights: ``(N, L)`` detached weights of the clipped term, or ``None``: the truncated
            importance-sampling correction for a rollout engine whose numerics differ from the trainer's
            (TRL 1.16 multiplies ``per_token_loss`` by it before adding the KL term; ``GRPOTask``'s
            ``importance_sampling_cap``).
        kl_clamp: clamp each token's k3 estimate to ±this (:func:`k3_kl`; released GRASP: 10), in the loss and
            in ``kl_mean``; ``None``: no clamp.

    Returns:
        ``(loss, metrics)``: a float32 scalar loss, and detached float32 scalars ``kl_mean`` (masked
        mean of k3; present only when ``ref_logp`` is given), ``clip_ratio`` (share of tokens in the
        clipped region: ratio < 1-ε with A < 0, or ratio > 1+ε_high with A > 0 — TRL's
        ``clip_ratio/region_mean``), ``clip_ratio_low``, ``clip_ratio_high`` and ``ratio_mean``.

    Raises:
        GraspConfigError: unknown ``loss_type``; ``dr_grpo`` without ``max_completion_length``;
        ``beta != 0`` without ``ref_logp``. ValueError: mismatched shapes.
    """
    if loss_type not in LOSS_TYPES:
        raise GraspConfigError(f"unknown loss_type {loss_type!r}; expected one of {list(LOSS_TYPES)}")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise GraspConfigError("loss_type 'dr_grpo' needs max_completion_length (the generation budget in tokens)")
    if beta != 0.0 and ref_logp is None:
        raise GraspConfigError(f"beta={beta} needs reference log-probs (ref_logp is None)")
    if logp.dim() != 2 or mask.shape != logp.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"logp (N, L), mask (N, L), advantages (N,) expected, got {tuple(logp.shape)}, "
                         f"{tuple(mask.shape)}, {tuple(advantages.shape)}")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    logp32 = logp.float()
    old32 = logp32.detach() if old_logp is None else old_logp.float()
    mask32 = mask.float()
    adv = advantages.float().unsqueeze(1)

    ratio = torch.exp((logp32 - old32).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = ratio.clamp(1 - epsilon, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    if token_weights is not None:
        per_token = per_token * token_weights.detach().float()
    metrics: dict[str, Tensor] = {}
    if ref_logp is not None:
        kl = k3_kl(logp32, ref_logp.float(), kl_clamp)
        metrics["kl_mean"] = _masked_mean(kl, mask32)
        if beta != 0.0:
            per_token = per_token + beta * kl

    token_sum = (per_token * mask32).sum()
    if loss_type == "grpo":
        loss = ((per_token * mask32).sum(-1) / mask32.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo" or (loss_type == "dapo" and num_items_in_batch is None):
        loss = token_sum / mask32.sum().clamp(min=1.0)
    elif loss_type == "dapo":
        loss = token_sum / torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=logp.device).clamp(min=1.0)
    else:  # dr_grpo
        loss = token_sum / (logp.shape[0] * max_completion_length)

    low = (ratio < 1 - epsilon) & (adv < 0)
    high = (ratio > 1 + eps_high) & (adv > 0)
    metrics["clip_ratio"] = _masked_mean((low | high).float(), mask32)
    metrics["clip_ratio_low"] = _masked_mean(low.float(), mask32)
    metrics["clip_ratio_high"] = _masked_mean(high.float(), mask32)
    metrics["ratio_mean"] = _masked_mean(ratio, mask32)
    return loss, metrics
