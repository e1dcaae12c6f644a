"""The step metrics of a GRPO-SGR run that learns, on CPU: the tiny Qwen3-VL on the bundled sample data,
a short SFT warm-up (so completions have a format to reward, as ``grpo_learning.py``), then GRPO with
the SGR rewards and ``beta`` 0.05, each step's ``train/`` values recorded (the module's
``last_step_metrics``, what the loggers get). The source of the tiny-model ranges in
docs/metrics.md's "What healthy looks like".

    python benchmarks/healthy_ranges.py [--sft-steps 60] [--grpo-steps 30] [--out benchmarks/results]

Writes ``healthy_ranges_tiny.json`` (every step's values, and per tag the min, median and max over the
steps and the means of the first and last 5 steps) and prints the summary as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402
from grpo_learning import _data, _trainer  # noqa: E402 (sibling script; benchmarks/ is sys.path[0] when run as a script)

from grasp_lightning.engines.decoding import RolloutConfig  # noqa: E402
from grasp_lightning.module import GraspModule, OptimConfig  # noqa: E402
from grasp_lightning.policy import PolicyConfig  # noqa: E402
from grasp_lightning.tasks.grpo import GRPOTask, LossConfig, RewardConfig  # noqa: E402
from grasp_lightning.tasks.sft import SFTTask  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: The tags summarised (docs/metrics.md's healthy ranges).
TAGS = ("train/reward/mean", "train/reward/std", "train/kl", "train/entropy", "train/clip_ratio", "train/ratio/mean",
        "train/zero_variance_groups/fraction", "train/completion_length/mean",
        "train/completion_length/truncated_fraction", "train/answer/parsed_fraction", "train/advantage/std",
        "train/loss")


class StepRecorder(L.Callback):
    """Every optimizer step's reduced ``train/`` values (``GraspModule.last_step_metrics``)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        values = getattr(pl_module, "last_step_metrics", None) or {}
        self.steps.append({k: float(v) for k, v in values.items()})


def summarise(steps: list[dict[str, float]], tags=TAGS, edge: int = 5) -> dict[str, dict[str, float]]:
    """Per tag: ``min``, ``median``, ``max`` over the steps that logged it, and the means of its first
    and last ``edge`` steps (``first``, ``last``), each rounded to 4 decimals."""
    out = {}
    for tag in tags:
        series = [s[tag] for s in steps if tag in s]
        if series:
            out[tag] = {"min": min(series), "median": statistics.median(series), "max": max(series),
                        "first": statistics.fmean(series[:edge]), "last": statistics.fmean(series[-edge:]),
                        "steps": len(series)}
            out[tag] = {k: round(v, 4) if isinstance(v, float) else v for k, v in out[tag].items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--grpo-steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results"))
    args = parser.parse_args()
    L.seed_everything(args.seed)
    tiny = str(REPO / "grasp_lightning/assets/tiny-qwen3vl")
    t0 = time.perf_counter()
    sft = GraspModule(SFTTask(), policy=PolicyConfig(name_or_path=tiny, dtype="float32"),
                      optim=OptimConfig(lr=3e-3, warmup_steps=5, scheduler="constant_with_warmup"))
    _trainer(args.sft_steps, []).fit(sft, _data("train/data_sft.jsonl", "sft", 4))
    sft_seconds = time.perf_counter() - t0
    recorder = StepRecorder()
    settings = {"num_generations": 8, "max_new_tokens": 48, "beta": 0.05, "loss": "grpo", "num_iterations": 1,
                "rewards": ["accuracy", "format", "grounding_presence", "social_grounding"],
                "weights": [1.0, 0.1, 0.05, 0.2], "prompts_per_step": 2, "lr": args.lr}
    with tempfile.TemporaryDirectory() as start:
        sft.policy.save_pretrained(start)
        sft.processor.save_pretrained(start)
        task = GRPOTask(reward=RewardConfig(terms=settings["rewards"], weights=settings["weights"]),
                        loss=LossConfig(beta=settings["beta"], type="grpo"))
        grpo = GraspModule(task, policy=PolicyConfig(name_or_path=start, dtype="float32"),
                           optim=OptimConfig(lr=args.lr, warmup_steps=5, scheduler="constant_with_warmup"),
                           rollout=RolloutConfig(num_generations=8, max_new_tokens=48))
        t1 = time.perf_counter()
        _trainer(args.grpo_steps, [recorder]).fit(grpo, _data("train/data_rl.jsonl", "rl", 2))
        grpo_seconds = time.perf_counter() - t1
    if not recorder.steps:
        raise SystemExit("no GRPO step was recorded (--grpo-steps must be >= 1)")
    summary = summarise(recorder.steps)
    result = {"command": "python benchmarks/healthy_ranges.py", "model": "tiny Qwen3-VL (random init) + SFT warm-up",
              "sft_steps": args.sft_steps, "grpo_steps": len(recorder.steps), "seed": args.seed, "settings": settings,
              "sft_seconds": round(sft_seconds, 1), "grpo_seconds": round(grpo_seconds, 1), "summary": summary}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "healthy_ranges_tiny.json").write_text(json.dumps({**result, "steps": recorder.steps}, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
