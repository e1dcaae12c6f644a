"""The memory table of ``docs/scaling.md``: each model x its setups, GiB per GPU, and the longest clip that fits.

The rows (:data:`TABLE_ROWS`) name a model and its setups; each setup's
:class:`~grasp_lightning.planning.spec.RunSpec` comes from the recipes, instantiated by the
``plan-memory`` command (``python -m grasp_lightning plan-memory --table``,
:mod:`grasp_lightning.commands.plan_memory`). ``tests/unit/planning/test_estimate.py`` checks that docs/scaling.md holds
exactly the table this prints.
"""

from __future__ import annotations

from dataclasses import replace

from grasp_lightning.planning.architectures import architecture_config
from grasp_lightning.planning.estimate import MemoryPlan, fits, format_gib, plan_memory
from grasp_lightning.planning.layers import linear_state_bytes, text_shapes
from grasp_lightning.planning.spec import RunSpec
from grasp_lightning.planning.tokens import video_tokens

#: Memory of one H200 as ``nvidia-smi`` reports it (143771 MiB, sold as 141 GB), in GiB.
H200_GIB = 143771 / 1024
#: A setup of the table: (label, config files composed in order, GPU memory in GiB).
Setup = tuple[str, tuple[str, ...], float]
#: (setup label, config files, GPU GiB) of the memory table, for every model.
TABLE_SETUPS: tuple[Setup, ...] = (
    ("SFT, full, 8 x H200 ZeRO-2", ("sft.yaml",), H200_GIB),
    ("SGR, full, 8 x H200 ZeRO-2", ("sgr.yaml",), H200_GIB),
    ("SFT, LoRA r16, 1 x 24 GB", ("sft.yaml", "lora.yaml"), 24.0),
    ("SGR, LoRA r16, 1 x 24 GB", ("sgr.yaml", "lora.yaml"), 24.0),
)
#: LoRA on one 48 GB GPU (the size above 24 GB that Qwen3.5-9B's LoRA rows are asked on).
LORA_48_SETUPS: tuple[Setup, ...] = (
    ("SFT, LoRA r16, 1 x 48 GB", ("sft.yaml", "lora.yaml"), 48.0),
    ("SGR, LoRA r16, 1 x 48 GB", ("sgr.yaml", "lora.yaml"), 48.0),
)
#: QLoRA (configs/qlora.yaml: LoRA r16 on an NF4 base, double quantization) on one 24 GB GPU.
QLORA_SETUPS: tuple[Setup, ...] = (
    ("SFT, QLoRA r16 NF4, 1 x 24 GB", ("sft.yaml", "qlora.yaml"), 24.0),
    ("SGR, QLoRA r16 NF4, 1 x 24 GB", ("sgr.yaml", "qlora.yaml"), 24.0),
)
#: The table's rows: each model (a bundled architecture) with its setups, in order.
TABLE_ROWS: tuple[tuple[str, tuple[Setup, ...]], ...] = (
    ("Qwen3-VL-2B-Instruct", TABLE_SETUPS),
    ("Qwen3-VL-4B-Instruct", TABLE_SETUPS + QLORA_SETUPS),
    ("Qwen3-VL-8B-Instruct", TABLE_SETUPS + QLORA_SETUPS),
    ("Qwen3.5-9B", TABLE_SETUPS + LORA_48_SETUPS + QLORA_SETUPS),
)
#: The table's models.
TABLE_MODELS = tuple(model for model, _ in TABLE_ROWS)


def longest_fitting_clip(spec: RunSpec, gpu_memory_gib: float) -> float | None:
    """The longest clip length ``L`` (whole seconds, up to ``max_frames / fps``) such that every clip of
    1 to ``L`` seconds fits, or ``None`` when a 1 s clip does not.

    Tokens are not monotonic in the clip's length: the processor's per-frame cap shrinks the frames
    in 32-pixel steps (a 62 s clip at 448 x 448 has 12,152 visual tokens, a 63 s clip 10,647), so
    every length is planned rather than bisected.
    """
    config = architecture_config(spec.model)
    longest = None
    for seconds in range(1, max(1, int(spec.max_frames / spec.fps)) + 1):
        if not fits(plan_memory(replace(spec, video_seconds=float(seconds)), config), gpu_memory_gib).fits:
            break
        longest = float(seconds)
    return longest


def table_row(model: str, label: str, plan: MemoryPlan, gpu_memory_gib: float, longest: float | None) -> str:
    """One Markdown row of the scaling table (GiB per GPU)."""
    clip = "none" if longest is None else f"{longest:.0f} s"
    return (f"| {model.removesuffix('-Instruct')} | {label} | {format_gib(plan.weights)} | "
            f"{format_gib(plan.gradients + plan.optimizer_states)} | {format_gib(plan.reference_model)} | "
            f"{format_gib(plan.training)} | {format_gib(plan.rollout)} | {format_gib(plan.peak)} | "
            f"{'yes' if fits(plan, gpu_memory_gib).fits else 'no'} | {clip} |")


def _hybrid_note(rows: list[tuple[str, str, RunSpec, float]]) -> str:
    """A sentence per hybrid model of the rows: its layer kinds and per-sequence linear-attention state."""
    notes = []
    for model in dict.fromkeys(model for model, *_ in rows):
        shapes = text_shapes(getattr(config := architecture_config(model), "text_config", config))
        if shapes.linear_layers:
            notes.append(f" {model}: the rollout cache is the KV cache of its {shapes.full_layers} full-attention "
                         f"layers plus, per sequence, the {shapes.linear_layers} linear-attention layers' state "
                         f"({linear_state_bytes(shapes) / 2**20:.1f} MiB, constant in length); their activations are "
                         "those of transformers' pure-torch chunked gated delta rule (no flash-linear-attention).")
    return "".join(notes)


def scaling_table(rows: list[tuple[str, str, RunSpec, float]], *, video_seconds: float = 60.0,
                  text_tokens: int = 256) -> str:
    """The memory table of ``docs/scaling.md`` (Markdown).

    Args:
        rows: ``(model, setup label, spec, GPU GiB)`` per row (:data:`TABLE_ROWS`); each spec is
            planned at ``video_seconds`` and for every clip length.
        video_seconds: the clip of the table's columns (s). text_tokens: the prompt besides the video.
    """
    head = ("| Model | Setup | Weights | Grads + optimizer | Reference | Activations + logits | Rollout | "
            "Peak | Fits | Longest clip that fits |")
    lines = [head, "|" + "---|" * 2 + "---:|" * 6 + "---|---:|"]
    for model, label, spec, gpu in rows:
        spec = replace(spec, text_tokens=text_tokens)
        plan = plan_memory(replace(spec, video_seconds=video_seconds))
        lines.append(table_row(model, label, plan, gpu, longest_fitting_clip(spec, gpu)))
    first = rows[0][2]
    most = max((video_tokens(sec, first.fps, first.max_frames, first.max_pixels,
                             frame_max_tokens=first.frame_max_tokens).total, sec)
               for sec in range(1, int(first.max_frames / first.fps) + 1))
    lines += ["", f"GiB per GPU for a {video_seconds:g} s clip at 2 fps (448 x 448 frames; {text_tokens} prompt tokens "
              "besides the video), micro-batch 1; SFT counts the full target budget (2048 tokens), GRPO K = 8 "
              "completions of 1024 tokens. Peak = weights + gradients + optimizer + reference + ZeRO buckets + "
              "max(activations + logits, rollout cache or prefill); SGR's logits are one chunk of the LM head "
              "(model.task.init_args.compute.logprob_chunk_size, 256 tokens), never the (K x 1024, V) tensor."
              + _hybrid_note(rows) + " Fits: peak <= 90% of "
              f"the GPU - 2 GiB (H200: {H200_GIB:.1f} GiB). Longest clip that fits: the longest clip, up to "
              "data.video.max_frames / fps, whose peak fits, and every shorter clip's too (the processor caps a clip's "
              "pixels, so past a minute its frames shrink in 32-pixel steps and the count is not monotonic: at most "
              f"{most[0]:,} video tokens, at {most[1]} s). Token counts follow the Qwen3-VL processor exactly, "
              "timestamps included (Qwen3.5 uses the same processor and settings). QLoRA: the language model's "
              "Linears in bitsandbytes' NF4 layout with double quantization (4.127 bits per weight), the vision "
              "tower, embeddings and LM head in bf16, plus one Linear dequantized to bf16 at a time. "
              "Computed by `python -m grasp_lightning plan-memory --table`."]
    return "\n".join(lines)
