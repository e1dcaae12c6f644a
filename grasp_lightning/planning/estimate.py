"""The per-GPU memory of a run: model states, reference model, ZeRO buffers, activations, logits, rollout.

:func:`plan_memory` turns a :class:`~grasp_lightning.planning.spec.RunSpec` into a
:class:`MemoryPlan` (bytes per GPU, with a short derivation of every component); :func:`fits`
checks it against a GPU and :func:`format_plan` prints it. Parameters are counted exactly
(:mod:`grasp_lightning.planning.architectures`), tokens as the processor writes them
(:mod:`grasp_lightning.planning.tokens`). Per GPU, with ``P`` parameters, ``P_t`` of them
trainable and ``N`` data-parallel ranks:

- weights: ``P x 2 B`` (bf16). LoRA adds ``r (in + out)`` per wrapped Linear, in float32 without
  DeepSpeed (peft's ``get_peft_model(autocast_adapter_dtype=True)``). A full fine-tune without
  DeepSpeed keeps its trainable weights in float32 (``GraspModule`` casts them:
  ``policy.keep_float32_masters``): ``(P - P_t) x 2 B + P_t x 4 B``, and under ``*-mixed`` precision
  autocast holds a bf16 copy of them through the forward/backward (``P_t x 2 B``, with the activations).
  QLoRA (``model.lora.quantize``): the ``Q`` values of the quantized Linears in bitsandbytes' 4-bit
  layout (:mod:`grasp_lightning.planning.quantized`: 4.5 bits each, 4.127 with double quantization),
  ``(P - Q) x 2 B`` for the rest, the adapters in float32, plus the largest quantized Linear
  dequantized to the compute dtype (one at a time, in every forward and backward).
- gradients: ZeRO-2 ``P_t x (2 B bf16 + 4 B fp32) / N``; ZeRO-1 ``P_t x (2 + 4 / N) B``; without
  ZeRO ``P_t x 4 B`` (float32 masters or adapters), twice under DDP (its buckets are a second copy).
- optimizer states: with DeepSpeed, Adam's fp32 master copy + exp_avg + exp_avg_sq = ``12 B x P_t /
  N`` (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1: 2 + 2 + 12 bytes per parameter; DeepSpeed's
  ``estimate_zero2_model_states_mem_needs`` counts the same 2 + 18 / N). torch AdamW without ZeRO
  keeps exp_avg and exp_avg_sq in the parameter's dtype (float32: ``8 B x P_t``).
- tokens: :func:`video_tokens` follows a clip through ``GraspDataModule`` (fps, ``max_frames``) and sizes
  its frames with the data path's own rule (:func:`grasp_lightning.data.frames.clip_frames`: ``max_pixels``
  and the Qwen3-VL processor's per-frame pixel cap and ``smart_resize`` to multiples of 32 pixels, or the
  released rule's ``frame_max_tokens``), 2-frame groups, one ``<t seconds>`` timestamp and vision start/end per group), with the
  processor's settings read from the model directory (``processor_config.json`` or
  ``video_preprocessor_config.json``); it matches the processor's prompt length exactly.
- reference model: a task that needs one (``Task.needs_reference``; GRPO with ``beta != 0``): ``P x 2 B``;
  0 for LoRA with the adapter-disabled reference and for a task without one (SFT, ``beta == 0``).
- ZeRO buffers: the reduce buckets, ``(1 + overlap_comm) x reduce_bucket_size x 2 B`` (DeepSpeed
  ``setup_buckets`` with ``contiguous_gradients``).
- activations: kept for the backward pass, per decoder layer and token by its kind
  (:mod:`grasp_lightning.planning.layers`: full attention, or Qwen3.5's Gated DeltaNet linear
  attention with its chunked float32 rule and per-chunk recurrent states; counted from the
  transformers code and checked against autograd's saved tensors), or only each layer's input under
  gradient checkpointing plus one layer's full set (the larger kind's) while it is recomputed.
- logits: the loss's logits and their float32 copies, as ``tasks/sft.py`` and ``tasks/grpo.py``
  compute them (:data:`SFT_LOGIT_BYTES`, :data:`GRPO_LOGIT_BYTES`); with GRPO's chunked log-probs
  (``logprob_chunk_size``) one chunk's (:data:`CHUNK_LOGIT_BYTES`).
- rollout (a task that samples rollouts, ``Task.samples_rollouts``: GRPO): the KV cache of the
  full-attention layers, ``2 x full layers x kv_heads x head_dim x 2 B`` per token of the ``B x K``
  sequences (``generate(num_return_sequences=K)`` prefills the prompt K times), plus, for a hybrid
  model, each sequence's linear-attention state (convolution window and float32 recurrent state,
  constant in its length: :func:`~grasp_lightning.planning.layers.linear_state_bytes`); or, if
  larger, the prompt's cache plus the prefill's no-grad working set of one layer
  (:func:`~grasp_lightning.planning.layers.prefill_working_bytes`). The shared-prefix cache (prompt
  cached once per group, as a prefix-sharing cache such as vLLM's holds it; every sequence keeps its
  own linear-attention state) is reported beside it; HF's ``cache.batch_repeat_interleave(K)`` copies
  the prompt's cache K times, so there it only saves the prefill, not the cache.

- sequence parallelism (``model.sequence_parallel: N``, Ulysses, :mod:`grasp_lightning.sequence_parallel`):
  every rank of a group holds the whole sample, so the vision tower's activations (or a frozen one's
  transient), the DeepStack visual embeddings and the input embeddings are whole; from the first decoder
  layer on each rank keeps ``ceil(L / N)`` positions of every forward of ``L`` tokens (the shared prompt's,
  each completion's, or each whole sequence's), with the layers' per-token bytes unchanged (attention and
  Gated DeltaNet hold ``H/N`` heads over the whole sequence, as many bytes as the chunk's ``H`` heads), plus
  one layer's all-to-all send and receive buffers (:func:`~grasp_lightning.planning.layers.all_to_all_bytes`);
  the shared prompt's cache holds the rank's heads only (``/ N``). The logits are those of the scored
  positions in the rank's chunk, the worst rank's: a shared-prompt completion is split, but the target of a
  whole sequence (SFT, or GRPO without ``share_prompt``) lies at its end, where the last rank may hold all of
  it. Weights, gradients and optimizer states are not split by SP (ZeRO-2 still partitions over all ranks),
  and generation is not split: the rollout is unchanged. ``N`` must divide the attention heads, the key/value
  heads or be a multiple of them, the Gated DeltaNet heads (the rule of
  :func:`~grasp_lightning.sequence_parallel.config_unsupported_reason`) and the run's GPUs.

Peak = weights + gradients + optimizer states + reference + buffers + max(training pass, rollout):
the rollout runs without gradients before the training forward, so the two never coexist.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.planning.architectures import (
    ParamCounts,
    architecture_config,
    count_parameters,
    format_count,
    lora_parameters,
    lora_targets,
)
from grasp_lightning.planning.layers import (
    TextShapes,
    all_to_all_bytes,
    decoder_layer_bytes,
    decoder_stack_bytes,
    kv_bytes_per_token,
    layer_activation_bytes,
    linear_state_bytes,
    prefill_working_bytes,
    rms_norm_bytes,
    stack_activation_bytes,
    text_shapes,
)
from grasp_lightning.planning.quantized import quantized_base
from grasp_lightning.planning.spec import RunSpec
from grasp_lightning.planning.tokens import VideoTokens, processor_video_settings, video_tokens
from grasp_lightning.sequence_parallel import config_unsupported_reason

log = logging.getLogger(__name__)

GIB = 2**30
#: Bytes per logit position and vocabulary entry in SFT: bf16 logits (2) + the float32 copy (4) +
#: the float32 log-softmax ``F.cross_entropy`` keeps for backward (4) (``tasks/sft.py``; logits are
#: computed for the response positions only, ``logits_to_keep``).
SFT_LOGIT_BYTES = 10
#: The same for GRPO scoring of completion positions: bf16 logits (2) + the float32 rows that
#: ``logsumexp`` keeps for backward (4); the no-grad entropy works one row at a time
#: (``grasp_lightning/grpo/scoring.py: logps_and_entropy``).
GRPO_LOGIT_BYTES = 6
#: Bytes per position and vocabulary entry of one chunk of chunked GRPO scoring
#: (``grasp_lightning/grpo/logprobs.py``), at its peak in the backward's recompute: the bf16 logits (2),
#: their float32 scaled copy (4), the float32 softmax of the gradient (4) and the bf16 gradient of the
#: logits (2). Only one chunk exists at a time; the hidden states it starts from are the final norm's
#: output, already among the activations.
CHUNK_LOGIT_BYTES = 12
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def format_gib(n: int) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f}"


@dataclass
class MemoryPlan:
    """Per-GPU memory of one run, in bytes, with a short derivation of every component.

    ``peak = static + max(training, rollout)`` where ``static`` holds the model states, the
    reference model and the ZeRO buffers; ``training`` the activations and logits of one
    micro-batch (or a frozen vision tower's one-layer transient, if larger); ``rollout`` the cache
    of generation, :attr:`rollout_cache` (or the prefill's peak). ``kv_cache`` holds the
    full-attention layers' keys/values of the ``B x K`` sequences, ``linear_states`` their
    linear-attention states (0 without such layers); ``kv_cache_shared_prefix`` is both with the
    prompt's keys/values held once per group. ``deepspeed_model_states`` is DeepSpeed's own
    estimate (``None`` without ZeRO), which assumes every parameter is trainable. ``decoder_tokens``:
    tokens one GPU's decoder layers hold in the training forward (with sequence parallelism, its chunks).
    """

    spec: RunSpec
    name: str
    params_total: int
    params_vision: int
    params_trainable: int
    prompt_tokens: int
    visual_tokens: int
    sequence_tokens: int
    sequences: int
    weights: int
    gradients: int
    optimizer_states: int
    reference_model: int
    zero_buffers: int
    activations: int
    logits: int
    vision_transient: int
    kv_cache: int
    linear_states: int
    kv_cache_shared_prefix: int
    rollout: int
    deepspeed_model_states: int | None
    decoder_tokens: int = 0
    how: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def rollout_cache(self) -> int:
        """Bytes of the rollout's cache: full-attention keys/values + linear-attention states."""
        return self.kv_cache + self.linear_states

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer states (what DeepSpeed's estimator covers)."""
        return self.weights + self.gradients + self.optimizer_states

    @property
    def static(self) -> int:
        """Memory held for the whole run: model states, reference model, ZeRO buffers."""
        return self.model_states + self.reference_model + self.zero_buffers

    @property
    def training(self) -> int:
        """The training forward/backward of one micro-batch."""
        return max(self.activations + self.logits, self.vision_transient)

    @property
    def peak(self) -> int:
        """Peak bytes per GPU: static + the larger of the training pass and the rollout."""
        return self.static + max(self.training, self.rollout)


def _strategy_label(spec: RunSpec) -> str:
    if spec.zero_stage:
        offload = " + optimizer offload" if spec.offload_optimizer else ""
        return f"DeepSpeed ZeRO-{spec.zero_stage}{offload} on {spec.world_size} GPU(s)"
    return f"{'DDP on ' if spec.world_size > 1 else ''}{spec.world_size} GPU(s), no ZeRO"


def deepspeed_zero2_estimate(total_params: int, gpus_per_node: int, num_nodes: int,
                             cpu_offload: bool = False) -> int | None:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` GPU bytes per GPU (``2 P + 18 P / N``,
    or ``2 P`` with offload), or ``None`` when DeepSpeed cannot be imported. Imported lazily: on a
    machine without a GPU DeepSpeed warns and selects its CPU accelerator."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs its accelerator choice on stdout
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except (ImportError, RuntimeError, OSError) as exc:
        log.warning("DeepSpeed's estimator is unavailable (%s); reporting ours only", exc)
        return None
    _, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node=gpus_per_node,
                                                   num_nodes=num_nodes, cpu_offload=cpu_offload)
    return int(gpu)


def _model_states(spec: RunSpec, counts: ParamCounts, n_lora: int, trainable: int, how: dict) -> dict[str, Any]:
    """Weights, gradients, optimizer states, ZeRO buffers and DeepSpeed's estimate, bytes per GPU."""
    n = spec.world_size
    if spec.zero_stage:  # DeepSpeed casts the module to 16 bit under bf16/16 precision, to float32 under 32
        wb = 2 if spec.precision.startswith(("bf16", "16")) else 4
    else:
        wb = _DTYPE_BYTES[spec.dtype]
    how["weights"] = f"{format_count(counts.total)} x {wb} B" + (f" + {format_count(n_lora)} adapters" if n_lora else "")
    if not spec.zero_stage:
        # Outside DeepSpeed the optimizer updates float32 parameters: peft's adapters, or the float32
        # master weights GraspModule keeps for a full fine-tune (policy.keep_float32_masters).
        tb = 4 if n_lora or wb < 4 else wb
        masters = 0 if n_lora else trainable  # full fine-tune: the trainable weights are float32
        if masters and wb < 4:
            how["weights"] = (f"{format_count(counts.total - trainable)} frozen x {wb} B + {format_count(trainable)} "
                              "trainable x 4 B (float32 masters)")
        how["gradients"] = f"{format_count(trainable)} x {tb} B" + (" x 2 (DDP buckets)" if n > 1 else "")
        how["optimizer states"] = f"{format_count(trainable)} x 2 x {tb} B (torch AdamW exp_avg, exp_avg_sq)"
        how["ZeRO buffers"] = "no ZeRO"
        weights = wb * (counts.total - masters) + tb * masters + 4 * n_lora
        if spec.lora.enabled and spec.lora.quantize:
            weights = _quantized_weights(spec, counts, wb, n_lora, how)
        return dict(weights=weights, gradients=tb * trainable * (2 if n > 1 else 1),
                    optimizer_states=2 * tb * trainable, zero_buffers=0, deepspeed_model_states=None)
    # DeepSpeed casts the whole module, adapters included, to 16 bit and keeps fp32 partitions
    grad_b = wb / n if spec.zero_stage == 2 else wb
    offload = spec.offload_optimizer
    how["gradients"] = (f"{format_count(trainable)} x ({wb} B{'' if spec.zero_stage == 2 else ' unpartitioned'}"
                        f"{'' if offload else ' + 4 B fp32'}) / {n}")
    how["optimizer states"] = ("on the CPU (offload)" if offload
                               else f"{format_count(trainable)} x 12 B (fp32 master, exp_avg, exp_avg_sq) / {n}")
    how["ZeRO buffers"] = f"{1 + spec.overlap_comm} x {spec.reduce_bucket_size:.0e} x {wb} B reduce buckets"
    return dict(weights=wb * (counts.total + n_lora), gradients=int(trainable * (grad_b + (0 if offload else 4 / n))),
                optimizer_states=0 if offload else int(12 * trainable / n),
                zero_buffers=(1 + spec.overlap_comm) * spec.reduce_bucket_size * wb,
                deepspeed_model_states=deepspeed_zero2_estimate(counts.total + n_lora, spec.devices, spec.num_nodes,
                                                                offload))


def _quantized_weights(spec: RunSpec, counts: ParamCounts, wb: int, n_lora: int, how: dict) -> int:
    """Bytes of a QLoRA policy's weights: the 4-bit Linears, the rest in ``model.policy.dtype``, the
    float32 adapters and the dequantization workspace (:func:`~grasp_lightning.planning.quantized.quantized_base`)."""
    compute = _DTYPE_BYTES[spec.lora.quant_compute_dtype or spec.dtype]
    q = quantized_base(counts, double_quant=spec.lora.double_quant, compute_bytes=compute)
    dq = " double-quantized" if spec.lora.double_quant else ""
    how["weights"] = (f"{format_count(q.params)} {spec.lora.quantize}{dq} = {format_gib(q.bytes)} GiB + "
                      f"{format_count(counts.total - q.params)} x {wb} B + {format_count(n_lora)} adapters x 4 B + "
                      f"{format_gib(q.workspace)} GiB dequantization workspace")
    return q.bytes + wb * (counts.total - q.params) + 4 * n_lora + q.workspace


def _reference(spec: RunSpec, counts: ParamCounts, how: dict) -> int:
    """Bytes of the frozen reference model per GPU: none when the task needs none
    (``spec.needs_reference``), or when LoRA's reference is the policy with its adapters disabled."""
    adapter_ref = spec.lora.enabled and not spec.separate_reference
    if not spec.needs_reference or adapter_ref:
        how["reference model"] = f"{spec.task}: none" if not spec.needs_reference else "policy with adapters disabled"
        return 0
    how["reference model"] = f"{format_count(counts.total)} x {_DTYPE_BYTES[spec.dtype]} B, frozen copy"
    return _DTYPE_BYTES[spec.dtype] * counts.total


def _tokens(spec: RunSpec) -> tuple[VideoTokens, int, int, int]:
    """The clip's tokens, prompt tokens, completion tokens and sequences per micro-batch.

    The processor's settings come from the model directory (:func:`processor_video_settings`);
    ``spec.text_tokens`` counts the rendered prompt with its one video placeholder. A task that
    samples rollouts has ``B x K`` sequences of ``max_new_tokens`` completions; any other trains on
    ``B`` targets of ``response_tokens`` (default: the ``max_target_tokens`` budget).

    Raises:
        GraspConfigError: neither ``response_tokens`` nor ``data.prompt.max_target_tokens`` is set (SFT).
    """
    vt = video_tokens(spec.video_seconds, spec.fps, spec.max_frames, spec.max_pixels,
                      frame_max_tokens=spec.frame_max_tokens, frame_size=spec.frame_size, sampling=spec.sampling,
                      source_fps=spec.source_fps, settings=processor_video_settings(spec.model))
    prompt = vt.total + spec.text_tokens
    if not spec.samples_rollouts:
        completion = spec.response_tokens if spec.response_tokens is not None else spec.max_target_tokens
        if completion is None:
            raise GraspConfigError("data.prompt.max_target_tokens is null (no target budget): give the target's tokens "
                                   "(--response-tokens)")
        return vt, prompt, completion, spec.micro_batch_size
    return vt, prompt, spec.max_new_tokens, spec.micro_batch_size * spec.num_generations


def _layers_label(s: TextShapes) -> str:
    """``36 layers`` or ``32 layers (24 linear-attention + 8 full-attention)``."""
    mixed = f" ({s.linear_layers} linear-attention + {s.full_layers} full-attention)" if s.linear_layers else ""
    return f"{len(s.kinds)}{mixed} layers"


def _shared_prompt_bytes(spec: RunSpec, s: TextShapes, prompts: int, prompt: int, sequences: int) -> int:
    """What GRPO's shared-prompt scoring keeps beyond the layers' own sets: the prompts' cache (keys/values
    and linear-attention states, with their graph) kept for the backward pass under checkpointing,
    and the cache repeated K times inside each layer (one layer's under checkpointing, every layer's
    without): a full-attention layer's K-fold keys/values, a linear-attention layer's K-fold states.
    Under sequence parallelism over ``N`` ranks each rank's cache holds its heads only: ``g / N``
    key/value heads (one repeated head when ``g < N``) and ``1 / N`` of the linear-attention states."""
    ckpt, n = spec.gradient_checkpointing, spec.sequence_parallel
    kv_token = kv_bytes_per_token(s) * max(s.kv_heads // n, 1) // s.kv_heads if n > 1 else kv_bytes_per_token(s)
    state = linear_state_bytes(s) // n
    per_full = kv_token // s.full_layers if s.full_layers else 0
    per_linear = state // s.linear_layers if s.linear_layers else 0
    cache = prompts * (prompt * kv_token + state) if ckpt else 0
    repeated_full = sequences * prompt * per_full * (1 if ckpt else s.full_layers)
    repeated_linear = sequences * per_linear * (1 if ckpt else s.linear_layers)
    return cache + (max(repeated_full, repeated_linear) if ckpt else repeated_full + repeated_linear)


def _activations(spec: RunSpec, text, vision, counts: ParamCounts, vt: VideoTokens, prompt: int, completion: int,
                 sequences: int, how: dict) -> dict[str, int]:
    """Activations kept for backward, logits, a frozen vision tower's transient, and the tokens the decoder
    holds, bytes (tokens) per GPU.

    A task that shares prompts (GRPO's ``share_prompt``) runs the ``B`` prompts once (clip included)
    and the ``B x K`` completions against their cache (:func:`_shared_prompt_bytes`). Under sequence
    parallelism the decoder holds each forward's ``ceil(L / N)`` chunk (module docstring).
    """
    s = text_shapes(text)
    h, layers, n = s.hidden, len(s.kinds), spec.sequence_parallel
    shared = spec.samples_rollouts and spec.shares_prompt
    prompts = spec.micro_batch_size if shared else sequences  # prompt copies run through the model
    tokens = prompts * prompt + sequences * completion
    if shared:  # the prompt forward and the completion forward, each split
        local = prompts * -(-prompt // n) + sequences * -(-completion // n)
    else:  # each whole sequence, split
        local = sequences * -(-(prompt + completion) // n)
    flash = spec.attn_implementation != "eager"
    per_kind = decoder_layer_bytes(s, prompt + completion, flash=flash, sequence_parallel=n)
    dropout = 0
    if spec.lora.enabled and spec.lora.dropout > 0:  # nn.Dropout on each wrapped Linear's input: 2 B + 1 B mask
        dropout = 3 * sum(i for _, i, _ in lora_targets(counts, spec.lora.target_modules)) // layers
    activations = decoder_stack_bytes(local, s, per_kind, extra_per_layer=dropout,
                                      checkpointing=spec.gradient_checkpointing)
    # the input embeddings (2 h, whole: every rank embeds the whole sample, and its chunk is a view of them),
    # the final norm (its float32 copies, rsqrt, 16-bit output) and one layer's all-to-all buffers, per chunk
    activations += tokens * 2 * h + local * (rms_norm_bytes(h, zero_centred=s.zero_centred_norm) + 2 * h
                                             + all_to_all_bytes(s, n))
    if not spec.zero_stage and not spec.lora.enabled and spec.precision.endswith("-mixed"):
        trainable = counts.language + (0 if spec.freeze_vision else counts.vision)
        activations += 2 * trainable  # autocast's bf16 copies of the float32 master weights
    deepstack = len(getattr(vision, "deepstack_visual_indexes", ()) or ())
    activations += prompts * vt.visual_tokens * deepstack * h * 2  # DeepStack visual embeddings
    if shared:
        activations += _shared_prompt_bytes(spec, s, prompts, prompt, sequences)
    transient, trained = 0, vision is not None and not (spec.freeze_vision or spec.lora.enabled)
    if vision is not None:
        hv, heads_v, merge2 = vision.hidden_size, vision.num_heads, vision.spatial_merge_size**2
        patches = prompts * vt.visual_tokens * merge2  # naive GRPO rows repeat each prompt's pixels K times
        per_patch = layer_activation_bytes(hv, vision.intermediate_size, heads_v, heads_v, hv // heads_v,
                                           vt.tokens_per_group * merge2, gated_mlp=False, qk_norm=False, flash=flash)
        if trained:
            activations += stack_activation_bytes(patches, vision.depth, hv, per_patch,
                                                  checkpointing=spec.gradient_checkpointing)
        else:
            transient = patches * per_patch  # no graph is kept: one block's tensors at a time
    # logits only from the last prompt position on (both tasks); under SP the worst rank's positions
    per_row = -(-completion // n) + 1 if shared else min(completion + 1, -(-(prompt + completion) // n))
    scored = sequences * min(completion + 1, per_row)
    logit_bytes = GRPO_LOGIT_BYTES if spec.samples_rollouts else SFT_LOGIT_BYTES
    chunked = spec.samples_rollouts and spec.logprob_chunk_size is not None
    if chunked:  # one chunk of the LM head at a time, recomputed in the backward
        scored, logit_bytes = min(scored, spec.logprob_chunk_size), CHUNK_LOGIT_BYTES
    per_layer = ", ".join(f"{kind.split('_')[0]} {b:,} B/token" for kind, b in per_kind.items())
    split = f" of {tokens} (SP {n}: ceil(L/{n}) per forward)" if n > 1 else ""
    how["activations"] = (f"{local} tokens{split} x {_layers_label(s)}"
                          f"{' checkpointed' if spec.gradient_checkpointing else ''}"
                          f" ({per_layer}){' + vision tower' if trained else ''}{' (shared prompts)' if shared else ''}")
    how["logits"] = (f"{scored} positions x {text.vocab_size} x {logit_bytes} B"
                     f"{' (one chunk of the LM head)' if chunked else ''}")
    return dict(activations=activations, logits=scored * text.vocab_size * logit_bytes, vision_transient=transient,
                decoder_tokens=local)


def _rollout(spec: RunSpec, text, prompt: int, completion: int, sequences: int, how: dict) -> dict[str, int]:
    """Rollout generation (GRPO): KV cache, linear-attention states (and the shared-prefix variant) and
    the rollout's peak, bytes per GPU; none for a task that samples no rollouts.

    Without ``shares_prompt`` the ``B x K`` rows are prefilled together; with it the ``B`` prompts
    are prefilled once and the cache is repeated K times (``cache.batch_repeat_interleave(K)``;
    ``scoring.expand_cache`` for the linear-attention states; both copies live for a moment),
    so the cache itself is as large either way.
    """
    if not spec.samples_rollouts:
        how["rollout"] = f"{spec.task}: no rollout"
        return dict(kv_cache=0, linear_states=0, kv_cache_shared_prefix=0, rollout=0)
    if spec.rollout_engine == "vllm":
        share = (f"its {spec.engine_memory_fraction:g} of the GPU is reserved in the fit "
                 "(model.rollout.vllm.gpu_memory_utilization)" if spec.engine_memory_fraction
                 else "a server at model.rollout.vllm.address, on other GPUs")
        how["rollout"] = f"vLLM engine: its own weights and KV cache; {share}"
        return dict(kv_cache=0, linear_states=0, kv_cache_shared_prefix=0, rollout=0)
    s = text_shapes(text)
    kv_token, state, b, k = kv_bytes_per_token(s), linear_state_bytes(s), spec.micro_batch_size, spec.num_generations
    kv_cache, states = sequences * (prompt + completion) * kv_token, sequences * state
    shared = b * (prompt + k * completion) * kv_token + states  # each completion keeps its own state
    working = prefill_working_bytes(s)  # one layer's no-grad tensors per prompt token
    if spec.shares_prompt:
        prefill = max(b * (prompt * (kv_token + working) + state), b * (k + 1) * (prompt * kv_token + state))
    else:
        prefill = sequences * (prompt * (kv_token + working) + state)
    linear = (f" + linear-attention states {sequences} x {state:,} B = {format_gib(states)} GiB"
              if s.linear_layers else "")
    how["rollout"] = (f"KV cache {sequences} x {prompt + completion} tokens x {kv_token} B = {format_gib(kv_cache)} GiB"
                      f"{linear} (shared prefix {format_gib(shared)}); prefill peak {format_gib(prefill)}")
    return dict(kv_cache=kv_cache, linear_states=states, kv_cache_shared_prefix=shared,
                rollout=max(kv_cache + states, prefill))


def plan_memory(spec: RunSpec, config=None) -> MemoryPlan:
    """Per-GPU memory of the run ``spec`` describes (see the module docstring for every formula).

    Args:
        spec: the run.
        config: the model's ``transformers`` config (default: ``architecture_config(spec.model)``).

    Raises:
        GraspConfigError: unknown dtype or ZeRO stage; QLoRA under DeepSpeed; a ``model.sequence_parallel``
            the model's heads or the run's GPUs do not allow (:func:`_check_sequence_parallel`).
    """
    if spec.zero_stage not in (0, 1, 2):
        raise GraspConfigError(f"ZeRO stage {spec.zero_stage} is not modelled (0, 1 or 2)")
    if spec.lora.enabled and spec.lora.quantize and spec.zero_stage:
        raise GraspConfigError(f"model.lora.quantize={spec.lora.quantize} does not run under DeepSpeed ZeRO-"
                               f"{spec.zero_stage} (fit refuses it): plan it with trainer.strategy: auto or ddp "
                               "(configs/qlora.yaml)")
    if spec.dtype not in _DTYPE_BYTES:
        raise GraspConfigError(f"model.policy.dtype {spec.dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    config = config if config is not None else architecture_config(spec.model)
    text, vision = getattr(config, "text_config", config), getattr(config, "vision_config", None)
    _check_sequence_parallel(spec, text)
    counts = count_parameters(config)
    n_lora = lora_parameters(counts, spec.lora.r, spec.lora.target_modules) if spec.lora.enabled else 0
    trainable = n_lora if spec.lora.enabled else counts.language + (0 if spec.freeze_vision else counts.vision)
    how: dict[str, str] = {}
    vt, prompt, completion, sequences = _tokens(spec)
    rule = (f"frame_max_tokens {spec.frame_max_tokens}" if spec.frame_max_tokens is not None
            else f"max_pixels {spec.max_pixels:,}")
    how["tokens"] = (f"{vt.frames} frames of {vt.frame_size[0]} x {vt.frame_size[1]} ({rule}) -> {vt.groups} groups x "
                     f"{vt.tokens_per_group}")
    notes = []
    if spec.sequence_parallel > 1 and spec.samples_rollouts and spec.rollout_engine == "hf":
        notes.append(f"sequence parallelism splits the training forwards, not generation: the rollout's cache is "
                     f"the whole sequences' on every rank of the SP {spec.sequence_parallel} group")
    if spec.max_prompt_tokens is not None and prompt > spec.max_prompt_tokens:
        notes.append(f"the prompt ({prompt} tokens) is over data.prompt.max_prompt_tokens={spec.max_prompt_tokens}: "
                     "such items are skipped (TokenBudgetError)")
    return MemoryPlan(spec=spec, name=getattr(config, "name_or_path", "") or spec.model, params_total=counts.total,
                      params_vision=counts.vision, params_trainable=trainable, prompt_tokens=prompt,
                      visual_tokens=vt.visual_tokens, sequence_tokens=prompt + completion, sequences=sequences,
                      reference_model=_reference(spec, counts, how),
                      **_model_states(spec, counts, n_lora, trainable, how),
                      **_activations(spec, text, vision, counts, vt, prompt, completion, sequences, how),
                      **_rollout(spec, text, prompt, completion, sequences, how), how=how, notes=notes)


def _check_sequence_parallel(spec: RunSpec, text) -> None:
    """Refuse a ``model.sequence_parallel`` the decoder's heads do not allow
    (:func:`~grasp_lightning.sequence_parallel.config_unsupported_reason`, the rule ``fit`` applies) or that
    does not divide the run's GPUs (``trainer.devices x trainer.num_nodes``).

    Raises:
        GraspConfigError: naming ``model.sequence_parallel`` and why.
    """
    n = spec.sequence_parallel
    if n == 1:
        return
    if n < 1:
        raise GraspConfigError(f"model.sequence_parallel must be >= 1, got {n}")
    reason = config_unsupported_reason(text, n)
    if reason:
        raise GraspConfigError(f"model.sequence_parallel: {n}: {reason}")
    if spec.world_size % n:
        raise GraspConfigError(f"model.sequence_parallel: {n} does not divide the {spec.world_size} GPUs of this run "
                               "(trainer.devices x trainer.num_nodes): the groups are ranks g*N .. g*N+N-1")


@dataclass(frozen=True)
class Fit:
    """Verdict of :func:`fits`, in GiB: ``usable_gib = gpu_gib x (1 - margin) - reserve``; the run fits
    when ``need_gib <= usable_gib``."""

    fits: bool
    need_gib: float
    usable_gib: float
    gpu_gib: float

    @property
    def headroom_gib(self) -> float:
        """Usable GiB left over (negative: short by that much)."""
        return self.usable_gib - self.need_gib


def fits(plan: MemoryPlan, gpu_memory_gib: float, *, margin: float = 0.10, reserve_gib: float = 2.0) -> Fit:
    """Whether the plan's peak fits a GPU of ``gpu_memory_gib`` GiB, keeping ``margin`` (fraction) for
    allocator fragmentation and ``reserve_gib`` for the CUDA context, NCCL and kernels' workspaces; a
    colocated vLLM engine's share (``spec.engine_memory_fraction`` of the GPU) is not usable by the trainer."""
    usable = gpu_memory_gib * (1 - margin - plan.spec.engine_memory_fraction) - reserve_gib
    need = plan.peak / GIB
    return Fit(need <= usable, need, usable, gpu_memory_gib)


def format_plan(plan: MemoryPlan, gpu_memory_gib: float | None = None) -> str:
    """A readable table of the plan: GiB per component per GPU, peak, GPU size and the verdict."""
    s = plan.spec
    frozen = " (vision frozen)" if s.freeze_vision else ""
    qlora = f" on a {s.lora.quantize} base (QLoRA)" if s.lora.enabled and s.lora.quantize else ""
    mode = f"LoRA r={s.lora.r}{qlora}" if s.lora.enabled else f"full fine-tune{frozen}"
    shared = ", prompts shared" if s.shares_prompt else ""
    frames = f"{plan.how['tokens']} = " if "tokens" in plan.how else ""
    task = f"{s.task} (K={s.num_generations}, {s.max_new_tokens} new tokens{shared})" if s.samples_rollouts else s.task
    sp = (f", sequence parallel {s.sequence_parallel} ({s.world_size // s.sequence_parallel} data-parallel group(s))"
          if s.sequence_parallel > 1 else "")
    lines = [f"Memory plan: {plan.name}, {task}, {mode}, {_strategy_label(s)}{sp}, "
             f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}",
             f"Parameters: {format_count(plan.params_total)} (vision {format_count(plan.params_vision)}), "
             f"{format_count(plan.params_trainable)} trainable",
             f"Tokens: {s.video_seconds:g} s at {s.fps:g} fps -> {frames}{plan.visual_tokens} visual tokens; prompt "
             f"{plan.prompt_tokens}; {plan.sequences} sequence(s) x {plan.sequence_tokens} tokens per micro-batch", "",
             f"{'component':<18} {'GiB/GPU':>9}  how"]
    rows = [("weights", plan.weights), ("gradients", plan.gradients), ("optimizer states", plan.optimizer_states),
            ("reference model", plan.reference_model), ("ZeRO buffers", plan.zero_buffers),
            ("activations", plan.activations), ("logits", plan.logits), ("rollout", plan.rollout)]
    lines += [f"{name:<18} {format_gib(value):>9}  {plan.how.get(name, '')}" for name, value in rows]
    lines.append(f"{'peak':<18} {format_gib(plan.peak):>9}  static {format_gib(plan.static)} + max(training "
                 f"{format_gib(plan.training)}, rollout {format_gib(plan.rollout)})")
    ours = f"ours {format_gib(plan.model_states)} GiB"
    ds = ("n/a (no ZeRO)" if plan.deepspeed_model_states is None
          else f"{format_gib(plan.deepspeed_model_states)} GiB (all parameters trainable)")
    lines.append(f"model states: DeepSpeed estimate_zero2_model_states_mem_needs {ds}; {ours}")
    if plan.vision_transient > plan.activations + plan.logits:
        lines.append(f"note: the frozen vision tower's one-block transient ({format_gib(plan.vision_transient)} GiB) "
                     "sets the training peak")
    lines += [f"note: {note}" for note in plan.notes]
    if gpu_memory_gib is not None:
        verdict = fits(plan, gpu_memory_gib)
        engine = (f" + {s.engine_memory_fraction:g} for the vLLM engine" if s.engine_memory_fraction else "")
        lines.append(f"GPU {gpu_memory_gib:.1f} GiB, usable {verdict.usable_gib:.1f} GiB (10%{engine} + 2 GiB reserved): "
                     f"fits: {'yes' if verdict.fits else 'no'} (headroom {verdict.headroom_gib:+.1f} GiB)")
    return "\n".join(lines)


