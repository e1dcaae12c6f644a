"""Does GRPO learn? The tiny Qwen3-VL on the sample data, on CPU: a short SFT warm-up (so completions
have a format to reward), then GRPO with the SGR rewards; the mean total reward of the first 10
steps is compared with the last 10.

    python benchmarks/grpo_learning.py [--sft-steps 60] [--grpo-steps 80] [--out benchmarks/results]

Prints a JSON object as its last line with ``reward_first10`` and ``reward_last10`` and writes a PNG
of the reward curve next to the JSON file.

``--loss-types``: every loss type (``all``: :data:`grasp_lightning.grpo.objective.LOSS_TYPES`, read when the
script runs) over the same ``--steps`` optimizer steps and the same ``--seeds``, from the tiny model as it is (no
SFT) with a reward its random samples already vary on (:func:`vowel_share`, the share of vowels among a
completion's letters; 2 prompts x K = 8, 16 new tokens, lr 1e-2, beta 0, each rollout batch used for
``--num-iterations`` 2 optimizer steps). With rollouts used once the ratio is 1 at every token, where every
loss type's gradient is ``A * grad log p`` up to how tokens are weighted, and with completions of equal
length (the tiny model runs to the budget) up to one constant factor, which AdamW removes: the types would
differ only through Adam's eps. The second use of each batch puts the ratios off 1, where the clip and the
types' own shapes act. Writes ``grpo_loss_types.json``
(every run's per-step rewards; per type the mean and spread over the seeds of the first and last
``--last`` steps' mean reward) and ``grpo_loss_types.png`` (per type the mean over seeds, a band from the
lowest to the highest seed) and prints the summary as its last line::

    python benchmarks/grpo_learning.py --loss-types all --seeds 0,1,2 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ is not installed
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402

from benchmarks.rollout_engines import vowel_share  # noqa: E402
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


#: Settings a loss type needs beyond ``type`` (docs/training.md, "The objective family"): cispo caps its weight
#: at ``epsilon_high`` (ScaleRL's 5.0); luspo takes the sequence-level ratio, as its paper does.
TYPE_SETTINGS: dict[str, dict] = {"cispo": {"epsilon_high": 5.0}, "luspo": {"ratio_level": "sequence"}}


def loss_type_run(loss_type: str, seed: int, args) -> tuple[list[float], float]:
    """``args.steps`` GRPO steps of ``loss_type`` from the tiny model, rewarded by :func:`vowel_share`: the mean
    reward of each step and the seconds the fit took."""
    from grasp_lightning.grpo import objective

    L.seed_everything(seed)
    trace = RewardTrace()
    task = GRPOTask(reward=RewardConfig(terms=[vowel_share], weights=[1.0]),
                    loss=LossConfig(beta=0.0, type=loss_type, num_iterations=args.num_iterations,
                                    **TYPE_SETTINGS.get(loss_type, {})))
    module = GraspModule(task, policy=PolicyConfig(name_or_path=str(REPO / "grasp_lightning/assets/tiny-qwen3vl"),
                                                   dtype="float32"),
                         optim=OptimConfig(lr=args.lr, warmup_steps=0),
                         rollout=RolloutConfig(num_generations=args.k, max_new_tokens=args.tokens, stop_at_answer=False))
    assert loss_type in objective.LOSS_TYPES
    t0 = time.perf_counter()
    _trainer(args.steps, [trace]).fit(module, _data("train/data_rl.jsonl", "rl", args.prompts))
    return trace.rewards, time.perf_counter() - t0


def compare_loss_types(args) -> None:
    """``--loss-types``: each type over the same steps and seeds; the JSON file, the plot, one summary line."""
    from grasp_lightning.grpo import objective

    types = list(objective.LOSS_TYPES) if args.loss_types == "all" else args.loss_types.split(",")
    seeds = [int(x) for x in args.seeds.split(",")]
    runs: dict[str, dict[str, list[float]]] = {}
    seconds: dict[str, float] = {}
    for loss_type in types:
        runs[loss_type], seconds[loss_type] = {}, 0.0
        for seed in seeds:
            rewards, took = loss_type_run(loss_type, seed, args)
            runs[loss_type][str(seed)] = [round(r, 4) for r in rewards]
            seconds[loss_type] += took
    last = min(args.last, args.steps)
    summary = {}
    for loss_type, by_seed in runs.items():
        firsts = [statistics.fmean(r[:last]) for r in by_seed.values()]
        lasts = [statistics.fmean(r[-last:]) for r in by_seed.values()]
        gains = [b - a for a, b in zip(firsts, lasts)]
        summary[loss_type] = {"first_mean": round(statistics.fmean(firsts), 4),
                              "last_mean": round(statistics.fmean(lasts), 4),
                              "last_std": round(statistics.stdev(lasts), 4) if len(lasts) > 1 else 0.0,
                              "last_min": round(min(lasts), 4), "last_max": round(max(lasts), 4),
                              "gain_mean": round(statistics.fmean(gains), 4),
                              "gain_min": round(min(gains), 4),
                              "s_per_step": round(seconds[loss_type] / (len(seeds) * args.steps), 2)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for loss_type, by_seed in runs.items():
        curves = list(by_seed.values())
        steps = range(1, min(len(c) for c in curves) + 1)
        per_step = [[c[i - 1] for c in curves] for i in steps]
        line, = ax.plot(steps, [statistics.fmean(v) for v in per_step], lw=1.8, label=loss_type)
        ax.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward (vowel share)")
    ax.set_title(f"tiny Qwen3-VL, CPU: mean of seeds {args.seeds}, band min-max")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "grpo_loss_types.png", dpi=120)
    settings = {"steps": args.steps, "seeds": seeds, "last": last, "prompts": args.prompts, "k": args.k,
                "max_new_tokens": args.tokens, "num_iterations": args.num_iterations, "lr": args.lr, "beta": 0.0, "reward": "vowel_share",
                "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    result = {"loss_types": summary, **settings, "plot": str(out / "grpo_loss_types.png")}
    (out / "grpo_loss_types.json").write_text(json.dumps({**result, "rewards": runs}, indent=1))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--grpo-steps", type=int, default=80)
    parser.add_argument("--lr", type=float, default=None, help="3e-4 (SGR run); 1e-2 with --loss-types")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO / "benchmarks/results"))
    parser.add_argument("--loss-types", default=None, help="all, or a comma list: compare the loss types")
    parser.add_argument("--seeds", default="0,1,2", help="with --loss-types: the seeds of every type")
    parser.add_argument("--steps", type=int, default=20, help="with --loss-types: GRPO steps of every run")
    parser.add_argument("--last", type=int, default=5, help="with --loss-types: steps averaged at the start and end")
    parser.add_argument("--prompts", type=int, default=2, help="with --loss-types: prompts per step")
    parser.add_argument("--k", type=int, default=8, help="with --loss-types: completions per prompt")
    parser.add_argument("--tokens", type=int, default=16, help="with --loss-types: new tokens at most")
    parser.add_argument("--num-iterations", type=int, default=2,
                        help="with --loss-types: optimizer steps per rollout batch (1: every ratio is 1)")
    args = parser.parse_args()
    if args.loss_types:
        args.lr = 1e-2 if args.lr is None else args.lr
        compare_loss_types(args)
        return
    args.lr = 3e-4 if args.lr is None else args.lr
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
