"""End-to-end learning benchmark on the synthetic social world: SFT, then plain GRPO and GRPO-SGR.

1. Generates the world (:mod:`grasp_lightning.generators.world`) and its random-initialised tiny Qwen3-VL.
2. Trains SFT (``configs/world_sft.yaml``) from scratch, validating on the world's bench every
   ``--val-every`` steps and checkpointing at the same steps.
3. Takes the earliest SFT checkpoint whose bench accuracy reached ``--handoff-acc`` (a partially
   trained policy, as the paper's SFT warm-up), exports it as a Hugging Face directory, and from it
   trains plain GRPO (``configs/world_grpo.yaml``: accuracy + format) and GRPO-SGR
   (``configs/world_sgr.yaml``: + grounding presence + Social Grounding Reward) with equal budgets.
   The exported policy is also each run's reference model.
4. Prints one JSON line: held-out bench accuracy and grounding precision (paper, Figure 5) of the
   hand-off SFT policy, the fully trained SFT policy, GRPO and SGR, with wall-clock seconds per stage;
   writes ``world_seed<N>.json`` and the learning curves ``world_seed<N>.png`` under ``--results``.

Every stage runs as ``python -m grasp_lightning fit`` in a subprocess with ``OMP_NUM_THREADS`` set to
``--threads``; seconds are wall-clock and include validation. Usage (from the repository root)::

    python benchmarks/world.py --seed 0 [--sft-steps 900] [--rl-steps 150] [--work /tmp/grasp_world_bench]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("benchmarks.world")
TOL = 1e-6  #: accuracies read back from TensorBoard are float32


def export_policy(ckpt: Path, init_dir: Path, out_dir: Path) -> Path:
    """Export the policy of an SFT checkpoint as a Hugging Face directory with
    :func:`grasp_lightning.commands.export.export_checkpoint` (the world's model is float32, vision trained)."""
    from grasp_lightning.commands.export import export_checkpoint
    from grasp_lightning.policy import PolicyConfig

    policy = PolicyConfig(name_or_path=str(init_dir), dtype="float32", freeze_vision=False)
    return export_checkpoint(ckpt, out_dir, policy, overwrite=True)


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float, float]]:
    """``(step, value, wall_time)`` of a TensorBoard scalar in a run directory (empty if absent)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, float(e.value), e.wall_time) for e in acc.Scalars(tag)]


def fit(name: str, recipe: str, overrides: dict, work: Path, threads: int) -> tuple[Path, float, float]:
    """Run ``python -m grasp_lightning fit`` with a recipe plus an override file.

    Returns:
        ``(log dir, wall-clock seconds, start time as a Unix timestamp)``.

    Raises:
        RuntimeError: the run exited with an error (its log is ``<work>/<name>.log``).
    """
    shutil.rmtree(work / "runs" / name, ignore_errors=True)  # a rerun must not append to old event files
    override = work / f"{name}.override.yaml"
    override.write_text(yaml.safe_dump(overrides, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", GRASP_LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", str(ROOT / "configs" / recipe),
           "--config", str(override)]
    log.info("%s: %s", name, " ".join(cmd))
    started, t0 = time.time(), time.perf_counter()
    with open(work / f"{name}.log", "w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}); see {work / f'{name}.log'}")
    return work / "runs" / name / "version_0", seconds, started


def run_overrides(name: str, world: Path, policy: Path, work: Path, seed: int, steps: int, val_every: int,
                  callbacks: list | None = None) -> dict:
    """Override keys shared by the three stages (paths, steps, validation cadence, logger)."""
    trainer = {"max_steps": steps, "val_check_interval": val_every, "default_root_dir": str(work / "runs"),
               "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                          "init_args": {"save_dir": str(work / "runs"), "name": name, "version": 0}}}
    if callbacks is not None:
        trainer["callbacks"] = callbacks
    return {"seed_everything": seed, "trainer": trainer, "model": {"policy": {"name_or_path": str(policy)}},
            "data": {"root": str(world), "seed": seed}}


def summary(run: Path, started: float, at_step: int | None = None) -> dict:
    """Bench accuracy and grounding precision of a run at validation step ``at_step`` (default: the last),
    with the seconds from the run's start (``started``, a Unix timestamp) to that validation's end.

    Raises:
        RuntimeError: the run logged no bench accuracy.
    """
    acc = scalars(run, "val/acc/overall")
    prec = {s: v for s, v, _ in scalars(run, "val/grounding/precision")}
    if not acc:
        raise RuntimeError(f"{run}: no val/acc/overall logged")
    step, value, wall = next(a for a in acc if a[0] == at_step) if at_step is not None else acc[-1]
    return {"step": step + 1, "acc": round(value, 4), "grounding_precision": round(prec.get(step, float("nan")), 4),
            "seconds": round(wall - started, 1)}


def save_figure(fig, axes, path: Path) -> None:
    """Grid and legend on every axis, then write ``path`` (PNG, 100 dpi) and close the figure."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(path: Path, sft: Path, sft_started: float, grpo: Path, sgr: Path, handoff: dict, seed: int) -> None:
    """Learning curves: SFT bench accuracy over wall-clock seconds; GRPO vs SGR bench accuracy and
    grounding precision over RL steps (starting from the hand-off SFT checkpoint's values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    acc = scalars(sft, "val/acc/overall")
    prec = scalars(sft, "val/grounding/precision")
    axes[0].plot([a[2] - sft_started for a in acc], [a[1] for a in acc], "o-", label="SFT accuracy")
    axes[0].plot([a[2] - sft_started for a in prec], [a[1] for a in prec], "s--", label="SFT grounding precision")
    axes[0].axvline(handoff["seconds"], color="grey", ls="--", label=f"hand-off (step {handoff['step']})")
    axes[0].axhline(0.25, color="k", lw=0.5, ls=":", label="chance")
    axes[0].set(title=f"SFT from scratch (seed {seed})", xlabel="wall-clock seconds", ylabel="bench", ylim=(0, 1.02))
    for ax, tag, label in ((axes[1], "val/acc/overall", "bench accuracy"),
                           (axes[2], "val/grounding/precision", "grounding precision")):
        start = handoff["acc"] if tag.endswith("overall") else handoff["grounding_precision"]
        for run, name in ((grpo, "GRPO (accuracy + format)"), (sgr, "GRPO + SGR")):
            pts = scalars(run, tag)
            ax.plot([0] + [p[0] + 1 for p in pts], [start] + [p[1] for p in pts], "o-", label=name)
        ax.set(title=f"from SFT step {handoff['step']}", xlabel="RL step", ylabel=label, ylim=(0, 1.02))
    save_figure(fig, axes, path)


def add_sft_options(p: argparse.ArgumentParser, sft_steps: int, work: Path) -> None:
    """The options of :func:`sft_handoff` (shared with ``benchmarks/dynamic_sampling.py``)."""
    p.add_argument("--seed", type=int, default=0, help="seed of the world, the initial weights and training")
    p.add_argument("--train", type=int, default=8000, help="SFT clips (and as many RL clips)")
    p.add_argument("--bench", type=int, default=200, help="held-out bench clips")
    p.add_argument("--sft-steps", type=int, default=sft_steps, help="SFT optimizer steps (batch 32)")
    p.add_argument("--val-every", type=int, default=100, help="validate and checkpoint SFT every N steps")
    p.add_argument("--handoff-acc", type=float, default=0.5, help="hand off the first SFT checkpoint at this accuracy")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each stage")
    p.add_argument("--reuse-sft", action="store_true",
                   help="keep the world and the SFT run of an earlier call with the same --work and --seed "
                        "(rerun only the RL stages)")
    p.add_argument("--work", type=Path, default=work, help="scratch directory")


def sft_handoff(args: argparse.Namespace) -> dict:
    """Stages 1-3 of the module docstring up to the hand-off: the world, its initial model, the SFT run from
    scratch (or those of an earlier call, ``args.reuse_sft``), and the export of the first SFT checkpoint
    whose bench accuracy reached ``args.handoff_acc`` (the last one if none did).

    ``args`` holds ``seed, train, bench, sft_steps, val_every, handoff_acc, threads, reuse_sft, work``
    (:func:`main`'s options). Returns a dict with ``work, data, init, sft_run, sft_started`` (Unix time),
    ``sft_seconds, world_seconds``, the ``handoff`` summary (:func:`summary`) and the ``export`` directory.

    Raises:
        RuntimeError: the SFT run failed or logged no bench accuracy.
    """
    from grasp_lightning.generators import world as world_mod

    work = args.work / f"seed{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    data, init, stage = work / "world", work / "init", work / "sft_stage.json"
    if args.reuse_sft and stage.exists():
        done = json.loads(stage.read_text())
        gen_seconds, sft_s, sft_started = done["world_seconds"], done["seconds"], done["started"]
        sft_run = work / "runs" / "sft" / "version_0"
        log.info("reusing the world and the SFT run of %s", stage)
    else:
        t0 = time.perf_counter()
        world_mod.generate_world(data, seed=args.seed, n_train=args.train, n_bench=args.bench)
        world_mod.build_world_model(init, seed=args.seed)
        gen_seconds = time.perf_counter() - t0
        ckpt_cb = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": "{step}", "every_n_train_steps": args.val_every, "save_top_k": -1,
                                  "save_weights_only": True}},
                   {"class_path": "callbacks.bench.GraspBenchReport", "init_args": {"print_table": False}}]
        sft_overrides = run_overrides("sft", data, init, work, args.seed, args.sft_steps, args.val_every, ckpt_cb)
        sft_run, sft_s, sft_started = fit("sft", "world_sft.yaml", sft_overrides, work, args.threads)
        if not scalars(sft_run, "val/acc/overall"):  # before the stage is recorded for --reuse-sft
            raise RuntimeError(f"{sft_run}: SFT logged no val/acc/overall (--sft-steps {args.sft_steps} must be "
                               f">= --val-every {args.val_every})")
        stage.write_text(json.dumps({"world_seconds": gen_seconds, "seconds": sft_s, "started": sft_started}))
    acc = scalars(sft_run, "val/acc/overall")
    if not acc:
        raise RuntimeError(f"{sft_run}: SFT logged no val/acc/overall")
    # TensorBoard stores float32: 180/200 reads back as 0.8999999762, so compare with a tolerance
    hand = next((a for a in acc if a[1] >= args.handoff_acc - TOL), acc[-1])
    handoff = summary(sft_run, sft_started, at_step=hand[0])
    export = export_policy(sft_run / "checkpoints" / f"step={hand[0] + 1}.ckpt", init, work / "sft_export")
    return {"work": work, "data": data, "init": init, "sft_run": sft_run, "sft_started": sft_started,
            "sft_seconds": sft_s, "world_seconds": gen_seconds, "handoff": handoff, "export": export}


def main(argv: list[str] | None = None) -> None:
    """Command line; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sft_options(p, sft_steps=900, work=Path("/tmp/grasp_world_bench"))
    p.add_argument("--rl-steps", type=int, default=150, help="GRPO and SGR optimizer steps each (16 prompts x K=8)")
    p.add_argument("--rl-val-every", type=int, default=25, help="validate GRPO and SGR every N steps")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="where JSON and PNG go")
    args = p.parse_args(argv)
    if args.sft_steps < args.val_every:
        p.error(f"--sft-steps {args.sft_steps} < --val-every {args.val_every}: SFT would never be validated")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stage = sft_handoff(args)
    work, data, export, handoff = stage["work"], stage["data"], stage["export"], stage["handoff"]
    sft_run, sft_started, sft_s, gen_seconds = (stage["sft_run"], stage["sft_started"], stage["sft_seconds"],
                                                stage["world_seconds"])
    acc = scalars(sft_run, "val/acc/overall")
    from transformers import AutoModelForImageTextToText

    params = sum(t.numel() for t in AutoModelForImageTextToText.from_pretrained(export).parameters())
    result = {"seed": args.seed, "params": params, "threads": args.threads,
              "world": {"train": args.train, "bench": args.bench, "seconds": round(gen_seconds, 1)},
              "sft_handoff": handoff, "sft": summary(sft_run, sft_started)}
    result["sft"]["run_seconds"] = round(sft_s, 1)
    reached = [a for a in acc if a[1] >= 0.9 - TOL]
    result["sft"]["seconds_to_90"] = round(reached[0][2] - sft_started, 1) if reached else None
    result["sft"]["steps_to_90"] = reached[0][0] + 1 if reached else None
    for name, recipe in (("grpo", "world_grpo.yaml"), ("sgr", "world_sgr.yaml")):
        run, secs, started = fit(name, recipe, run_overrides(name, data, export, work, args.seed, args.rl_steps,
                                                             args.rl_val_every), work, args.threads)
        result[name] = summary(run, started)
        result[name].update(run_seconds=round(secs, 1), from_sft_step=handoff["step"])
    args.results.mkdir(parents=True, exist_ok=True)
    png = args.results / f"world_seed{args.seed}.png"
    plot(png, sft_run, sft_started, work / "runs" / "grpo" / "version_0", work / "runs" / "sgr" / "version_0",
         handoff, args.seed)
    result["curves_png"] = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
    (args.results / f"world_seed{args.seed}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
