"""Memory planner: the per-GPU memory of a grasp_lightning run, read from its config.

``python -m grasp_lightning.planning.memory --config configs/sgr.yaml [--config configs/lora.yaml] --gpu-memory-gib 140``
prints the bytes of every component per GPU and whether the run fits; ``--table`` prints the
README's scaling table (Qwen3-VL 2B/4B/8B; full fine-tune on 8 x H200, LoRA on one 24 GB GPU).

Parameters are counted exactly, by building the model on the meta device from the published shapes
(``assets/qwen3vl-architectures.json``) or a local ``config.json``. Per GPU, with ``P`` parameters,
``P_t`` of them trainable and ``N`` data-parallel ranks:

- weights: ``P x 2 B`` (bf16). LoRA adds ``r (in + out)`` per wrapped Linear, in float32 without
  DeepSpeed (peft's ``get_peft_model(autocast_adapter_dtype=True)``). A full fine-tune without
  DeepSpeed keeps its trainable weights in float32 (``GraspModule`` casts them:
  ``policy.keep_float32_masters``): ``(P - P_t) x 2 B + P_t x 4 B``, and under ``*-mixed`` precision
  autocast holds a bf16 copy of them through the forward/backward (``P_t x 2 B``, with the activations).
- gradients: ZeRO-2 ``P_t x (2 B bf16 + 4 B fp32) / N``; ZeRO-1 ``P_t x (2 + 4 / N) B``; without
  ZeRO ``P_t x 4 B`` (float32 masters or adapters), twice under DDP (its buckets are a second copy).
- optimizer states: with DeepSpeed, Adam's fp32 master copy + exp_avg + exp_avg_sq = ``12 B x P_t /
  N`` (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1: 2 + 2 + 12 bytes per parameter; DeepSpeed's
  ``estimate_zero2_model_states_mem_needs`` counts the same 2 + 18 / N). torch AdamW without ZeRO
  keeps exp_avg and exp_avg_sq in the parameter's dtype (float32: ``8 B x P_t``).
- tokens: :func:`video_tokens` follows a clip through ``GraspDataModule`` (fps, ``max_frames``,
  ``max_pixels``) and the Qwen3-VL processor (per-frame pixel cap, ``smart_resize`` to multiples of
  32 pixels, 2-frame groups, one ``<t seconds>`` timestamp and vision start/end per group), with the
  processor's settings read from the model directory (``processor_config.json`` or
  ``video_preprocessor_config.json``); it matches the processor's prompt length exactly.
- reference model: GRPO with ``beta != 0``: ``P x 2 B``; 0 for LoRA with the adapter-disabled
  reference, for ``beta == 0`` and for SFT.
- ZeRO buffers: the reduce buckets, ``(1 + overlap_comm) x reduce_bucket_size x 2 B`` (DeepSpeed
  ``setup_buckets`` with ``contiguous_gradients``).
- activations: kept for the backward pass, :func:`layer_activation_bytes` (after Korthikanti et al.
  2022) per layer and token, or only each layer's input under gradient checkpointing.
- logits: the loss's logits and their float32 copies, as ``tasks/sft.py`` and ``tasks/grpo.py``
  compute them (:data:`SFT_LOGIT_BYTES`, :data:`GRPO_LOGIT_BYTES`).
- rollout (GRPO): the KV cache, ``2 x layers x kv_heads x head_dim x 2 B`` per token of the ``B x K``
  sequences (``generate(num_return_sequences=K)`` prefills the prompt K times), or, if larger, the
  prompt's cache plus the prefill's no-grad working set of one layer, ``2 B x (2h + 3i)`` per token
  (residual, normed input, gate, up, SiLU(gate)). The shared-prefix cache (prompt cached once per
  group, as a prefix-sharing cache such as vLLM's holds it) is reported beside it; HF's
  ``cache.batch_repeat_interleave(K)`` copies the prompt's cache K times, so there it only saves the
  prefill, not the cache.

Peak = weights + gradients + optimizer states + reference + buffers + max(training pass, rollout):
the rollout runs without gradients before the training forward, so the two never coexist.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.module import RolloutConfig
from grasp_lightning.policy import LoraConfig, PolicyConfig, vision_modules

log = logging.getLogger(__name__)

_POLICY_DEFAULTS = PolicyConfig()  # the code's defaults, read once
_ROLLOUT_DEFAULTS = RolloutConfig()

GIB = 2**30
ARCHITECTURES_FILE = Path(__file__).resolve().parent.parent / "assets" / "qwen3vl-architectures.json"
#: The GRASP paper's model; used when a config names a checkpoint that is not on this machine.
DEFAULT_ARCHITECTURE = "Qwen3-VL-8B-Instruct"
#: Memory of one H200 as ``nvidia-smi`` reports it (143771 MiB, sold as 141 GB), in GiB.
H200_GIB = 143771 / 1024
#: ``share_prompt`` when a GRPO config does not set it: the default of ``tasks.grpo.GRPOTask`` (the
#: core does not import tasks; ``tests/test_memory.py`` checks the two agree).
SHARE_PROMPT_DEFAULT = True  # tasks/grpo.py: GRPOTask(share_prompt=True)
#: ``trainer.precision`` when a config does not set it: Lightning's ``Trainer(precision="32-true")``.
TRAINER_PRECISION_DEFAULT = "32-true"
#: Qwen3-VL's published video processor settings (``video_preprocessor_config.json``, or the
#: ``video_processor`` section of a transformers-5 ``processor_config.json``): ``size`` in pixels over
#: the whole clip, ``max_video_tokens`` the per-frame ceiling of ``cap_pixels_per_frame``.
QWEN3VL_VIDEO_PROCESSOR = {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "max_video_tokens": 768,
                           "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
#: Frame rate of the video files when a plan does not say (frames/s): it only shifts timestamps.
DEFAULT_SOURCE_FPS = 30.0
#: Bytes per logit position and vocabulary entry in SFT: bf16 logits (2) + the float32 copy (4) +
#: the float32 log-softmax ``F.cross_entropy`` keeps for backward (4) (``tasks/sft.py``; logits are
#: computed for the response positions only, ``logits_to_keep``).
SFT_LOGIT_BYTES = 10
#: The same for GRPO scoring of completion positions: bf16 logits (2) + the float32 rows that
#: ``logsumexp`` keeps for backward (4); the no-grad entropy works one row at a time
#: (``grasp_lightning/shared_prompt.py: logps_and_entropy``).
GRPO_LOGIT_BYTES = 6

_TEXT_COMMON = {"head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "vocab_size": 151936, "pad_token_id": 151643,
                "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20],
                                    "mrope_interleaved": True}}
_VISION_COMMON = {"patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
                  "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh"}
_TOKEN_IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
              "vision_end_token_id": 151653}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def _gib(n: int) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f}"


def _count(n: int) -> str:
    """A parameter count as 8.767B, 17.4M or 190.5K."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.{3 if unit == 'B' else 1}f}{unit}"
    return str(n)


# ---------------------------------------------------------------------------------- architectures
def bundled_architectures() -> dict[str, dict]:
    """The published Qwen3-VL shapes shipped in ``assets/qwen3vl-architectures.json``, by name."""
    data = json.loads(ARCHITECTURES_FILE.read_text())
    return {name: arch for name, arch in data.items() if not name.startswith("_")}


def bundled_name(name: str) -> str | None:
    """The bundled architecture a name or Hub id stands for, by its basename (``Qwen/Qwen3-VL-8B-Instruct``,
    ``Qwen3-VL-8B-Thinking``, ``8B``), or ``None``. Thinking variants share the Instruct shapes."""
    base = name.rstrip("/").rsplit("/", 1)[-1].lower()
    match = re.fullmatch(r"(?:qwen3-vl-)?(\d+)b(?:-(?:instruct|thinking))?", base)
    key = f"Qwen3-VL-{match.group(1)}B-Instruct" if match else None
    return key if key in bundled_architectures() else None


def architecture_config(name: str):
    """A ``transformers`` config for a model, built locally (no network).

    Args:
        name: a local model directory (its ``config.json`` is read with ``AutoConfig``), or a
            bundled Qwen3-VL name or Hub id (``Qwen3-VL-2B-Instruct``, ``Qwen/Qwen3-VL-8B-Instruct``).

    Raises:
        GraspConfigError: neither a directory with ``config.json`` nor a bundled architecture.
    """
    path = Path(name)
    if (path / "config.json").is_file():
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path)
    key = bundled_name(name)
    if key is None:
        raise GraspConfigError(f"model {name!r}: no config.json there, and its basename is none of the bundled "
                               f"architectures {sorted(bundled_architectures())}")
    from transformers import Qwen3VLConfig

    arch = bundled_architectures()[key]
    config = Qwen3VLConfig(text_config={**_TEXT_COMMON, **arch["text"]},
                           vision_config={**_VISION_COMMON, **arch["vision"]},
                           tie_word_embeddings=arch["tie_word_embeddings"], **_TOKEN_IDS)
    config.eos_token_id, config.pad_token_id = 151645, 151643
    config.name_or_path = key
    return config


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model counted on the meta device (a tied embedding counts once).

    Attributes:
        total: all parameters.
        vision: the vision tower with its mergers (``model.visual``).
        linears: ``(qualified name, in_features, out_features)`` of every ``nn.Linear``, for LoRA.
    """

    total: int
    vision: int
    linears: tuple[tuple[str, int, int], ...]

    @property
    def language(self) -> int:
        """The language model: embeddings, decoder layers, final norm and (untied) LM head."""
        return self.total - self.vision


_COUNTS: dict[str, ParamCounts] = {}


def count_parameters(config) -> ParamCounts:
    """Build ``AutoModelForImageTextToText.from_config(config)`` on the meta device and count (cached)."""
    key = config.to_json_string(use_diff=False)
    if key not in _COUNTS:
        from transformers import AutoModelForImageTextToText

        with torch.device("meta"):
            model = AutoModelForImageTextToText.from_config(config)
        vision = sum(p.numel() for tower in vision_modules(model) for p in tower.parameters())
        linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules()
                        if isinstance(m, nn.Linear))
        _COUNTS[key] = ParamCounts(sum(p.numel() for p in model.parameters()), vision, linears)
    return _COUNTS[key]


def lora_targets(counts: ParamCounts, target_modules: list[str] | str) -> list[tuple[str, int, int]]:
    """The Linears peft wraps: a string is a regex matched against the whole module name
    (``re.fullmatch``); a list matches a name equal to an entry or ending in ``.entry``
    (peft ``check_target_module_exists``)."""
    if isinstance(target_modules, str):
        return [lin for lin in counts.linears if re.fullmatch(target_modules, lin[0])]
    return [lin for lin in counts.linears if lin[0] in target_modules
            or any(lin[0].endswith(f".{t}") for t in target_modules)]


def lora_parameters(counts: ParamCounts, r: int, target_modules: list[str] | str) -> int:
    """Adapter parameters of rank ``r``: ``r x (in + out)`` per wrapped Linear (A is r x in, B is out x r)."""
    return sum(r * (fan_in + fan_out) for _, fan_in, fan_out in lora_targets(counts, target_modules))


# ---------------------------------------------------------------------------------- tokens
def timestamp_tokens(seconds: float) -> int:
    """Tokens of the timestamp ``<{seconds:.1f} seconds>`` the Qwen3-VL processor writes before a group.

    Qwen's byte-level BPE pre-tokenizer splits numbers into single digits and the text sits between
    two special tokens, so it is ``<``, one token per digit, ``.``, `` seconds`` and ``>``:
    ``<0.2 seconds>`` is 6 tokens, ``<12.5 seconds>`` 7, ``<123.5 seconds>`` 8 (checked against
    Qwen3's ``tokenizer.json`` in ``tests/test_memory.py``).

    Args:
        seconds: the group's timestamp in seconds (>= 0).
    """
    digits = sum(ch.isdigit() for ch in f"{seconds:.1f}")
    return digits + 4


@dataclass(frozen=True)
class VideoTokens:
    """Tokens of one clip as the Qwen3-VL processor lays them out.

    The template's ``<|vision_start|><|video_pad|><|vision_end|>`` keeps its start and end; its
    ``<|video_pad|>`` becomes, per temporal group, ``<t seconds><|vision_start|>`` + the group's
    ``<|video_pad|>`` tokens + ``<|vision_end|>`` (``Qwen3VLProcessor.replace_video_token``).

    Attributes:
        frames: frames decoded (``data.video.sample_indices``: fps, ``max_frames``).
        groups: temporal patches (2 frames each, an odd count padded with the last frame).
        frame_size: ``(height, width)`` in pixels after the decode cap and the processor's resize.
        tokens_per_group: visual tokens per group, ``H/16 x W/16 / 4``.
        timestamp_tokens: tokens of all groups' ``<t seconds>`` texts.
    """

    frames: int
    groups: int
    frame_size: tuple[int, int]
    tokens_per_group: int
    timestamp_tokens: int

    @property
    def pixels_per_frame(self) -> int:
        """Pixels of a frame as the vision tower sees it."""
        return self.frame_size[0] * self.frame_size[1]

    @property
    def visual_tokens(self) -> int:
        """``<|video_pad|>`` tokens (one per merged 2 x 2 patch of a 2-frame group)."""
        return self.groups * self.tokens_per_group

    @property
    def text_tokens(self) -> int:
        """Timestamps and the per-group ``<|vision_start|>``/``<|vision_end|>``, minus the template's
        one ``<|video_pad|>`` placeholder they replace."""
        return self.timestamp_tokens + 2 * self.groups - 1

    @property
    def total(self) -> int:
        """Tokens the clip adds to a prompt whose template holds one video placeholder."""
        return self.visual_tokens + self.text_tokens


def processor_frame_size(frames: int, height: int, width: int, settings: dict) -> tuple[int, int]:
    """``(height, width)`` the Qwen3-VL video processor resizes ``frames`` frames of ``height x width`` to.

    As ``Qwen3VLVideoProcessor.resize`` with ``cap_pixels_per_frame=True`` (what ``data/prompts.py``
    passes): each frame may have ``max(min(max_video_tokens x f^2, longest_edge // frames),
    int(1.05 x shortest_edge))`` pixels (``f = patch_size x merge_size`` = 32), then transformers'
    ``smart_resize`` rounds the sides to multiples of ``f`` (down, keeping the aspect ratio, when the
    clip is over its budget; to the nearest multiple otherwise).

    Args:
        frames: frames passed to the processor (>= ``temporal_patch_size``).
        height, width: pixels of the decoded frames.
        settings: the video processor's settings (:func:`processor_video_settings`).
    """
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    factor = settings["patch_size"] * settings["merge_size"]
    size = settings["size"]
    per_frame = max(min(settings["max_video_tokens"] * factor**2, size["longest_edge"] // frames),
                    int(size["shortest_edge"] * 1.05))
    return smart_resize(frames, height, width, temporal_factor=settings["temporal_patch_size"], factor=factor,
                        min_pixels=size["shortest_edge"], max_pixels=per_frame * frames)


def video_tokens(seconds: float, fps: float, max_frames: int, max_pixels: int, *,
                 frame_size: tuple[int, int] | None = None,
                 source_fps: float = DEFAULT_SOURCE_FPS, settings: dict | None = None) -> VideoTokens:
    """Tokens of a clip of ``seconds`` decoded as ``GraspDataModule`` does and encoded by the processor.

    1. Frames: ``data.video.sample_indices`` of a ``round(seconds x source_fps)``-frame clip at
       ``fps`` (at most ``max_frames``, at least 2); frames are passed with ``do_sample_frames=False``,
       so the processor's own fps/min/max-frame sampling does not apply.
    2. Pixels: ``data.video.reduced_size(height, width, max_pixels)`` at decode time, then
       :func:`processor_frame_size`.
    3. Groups: ``ceil(frames / temporal_patch_size)``; each gets ``<t seconds>`` with ``t`` the mean
       of its frames' source indices / ``source_fps`` (the last group padded with the last frame),
       as ``Qwen3VLProcessor._calculate_timestamps`` computes it from ``video_metadata``.

    Args:
        seconds: clip length (s). fps: decode rate (frames/s). max_frames: ``data.max_frames``.
        max_pixels: ``data.max_pixels`` (pixels per decoded frame).
        frame_size: the source video's ``(height, width)`` in pixels (default: square frames of
            ``max_pixels``, i.e. 448 x 448 for the recipes).
        source_fps: the video file's frame rate (frames/s); it only moves timestamps by a frame.
        settings: the video processor's settings (default: Qwen3-VL's published ones).

    Raises:
        GraspConfigError: ``seconds``, ``fps`` or ``source_fps`` not positive.
    """
    if seconds <= 0 or fps <= 0 or source_fps <= 0:
        raise GraspConfigError(f"video seconds, fps and source fps must be > 0, got {seconds} s at {fps} fps "
                               f"from a {source_fps} fps file")
    from grasp_lightning.data.video import reduced_size, sample_indices

    settings = {**QWEN3VL_VIDEO_PROCESSOR, **(settings or {})}
    total = max(1, round(seconds * source_fps))
    indices = [int(i) for i in sample_indices(total, source_fps, fps=fps, max_frames=max_frames)]
    if frame_size is None:
        side = math.isqrt(max_pixels)
        frame_size = (side, side)
    height, width = reduced_size(*frame_size, max_pixels)
    t_patch = settings["temporal_patch_size"]
    resized = processor_frame_size(len(indices), height, width, settings)
    patch, merge = settings["patch_size"], settings["merge_size"]
    per_group = (resized[0] // patch) * (resized[1] // patch) // merge**2
    padded = indices + indices[-1:] * (-len(indices) % t_patch)
    stamps = [(padded[i] + padded[i + t_patch - 1]) / 2 / source_fps for i in range(0, len(padded), t_patch)]
    return VideoTokens(len(indices), len(stamps), tuple(resized), per_group, sum(map(timestamp_tokens, stamps)))


def processor_video_settings(name_or_path: str) -> dict:
    """The video processor settings the planner needs, read from a local model directory.

    Looks in the transformers-5 layout first (the ``video_processor`` section of
    ``processor_config.json``, which ``save_pretrained``, our exports and the stand-ins write), then
    in the older ``video_preprocessor_config.json``; missing keys (or no directory, e.g. a Hub id)
    take Qwen3-VL's published values (:data:`QWEN3VL_VIDEO_PROCESSOR`).

    Returns:
        ``{"size": {"shortest_edge", "longest_edge"}, "max_video_tokens", "patch_size",
        "merge_size", "temporal_patch_size"}`` (pixels per clip, tokens per frame, pixels, patches, frames).

    Raises:
        GraspConfigError: a settings file that is not valid JSON.
    """
    folder = Path(name_or_path)
    for name, section in (("processor_config.json", "video_processor"), ("video_preprocessor_config.json", None)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise GraspConfigError(f"{path}: not valid JSON ({err})") from err
        data = data.get(section) if section else data
        if isinstance(data, dict):
            return {key: data.get(key, default) or default for key, default in QWEN3VL_VIDEO_PROCESSOR.items()}
    return dict(QWEN3VL_VIDEO_PROCESSOR)


# ---------------------------------------------------------------------------------- activations
def layer_activation_bytes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int, seq_len: int,
                           *, gated_mlp: bool = True, qk_norm: bool = True, flash: bool = True) -> int:
    """Bytes one transformer layer keeps for the backward pass, per token, with 16-bit activations.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
    Sec. 4.1, Eq. 1) count ``s b h (34 + 5 a s / h)`` bytes per GPT layer: 34 h per token plus
    ``5 a s`` for the attention scores, softmax and dropout. Recounted for a Qwen3 decoder layer
    (RMSNorm, grouped-query attention with ``g`` KV heads, q/k-norm, no dropout, SwiGLU), in elements:
    attention: norm input ``h``, QKV input ``h``, Q, K, V ``(a + 2g) d``, Q and K before q/k-norm
    ``(a + g) d``, output-projection input ``a d``; MLP: norm input ``h``, gate/up input ``h``, gate,
    up, SiLU(gate) and their product ``4 i`` (a plain GELU MLP, as in the vision tower: ``2 i``).
    With flash attention (``flash_attention_2``, or ``sdpa`` on a GPU) the ``s x s`` scores are never
    stored; with ``eager`` attention Korthikanti's ``5 a s`` bytes are added.

    Returns:
        bytes per token (multiply by tokens).
    """
    attn = 2 * hidden + (heads + 2 * kv_heads) * head_dim + heads * head_dim + (qk_norm * (heads + kv_heads) * head_dim)
    mlp = 2 * hidden + (4 if gated_mlp else 2) * intermediate
    return 2 * (attn + mlp) + (0 if flash else 5 * heads * seq_len)


def stack_activation_bytes(tokens: int, layers: int, hidden: int, per_layer: int, *, checkpointing: bool) -> int:
    """Activations of a stack of ``layers`` layers for ``tokens`` tokens, in bytes.

    Without checkpointing every layer keeps ``per_layer`` bytes per token. With (HF per-layer)
    checkpointing each layer keeps only its 16-bit input (``2 h`` bytes per token) and one layer's
    full activations exist again while it is recomputed in the backward pass.
    """
    per_token = layers * 2 * hidden + per_layer if checkpointing else layers * per_layer
    return tokens * per_token


# ---------------------------------------------------------------------------------- the plan
@dataclass
class RunSpec:
    """What the planner needs to know about a run (:func:`plan_from_config` reads it from YAML).

    Attributes:
        model: a bundled architecture name, Hub id or local directory (``model.policy.name_or_path``).
        task: ``"sft"`` or ``"grpo"`` (``model.task.class_path``).
        devices, num_nodes: GPUs per node and nodes; the data-parallel world is their product.
        zero_stage: 0 (no DeepSpeed: ``auto``, ``ddp``, one device), 1 or 2.
        offload_optimizer: DeepSpeed keeps the optimizer states and fp32 gradients on the CPU.
        reduce_bucket_size, overlap_comm: DeepSpeed bucket size (elements) and double buffering.
        precision: Lightning precision (``bf16-mixed``, ``32-true``, ...).
        dtype: ``model.policy.dtype``, the dtype weights are loaded in.
        freeze_vision: the vision tower gets no gradients.
        lora: LoRA settings (``enabled`` turns LoRA on).
        separate_reference: ``model.reference.name_or_path`` names a checkpoint (a full copy even with LoRA).
        gradient_checkpointing, attn_implementation: as in ``model.policy``.
        micro_batch_size: prompts per micro-batch per GPU (``data.batch_size``).
        num_generations, max_new_tokens, beta: GRPO's K, completion budget (tokens) and KL weight.
        share_prompt: GRPO encodes each group's clip and runs its prompt once
            (``model.task.init_args.share_prompt``); ``False``: K repeated rows, like TRL.
        video_seconds, fps, max_frames, max_pixels: the clip (seconds, frames/s, frames, pixels/frame).
        frame_size: the source video's ``(height, width)`` in pixels (``None``: square frames of
            ``max_pixels``); source_fps: its frame rate (frames/s).
        text_tokens: tokens of the rendered prompt (system prompt, question, options, chat markers)
            with its one video placeholder ``<|vision_start|><|video_pad|><|vision_end|>``.

    Defaults are the code's own (``PolicyConfig``, ``RolloutConfig``, ``GRPOTask``, Lightning's
    ``Trainer``, ``GraspDataModule``), so a config that leaves a key out is planned as it runs.
        response_tokens: SFT target tokens (``None``: ``max_target_tokens``, the worst case).
        max_target_tokens, max_prompt_tokens: the data budgets (tokens).
    """

    model: str = DEFAULT_ARCHITECTURE
    task: str = "sft"
    devices: int = 1
    num_nodes: int = 1
    zero_stage: int = 0
    offload_optimizer: bool = False
    reduce_bucket_size: int = 200_000_000
    overlap_comm: bool = True
    precision: str = TRAINER_PRECISION_DEFAULT
    dtype: str = _POLICY_DEFAULTS.dtype
    freeze_vision: bool = _POLICY_DEFAULTS.freeze_vision
    lora: LoraConfig = field(default_factory=LoraConfig)
    separate_reference: bool = False
    gradient_checkpointing: bool = _POLICY_DEFAULTS.gradient_checkpointing
    attn_implementation: str | None = _POLICY_DEFAULTS.attn_implementation
    micro_batch_size: int = 1
    num_generations: int = _ROLLOUT_DEFAULTS.num_generations
    max_new_tokens: int = _ROLLOUT_DEFAULTS.max_new_tokens
    beta: float = 0.05
    share_prompt: bool = SHARE_PROMPT_DEFAULT
    video_seconds: float = 60.0
    fps: float = 2.0
    max_frames: int = 240
    max_pixels: int = 448 * 448
    frame_size: tuple[int, int] | None = None
    source_fps: float = DEFAULT_SOURCE_FPS
    text_tokens: int = 256
    response_tokens: int | None = None
    max_target_tokens: int = 2048
    max_prompt_tokens: int | None = 16384

    @property
    def world_size(self) -> int:
        """Data-parallel ranks: devices x nodes."""
        return self.devices * self.num_nodes


@dataclass
class MemoryPlan:
    """Per-GPU memory of one run, in bytes, with a short derivation of every component.

    ``peak = static + max(training, rollout)`` where ``static`` holds the model states, the
    reference model and the ZeRO buffers; ``training`` the activations and logits of one
    micro-batch (or a frozen vision tower's one-layer transient, if larger); ``rollout`` the KV
    cache of generation (or the prefill's peak). ``deepspeed_model_states`` is DeepSpeed's own
    estimate (``None`` without ZeRO), which assumes every parameter is trainable.
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
    kv_cache_shared_prefix: int
    rollout: int
    deepspeed_model_states: int | None
    how: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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
    how["weights"] = f"{_count(counts.total)} x {wb} B" + (f" + {_count(n_lora)} adapters" if n_lora else "")
    if not spec.zero_stage:
        # Outside DeepSpeed the optimizer updates float32 parameters: peft's adapters, or the float32
        # master weights GraspModule keeps for a full fine-tune (policy.keep_float32_masters).
        tb = 4 if n_lora or wb < 4 else wb
        masters = 0 if n_lora else trainable  # full fine-tune: the trainable weights are float32
        if masters and wb < 4:
            how["weights"] = (f"{_count(counts.total - trainable)} frozen x {wb} B + {_count(trainable)} "
                              "trainable x 4 B (float32 masters)")
        how["gradients"] = f"{_count(trainable)} x {tb} B" + (" x 2 (DDP buckets)" if n > 1 else "")
        how["optimizer states"] = f"{_count(trainable)} x 2 x {tb} B (torch AdamW exp_avg, exp_avg_sq)"
        how["ZeRO buffers"] = "no ZeRO"
        weights = wb * (counts.total - masters) + tb * masters + 4 * n_lora
        return dict(weights=weights, gradients=tb * trainable * (2 if n > 1 else 1),
                    optimizer_states=2 * tb * trainable, zero_buffers=0, deepspeed_model_states=None)
    # DeepSpeed casts the whole module, adapters included, to 16 bit and keeps fp32 partitions
    grad_b = wb / n if spec.zero_stage == 2 else wb
    offload = spec.offload_optimizer
    how["gradients"] = (f"{_count(trainable)} x ({wb} B{'' if spec.zero_stage == 2 else ' unpartitioned'}"
                        f"{'' if offload else ' + 4 B fp32'}) / {n}")
    how["optimizer states"] = ("on the CPU (offload)" if offload
                               else f"{_count(trainable)} x 12 B (fp32 master, exp_avg, exp_avg_sq) / {n}")
    how["ZeRO buffers"] = f"{1 + spec.overlap_comm} x {spec.reduce_bucket_size:.0e} x {wb} B reduce buckets"
    return dict(weights=wb * (counts.total + n_lora), gradients=int(trainable * (grad_b + (0 if offload else 4 / n))),
                optimizer_states=0 if offload else int(12 * trainable / n),
                zero_buffers=(1 + spec.overlap_comm) * spec.reduce_bucket_size * wb,
                deepspeed_model_states=deepspeed_zero2_estimate(counts.total + n_lora, spec.devices, spec.num_nodes,
                                                                offload))


def _reference(spec: RunSpec, counts: ParamCounts, how: dict) -> int:
    """Bytes of the frozen reference model per GPU."""
    adapter_ref = spec.lora.enabled and not spec.separate_reference
    if spec.task == "sft" or spec.beta == 0.0 or adapter_ref:
        how["reference model"] = ("SFT: none" if spec.task == "sft" else "beta = 0: none" if spec.beta == 0.0
                                  else "policy with adapters disabled")
        return 0
    how["reference model"] = f"{_count(counts.total)} x {_DTYPE_BYTES[spec.dtype]} B, frozen copy"
    return _DTYPE_BYTES[spec.dtype] * counts.total


def _tokens(spec: RunSpec) -> tuple[VideoTokens, int, int, int]:
    """The clip's tokens, prompt tokens, completion tokens and sequences per micro-batch.

    The processor's settings come from the model directory (:func:`processor_video_settings`);
    ``spec.text_tokens`` counts the rendered prompt with its one video placeholder."""
    vt = video_tokens(spec.video_seconds, spec.fps, spec.max_frames, spec.max_pixels, frame_size=spec.frame_size,
                      source_fps=spec.source_fps, settings=processor_video_settings(spec.model))
    prompt = vt.total + spec.text_tokens
    if spec.task == "sft":
        completion = spec.response_tokens if spec.response_tokens is not None else spec.max_target_tokens
        return vt, prompt, completion, spec.micro_batch_size
    return vt, prompt, spec.max_new_tokens, spec.micro_batch_size * spec.num_generations


def _kv_bytes_per_token(text) -> int:
    """KV-cache bytes per token over all layers: K and V x layers x kv_heads x head_dim x 2 B."""
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * 2


def _activations(spec: RunSpec, text, vision, counts: ParamCounts, vt: VideoTokens, prompt: int, completion: int,
                 sequences: int, how: dict) -> dict[str, int]:
    """Activations kept for backward, logits, and a frozen vision tower's transient, bytes per GPU.

    GRPO with ``share_prompt`` runs the ``B`` prompts once (clip included) and the ``B x K``
    completions against their cache, whose keys/values are repeated K times inside each layer's
    attention: the cache stays alive for the backward pass, and the repeated keys/values of one
    layer (of every layer without checkpointing) are saved by the attention.
    """
    h, layers = text.hidden_size, text.num_hidden_layers
    shared = spec.task == "grpo" and spec.share_prompt
    prompts = spec.micro_batch_size if shared else sequences  # prompt copies run through the model
    tokens = prompts * prompt + sequences * completion
    head_dim = getattr(text, "head_dim", None) or h // text.num_attention_heads
    flash = spec.attn_implementation != "eager"
    per_layer = layer_activation_bytes(h, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads,
                                       head_dim, prompt + completion, flash=flash)
    if spec.lora.enabled and spec.lora.dropout > 0:  # nn.Dropout on each wrapped Linear's input: 2 B + 1 B mask
        per_layer += 3 * sum(i for _, i, _ in lora_targets(counts, spec.lora.target_modules)) // layers
    activations = stack_activation_bytes(tokens, layers, h, per_layer, checkpointing=spec.gradient_checkpointing)
    activations += tokens * 2 * 2 * h  # input embeddings and the final norm's input
    if not spec.zero_stage and not spec.lora.enabled and spec.precision.endswith("-mixed"):
        trainable = counts.language + (0 if spec.freeze_vision else counts.vision)
        activations += 2 * trainable  # autocast's bf16 copies of the float32 master weights
    deepstack = len(getattr(vision, "deepstack_visual_indexes", ()) or ())
    activations += prompts * vt.visual_tokens * deepstack * h * 2  # DeepStack visual embeddings
    if shared:
        repeated = sequences * prompt * _kv_bytes_per_token(text) // layers  # one layer's K-fold keys/values
        cache = prompts * prompt * _kv_bytes_per_token(text) if spec.gradient_checkpointing else 0
        activations += cache + repeated * (1 if spec.gradient_checkpointing else layers)
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
    scored = sequences * (completion + 1)  # logits only from the last prompt position on (both tasks)
    logit_bytes = SFT_LOGIT_BYTES if spec.task == "sft" else GRPO_LOGIT_BYTES
    how["activations"] = (f"{tokens} tokens x {layers} {'checkpointed ' if spec.gradient_checkpointing else ''}"
                          f"layers{' + vision tower' if trained else ''}{' (shared prompts)' if shared else ''}")
    how["logits"] = f"{scored} positions x {text.vocab_size} x {logit_bytes} B"
    return dict(activations=activations, logits=scored * text.vocab_size * logit_bytes, vision_transient=transient)


def _rollout(spec: RunSpec, text, prompt: int, completion: int, sequences: int, how: dict) -> dict[str, int]:
    """GRPO generation: KV cache (and its shared-prefix variant) and the rollout's peak, bytes per GPU.

    Without ``share_prompt`` the ``B x K`` rows are prefilled together; with it the ``B`` prompts
    are prefilled once and ``cache.batch_repeat_interleave(K)`` copies the cache (both copies live
    for a moment), so the cache itself is as large either way.
    """
    if spec.task != "grpo":
        how["rollout"] = "SFT: no rollout"
        return dict(kv_cache=0, kv_cache_shared_prefix=0, rollout=0)
    kv_token, b, k = _kv_bytes_per_token(text), spec.micro_batch_size, spec.num_generations
    kv_cache = sequences * (prompt + completion) * kv_token
    shared = b * (prompt + k * completion) * kv_token
    working = 2 * (2 * text.hidden_size + 3 * text.intermediate_size)  # one layer's no-grad tensors per token
    if spec.share_prompt:
        prefill = max(b * prompt * (kv_token + working), b * (k + 1) * prompt * kv_token)
    else:
        prefill = sequences * prompt * (kv_token + working)
    how["rollout"] = (f"KV cache {sequences} x {prompt + completion} tokens x {kv_token} B = {_gib(kv_cache)} GiB "
                      f"(shared prefix {_gib(shared)}); prefill peak {_gib(prefill)}")
    return dict(kv_cache=kv_cache, kv_cache_shared_prefix=shared, rollout=max(kv_cache, prefill))


def plan_memory(spec: RunSpec, config=None) -> MemoryPlan:
    """Per-GPU memory of the run ``spec`` describes (see the module docstring for every formula).

    Args:
        spec: the run.
        config: the model's ``transformers`` config (default: ``architecture_config(spec.model)``).

    Raises:
        GraspConfigError: unknown task, dtype or ZeRO stage.
    """
    if spec.task not in ("sft", "grpo"):
        raise GraspConfigError(f"task must be 'sft' or 'grpo', got {spec.task!r}")
    if spec.zero_stage not in (0, 1, 2):
        raise GraspConfigError(f"ZeRO stage {spec.zero_stage} is not modelled (0, 1 or 2)")
    if spec.dtype not in _DTYPE_BYTES:
        raise GraspConfigError(f"model.policy.dtype {spec.dtype!r} is not one of {sorted(_DTYPE_BYTES)}")
    config = config if config is not None else architecture_config(spec.model)
    text, vision = getattr(config, "text_config", config), getattr(config, "vision_config", None)
    counts = count_parameters(config)
    n_lora = lora_parameters(counts, spec.lora.r, spec.lora.target_modules) if spec.lora.enabled else 0
    trainable = n_lora if spec.lora.enabled else counts.language + (0 if spec.freeze_vision else counts.vision)
    how: dict[str, str] = {}
    vt, prompt, completion, sequences = _tokens(spec)
    notes = []
    if spec.max_prompt_tokens is not None and prompt > spec.max_prompt_tokens:
        notes.append(f"the prompt ({prompt} tokens) is over data.max_prompt_tokens={spec.max_prompt_tokens}: "
                     "such items are skipped (TokenBudgetError)")
    return MemoryPlan(spec=spec, name=getattr(config, "name_or_path", "") or spec.model, params_total=counts.total,
                      params_vision=counts.vision, params_trainable=trainable, prompt_tokens=prompt,
                      visual_tokens=vt.visual_tokens, sequence_tokens=prompt + completion, sequences=sequences,
                      reference_model=_reference(spec, counts, how),
                      **_model_states(spec, counts, n_lora, trainable, how),
                      **_activations(spec, text, vision, counts, vt, prompt, completion, sequences, how),
                      **_rollout(spec, text, prompt, completion, sequences, how), how=how, notes=notes)


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
    allocator fragmentation and ``reserve_gib`` for the CUDA context, NCCL and kernels' workspaces."""
    usable = gpu_memory_gib * (1 - margin) - reserve_gib
    need = plan.peak / GIB
    return Fit(need <= usable, need, usable, gpu_memory_gib)


def format_plan(plan: MemoryPlan, gpu_memory_gib: float | None = None) -> str:
    """A readable table of the plan: GiB per component per GPU, peak, GPU size and the verdict."""
    s = plan.spec
    frozen = " (vision frozen)" if s.freeze_vision else ""
    mode = f"LoRA r={s.lora.r}" if s.lora.enabled else f"full fine-tune{frozen}"
    shared = ", prompts shared" if s.share_prompt else ""
    task = f"GRPO (K={s.num_generations}, {s.max_new_tokens} new tokens{shared})" if s.task == "grpo" else "SFT"
    lines = [f"Memory plan: {plan.name}, {task}, {mode}, {_strategy_label(s)}, "
             f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}",
             f"Parameters: {_count(plan.params_total)} (vision {_count(plan.params_vision)}), "
             f"{_count(plan.params_trainable)} trainable",
             f"Tokens: {s.video_seconds:g} s at {s.fps:g} fps -> {plan.visual_tokens} visual tokens; prompt "
             f"{plan.prompt_tokens}; {plan.sequences} sequence(s) x {plan.sequence_tokens} tokens per micro-batch", "",
             f"{'component':<18} {'GiB/GPU':>9}  how"]
    rows = [("weights", plan.weights), ("gradients", plan.gradients), ("optimizer states", plan.optimizer_states),
            ("reference model", plan.reference_model), ("ZeRO buffers", plan.zero_buffers),
            ("activations", plan.activations), ("logits", plan.logits), ("rollout", plan.rollout)]
    lines += [f"{name:<18} {_gib(value):>9}  {plan.how.get(name, '')}" for name, value in rows]
    lines.append(f"{'peak':<18} {_gib(plan.peak):>9}  static {_gib(plan.static)} + max(training "
                 f"{_gib(plan.training)}, rollout {_gib(plan.rollout)})")
    ours = f"ours {_gib(plan.model_states)} GiB"
    ds = ("n/a (no ZeRO)" if plan.deepspeed_model_states is None
          else f"{_gib(plan.deepspeed_model_states)} GiB (all parameters trainable)")
    lines.append(f"model states: DeepSpeed estimate_zero2_model_states_mem_needs {ds}; {ours}")
    if plan.vision_transient > plan.activations + plan.logits:
        lines.append(f"note: the frozen vision tower's one-block transient ({_gib(plan.vision_transient)} GiB) "
                     "sets the training peak")
    lines += [f"note: {note}" for note in plan.notes]
    if gpu_memory_gib is not None:
        verdict = fits(plan, gpu_memory_gib)
        lines.append(f"GPU {gpu_memory_gib:.1f} GiB, usable {verdict.usable_gib:.1f} GiB (10% + 2 GiB reserved): "
                     f"fits: {'yes' if verdict.fits else 'no'} (headroom {verdict.headroom_gib:+.1f} GiB)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- configs
def load_yaml_configs(config_paths: list[str | Path]) -> dict:
    """Compose YAML files in order with a plain deep merge: mappings merge key by key, anything
    else (lists, scalars, a string replacing a mapping such as ``strategy: auto``) replaces.

    Raises:
        GraspConfigError: a file is missing or its top level is not a mapping.
    """
    import yaml

    merged: dict = {}
    for path in config_paths:
        path = Path(path)
        if not path.is_file():
            raise GraspConfigError(f"{path}: config file not found")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise GraspConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
        merged = _deep_merge(merged, data)
    return merged


def _deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _get(cfg: dict, dotted: str, default: Any = None, *, keep_none: bool = False) -> Any:
    """The value at a dotted key; ``default`` when it is absent (or null, unless ``keep_none``)."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None and not keep_none else node


def _set(cfg: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _devices(value: Any, notes: list[str]) -> int:
    if isinstance(value, (list, tuple)):
        return len(value)
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    notes.append(f"trainer.devices={value!r}: planned for 1 device")
    return 1


def _strategy(value: Any, where: str = "trainer.strategy") -> dict:
    """``zero_stage``, ``offload_optimizer``, ``reduce_bucket_size``, ``overlap_comm`` of a Lightning
    strategy given as a registry name or a ``class_path``/``init_args`` mapping (DeepSpeedStrategy
    defaults: stage 2, overlap_comm, 2e8-element buckets)."""
    if isinstance(value, dict):
        class_path, args = str(value.get("class_path", "")), value.get("init_args") or {}
        if not class_path.endswith("DeepSpeedStrategy"):
            if "FSDP" in class_path:
                raise GraspConfigError(f"{where}: {class_path} is not modelled (DeepSpeed ZeRO-1/2, DDP or one device)")
            return {"zero_stage": 0}
        out = {"zero_stage": int(args.get("stage", 2)), "offload_optimizer": bool(args.get("offload_optimizer", False))}
        if "reduce_bucket_size" in args:
            out["reduce_bucket_size"] = int(float(args["reduce_bucket_size"]))
        if "overlap_comm" in args:
            out["overlap_comm"] = bool(args["overlap_comm"])
        return out
    name = str(value or "auto")
    if name.startswith("deepspeed"):
        match = re.fullmatch(r"deepspeed(?:_stage_(\d))?(_offload)?", name)
        if not match:
            raise GraspConfigError(f"{where}: {name!r} is not modelled")
        return {"zero_stage": int(match.group(1) or 2), "offload_optimizer": bool(match.group(2))}
    if name.startswith("fsdp"):
        raise GraspConfigError(f"{where}: {name!r} is not modelled (DeepSpeed ZeRO-1/2, DDP or one device)")
    return {"zero_stage": 0}


def spec_from_config(cfg: dict, **extra: Any) -> tuple[RunSpec, list[str]]:
    """A :class:`RunSpec` from a composed config mapping (keys as in ``configs/*.yaml``; absent keys
    take the code's defaults). ``extra`` sets RunSpec fields the YAML does not hold (video seconds,
    text tokens). Returns the spec and notes about assumptions made.

    Raises:
        GraspConfigError: the task is neither SFT nor GRPO, or the strategy is not modelled.
    """
    notes: list[str] = []
    class_path = str(_get(cfg, "model.task.class_path", ""))
    task = "grpo" if "grpo" in class_path.lower() else "sft" if "sft" in class_path.lower() else None
    if task is None:
        raise GraspConfigError(f"model.task.class_path {class_path!r}: the planner knows SFT and GRPO tasks")
    targs = _get(cfg, "model.task.init_args", {}) or {}
    name = str(_get(cfg, "model.policy.name_or_path", DEFAULT_ARCHITECTURE))
    if not (Path(name) / "config.json").is_file() and bundled_name(name) is None:
        notes.append(f"model {name!r} is not on this machine and not a bundled architecture: planned as "
                     f"{DEFAULT_ARCHITECTURE} (the GRASP paper's model; override model.policy.name_or_path)")
        name = DEFAULT_ARCHITECTURE
    lora_cfg = _get(cfg, "model.lora", {}) or {}
    lora = LoraConfig(**{k: v for k, v in lora_cfg.items() if k in LoraConfig.__dataclass_fields__})
    d = RunSpec()  # the code's defaults for keys the YAML leaves out
    values = dict(
        model=name, task=task, devices=_devices(_get(cfg, "trainer.devices", "auto"), notes),
        num_nodes=int(_get(cfg, "trainer.num_nodes", d.num_nodes)),
        precision=str(_get(cfg, "trainer.precision", d.precision)),
        dtype=str(_get(cfg, "model.policy.dtype", d.dtype)),
        freeze_vision=bool(_get(cfg, "model.policy.freeze_vision", d.freeze_vision)), lora=lora,
        separate_reference=_get(cfg, "model.reference.name_or_path") is not None,
        gradient_checkpointing=bool(_get(cfg, "model.policy.gradient_checkpointing", d.gradient_checkpointing)),
        attn_implementation=_get(cfg, "model.policy.attn_implementation", d.attn_implementation),
        micro_batch_size=int(_get(cfg, "data.batch_size", d.micro_batch_size)),
        num_generations=int(_get(cfg, "model.rollout.num_generations", d.num_generations)),
        max_new_tokens=int(_get(cfg, "model.rollout.max_new_tokens", d.max_new_tokens)),
        beta=float(targs.get("beta", d.beta)), share_prompt=bool(targs.get("share_prompt", d.share_prompt)),
        fps=float(_get(cfg, "data.fps", d.fps)), max_frames=int(_get(cfg, "data.max_frames", d.max_frames)),
        max_pixels=int(_get(cfg, "data.max_pixels", d.max_pixels)),
        max_target_tokens=int(_get(cfg, "data.max_target_tokens", d.max_target_tokens)),
        max_prompt_tokens=_get(cfg, "data.max_prompt_tokens", d.max_prompt_tokens, keep_none=True),
        **_strategy(_get(cfg, "trainer.strategy", "auto")))
    values.update(extra)
    return RunSpec(**values), notes


def plan_from_config(config_paths: list[str | Path], overrides: dict[str, Any] | None = None, *,
                     gpu_memory_gib: float | None = None, video_seconds: float = 60.0, text_tokens: int = 256,
                     response_tokens: int | None = None, frame_size: tuple[int, int] | None = None,
                     source_fps: float = DEFAULT_SOURCE_FPS) -> MemoryPlan:
    """Plan a run from grasp_lightning config files, composed in order, then ``overrides``.

    Args:
        config_paths: YAML files as given to ``python -m grasp_lightning fit --config ...``.
        overrides: dotted keys to values, e.g. ``{"model.policy.name_or_path": "Qwen3-VL-2B-Instruct"}``.
        gpu_memory_gib: the GPU's memory in GiB; logged verdict (see :func:`fits`).
        video_seconds: clip length in seconds (at the recipes' settings 60 s gives 12,289 video tokens;
            the most, 14,639, is at 250 s: the processor shrinks frames of longer clips).
        text_tokens: tokens of the rendered prompt with its one video placeholder (system prompt,
            question, options, chat markers).
        response_tokens: SFT target tokens (default: ``data.max_target_tokens``).
        frame_size: the source video's ``(height, width)`` in pixels (default: square frames of
            ``data.max_pixels``). source_fps: its frame rate (frames/s).

    Raises:
        GraspConfigError: a missing file or a value the planner does not model.
    """
    cfg = load_yaml_configs(config_paths)
    for key, value in (overrides or {}).items():
        _set(cfg, key, value)
    spec, notes = spec_from_config(cfg, video_seconds=video_seconds, text_tokens=text_tokens,
                                   response_tokens=response_tokens, frame_size=frame_size, source_fps=source_fps)
    plan = plan_memory(spec)
    plan.notes[:0] = notes
    for note in notes:
        log.warning("%s", note)
    if gpu_memory_gib is not None:
        verdict = fits(plan, gpu_memory_gib)
        log.info("%s: peak %.1f GiB of %.1f usable: %s", plan.name, verdict.need_gib, verdict.usable_gib,
                 "fits" if verdict.fits else "does not fit")
    return plan


# ---------------------------------------------------------------------------------- the README table
#: (setup label, config files, GPU GiB) of the README's scaling table.
TABLE_SETUPS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("SFT, full, 8 x H200 ZeRO-2", ("sft.yaml",), H200_GIB),
    ("SGR, full, 8 x H200 ZeRO-2", ("sgr.yaml",), H200_GIB),
    ("SFT, LoRA r16, 1 x 24 GB", ("sft.yaml", "lora.yaml"), 24.0),
    ("SGR, LoRA r16, 1 x 24 GB", ("sgr.yaml", "lora.yaml"), 24.0),
)


def longest_fitting_clip(config_paths: list[str | Path], overrides: dict[str, Any], gpu_memory_gib: float,
                         **kwargs: Any) -> float | None:
    """The longest clip length ``L`` (whole seconds, up to ``max_frames / fps``) such that every clip of
    1 to ``L`` seconds fits, or ``None`` when a 1 s clip does not.

    Tokens are not monotonic in the clip's length: the processor's per-frame cap shrinks the frames
    in 32-pixel steps (a 62 s clip at 448 x 448 has 12,152 visual tokens, a 63 s clip 10,647), so
    every length is planned rather than bisected.

    Args:
        kwargs: as :func:`plan_from_config` (``text_tokens``, ``frame_size``, ...), except ``video_seconds``.
    """
    cfg = load_yaml_configs(config_paths)
    for key, value in overrides.items():
        _set(cfg, key, value)
    extra = {k: v for k, v in kwargs.items() if v is not None}
    spec, _ = spec_from_config(cfg, **extra)
    config = architecture_config(spec.model)
    longest = None
    for seconds in range(1, max(1, int(spec.max_frames / spec.fps)) + 1):
        if not fits(plan_memory(replace(spec, video_seconds=float(seconds)), config), gpu_memory_gib).fits:
            break
        longest = float(seconds)
    return longest


def scaling_table(configs_dir: str | Path = "configs", *, video_seconds: float = 60.0, text_tokens: int = 256,
                  models: tuple[str, ...] = ("Qwen3-VL-2B-Instruct", "Qwen3-VL-4B-Instruct",
                                             "Qwen3-VL-8B-Instruct")) -> str:
    """The README's "Scaling" table (Markdown): every model x :data:`TABLE_SETUPS`, GiB per GPU."""
    head = ("| Model | Setup | Weights | Grads + optimizer | Reference | Activations + logits | Rollout | "
            "Peak | Fits | Longest clip that fits |")
    lines = [head, "|" + "---|" * 2 + "---:|" * 6 + "---|---:|"]
    for model in models:
        for label, files, gpu in TABLE_SETUPS:
            paths = [Path(configs_dir) / f for f in files]
            overrides = {"model.policy.name_or_path": model}
            plan = plan_from_config(paths, overrides, video_seconds=video_seconds, text_tokens=text_tokens)
            verdict = fits(plan, gpu)
            longest = longest_fitting_clip(paths, overrides, gpu, text_tokens=text_tokens)
            clip = "none" if longest is None else f"{longest:.0f} s"
            lines.append(f"| {model.removesuffix('-Instruct')} | {label} | {_gib(plan.weights)} | "
                         f"{_gib(plan.gradients + plan.optimizer_states)} | {_gib(plan.reference_model)} | "
                         f"{_gib(plan.training)} | {_gib(plan.rollout)} | {_gib(plan.peak)} | "
                         f"{'yes' if verdict.fits else 'no'} | {clip} |")
    spec, _ = spec_from_config(load_yaml_configs([Path(configs_dir) / TABLE_SETUPS[0][1][0]]))
    most = max((video_tokens(sec, spec.fps, spec.max_frames, spec.max_pixels).total, sec)
               for sec in range(1, int(spec.max_frames / spec.fps) + 1))
    lines += ["", f"GiB per GPU for a {video_seconds:g} s clip at 2 fps (448 x 448 frames; {text_tokens} prompt tokens "
              "besides the video), micro-batch 1; SFT counts the full target budget (2048 tokens), GRPO K = 8 "
              "completions of 1024 tokens. Peak = weights + gradients + optimizer + reference + ZeRO buckets + "
              "max(activations + logits, rollout KV cache or prefill). Fits: peak <= 90% of the GPU - 2 GiB (H200: "
              f"{H200_GIB:.1f} GiB). Longest clip that fits: the longest clip, up to data.max_frames / fps, whose "
              "peak fits, and every shorter clip's too (the processor caps a clip's pixels, so past a minute its "
              "frames "
              f"shrink in 32-pixel steps and the count is not monotonic: at most {most[0]:,} video tokens, at "
              f"{most[1]} s). Token counts follow the Qwen3-VL processor exactly, timestamps included. "
              "Computed by `python -m grasp_lightning.planning.memory --table`."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- command line
def _parse_override(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise GraspConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. model.lora.r=8")
    return key.strip(), yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    """``python -m grasp_lightning.planning.memory``: print a plan (``--config ...``) or the README table (``--table``)."""
    parser = argparse.ArgumentParser(prog="python -m grasp_lightning.planning.memory", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=[], help="a grasp_lightning YAML config (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a dotted config key, e.g. model.policy.name_or_path=Qwen3-VL-2B-Instruct")
    parser.add_argument("--model", help="shorthand for --set model.policy.name_or_path=MODEL")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="GPU memory in GiB (H200: 140.4)")
    parser.add_argument("--video-seconds", type=float, default=60.0, help="clip length in seconds")
    parser.add_argument("--text-tokens", type=int, default=256,
                        help="prompt tokens besides the clip (the template with its one video placeholder)")
    parser.add_argument("--response-tokens", type=int, default=None, help="SFT target tokens (default: the budget)")
    parser.add_argument("--table", action="store_true", help="print the README scaling table")
    parser.add_argument("--configs-dir", default="configs", help="where --table finds sft/sgr/lora.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.table:
        sys.stdout.write(scaling_table(args.configs_dir, video_seconds=args.video_seconds,
                                       text_tokens=args.text_tokens) + "\n")
        return 0
    if not args.config:
        parser.error("give --config FILE (repeatable) or --table")
    overrides = dict(_parse_override(s) for s in args.set)
    if args.model:
        if not (Path(args.model) / "config.json").is_file() and bundled_name(args.model) is None:
            known = ", ".join(sorted(bundled_architectures()))
            parser.error(f"--model {args.model!r}: no config.json there and not a published architecture "
                         f"(known: {known})")
        overrides["model.policy.name_or_path"] = args.model
    plan = plan_from_config(args.config, overrides, gpu_memory_gib=args.gpu_memory_gib,
                            video_seconds=args.video_seconds, text_tokens=args.text_tokens,
                            response_tokens=args.response_tokens)
    sys.stdout.write(format_plan(plan, args.gpu_memory_gib) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
