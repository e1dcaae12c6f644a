"""Does ``dynamic_sampling: refill`` learn in fewer optimizer steps than ``drop``? GRPO on the synthetic world.

1. The world, its tiny Qwen3-VL and SFT from scratch to the hand-off checkpoint, as the synthetic-world
   experiment's ``experiments/world/run.py`` (:func:`experiments.world.run.sft_handoff`; ``--reuse-sft`` keeps
   an earlier call's).
2. From that export, one plain GRPO run (``experiments/world/configs/grpo.yaml``: accuracy + format, 16 prompts x K = 8
   per optimizer step) per ``--arms`` entry, equal optimizer steps and seeds, differing only in
   ``model.task.init_args.batching.dynamic_sampling``. ``drop`` masks the groups whose rewards are all equal out of
   the loss; ``refill`` draws further windows of 16 prompts from the data stream (at most
   ``--max-resample`` per step) until 16 useful groups are in the batch (DAPO's dynamic sampling).
3. Compares the arms per optimizer step on two measures that selection cannot bias:
   - ``dynamic_sampling/reward_mean_tried``: the mean reward of every group sampled at the step, before any
     is left out (the policy's reward on fresh prompts; ``reward/mean`` is over the groups trained on, which
     under ``drop`` are all the groups tried, so that arm logs only ``reward/mean``);
   - held-out bench accuracy (``val/acc/overall``, greedy, every ``--rl-val-every`` steps).

   For each: the target is the ``drop`` arm's final value (the mean of its last ``--window`` logged rewards;
   its last bench accuracy), and ``steps_to_target`` is the first optimizer step at which each arm's
   moving mean (bench: its value) reaches it, with the completions it had sampled by then. Refill samples
   more per step, so both steps and completions are reported.

Prints one JSON line and writes ``dynamic_sampling_seed<N>.json`` and ``.png`` under ``--results``. Each
stage is ``python -m grasp_lightning fit`` in a subprocess (``OMP_NUM_THREADS`` = ``--threads``)::

    python benchmarks/dynamic_sampling.py --seed 0 [--sft-steps 300] [--rl-steps 100] [--arms drop,refill]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: experiments/ is not installed

from experiments.world.run import (  # noqa: E402
    CONFIGS,
    ROOT,
    add_sft_options,
    fit,
    run_overrides,
    save_figure,
    scalars,
    sft_handoff,
)

log = logging.getLogger("benchmarks.dynamic_sampling")
ARMS = ("off", "drop", "refill")


def moving_mean(points: list[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """``(step, mean of the last `window` values up to it)`` for each point (fewer at the start)."""
    out = []
    for i, (step, _) in enumerate(points):
        chunk = [v for _, v in points[max(0, i - window + 1): i + 1]]
        out.append((step, sum(chunk) / len(chunk)))
    return out


def first_reaching(points: list[tuple[int, float]], target: float) -> int | None:
    """The first step whose value is at least ``target`` (1e-6 slack: TensorBoard stores float32), or None."""
    return next((step for step, v in points if v >= target - 1e-6), None)


def arm_series(run: Path, k: int) -> dict:
    """Per optimizer step (1-based) of a GRPO run: reward over the groups tried, groups tried and kept,
    completions sampled so far; bench accuracy at each validation.

    Raises:
        RuntimeError: the run logged neither ``dynamic_sampling/reward_mean_tried`` (refill) nor ``reward/mean``.
    """
    # refill logs the reward over every group tried; with drop every group tried is trained: train/reward/mean
    tried = [(s + 1, v) for s, v, _ in (scalars(run, "train/dynamic_sampling/reward_mean_tried")
                                        or scalars(run, "train/reward/mean"))]
    if not tried:
        raise RuntimeError(f"{run}: neither train/dynamic_sampling/reward_mean_tried nor train/reward/mean logged")
    groups = {s + 1: v for s, v, _ in scalars(run, "train/dynamic_sampling/groups_tried")}
    kept = {s + 1: v for s, v, _ in scalars(run, "train/dynamic_sampling/groups_kept")}
    sampled, completions = 0.0, {}
    for step in sorted(groups):
        sampled += groups[step] * k
        completions[step] = sampled
    bench = [(s + 1, v) for s, v, _ in scalars(run, "val/acc/overall")]
    return {"reward_tried": tried, "groups_tried": groups, "groups_kept": kept, "completions": completions,
            "bench_acc": bench}


def plot(path: Path, series: dict[str, dict], handoff: dict, window: int, seed: int) -> None:
    """Reward over the groups tried (moving mean) and bench accuracy against optimizer steps, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, s in series.items():
        pts = moving_mean(s["reward_tried"], window)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], label=arm)
        axes[1].plot([0] + [p[0] for p in s["bench_acc"]], [handoff["acc"]] + [p[1] for p in s["bench_acc"]], "o-",
                     label=arm)
    axes[0].set(title=f"reward of every group sampled ({window}-step mean)", xlabel="optimizer step",
                ylabel="accuracy + 0.1 format")
    axes[1].set(title=f"held-out bench, from SFT step {handoff['step']} (seed {seed})", xlabel="optimizer step",
                ylabel="accuracy", ylim=(0, 1.02))
    save_figure(fig, axes, path)


def main(argv: list[str] | None = None) -> None:
    """Command line; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sft_options(p, sft_steps=1200, work=Path("/tmp/grasp_dynamic_sampling"))  # batch 8: the 300 x 32 clips it was measured with
    p.add_argument("--rl-steps", type=int, default=100, help="GRPO optimizer steps per arm (16 prompts x K=8)")
    p.add_argument("--rl-val-every", type=int, default=20, help="validate each arm every N steps")
    p.add_argument("--arms", default="drop,refill", help=f"comma-separated dynamic_sampling modes of {ARMS}")
    p.add_argument("--max-resample", type=int, default=4, help="refill: further windows drawn per step at most")
    p.add_argument("--window", type=int, default=10, help="steps in the moving mean of the tried reward")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="where JSON and PNG go")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        p.error(f"--arms: {bad or arms!r} not among {ARMS}")
    if args.max_resample < 0 or args.window < 1 or args.rl_steps < 1 or args.rl_val_every < 1:
        p.error("--max-resample must be >= 0 and --window, --rl-steps, --rl-val-every >= 1")
    if args.sft_steps < args.val_every:
        p.error(f"--sft-steps {args.sft_steps} < --val-every {args.val_every}: SFT would never be validated")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stage = sft_handoff(args)
    work, handoff = stage["work"], stage["handoff"]
    import yaml

    k = yaml.safe_load((CONFIGS / "grpo.yaml").read_text())["model"]["rollout"]["num_generations"]
    result = {"seed": args.seed, "threads": args.threads, "sft_handoff": handoff, "rl_steps": args.rl_steps,
              "max_resample": args.max_resample, "window": args.window, "arms": {}}
    series = {}
    for arm in arms:
        name = f"grpo_{arm}"
        overrides = run_overrides(name, stage["data"], stage["export"], work, args.seed, args.rl_steps,
                                  args.rl_val_every)
        overrides["trainer"]["log_every_n_steps"] = 1
        overrides["model"]["task"] = {"init_args": {"batching": {"dynamic_sampling": arm,
                                                                  "max_resample": args.max_resample}}}
        run, secs, _ = fit(name, "grpo.yaml", overrides, work, args.threads)
        s = series[arm] = arm_series(run, k)
        steps = len(s["reward_tried"])
        result["arms"][arm] = {
            "run_seconds": round(secs, 1), "steps": steps,
            "groups_tried_per_step": round(sum(s["groups_tried"].values()) / max(1, len(s["groups_tried"])), 3),
            "kept_fraction": round(sum(s["groups_kept"].values()) / max(1.0, sum(s["groups_tried"].values())), 4),
            "completions": int(max(s["completions"].values(), default=0)),
            "reward_tried_first": round(moving_mean(s["reward_tried"][:args.window], args.window)[-1][1], 4),
            "reward_tried_last": round(moving_mean(s["reward_tried"], args.window)[-1][1], 4),
            "bench_acc": [[step, round(v, 4)] for step, v in s["bench_acc"]]}
    if "drop" in series:
        base = result["arms"]["drop"]
        targets = {"reward_tried": base["reward_tried_last"],
                   "bench_acc": series["drop"]["bench_acc"][-1][1] if series["drop"]["bench_acc"] else None}
        comparison = {"targets (drop's final values)": targets}
        for arm, s in series.items():
            reward_step = first_reaching(moving_mean(s["reward_tried"], args.window), targets["reward_tried"])
            bench_step = (first_reaching(s["bench_acc"], targets["bench_acc"])
                          if targets["bench_acc"] is not None else None)
            comparison[arm] = {
                "steps_to_target_reward": reward_step,
                "completions_to_target_reward": int(s["completions"].get(reward_step, 0)) if reward_step else None,
                "steps_to_target_bench_acc": bench_step,
                "completions_to_target_bench_acc": (int(s["completions"].get(bench_step, 0)) if bench_step else None)}
        if "refill" in series:
            r, d = comparison["refill"], comparison["drop"]
            comparison["refill_fewer_steps_to_reward"] = (r["steps_to_target_reward"] is not None
                                                          and r["steps_to_target_reward"] < d["steps_to_target_reward"])
            comparison["refill_fewer_steps_to_bench_acc"] = (
                r["steps_to_target_bench_acc"] is not None and d["steps_to_target_bench_acc"] is not None
                and r["steps_to_target_bench_acc"] < d["steps_to_target_bench_acc"])
        result["comparison"] = comparison
    args.results.mkdir(parents=True, exist_ok=True)
    png = args.results / f"dynamic_sampling_seed{args.seed}.png"
    plot(png, series, handoff, args.window, args.seed)
    result["curves_png"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    (args.results / f"dynamic_sampling_seed{args.seed}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
