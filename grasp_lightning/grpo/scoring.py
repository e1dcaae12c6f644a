"""Group-shared rollouts and scoring: each GRPO group's clip is encoded once and its prompt prefilled once.

In video GRPO the prompt dominates (a 2 fps clip gives thousands of visual tokens, a completion a
few hundred). Repeating every prompt K times as separate rows (TRL 1.16 ``GRPOTrainer``, our
``share_prompt=False`` mode) runs the vision encoder, the prompt prefill and the prompt part of
every log-prob forward K times per group. Here the shared work runs once per prompt:

* **Sampling** (:func:`prefill_for_generation`): the ``B`` prompts but their last token are
  prefilled once (vision encoder included) into a ``DynamicCache``, the cache is expanded with
  ``cache.batch_repeat_interleave(K)``, and ``generate`` continues from it with the ``B*K`` rows
  (``cache=``). Qwen3-VL keeps its M-RoPE offsets in ``model.model.rope_deltas`` ``(B, 1)``; they
  are repeated to ``(B*K, 1)`` so the decode positions are the ones plain ``generate`` uses.
* **Scoring** (:func:`shared_completion_logps`): the ``B`` prompts run once, with gradients, into a
  :class:`SharedPrefixCache`; its keys/values are repeated K times *inside* the attention of a
  second forward over the ``B*K`` completions, whose M-RoPE positions are given explicitly
  (``prompt length + rope delta + j``, exactly what ``get_rope_index`` assigns to text after the
  prompt). Back-propagation through the cache sums the K rows' gradients into the shared prompt
  computation, which is what the repeated rows compute. Gradient checkpointing works: the cache's
  layers are idempotent (a recompute in the backward pass writes/reads the same states), so the
  decoder layers may keep it (transformers' ``_can_checkpoint_with_cache``).

**Hybrid models** (Qwen3.5: three of every four decoder layers are Gated DeltaNet linear attention,
``layer_types`` ``linear_attention``) share the prompt the same way. A linear-attention layer has no
keys/values but two per-row states after the prompt: the last ``linear_conv_kernel_dim`` inputs of
its causal convolution ``(B, C, kernel)`` and the recurrent state ``(B, H_v, d_k, d_v)`` (float32).
Sampling repeats both K times (transformers' ``LinearAttentionLayer`` has no
``batch_repeat_interleave``, so :func:`expand_cache` does it); scoring keeps them, with gradients, in
:class:`SharedPrefixCache`, whose read mode hands each completion row its prompt's convolution
window and recurrent state as the starting point (``initial_state`` of the chunked gated delta
rule). Left padding is neutral here too: transformers zeroes padded positions before the
convolution, so a zero input leaves the zero initial state at zero (no key, no value, only decay).
Continuing the recurrence from the prompt's state is the same recurrence as running prompt and
completion in one pass, regrouped into different 64-token chunks, so the results agree to float
rounding (float32: ~1e-6), not bit for bit.

Both equal the naive per-row computation within float tolerance (``tests/unit/grpo/test_scoring.py``,
for Qwen3-VL and Qwen3.5). Sharing needs a Qwen-VL-style model (``get_rope_index`` and
``rope_deltas``), decoder layers that are full or linear attention (not sliding-window), and vision
inputs; :func:`sharing_unsupported_reason` says why not otherwise, and callers fall back to the naive
path (:func:`repeat_prompts` + :func:`completion_logps`).

Layout everywhere: ``N = B * K`` rows, rows ``b*K .. b*K+K-1`` belong to prompt ``b``; prompts are
left-padded ``(B, Lp)``, completions right-padded ``(N, Lc)``.
"""

from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DynamicCache,
    DynamicLayer,
    LinearAttentionCacheLayerMixin,
)

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.logprobs import chunked_logps_and_entropy, hidden_states_as_logits
from grasp_lightning.grpo.vision import VisionFeatures, inner_module, reuse_vision
from grasp_lightning.sequence_parallel import SequenceParallel

#: Prompt-level text inputs (one row per prompt, repeated K times for the naive path).
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
#: Vision inputs: (patch rows, grid) pairs. A prompt may carry a clip, an image, both, or (in a mixed
#: batch) neither of one kind; :func:`split_vision` finds which rows carry which.
VISION_KEYS = (("pixel_values_videos", "video_grid_thw"), ("pixel_values", "image_grid_thw"))
#: ``mm_token_type_ids`` value of each grid's placeholder tokens (the Qwen3-VL processor: 1 image, 2 video).
MM_TOKEN_TYPE = {"video_grid_thw": 2, "image_grid_thw": 1}
#: Decoder layer kinds whose prompt state can be shared: attention keys/values, linear-attention states.
SHARED_LAYER_TYPES = ("full_attention", "linear_attention")


# ---------------------------------------------------------------------------------------- model plumbing
def vl_core(model) -> torch.nn.Module | None:
    """The module holding ``get_rope_index`` and the ``rope_deltas`` state (``Qwen3VLModel``), or ``None``.

    Looks through a peft wrapper (``get_base_model``) and the ``*ForConditionalGeneration.model`` level.
    """
    return inner_module(model, "get_rope_index", "rope_deltas")


def sharing_unsupported_reason(model, prompt: dict[str, torch.Tensor]) -> str | None:
    """Why group sharing cannot be exact for this model and these prompts, or ``None`` when it can.

    Sharing needs M-RoPE state (``get_rope_index``/``rope_deltas``: Qwen2/2.5/3-VL, Qwen3.5),
    decoder layers of the kinds in :data:`SHARED_LAYER_TYPES` (full attention, and the linear
    attention of hybrid models; a sliding-window cache is not covered by :class:`SharedPrefixCache`),
    and vision inputs (text-only left-padded prompts get positions from ``arange`` in transformers,
    not from the attention mask).
    """
    if vl_core(model) is None:
        return f"{type(model).__name__} has no M-RoPE core (get_rope_index / rope_deltas)"
    other = sorted(set(layer_types(model)) - set(SHARED_LAYER_TYPES))
    if other:
        return f"decoder layer types {other} are neither full nor linear attention"
    if not any(grid in prompt for _, grid in VISION_KEYS):
        return "the prompts carry no image or video"
    return None


def layer_types(model) -> list[str]:
    """The decoder's layer kinds in order (``config.layer_types``; all ``full_attention`` when unset).

    Qwen3.5's text config writes ``linear_attention`` for three of every four layers
    (``full_attention_interval`` 4); Qwen3-VL's are all ``full_attention``.
    """
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


def _rope_deltas(model, batch: int) -> torch.Tensor:
    deltas = vl_core(model).rope_deltas
    if deltas is None or deltas.shape[0] != batch:
        raise RuntimeError(f"expected rope_deltas of shape ({batch}, 1) after the prompt forward, got "
                           f"{None if deltas is None else tuple(deltas.shape)}")
    return deltas


@contextlib.contextmanager
def _cache_through_checkpointing(model):
    """Let checkpointed decoder layers keep a :class:`SharedPrefixCache` (its updates are idempotent)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
              and "_can_checkpoint_with_cache" not in vars(m)]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache


class _PrefixLayer(DynamicLayer):
    """One layer of :class:`SharedPrefixCache`: write mode stores, read mode prepends the repeated prefix."""

    def __init__(self, repeats: int = 0) -> None:
        super().__init__()
        self.repeats = repeats

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.repeats:  # read: (B, H, Lp, D) repeated to (B*K, ...) then the new tokens appended; nothing stored
            keys = self.keys.repeat_interleave(self.repeats, 0)
            values = self.values.repeat_interleave(self.repeats, 0)
            return torch.cat([keys, key_states], -2), torch.cat([values, value_states], -2)
        self.keys, self.values = key_states, value_states  # write: replace, so a recompute is harmless
        return key_states, value_states


class _PrefixLinearLayer(LinearAttentionCacheLayerMixin):
    """One linear-attention layer of :class:`SharedPrefixCache` (Gated DeltaNet): the prompt's states.

    Write mode keeps the convolution window ``(B, C, kernel)`` (the last ``kernel`` inputs of the
    causal convolution, zero-padded on the left for a shorter prompt) and the final recurrent state
    ``(B, H_v, d_k, d_v)``, both assigned (never copied in place), so the autograd graph is kept and
    a recompute under gradient checkpointing writes the same values. Read mode returns them repeated
    K times and stores nothing. ``record_past`` is set so that transformers never takes its in-place
    single-token convolution update (``causal_conv1d_update``) on these states.
    """

    def __init__(self, repeats: int = 0, conv: torch.Tensor | None = None, state: torch.Tensor | None = None) -> None:
        super().__init__()
        self.repeats = repeats
        self.record_past = True
        self.conv, self.state = conv, state
        self.has_previous_state[0] = conv is not None

    def lazy_initialization(self, conv_states=None, recurrent_states=None, state_idx: int = 0) -> None:
        """Nothing to allocate: the states are the tensors the prompt forward produced."""

    def conv_window(self) -> torch.Tensor | None:
        """The convolution window, repeated to ``(B*K, C, kernel)`` in read mode."""
        if self.conv is None or not self.repeats:
            return self.conv
        return self.conv.repeat_interleave(self.repeats, 0)

    def recurrent(self) -> torch.Tensor | None:
        """The recurrent state, repeated to ``(B*K, H_v, d_k, d_v)`` in read mode."""
        if self.state is None or not self.repeats:
            return self.state
        return self.state.repeat_interleave(self.repeats, 0)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs) -> torch.Tensor:
        """Return the convolution input with its left context; write mode keeps the last ``kernel`` columns."""
        if self.repeats:  # read: the prompt's window, then the completion tokens
            return torch.cat([self.conv_window(), conv_states], -1)
        kernel = conv_kernel_size or conv_states.shape[-1]
        self.conv_kernel_size[state_idx] = kernel
        pad = max(0, kernel - conv_states.shape[-1])
        self.conv = torch.nn.functional.pad(conv_states, (pad, 0))[..., -kernel:]
        self.has_previous_state[state_idx] = False  # the prompt forward itself runs without a previous state
        return conv_states

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """Write mode keeps the prompt's final recurrent state; read mode stores nothing."""
        if not self.repeats:
            self.state = recurrent_states
        return recurrent_states


class SharedPrefixCache(Cache):
    """A cache for scoring K completions against one prompt prefix, with gradients.

    A fresh cache (:meth:`for_model`) is in *write* mode: the prompt forward stores each attention
    layer's keys/values ``(B, H, Lp, D)`` and each linear-attention layer's convolution window and
    recurrent state (autograd graph kept). :meth:`expanded` returns a *read* cache over the same
    tensors: an attention layer returns ``cat(prefix.repeat_interleave(K, 0), new)``, a
    linear-attention layer its states repeated K times as the completions' starting point; nothing
    is stored, so the completion forward of ``B*K`` rows continues from the shared prefix and
    gradients flow back into it. Both modes are idempotent, which makes them safe under gradient
    checkpointing.
    """

    def __init__(self, layers: list[_PrefixLayer | _PrefixLinearLayer]) -> None:
        super().__init__(layers=layers)

    @classmethod
    def for_model(cls, model) -> "SharedPrefixCache":
        """A write-mode cache with one layer per decoder layer of ``model`` (:func:`layer_types`)."""
        return cls([_PrefixLinearLayer() if kind == "linear_attention" else _PrefixLayer()
                    for kind in layer_types(model)])

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The layer's convolution window (repeated in read mode), ``None`` before the prompt ran."""
        layer = self.layers[layer_idx]
        return layer.conv_window() if layer.repeats else None

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The layer's recurrent state (repeated in read mode), ``None`` before the prompt ran."""
        layer = self.layers[layer_idx]
        return layer.recurrent() if layer.repeats else None

    def expanded(self, k: int) -> "SharedPrefixCache":
        """A read-mode cache repeating this prefix ``k`` times along the batch (no copy held)."""
        layers = []
        for layer in self.layers:
            if isinstance(layer, _PrefixLinearLayer):
                layers.append(_PrefixLinearLayer(k, layer.conv, layer.state))
                continue
            new = _PrefixLayer(repeats=k)
            new.lazy_initialization(layer.keys, layer.values)
            new.keys, new.values = layer.keys, layer.values
            layers.append(new)
        return SharedPrefixCache(layers)


def repeat_linear_states(layer, k: int) -> None:
    """Repeat a linear-attention cache layer's convolution and recurrent states K times along the batch
    (rows ``b*K .. b*K+K-1``), re-assigned rather than copied into the old buffers; its ``batch_size``
    follows where it has one. ``layer``: a transformers ``LinearAttentionCacheLayerMixin``."""
    for idx in range(layer.number_of_states):
        if layer.is_conv_states_initialized[idx]:
            layer.conv_states[idx] = layer.conv_states[idx].repeat_interleave(k, 0)
        if layer.is_recurrent_states_initialized[idx]:
            layer.recurrent_states[idx] = layer.recurrent_states[idx].repeat_interleave(k, 0)
    if hasattr(layer, "batch_size"):
        layer.batch_size *= k


def expand_cache(cache: Cache, k: int) -> None:
    """Repeat every row of a filled ``DynamicCache`` K times in place (rows ``b*K .. b*K+K-1``).

    Attention layers use transformers' ``batch_repeat_interleave``; linear-attention layers
    (``LinearAttentionLayer``, which has none in transformers 5.25) get their convolution and
    recurrent states repeated here, re-assigned rather than copied into the old buffers.
    """
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            repeat_linear_states(layer, k)
        if isinstance(layer, CacheLayerMixin):  # keys/values (also of a layer holding both kinds)
            layer.batch_repeat_interleave(k)


def _prompt_forward(model, prompt: dict[str, torch.Tensor], cache: Cache, *, drop_last: bool = False, keep: int = 1):
    """Forward the ``B`` prompts once (vision encoder included) into ``cache``; logits of the last ``keep``
    positions (``0``: all, what a split forward needs)."""
    args = {name: (prompt[name][:, :-1] if drop_last else prompt[name]) for name in TEXT_KEYS if name in prompt}
    for pixels, grid in VISION_KEYS:
        if grid in prompt:
            args[pixels], args[grid] = prompt[pixels], prompt[grid]
    return model(**args, cache=cache, use_cache=isinstance(cache, DynamicCache), logits_to_keep=keep)


# ---------------------------------------------------------------------------------------- sampling
@torch.no_grad()
def prefill_for_generation(model, prompt: dict[str, torch.Tensor], k: int) -> tuple[dict[str, torch.Tensor], Cache]:
    """Prefill the ``B`` prompts once and expand the cache to ``B*K`` rows for ``generate(cache=...)``.

    The last prompt token is left out of the prefill so ``generate`` has one uncached token per row
    to start from (its first step then computes the same logits as plain ``generate``'s prefill).
    Sets the model's ``rope_deltas`` to the repeated ``(B*K, 1)`` offsets.

    Args:
        model: a Qwen-VL-style generation model (see :func:`sharing_unsupported_reason`).
        prompt: left-padded prompt inputs of ``B`` prompts with their vision inputs.
        k: group size K.

    Returns:
        ``(text_inputs, cache)``: ``input_ids``/``attention_mask``/``mm_token_type_ids`` repeated to
        ``(B*K, Lp)`` and the expanded ``DynamicCache`` holding ``Lp - 1`` positions.
    """
    batch = prompt["input_ids"].shape[0]
    cache = DynamicCache(config=model.config)
    _prompt_forward(model, prompt, cache, drop_last=True)
    deltas = _rope_deltas(model, batch)
    expand_cache(cache, k)
    vl_core(model).rope_deltas = deltas.repeat_interleave(k, 0)
    return {name: prompt[name].repeat_interleave(k, 0) for name in TEXT_KEYS if name in prompt}, cache


# ---------------------------------------------------------------------------------------- vision per row
def grids_per_row(inputs: dict[str, torch.Tensor], grid_key: str) -> list[int]:
    """How many grids of ``grid_key`` (``video_grid_thw`` or ``image_grid_thw``) each of the ``B`` rows carries.

    Grids are in row order (collation concatenates them so, and the model pairs them with the rows'
    placeholder runs in that order: transformers' Qwen3-VL ``get_rope_index``). A row's share is read
    from ``mm_token_type_ids`` (:data:`MM_TOKEN_TYPE`): a grid ``(t, h, w)`` expands to
    ``t*h*w / merge²`` placeholder tokens, with ``merge²`` = the batch's patches over its placeholders
    (the processor's spatial merge, 4 for Qwen3-VL). Without ``mm_token_type_ids``, one grid per row.

    Raises:
        GraspConfigError: the grids do not add up to any row's placeholder count, or (without
            ``mm_token_type_ids``) their number is not ``B``.
    """
    batch = inputs["input_ids"].shape[0]
    grid = inputs.get(grid_key)
    if grid is None:
        return [0] * batch
    types = inputs.get("mm_token_type_ids")
    if types is None:
        if grid.shape[0] != batch:
            raise GraspConfigError(f"{grid_key} has {grid.shape[0]} rows for {batch} prompts and no "
                                   f"mm_token_type_ids says which prompt carries which")
        return [1] * batch
    tokens = (types == MM_TOKEN_TYPE[grid_key]).sum(1).tolist()
    patches = grid.prod(-1).tolist()
    total, carrying = sum(tokens), sum(1 for n in tokens if n)
    if len(patches) < carrying:
        raise GraspConfigError(f"{grid_key} has {len(patches)} rows for {carrying} prompts with its placeholders "
                               f"(mm_token_type_ids {MM_TOKEN_TYPE[grid_key]}): every such prompt needs its grids")
    if total == 0 or sum(patches) % total:
        raise GraspConfigError(f"{grid_key}: {sum(patches)} patches for {total} placeholder tokens in the batch")
    merge = sum(patches) // total
    counts, g = [], 0
    for b, n in enumerate(tokens):
        start, need = g, n * merge
        while need > 0 and g < len(patches):
            need -= patches[g]
            g += 1
        if need != 0:
            raise GraspConfigError(f"{grid_key}: row {b}'s {n} placeholder tokens match no run of its grids")
        counts.append(g - start)
    if g != len(patches):
        raise GraspConfigError(f"{grid_key}: {len(patches) - g} grids left over after the {batch} rows")
    return counts


def split_vision(inputs: dict[str, torch.Tensor]) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each row's vision inputs: ``{grid_key: [(patch rows (N_b, D), grids (G_b, 3)) for b in rows]}`` for
    the grid keys present (:data:`VISION_KEYS`); a row without that medium gets ``G_b = N_b = 0``.

    Raises:
        GraspConfigError: see :func:`grids_per_row`.
    """
    out = {}
    for pixels, grid_key in VISION_KEYS:
        if grid_key not in inputs:
            continue
        grid = inputs[grid_key]
        counts = grids_per_row(inputs, grid_key)
        grids = torch.split(grid, counts)
        patches = torch.split(inputs[pixels], [int(g.prod(-1).sum()) for g in grids])
        out[grid_key] = list(zip(patches, grids))
    return out


def gather_vision(parts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]], rows: list[int]) -> dict[str, torch.Tensor]:
    """The vision inputs of ``rows`` (indices into :func:`split_vision`'s lists, repeats allowed), in
    that order; a medium none of them carries is left out (the model takes no empty pixel tensor)."""
    out = {}
    for pixels, grid_key in VISION_KEYS:
        per_row = parts.get(grid_key)
        if per_row is None:
            continue
        chosen = [per_row[r] for r in rows if per_row[r][1].shape[0]]
        if chosen:
            out[pixels] = torch.cat([p for p, _ in chosen])
            out[grid_key] = torch.cat([g for _, g in chosen])
    return out


# ---------------------------------------------------------------------------------------- naive rows
def repeat_prompts(inputs: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Repeat each prompt's rows and vision patches K times (TRL-style rows ``b*K .. b*K+K-1``).

    Args:
        inputs: prompt inputs of B prompts; ``pixel_values_videos`` (``pixel_values``) holds the patch
            rows of the clips (images) of the rows that carry one, concatenated in row order, with
            ``video_grid_thw`` (``image_grid_thw``); a batch may mix image and video rows
            (:func:`split_vision`).
        k: group size K.

    Raises:
        GraspConfigError: the grids cannot be assigned to rows (:func:`grids_per_row`).
    """
    batch = inputs["input_ids"].shape[0]
    out = {name: inputs[name].repeat_interleave(k, dim=0) for name in TEXT_KEYS if name in inputs}
    out.update(gather_vision(split_vision(inputs), [b for b in range(batch) for _ in range(k)]))
    return out


def full_sequences(prompt: dict[str, torch.Tensor], completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                   k: int) -> dict[str, torch.Tensor]:
    """Model inputs of the ``B*K`` full sequences (prompt repeated K times + completion), the naive layout."""
    rep = repeat_prompts(prompt, k)
    rep["input_ids"] = torch.cat([rep["input_ids"], completion_ids], 1)
    rep["attention_mask"] = torch.cat([rep["attention_mask"], completion_mask.to(rep["attention_mask"].dtype)], 1)
    if "mm_token_type_ids" in rep:
        rep["mm_token_type_ids"] = torch.cat([rep["mm_token_type_ids"], torch.zeros_like(completion_ids)], 1)
    return rep


def logps_and_entropy(logits: torch.Tensor, completion_ids: torch.Tensor,
                      temperature: float, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs (differentiable) and entropies (no grad unless ``entropy_grad``: the entropy
    bonus of ``loss.entropy_coef``) from ``(N, Lc, V)`` aligned logits.

    Logits are divided by the sampling temperature first (TRL). Returns two ``(N, Lc)`` float32 tensors.
    The entropy is computed one row at a time, so at most one row's float32 copies of the
    ``(Lc, V)`` logits exist beside the logits themselves (without ``entropy_grad``; with it, autograd keeps
    each row's softmax for the backward).
    """
    logp = objective.selective_log_softmax(logits, completion_ids, temperature)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        rows = []
        for row in logits:
            scaled = row.float() / temperature
            rows.append(torch.logsumexp(scaled, -1) - (scaled.softmax(-1) * scaled).sum(-1))
        entropy = torch.stack(rows) if rows else logp.new_zeros(logp.shape)
    return logp, entropy


def completion_logps(model, inputs: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                     temperature: float, chunk_size: int | None = None,
                     entropy_grad: bool = False, sp: SequenceParallel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive scoring: one forward over full sequences whose last ``Lc`` tokens are ``completion_ids`` ``(N, Lc)``.

    ``chunk_size``: ``None`` takes the model's ``(N, Lc, V)`` logits (:func:`logps_and_entropy`); an
    integer takes its final hidden states and applies the LM head over that many tokens at a time
    (:func:`grasp_lightning.grpo.logprobs.chunked_logps_and_entropy`), so no ``(N, Lc, V)`` tensor exists.
    ``sp``: a sequence-parallel group of more than one rank splits the forward (:func:`_split_logps`); every
    rank of it returns the same values.

    Returns:
        ``(logp, entropy)``, both ``(N, Lc)`` float32 (see :func:`logps_and_entropy`).
    """
    lc = completion_ids.shape[1]
    if sp is not None and sp.size > 1:
        with sp.splitting(), hidden_states_as_logits(model) as head:
            hidden = model(**inputs, use_cache=False, logits_to_keep=0).logits  # (N, S/N, D): this rank's chunk
        layout = sp.layout()
        return _split_logps(sp, [(hidden, layout, layout.length - lc - 1, 0)], head, completion_ids, temperature,
                            chunk_size, entropy_grad)
    with _scoring_head(model, chunk_size) as head:
        out = model(**inputs, use_cache=False, logits_to_keep=lc + 1).logits[:, :-1]
    return _logps(out, head, completion_ids, temperature, chunk_size, entropy_grad)


@contextlib.contextmanager
def _scoring_head(model, chunk_size: int | None):
    """``None`` for the full-logits path; else the LM head, the model returning hidden states meanwhile."""
    if chunk_size is None:
        yield None
        return
    with hidden_states_as_logits(model) as head:
        yield head


def _logps(out: torch.Tensor, head, completion_ids: torch.Tensor, temperature: float,
           chunk_size: int | None, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies from logits (``head`` ``None``) or from hidden states (chunked head)."""
    if head is None:
        return logps_and_entropy(out, completion_ids, temperature, entropy_grad)
    return chunked_logps_and_entropy(out, head, completion_ids, temperature, chunk_size, entropy_grad)


def _split_logps(sp: SequenceParallel, pieces: list, head, completion_ids: torch.Tensor, temperature: float,
                 chunk_size: int | None, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies ``(N, Lc)`` of completions scored by split forwards, the same on every rank.

    ``pieces``: ``(hidden, layout, start, column)`` per split forward: its chunk of final hidden states
    ``(N, S/N, D)``, its :class:`~grasp_lightning.sequence_parallel.SplitLayout`, the position ``start``
    that predicts completion column ``column``; each following position predicts the next column, up to
    the forward's end or ``Lc``. Each rank applies the LM head (in chunks of ``chunk_size`` tokens, or
    whole) to the positions of its chunk only, and the group's sum places every column.
    """
    n, lc = completion_ids.shape
    logps = completion_ids.new_zeros((n, lc), dtype=torch.float32)
    entropies = torch.zeros_like(logps)
    for hidden, layout, start, column in pieces:
        if hidden.requires_grad:  # a rank whose chunk predicts no completion token still takes part in the
            logps = logps + 0.0 * hidden.sum()  # backward: its keys/values reached the other ranks' positions
        stop = start + min(lc - column, layout.length - start)
        first, last = layout.local_span(start, stop)
        if last == first:
            continue
        rows = hidden[:, first - layout.lo:last - layout.lo]
        ids = completion_ids[:, column + first - start:column + last - start]
        if rows.shape[0] != n:
            rows = rows.repeat_interleave(n // rows.shape[0], 0)
        size = chunk_size if chunk_size is not None else rows.shape[0] * rows.shape[1]
        lp, ent = chunked_logps_and_entropy(rows, head, ids, temperature, max(size, 1), entropy_grad)
        cols = (column + first - start, column + last - start)
        logps = logps + sp_place(lp, cols, lc)
        entropies = entropies + sp_place(ent, cols, lc)
    return sp.sum_disjoint(logps), sp.sum_disjoint(entropies)


def sp_place(values: torch.Tensor, cols: tuple[int, int], width: int) -> torch.Tensor:
    """``values`` ``(N, last - first)`` at columns ``cols = (first, last)`` of an ``(N, width)`` zero tensor."""
    return torch.nn.functional.pad(values, (cols[0], width - cols[1]))


# ---------------------------------------------------------------------------------------- shared scoring
def shared_completion_logps(model, prompt: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                            completion_mask: torch.Tensor, k: int, temperature: float,
                            chunk_size: int | None = None, entropy_grad: bool = False,
                            sp: SequenceParallel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-shared scoring: the B prompts run once, the ``B*K`` completions attend to their shared cache.

    Differentiable when grad is enabled (policy loss); also used under ``no_grad`` for the
    reference and old-policy log-probs.

    Args:
        model: Qwen-VL-style model (see :func:`sharing_unsupported_reason`).
        prompt: left-padded prompt inputs ``(B, Lp)`` with vision inputs.
        completion_ids: ``(B*K, Lc)`` right-padded completions.
        completion_mask: ``(B*K, Lc)`` bool/int, true on real completion tokens.
        k: group size K.
        temperature: sampling temperature (logits are divided by it).
        chunk_size: ``None``: full logits; an integer: the LM head over that many tokens at a time
            (see :func:`completion_logps`).
        sp: a sequence-parallel group of more than one rank splits both forwards (:func:`_split_shared_logps`).

    Returns:
        ``(logp, entropy)``, both ``(B*K, Lc)`` float32, equal to :func:`completion_logps` on
        :func:`full_sequences` within float tolerance.

    Raises:
        ValueError: ``completion_ids`` does not have ``B*K`` rows.
    """
    batch = prompt["input_ids"].shape[0]
    n, lc = completion_ids.shape
    if n != batch * k:
        raise ValueError(f"{n} completion rows for {batch} prompts x K={k}")
    if sp is not None and sp.size > 1:
        return _split_shared_logps(model, prompt, completion_ids, completion_mask, k, temperature, chunk_size,
                                   entropy_grad, sp)
    with _cache_through_checkpointing(model), _scoring_head(model, chunk_size) as head:
        cache = SharedPrefixCache.for_model(model)
        logits = _prompt_forward(model, prompt, cache).logits[:, -1:].repeat_interleave(k, 0)
        if lc > 1:
            positions, mask = _completion_positions(model, prompt, completion_mask, k, lc)
            out = model(input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=positions,
                        cache=cache.expanded(k), use_cache=False)
            logits = torch.cat([logits, out.logits], 1)
    return _logps(logits, head, completion_ids, temperature, chunk_size, entropy_grad)  # the head's forward is back


def _completion_positions(model, prompt: dict[str, torch.Tensor], completion_mask: torch.Tensor, k: int,
                          lc: int) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE positions ``(3, B*K, Lc-1)`` and attention mask ``(B*K, Lp+Lc-1)`` of the completion forward
    that reads the shared prompt cache (after the prompt forward set ``rope_deltas``)."""
    prompt_mask = prompt["attention_mask"]
    start = (prompt_mask.sum(1, keepdim=True) + _rope_deltas(model, prompt_mask.shape[0])).repeat_interleave(k, 0)
    positions = (start + torch.arange(lc - 1, device=start.device))[None].expand(3, -1, -1)
    mask = torch.cat([prompt_mask.repeat_interleave(k, 0), completion_mask[:, :-1].to(prompt_mask.dtype)], 1)
    return positions, mask


def _split_shared_logps(model, prompt, completion_ids, completion_mask, k, temperature, chunk_size, entropy_grad,
                        sp: SequenceParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`shared_completion_logps` with both forwards split over ``sp``'s ranks.

    The prompt forward writes the rank's heads' whole-sequence keys/values and linear-attention states
    into the :class:`SharedPrefixCache`; the completion forward (also split) reads them. Position
    ``Lp - 1`` of the prompt predicts completion column 0, position ``j`` of the completion forward
    column ``j + 1`` (:func:`_split_logps`).
    """
    lc = completion_ids.shape[1]
    with _cache_through_checkpointing(model), sp.splitting(), hidden_states_as_logits(model) as head:
        cache = SharedPrefixCache.for_model(model)
        hidden = _prompt_forward(model, prompt, cache, keep=0).logits
        prompt_layout = sp.layout()
        pieces = [(hidden, prompt_layout, prompt_layout.length - 1, 0)]
        if lc > 1:
            positions, mask = _completion_positions(model, prompt, completion_mask, k, lc)
            out = model(input_ids=completion_ids[:, :-1], attention_mask=mask, position_ids=positions,
                        cache=cache.expanded(k), use_cache=False, logits_to_keep=0)
            pieces.append((out.logits, sp.layout(), 0, 1))
    return _split_logps(sp, pieces, head, completion_ids, temperature, chunk_size, entropy_grad)


def score_completions(model, prompt: dict[str, torch.Tensor], completion_ids: torch.Tensor,
                      completion_mask: torch.Tensor, k: int, temperature: float,
                      share: bool, chunk_size: int | None = None,
                      vision: VisionFeatures | None = None,
                      entropy_grad: bool = False, sp: SequenceParallel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies ``(B*K, Lc)`` of the completions: group-shared or naive (repeated rows).

    ``chunk_size``: the LM head over that many completion tokens at a time (``None``: full logits;
    :func:`completion_logps`). ``vision``: the rollout's vision features, fed to the model instead of
    running its (frozen) vision tower again (:func:`grasp_lightning.grpo.vision.reuse_vision`).
    ``entropy_grad``: the entropies differentiable too (``loss.entropy_coef``'s bonus), else without grad.
    ``sp``: the sequence-parallel group splitting the forwards (:mod:`grasp_lightning.sequence_parallel`).
    """
    with reuse_vision(model, vision):
        if share:
            return shared_completion_logps(model, prompt, completion_ids, completion_mask, k, temperature,
                                           chunk_size, entropy_grad, sp)
        return completion_logps(model, full_sequences(prompt, completion_ids, completion_mask, k), completion_ids,
                                temperature, chunk_size, entropy_grad, sp)


def prompt_tokens_forwarded(prompt: dict[str, torch.Tensor], k: int, share: bool, *, generation: bool = False) -> int:
    """Prompt tokens (padding included) one pass runs through the language model.

    Scoring pass: ``B*Lp`` shared, ``B*K*Lp`` naive. Generation (``generation=True``): shared
    prefills ``B*(Lp-1)`` then feeds the last prompt token to each of the ``B*K`` rows; naive
    ``generate`` prefills ``B*K*Lp``.
    """
    batch, length = prompt["input_ids"].shape
    if not share:
        return batch * k * length
    return batch * (length - 1) + batch * k if generation else batch * length


# ---------------------------------------------------------------------------------------- generation calls
def concat_prompts(prompts: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-pad and concatenate the prompt inputs of several micro-batches into one generation call's batch.

    Text inputs (``input_ids`` with ``pad_token_id``, ``attention_mask`` and ``mm_token_type_ids``
    with 0) are left-padded to the longest prompt; vision patch rows (``pixel_values_videos``,
    ``pixel_values``) and grids (``video_grid_thw``, ``image_grid_thw``) of the micro-batches that
    carry them are concatenated in order, so prompt ``b`` of the result keeps its clip and image. Left padding changes no log-prob: positions come from the attention mask
    (``get_rope_index``), which is what makes one generation call over ``B·A`` prompts equal to
    ``A`` calls over ``B`` (up to float rounding of the padded matmuls).

    Args:
        prompts: inputs of ``B_i`` left-padded prompts each (``(B_i, L_i)``; no ``labels``).
        pad_token_id: the tokenizer's pad id.

    Returns:
        ``(sum B_i, max L_i)`` text inputs and the concatenated vision inputs.

    Raises:
        ValueError: empty list, or the dicts carry different text keys.
    """
    if not prompts:
        raise ValueError("concat_prompts: no prompts")
    vision = {key for pair in VISION_KEYS for key in pair}
    keys = set(prompts[0]) - vision
    if any(set(p) - vision != keys for p in prompts):
        raise ValueError(f"concat_prompts: prompts carry different inputs: {[sorted(p) for p in prompts]}")
    if len(prompts) == 1:
        return dict(prompts[0])
    length = max(p["input_ids"].shape[1] for p in prompts)
    out: dict[str, torch.Tensor] = {}
    for name in TEXT_KEYS:
        if name in keys:
            value = pad_token_id if name == "input_ids" else 0
            out[name] = torch.cat([torch.nn.functional.pad(p[name], (length - p[name].shape[1], 0), value=value)
                                   for p in prompts])
    for pixels, grid in VISION_KEYS:  # a micro-batch of image rows only has no video keys, and vice versa
        carrying = [p for p in prompts if grid in p]
        if carrying:
            out[pixels] = torch.cat([p[pixels] for p in carrying])
            out[grid] = torch.cat([p[grid] for p in carrying])
    return out


def select_prompts(prompt: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The prompts ``rows`` of a left-padded prompt batch, with the columns that are padding in all of
    them removed (what collating those prompts alone gives) and their vision inputs.

    Args:
        prompt: ``(B, L)`` text inputs with their vision inputs (image and video rows may mix).
        rows: prompt indices in ``0 .. B-1`` (any order; repeats allowed).

    A medium none of ``rows`` carries is left out; with no rows at all the vision keys are kept,
    empty, so the result still says what the batch carried.

    Raises:
        GraspConfigError: the grids cannot be assigned to rows (:func:`grids_per_row`).
    """
    index = torch.tensor(rows, dtype=torch.long, device=prompt["input_ids"].device)
    out = {name: prompt[name].index_select(0, index) for name in TEXT_KEYS if name in prompt}
    if "attention_mask" in out and len(rows):
        real = out["attention_mask"].bool().any(0)
        first = int(real.int().argmax()) if bool(real.any()) else 0
        out = {name: v[:, first:] for name, v in out.items()}
    if not rows:
        out.update({key: prompt[key][:0] for pair in VISION_KEYS for key in pair if key in prompt})
        return out
    out.update(gather_vision(split_vision(prompt), rows))
    return out
