"""A static KV cache and a compiled decode step for the Hugging Face rollout engine (``model.rollout.compile_decode``).

Eager ``generate`` at a small batch spends each decode step on Python and kernel launches rather than
on the weight reads that bound it. transformers' remedy is a :class:`transformers.StaticCache` (fixed
``(N, heads, max_len, head_dim)`` buffers updated in place, so every decode step has the same shapes)
and ``generate``'s automatic ``torch.compile`` of the forward once such a cache is in use
(``GenerationMixin._valid_auto_compile_criteria``; on CUDA with ``mode="reduce-overhead"``, i.e. CUDA
graphs). Only the decode steps are compiled; the prefill (vision tower included) stays eager.

The group-shared prefill is kept: each prompt is forwarded once into a static cache of ``B`` rows,
whose buffers are then repeated to ``B*K`` rows (:func:`expand_static_cache`), as
:func:`grasp_lightning.grpo.scoring.prefill_for_generation` does with a ``DynamicCache``. Qwen3.5's
hybrid cache is supported: transformers' ``StaticCache`` gives its Gated DeltaNet layers a
``LinearAttentionLayer`` (convolution window and recurrent state, fixed shape) and its full-attention
layers a ``StaticLayer``. A model whose static cache is not compileable is refused by name
(:func:`static_cache_for`).
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin, StaticLayer
from transformers.generation import CompileConfig

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.scoring import TEXT_KEYS, VISION_KEYS, _rope_deltas, repeat_linear_states, vl_core

KEY = "model.rollout.compile_decode"


def decode_compile_config(backend: str = "inductor") -> CompileConfig:
    """``generate``'s compile settings for the decode step, on every device type.

    ``inductor`` keeps transformers' default ``mode="reduce-overhead"`` (CUDA graphs on a GPU; ignored on
    a CPU); another backend (``aot_eager``, or a callable for tests) gets no mode, which torch only
    accepts for inductor. ``_compile_all_devices`` lets ``generate`` compile on a CPU too (by default it
    compiles only on accelerators).

    Args:
        backend: a ``torch.compile`` backend name or callable.
    """
    config = CompileConfig(backend=backend, fullgraph=False, mode="reduce-overhead" if backend == "inductor" else None)
    config._compile_all_devices = True
    return config


def static_cache_for(model, max_cache_len: int) -> StaticCache:
    """An empty :class:`transformers.StaticCache` for ``model``'s text decoder holding ``max_cache_len`` positions.

    Raises:
        GraspConfigError: the model's cache layers are not all compileable (a layer type transformers has
            no static form of), naming ``model.rollout.compile_decode`` and the layer types.
    """
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    if not cache.is_compileable:
        kinds = sorted({type(layer).__name__ for layer in cache.layers if not layer.is_compileable})
        raise GraspConfigError(f"{KEY}: {type(model).__name__}'s cache layers {kinds} have no compileable static "
                               f"form in transformers; set {KEY}: false")
    return cache


def expand_static_cache(cache: StaticCache, k: int) -> None:
    """Repeat every row of a filled static cache K times in place (rows ``b*K .. b*K+K-1``).

    Static key/value buffers are re-assigned repeated and re-marked as static addresses (their data
    pointers must stay fixed for CUDA graphs); linear-attention convolution and recurrent states are
    repeated as in :func:`grasp_lightning.grpo.scoring.expand_cache`. The fill level
    (``cumulative_length``) is shared by all rows and unchanged.
    """
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            repeat_linear_states(layer, k)
        if isinstance(layer, StaticLayer) and layer.is_initialized:
            layer.keys = layer.keys.repeat_interleave(k, 0)
            layer.values = layer.values.repeat_interleave(k, 0)
            layer.batch_size *= k
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)


@torch.no_grad()
def prefill_static(model, prompt: dict[str, torch.Tensor], k: int,
                   max_new_tokens: int) -> tuple[dict[str, torch.Tensor], StaticCache]:
    """Prefill the ``B`` prompts once into a static cache and expand it to ``B*K`` rows for ``generate(cache=...)``.

    The static counterpart of :func:`grasp_lightning.grpo.scoring.prefill_for_generation`: the last
    prompt token is left out of the prefill (``generate``'s first step forwards it), the model's
    ``rope_deltas`` are set to the repeated ``(B*K, 1)`` offsets, and the cache holds
    ``Lp - 1 + max_new_tokens + 1`` positions (room for every decode step).

    Args:
        model: a Qwen-VL-style generation model (see :func:`grasp_lightning.grpo.scoring.sharing_unsupported_reason`).
        prompt: left-padded prompt inputs of ``B`` prompts (``input_ids`` ``(B, Lp)``) with their vision inputs.
        k: group size K.
        max_new_tokens: the completion budget in tokens.

    Returns:
        ``(text_inputs, cache)``: ``input_ids``/``attention_mask``/``mm_token_type_ids`` repeated to
        ``(B*K, Lp)`` and the expanded :class:`transformers.StaticCache` holding ``Lp - 1`` positions.

    Raises:
        GraspConfigError: see :func:`static_cache_for`.
    """
    batch, length = prompt["input_ids"].shape
    cache = static_cache_for(model, length + max_new_tokens + 1)
    args = {name: prompt[name][:, :-1] for name in TEXT_KEYS if name in prompt}
    for pixels, grid in VISION_KEYS:
        if grid in prompt:
            args[pixels], args[grid] = prompt[pixels], prompt[grid]
    model(**args, cache=cache, use_cache=True, logits_to_keep=1)
    deltas = _rope_deltas(model, batch)
    expand_static_cache(cache, k)
    vl_core(model).rope_deltas = deltas.repeat_interleave(k, 0)
    return {name: prompt[name].repeat_interleave(k, 0) for name in TEXT_KEYS if name in prompt}, cache
