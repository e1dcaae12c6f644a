"""``python -m grasp_lightning plan-memory``: the per-GPU memory of a run, read from its config.

``python -m grasp_lightning plan-memory --config configs/sgr.yaml [--config configs/lora.yaml] --gpu-memory-gib 140``
prints the bytes of every component per GPU and whether the run fits. Overrides take ``fit``'s syntax
(``--trainer.devices 4``, ``--model.lora.enabled=true``, ``--model.sequence_parallel 8``). With
``--gpu-memory-gib``, a run that does not fit exits with status 1 and names the first single change of its
config that would make it fit (:func:`suggest_fit`), Ulysses sequence parallelism over 2, 4 or 8 of its GPUs
among them. ``--table`` prints the memory table of docs/scaling.md (Qwen3-VL 2B/4B/8B and Qwen3.5-9B; full fine-tune on 8 x H200, LoRA on one
24 GB GPU, and for Qwen3.5-9B on one 48 GB GPU too; QLoRA, ``configs/qlora.yaml``, on one 24 GB GPU for
Qwen3-VL-4B/8B and Qwen3.5-9B). ``--model`` takes a local checkpoint or a name
of :func:`~grasp_lightning.planning.architectures.known_model_names` (or its Hub id).

The configs are instantiated by the one config loader (:func:`grasp_lightning.commands.config.load_run`,
as ``fit`` would: a key a config leaves out has the code's value), and the planner reads the
objects (:func:`grasp_lightning.planning.spec.spec_from_run`): the task says whether it needs a
reference model, samples rollouts and shares prompts. The formulas are in
:mod:`grasp_lightning.planning.estimate`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grasp_lightning.commands.config import cli_value, config_args, load_run, override_args
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.planning.architectures import architecture_config, known_model_names
from grasp_lightning.planning.estimate import Fit, MemoryPlan, fits, format_plan, plan_memory
from grasp_lightning.planning.spec import RunSpec, bundled_or_local, spec_from_run
from grasp_lightning.planning.tables import TABLE_ROWS, Setup, scaling_table
from grasp_lightning.planning.tokens import DEFAULT_SOURCE_FPS
from grasp_lightning.sequence_parallel import config_unsupported_reason

log = logging.getLogger(__name__)


def load_spec(args: Sequence[str], **extra: Any) -> tuple[RunSpec, list[str]]:
    """The :class:`RunSpec` of a run given by ``fit``-style arguments (``--config`` files, ``--key=value``
    overrides), and notes about assumptions; ``extra``: the spec's clip and prompt fields."""
    run = load_run(args)
    return spec_from_run(run.module, run.datamodule, run.trainer, **extra)


def plan_from_config(config_paths: Sequence[str | Path], overrides: dict[str, Any] | None = None, *,
                     gpu_memory_gib: float | None = None, video_seconds: float = 60.0, text_tokens: int = 256,
                     response_tokens: int | None = None, frame_size: tuple[int, int] | None = None,
                     source_fps: float = DEFAULT_SOURCE_FPS, args: Sequence[str] = ()) -> MemoryPlan:
    """Plan a run from grasp_lightning config files, composed in order, then ``overrides``.

    Args:
        config_paths: YAML files as given to ``python -m grasp_lightning fit --config ...``.
        overrides: dotted keys to values, e.g. ``{"model.policy.name_or_path": "Qwen3-VL-2B-Instruct"}``.
        gpu_memory_gib: the GPU's memory in GiB; logged verdict (see :func:`fits`).
        video_seconds: clip length in seconds (at the recipes' settings 60 s gives 12,287 video tokens;
            the most, 14,637, is at 250 s: the processor shrinks frames of longer clips).
        text_tokens: tokens of the rendered prompt with its one video placeholder (system prompt,
            question, options, chat markers).
        response_tokens: SFT target tokens (default: ``data.prompt.max_target_tokens``).
        frame_size: the source video's ``(height, width)`` in pixels (default: square frames just large
            enough that the cap binds: ``data.video.max_pixels``, or ``data.video.frame_max_tokens`` whole
            tokens, :func:`~grasp_lightning.data.frames.default_frame_size`). source_fps: its frame rate (frames/s).
        args: further command-line overrides, after ``overrides`` (``["--model.lora.r=8"]``).

    Raises:
        GraspConfigError: a value the planner does not model (an FSDP strategy, ZeRO-3, a dtype).
        SystemExit: the configs do not parse (a missing file, an unknown key).
    """
    spec, notes = load_spec([*config_args(config_paths, overrides), *args], video_seconds=video_seconds,
                            text_tokens=text_tokens, response_tokens=response_tokens, frame_size=frame_size,
                            source_fps=source_fps)
    plan = plan_memory(spec)
    plan.notes[:0] = notes
    for note in notes:
        log.warning("%s", note)
    if gpu_memory_gib is not None:
        verdict = fits(plan, gpu_memory_gib)
        log.info("%s: peak %.1f GiB of %.1f usable: %s", plan.name, verdict.need_gib, verdict.usable_gib,
                 "fits" if verdict.fits else "does not fit")
    return plan


#: Exit status of ``plan-memory --gpu-memory-gib G`` when the run does not fit (argparse errors exit 2).
EXIT_DOES_NOT_FIT = 1
#: The ``model.sequence_parallel`` group sizes :func:`candidate_changes` tries (one node's GPUs at most).
SEQUENCE_PARALLEL_SIZES = (2, 4, 8)


def candidate_changes(spec: RunSpec) -> list[dict[str, Any]]:
    """Single changes of a run's config that lower its per-GPU memory, least invasive first.

    Each is a dict of dotted keys to values, as ``fit``'s ``--key value`` overrides: gradient
    checkpointing (if off); Ulysses sequence parallelism over 2, 4 or 8 of the run's GPUs
    (``model.sequence_parallel``, above the run's own, where it divides the GPUs and the model's heads
    allow it: :func:`~grasp_lightning.sequence_parallel.config_unsupported_reason`; it splits the
    training forwards' sequence, not the weights, and leaves ``world / N`` data-parallel groups); more GPUs
    with DeepSpeed ZeRO-2 (full fine-tune only: it shards gradients and optimizer states, which LoRA hardly
    has); LoRA adapters; a 4-bit base (QLoRA, no DeepSpeed); half the
    rollout's K (down to 2) and completion budget (down to 128 tokens); half the clip's frames
    (``data.video.max_frames``, down to 8). Which of them fits is for :func:`suggest_fit` to plan.
    """
    changes: list[dict[str, Any]] = []
    if not spec.gradient_checkpointing:
        changes.append({"model.policy.gradient_checkpointing": True})
    text = architecture_config(spec.model)
    text = getattr(text, "text_config", text)
    for n in SEQUENCE_PARALLEL_SIZES:
        if n > spec.sequence_parallel and not spec.world_size % n and config_unsupported_reason(text, n) is None:
            changes.append({"model.sequence_parallel": n})
    if not spec.lora.enabled:
        for devices in (2, 4, 8, 16, 32, 64):
            if devices > spec.world_size or (devices == spec.world_size and spec.zero_stage < 2):
                changes.append({"trainer.devices": devices, "trainer.strategy": "deepspeed_stage_2"})
        changes.append({"model.lora.enabled": True})
    if not spec.lora.quantize:
        changes.append({"model.lora.enabled": True, "model.lora.quantize": "nf4", "trainer.strategy": "auto"})
    if spec.samples_rollouts:
        k = spec.num_generations // 2
        while k >= 2:
            changes.append({"model.rollout.num_generations": k})
            k //= 2
        n = spec.max_new_tokens // 2
        while n >= 128:
            changes.append({"model.rollout.max_new_tokens": n})
            n //= 2
    frames = min(spec.max_frames, max(1, int(spec.video_seconds * spec.fps))) // 2
    while frames >= 8:
        changes.append({"data.video.max_frames": frames})
        frames //= 2
    return changes


def format_change(change: dict[str, Any]) -> str:
    """``{"trainer.devices": 4}`` -> ``--trainer.devices 4`` (``fit``'s syntax)."""
    return " ".join(f"--{key} {cli_value(value)}" for key, value in change.items())


def suggest_fit(args: Sequence[str], gpu_memory_gib: float, **extra: Any) -> tuple[dict[str, Any], Fit] | None:
    """The first of :func:`candidate_changes` with which the run of ``args`` (``fit``-style arguments)
    fits a GPU of ``gpu_memory_gib`` GiB (:func:`~grasp_lightning.planning.estimate.fits`), with its
    verdict; if none does, the first fitting sum of them, added in the same order; None if even all of them
    do not fit. A change the planner refuses (:class:`GraspConfigError`, e.g. a 4-bit base
    under DeepSpeed) is skipped. ``extra``: the spec's clip and prompt fields, as for :func:`load_spec`."""
    def verdict(change: dict[str, Any]) -> Fit | None:
        try:
            changed, _ = load_spec([*args, *override_args(change)], **extra)
            return fits(plan_memory(changed), gpu_memory_gib)
        except GraspConfigError:
            return None

    changes = candidate_changes(load_spec(args, **extra)[0])
    for change in changes:
        if (v := verdict(change)) is not None and v.fits:
            return change, v
    combined: dict[str, Any] = {}
    for change in changes:  # no single change fits: add them up, in the same order, while the planner accepts them
        if (v := verdict({**combined, **change})) is not None:
            combined.update(change)
            if v.fits:
                return combined, v
    return None


def table(configs_dir: str | Path = "configs", *, video_seconds: float = 60.0, text_tokens: int = 256,
          rows: Sequence[tuple[str, Sequence[Setup]]] = TABLE_ROWS) -> str:
    """The memory table of docs/scaling.md: each model of ``rows`` with its setups
    (:data:`~grasp_lightning.planning.tables.TABLE_ROWS`), each setup's recipes read from ``configs_dir``."""
    planned = []
    for model, setups in rows:
        for label, files, gpu in setups:
            paths = [Path(configs_dir) / f for f in files]
            spec, _ = load_spec(config_args(paths, {"model.policy.name_or_path": model}))
            planned.append((model, label, spec, gpu))
    return scaling_table(planned, video_seconds=video_seconds, text_tokens=text_tokens)


def build_parser() -> argparse.ArgumentParser:
    """The ``plan-memory`` command's parser."""
    from grasp_lightning.commands import COMMANDS

    parser = argparse.ArgumentParser(prog="python -m grasp_lightning plan-memory",
                                     description=COMMANDS["plan-memory"].description,
                                     epilog="Any other --KEY VALUE (or --KEY=VALUE) overrides a config key as in fit, "
                                            "e.g. --trainer.devices 4 --model.lora.enabled true.",
                                     allow_abbrev=False)
    parser.add_argument("--config", action="append", default=[], help="a grasp_lightning YAML config (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="deprecated: give fit's --KEY VALUE instead")
    parser.add_argument("--model", help="shorthand for --model.policy.name_or_path MODEL")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="GPU memory in GiB (H200: 140.4)")
    parser.add_argument("--video-seconds", type=float, default=60.0, help="clip length in seconds")
    parser.add_argument("--text-tokens", type=int, default=256,
                        help="prompt tokens besides the clip (the template with its one video placeholder)")
    parser.add_argument("--response-tokens", type=int, default=None, help="SFT target tokens (default: the budget)")
    parser.add_argument("--table", action="store_true", help="print the memory table of docs/scaling.md")
    parser.add_argument("--configs-dir", default="configs", help="where --table finds sft/sgr/lora/qlora.yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m grasp_lightning plan-memory``: print a plan (``--config ...``) or the memory table (``--table``)."""
    parser = build_parser()
    args, overrides = parser.parse_known_args(argv)
    if overrides and not overrides[0].startswith("--"):
        parser.error(f"unexpected argument {overrides[0]!r}: overrides are --KEY VALUE, e.g. --trainer.devices 4")
    if args.gpu_memory_gib is not None and not args.gpu_memory_gib > 0:
        parser.error(f"--gpu-memory-gib must be > 0, got {args.gpu_memory_gib}")
    if not args.video_seconds > 0:
        parser.error(f"--video-seconds must be > 0, got {args.video_seconds}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.table:
        sys.stdout.write(table(args.configs_dir, video_seconds=args.video_seconds, text_tokens=args.text_tokens)
                         + "\n")
        return 0
    if not args.config:
        parser.error("give --config FILE (repeatable) or --table")
    for text in args.set:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            parser.error(f"--set {text!r}: expected KEY=VALUE, e.g. model.lora.r=8")
        log.warning("--set %s is deprecated: give --%s %s, as fit takes it", text, key.strip(), value)
        overrides.append(f"--{key.strip()}={value}")
    if args.model:
        if not bundled_or_local(args.model):
            parser.error(f"--model {args.model!r}: no config.json there and not a published architecture "
                         f"(known: {', '.join(known_model_names())}, or their Hub ids Qwen/...)")
        overrides.append(f"--model.policy.name_or_path={args.model}")
    extra = {"video_seconds": args.video_seconds, "text_tokens": args.text_tokens,
             "response_tokens": args.response_tokens}
    plan = plan_from_config(args.config, gpu_memory_gib=args.gpu_memory_gib, args=overrides, **extra)
    sys.stdout.write(format_plan(plan, args.gpu_memory_gib) + "\n")
    if args.gpu_memory_gib is None or fits(plan, args.gpu_memory_gib).fits:
        return 0
    run_args = [*config_args(args.config), *overrides]
    found = suggest_fit(run_args, args.gpu_memory_gib, **extra)
    if found is None:
        tried = "; ".join(format_change(c) for c in candidate_changes(load_spec(run_args, **extra)[0]))
        sys.stdout.write(f"does not fit a {args.gpu_memory_gib:g} GiB GPU, even with all of these changes: "
                         f"{tried}; plan a larger GPU or shorter clips (--video-seconds)\n")
    else:
        change, verdict = found
        sys.stdout.write(f"does not fit a {args.gpu_memory_gib:g} GiB GPU; the first change that fits: "
                         f"{format_change(change)} (peak {verdict.need_gib:.1f} GiB of {verdict.usable_gib:.1f} "
                         f"usable)\n")
    return EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    sys.exit(main())
