"""Does GRPO learn? The tiny Qwen3-VL on the sample data, on CPU: a short SFT warm-up (so completions
have a format to reward), then GRPO with the SGR rewards; the mean total reward of the first 10
steps is compared with the last 10.

    python benchmarks/grpo_learning.py [--sft-steps 60] [--grpo-steps 80] [--out benchmarks/results]

Prints a JSON object as its last line with ``reward_first10`` and ``reward_last10`` and writes a PNG
of the reward curve next to the JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402

from grasp_lightning.data.datamodule_config import LoaderConfig, SourceConfig, VideoConfig
from grasp_lightning.datamodule import GraspDataModule  # noqa: E402
from grasp_lightning.engines.decoding import RolloutConfig  # noqa: E402
from grasp_lightning.module import GraspModule, OptimConfig  # noqa: E402
from grasp_lightning.policy import PolicyConfig  # noqa: E402
from grasp_lightning.tasks.grpo import GRPOTask, LossConfig, RewardConfig  # noqa: E402
from grasp_lightning.tasks.sft import SFTTask  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _data(train_file: str, mode: str, batch_size: int) -> GraspDataModule:
    """The bundled sample's rows (no bench), 8 frames of at most 4,096 pixels."""
    return GraspDataModule(source=SourceConfig(root=str(REPO / "grasp_lightning/assets/sample"), train_file=train_file,
                                               bench=None),
                           video=VideoConfig(max_frames=8, max_pixels=4096),
                           loader=LoaderConfig(data_mode=mode, batch_size=batch_size, num_workers=0, seed=0))


class RewardTrace(L.Callback):
    """Records the mean total reward of every GRPO step."""

    def __init__(self) -> None:
        self.rewards: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        if out is not None and "reward/mean" in out.metrics:
            self.rewards.append(float(out.metrics["reward/mean"]))


def _trainer(steps: int, callbacks: list) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_steps=steps, max_epochs=-1, logger=False, callbacks=callbacks,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--grpo-steps", type=int, default=80)
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
    with tempfile.TemporaryDirectory() as start:
        sft.policy.save_pretrained(start)
        sft.processor.save_pretrained(start)
        trace = RewardTrace()
        task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format", "grounding_presence", "social_grounding"],
                                             weights=[1.0, 0.1, 0.05, 0.2]),
                        loss=LossConfig(beta=0.05, type="grpo"))
        grpo = GraspModule(task, policy=PolicyConfig(name_or_path=start, dtype="float32"),
                           optim=OptimConfig(lr=args.lr, warmup_steps=5, scheduler="constant_with_warmup"),
                           rollout=RolloutConfig(num_generations=8, max_new_tokens=48))
        t1 = time.perf_counter()
        _trainer(args.grpo_steps, [trace]).fit(grpo, _data("train/data_rl.jsonl", "rl", 2))
        grpo_seconds = time.perf_counter() - t1
    rewards = trace.rewards
    if not rewards:
        raise SystemExit("no GRPO step logged a reward (--grpo-steps must be >= 1)")
    first, last = sum(rewards[:10]) / len(rewards[:10]), sum(rewards[-10:]) / len(rewards[-10:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, lw=1, label="mean reward per step")
    window = 10
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1])
              for i in range(len(rewards))]
    ax.plot(range(1, len(rewards) + 1), smooth, lw=2, label=f"{window}-step mean")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("total reward (SGR weights)")
    ax.set_title("tiny Qwen3-VL, sample data, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "grpo_learning.png", dpi=120)
    result = {"reward_first10": round(first, 4), "reward_last10": round(last, 4), "grpo_steps": len(rewards),
              "sft_steps": args.sft_steps, "sft_seconds": round(sft_seconds, 1),
              "grpo_seconds": round(grpo_seconds, 1), "seed": args.seed, "lr": args.lr,
              "plot": str(out / "grpo_learning.png")}
    (out / "grpo_learning.json").write_text(json.dumps({**result, "rewards": rewards}, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
