"""End-to-end learning benchmark on the synthetic social world, on every seed: SFT from scratch, and the
paper's ordering (plain GRPO < GRPO-SGR) on a world with a language shortcut, plus a temporal grounding arm.

For each seed of ``--seeds``:

1. **Base world SFT** (:mod:`experiments.world.world`, categories T1 T4 T6 G1 G2): generates the
   world and its random-initialised tiny Qwen3-VL, trains SFT (``configs/sft.yaml``) from scratch,
   validating on the held-out bench every ``--val-every`` steps. Reported: the last validation and the last
   one within 10 minutes (``within_10_min``), seconds and steps to 0.90, every category's accuracy.

For each seed of ``--rl-seeds`` (default: the first three):

2. **Shortcut world** (``WorldOptions(shortcut=0.7, temporal=True, shortcut_reasoning=True)``: J3 "When
   Person p points at x, who or what does Person g look at?", where the gaze follows the point in 70 % of the
   training clips and in none of the bench's, and whose training SFT targets state the prior where it holds,
   "<gesture>Person p points at x.</gesture><gaze>Person g looks at x.</gaze>"; ``--no-shortcut-reasoning``
   keeps the gaze sentence alone; and T3 time questions on 4-s clips): SFT for ``--rl-sft-steps``, the first
   checkpoint at ``--handoff-acc`` exported (a partially trained policy, as the paper's SFT warm-up; with
   ``--handoff-by prior``, of the checkpoints at ``--handoff-acc`` or above, the one whose J3 bench answers
   pick the pointed-at target most often, where the shortcut binds most), the
   shortcut prior's accuracy measured on the training and bench J3 clips, with the share of training
   targets stating it.
3. From that one checkpoint, with equal budgets (``--rl-steps`` of 16 prompts x K=8): plain GRPO
   (``configs/grpo.yaml``: accuracy + format), GRPO-SGR (``configs/sgr.yaml``: + grounding
   presence + Social Grounding Reward), GRPO-SGR + temporal (``configs/temporal.yaml``: + the
   temporal IoU term) and GRPO-SGR by modality (``configs/sgr_modal.yaml``: the grounding reward
   ``social_grounding_by_modality``, gaze events matched in ``<gaze>`` blocks only). The exported policy is each run's reference model. Reported per arm: bench
   accuracy, J3 accuracy (the shortcut-breaking split), T3 accuracy, grounding precision (paper, Figure 5),
   enumeration rate (completions naming every person the item shows), temporal IoU and the share of J3
   completions that state the prior (``J3_stating_prior``: a ``<gesture>`` block naming the point) or answer
   with the pointed-at target (``J3_following_point``).

Prints one JSON line ``{"per_seed": {...}, "summary": {...}}``; the summary holds min / median / max over
seeds, with ``sft_acc_min`` (lowest held-out SFT accuracy within 10 minutes) and ``sgr_minus_grpo_acc_min``
(lowest per-seed gap in J3 accuracy). Writes ``world_seed<N>.json`` and the curves ``world_seed<N>.png`` per
seed (``world_seed<N>_shortcut.png`` for the RL curves when the base-world figures were kept, ``--skip-sft``),
``world.json`` and the tables ``world.md`` under ``--results``.

Every stage runs as ``python -m grasp_lightning fit`` in a subprocess with ``OMP_NUM_THREADS`` set to
``--threads``; seconds are wall-clock and include validation. Usage (from the repository root)::

    python experiments/world/run.py --seeds 0 1 2 3 4 [--sft-steps 900] [--rl-steps 100] [--work /tmp/grasp_world_bench]

Stages can be run apart and joined: ``--skip-sft`` runs the RL comparison alone and keeps the base-world
SFT figures already in ``--results``; ``--reuse-sft --reuse-rl`` reads back the finished runs of ``--work``;
``--arms grpo sgr_modal`` runs only those arms (a summary key needs both of its arms on every seed).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  #: the repository root: the runs' working directory, on their Python path
CONFIGS = HERE / "configs"  #: the experiment's recipes (a recipe name is a file here)
RESULTS = HERE / "results"  #: the default ``--results``: the committed figures
_RESULTS_IN_REPO = RESULTS.relative_to(ROOT).as_posix()
if str(ROOT) not in sys.path:  # run as a script (python experiments/world/run.py): import experiments.world
    sys.path.insert(0, str(ROOT))
log = logging.getLogger("experiments.world.run")
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


def fit(name: str, recipe: str | tuple[str, ...], overrides: dict, work: Path, threads: int) -> tuple[Path, float, float]:
    """Run ``python -m grasp_lightning fit`` with a recipe (or several, in order: overlays last) plus an override file.

    Returns:
        ``(log dir, wall-clock seconds, start time as a Unix timestamp)``.

    Raises:
        RuntimeError: the run exited with an error (its log is ``<work>/<name>.log``).
    """
    shutil.rmtree(work / "runs" / name, ignore_errors=True)  # a rerun must not append to old event files
    (work / f"{name}.done.json").unlink(missing_ok=True)  # written again only when this run succeeds
    override = work / f"{name}.override.yaml"
    override.write_text(yaml.safe_dump(overrides, sort_keys=False))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", GRASP_LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    recipes = (recipe,) if isinstance(recipe, str) else recipe
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", *(a for r in recipes for a in ("--config", str(CONFIGS / r))),
           "--config", str(override)]
    log.info("%s: %s", name, " ".join(cmd))
    started, t0 = time.time(), time.perf_counter()
    with open(work / f"{name}.log", "w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}); see {work / f'{name}.log'}")
    (work / f"{name}.done.json").write_text(json.dumps({"seconds": seconds, "started": started}))
    return work / "runs" / name / "version_0", seconds, started


def finished_run(name: str, work: Path, steps: int, from_step: int | None = None) -> tuple[Path, float, float] | None:
    """An earlier :func:`fit` of ``name`` in ``work`` that ran all ``steps`` (its last validation at step
    ``steps``), as ``(log dir, seconds, start time)`` with the times :func:`fit` recorded
    (``<name>.done.json``), or ``None``. With ``from_step``, also ``None`` unless the run recorded that it
    started from that SFT hand-off step (``from_sft_step``, written by :func:`shortcut_rl`)."""
    run, done = work / "runs" / name / "version_0", work / f"{name}.done.json"
    acc = scalars(run, "val/acc/overall") if run.is_dir() and done.exists() else []
    if not acc or acc[-1][0] + 1 < steps:
        return None
    times = json.loads(done.read_text())
    if from_step is not None and times.get("from_sft_step") != from_step:
        log.info("not reusing %s: it started from SFT step %s, the hand-off is now step %d", run,
                 times.get("from_sft_step", "(not recorded)"), from_step)
        return None
    log.info("reusing the finished %s run %s (%d steps)", name, run, acc[-1][0] + 1)
    return run, times["seconds"], times["started"]


def run_overrides(name: str, world: Path, policy: Path, work: Path, seed: int, steps: int, val_every: int,
                  callbacks: list | None = None) -> dict:
    """Override keys shared by the three stages (paths, steps, validation cadence, logger)."""
    trainer = {"max_steps": steps, "val_check_interval": val_every, "default_root_dir": str(work / "runs"),
               "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                          "init_args": {"save_dir": str(work / "runs"), "name": name, "version": 0}}}
    if callbacks is not None:
        trainer["callbacks"] = callbacks
    return {"seed_everything": seed, "trainer": trainer, "model": {"policy": {"name_or_path": str(policy)}},
            "data": {"source": {"root": str(world)}, "loader": {"seed": seed}}}


def states_prior(text: str) -> bool:
    """Whether a ``J3`` reasoning or completion states the shortcut prior: it names the point in a
    ``<gesture>`` block (``WorldOptions.shortcut_reasoning``'s targets do; reading the gaze needs no point)."""
    from grasp_lightning.parsing import tag_contents

    return any("points at" in block for block in tag_contents(text, "gesture"))


def prior_rate(run: Path, step: int) -> float | None:
    """Share of the ``J3`` bench completions of validation step ``step`` (1-based, as :func:`summary`'s ``step``)
    that state the shortcut prior (:func:`states_prior`), from ``bench/step_<step>/results.json``
    (:class:`grasp_lightning.callbacks.eval_reports.EvalReports`); ``None`` without that file or without ``J3`` items."""
    path = run / "bench" / f"step_{step}" / "results.json"
    if not path.exists():
        return None
    j3 = [item for item in json.loads(path.read_text())["items"] if item["category"] == "J3"]
    return round(sum(states_prior(item["completion"]) for item in j3) / len(j3), 4) if j3 else None


def following_rate(run: Path, step: int, seed: int, options) -> float | None:
    """Share of the ``J3`` bench completions of validation step ``step`` (1-based) whose answer letter is the
    pointed-at target's: the shortcut prior's answer (:func:`experiments.world.world.shortcut_prior`),
    wrong on every bench item of the shortcut-breaking split. Each item is rebuilt from its uid
    (``world<seed>_b<k>_...``) with :func:`~experiments.world.world.make_world_entry` and ``options``
    (the world's :class:`~experiments.world.world.WorldOptions`). ``None`` without the results file or ``J3``.

    Raises:
        ValueError: an item's uid is not a bench clip of the world.
    """
    from experiments.world import world as world_mod

    path = run / "bench" / f"step_{step}" / "results.json"
    if not path.exists():
        return None
    picks = []
    for item in json.loads(path.read_text())["items"]:
        if item["category"] != "J3":
            continue
        found = re.fullmatch(rf"world{seed}_b(\d+)_qa\d+", item["uid"])
        if found is None:
            raise ValueError(f"{path}: J3 item {item['uid']!r} is not a bench clip of world seed {seed}")
        entry = world_mod.make_world_entry(seed, "b", int(found.group(1)), options)
        prior = world_mod.shortcut_prior(entry.question)
        (letter,) = [o.split(")", 1)[0] for o in entry.options if o.split(") ", 1)[1] == prior]
        picks.append(item["predicted"] == letter)
    return round(sum(picks) / len(picks), 4) if picks else None


def summary(run: Path, started: float, at_step: int | None = None) -> dict:
    """Bench accuracy, grounding precision, enumeration rate and temporal IoU of a run at validation step
    ``at_step`` (default: the last), every category's accuracy (``categories``), and the seconds from the run's
    start (``started``, a Unix timestamp) to that validation's end. A metric the run did not log is ``None``.

    Raises:
        RuntimeError: the run logged no bench accuracy.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})  # read the event files once
    events.Reload()
    tags = set(events.Tags()["scalars"])
    if "val/acc/overall" not in tags:
        raise RuntimeError(f"{run}: no val/acc/overall logged")
    acc = [(e.step, float(e.value), e.wall_time) for e in events.Scalars("val/acc/overall")]
    step, value, wall = next(a for a in acc if a[0] == at_step) if at_step is not None else acc[-1]

    def at(tag: str) -> float | None:
        found = [e.value for e in events.Scalars(tag) if e.step == step] if tag in tags else []
        return None if not found or math.isnan(found[-1]) else round(float(found[-1]), 4)

    cats = sorted(t.split("/", 1)[1] for t in tags if t.startswith("val_category/"))
    return {"step": step + 1, "J3_stating_prior": prior_rate(run, step + 1), "acc": round(value, 4), "grounding_precision": at("val/grounding/precision"),
            "enumeration_rate": at("val/grounding/enumeration_rate"), "temporal_iou": at("val/grounding/temporal_iou"),
            "categories": {c: at(f"val_category/{c}") for c in cats}, "seconds": round(wall - started, 1)}


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


def _curve(ax, run: Path, tag: str, start: float | None, label: str) -> None:
    """Plot a run's validation scalar over RL steps, from the hand-off value ``start`` at step 0."""
    pts = scalars(run, tag)
    xs, ys = [p[0] + 1 for p in pts], [p[1] for p in pts]
    if start is not None:
        xs, ys = [0] + xs, [start] + ys
    ax.plot(xs, ys, "o-", label=label)


def plot(path: Path, seed: int, sft: tuple[Path, float] | None, rl: dict | None) -> None:
    """Learning curves of one seed: base-world SFT bench accuracy (and T4) over wall-clock seconds; on the
    shortcut world, accuracy on the shortcut-breaking split (J3), grounding precision and T3 accuracy over RL
    steps of every RL arm, from the hand-off checkpoint's values (``rl``: ``{"handoff": summary, "runs":
    {name: run dir}, "sft_run": run dir}``). Without ``sft`` the first panel shows the shortcut world's SFT;
    without ``rl`` the figure is that one SFT panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if rl is not None else 1, figsize=(20, 4) if rl is not None else (6, 4), squeeze=False)
    axes = list(axes[0])
    if sft is not None:
        run, started = sft
        for tag, style, label in (("val/acc/overall", "o-", "SFT accuracy"), ("val_category/T4", "s--", "T4 (mutual gaze)"),
                                  ("val/grounding/precision", "^:", "grounding precision")):
            pts = scalars(run, tag)
            axes[0].plot([p[2] - started for p in pts], [p[1] for p in pts], style, label=label)
        axes[0].axhline(0.9, color="grey", lw=0.8, ls="--", label="target 0.90")
        axes[0].axvline(600, color="k", lw=0.5, ls=":", label="10 minutes")
        axes[0].set(title=f"SFT from scratch, base world (seed {seed})", xlabel="wall-clock seconds", ylabel="bench",
                    ylim=(0, 1.02))
    elif rl is not None:  # the base-world curves are in another figure: show the shortcut world's SFT
        for tag, style, label in (("val/acc/overall", "o-", "SFT accuracy"), ("val_category/J3", "s--", "J3"),
                                  ("val_category/T3", "^:", "T3")):
            pts = scalars(rl["sft_run"], tag)
            axes[0].plot([p[0] + 1 for p in pts], [p[1] for p in pts], style, label=label)
        axes[0].axvline(rl["handoff"]["step"], color="k", lw=0.5, ls=":", label="hand-off")
        axes[0].set(title=f"SFT from scratch, shortcut world (seed {seed})", xlabel="SFT step", ylabel="bench",
                    ylim=(0, 1.02))
    if rl is not None:
        panels = ((axes[1], "val_category/J3", "J3: shortcut-breaking split"),
                  (axes[2], "val/grounding/precision", "grounding precision"),
                  (axes[3], "val_category/T3", "T3: time questions"))
        hand = rl["handoff"]
        starts = {"val_category/J3": hand["categories"].get("J3"), "val_category/T3": hand["categories"].get("T3"),
                  "val/grounding/precision": hand["grounding_precision"]}
        for ax, tag, title in panels:
            for name, run in rl["runs"].items():
                _curve(ax, run, tag, starts[tag], ARMS[name][1])
            ax.set(title=f"shortcut world: {title}", xlabel="RL step (from the SFT hand-off)", ylim=(0, 1.02))
    save_figure(fig, axes, path)


def add_sft_options(p: argparse.ArgumentParser, sft_steps: int, work: Path, val_every: int = 100) -> None:
    """The options of :func:`sft_handoff` (shared with ``benchmarks/dynamic_sampling.py``)."""
    p.add_argument("--seed", type=int, default=0, help="seed of the world, the initial weights and training")
    p.add_argument("--train", type=int, default=8000, help="SFT clips (and as many RL clips)")
    p.add_argument("--bench", type=int, default=200, help="held-out bench clips")
    p.add_argument("--sft-steps", type=int, default=sft_steps, help="SFT optimizer steps (batch: configs/sft.yaml)")
    p.add_argument("--val-every", type=int, default=val_every, help="validate and checkpoint SFT every N steps")
    p.add_argument("--handoff-acc", type=float, default=0.5, help="hand off the first SFT checkpoint at this accuracy")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each stage")
    p.add_argument("--reuse-sft", action="store_true",
                   help="keep the world and the SFT run of an earlier call with the same --work and --seed "
                        "(rerun only the RL stages)")
    p.add_argument("--work", type=Path, default=work, help="scratch directory")


def sft_handoff(args: argparse.Namespace, options=None, tag: str = "", sft_steps: int | None = None,
                n_bench: int | None = None, n_train: int | None = None, n_rl: int | None = None,
                by_prior: bool = False) -> dict:
    """Stages 1-3 of the module docstring up to the hand-off: the world, its initial model, the SFT run from
    scratch (or those of an earlier call, ``args.reuse_sft``), and the export of the first SFT checkpoint
    whose bench accuracy reached ``args.handoff_acc`` (the last one if none did). With ``by_prior`` (a world
    with ``J3``), of the checkpoints at ``args.handoff_acc`` or above the one whose ``J3`` bench answers pick
    the pointed-at target most often (:func:`following_rate`; the first of equals): where the shortcut binds most.

    ``args`` holds ``seed, train, bench, sft_steps, val_every, handoff_acc, threads, reuse_sft, work``
    (:func:`main`'s options); ``options`` the world's :class:`~experiments.world.world.WorldOptions`
    (default: the base world), ``tag`` the suffix of its scratch directory ``<work>/seed<N><tag>``,
    ``sft_steps``, ``n_bench`` and ``n_train`` override ``args.sft_steps``, ``args.bench`` and ``args.train``; ``n_rl``
    is the number of RL clips (default ``n_train``; 0 for a world trained by SFT only). Returns a dict with
    ``work, data, init, sft_run, sft_started`` (Unix time), ``sft_seconds, world_seconds``, the ``handoff``
    summary (:func:`summary`), the ``export`` directory and the shortcut prior's accuracy on the training
    and bench splits (``prior_acc``; ``None`` without J3).

    Raises:
        RuntimeError: the SFT run failed or logged no bench accuracy.
    """
    from experiments.world import world as world_mod

    options = options or world_mod.WorldOptions()
    steps = args.sft_steps if sft_steps is None else sft_steps
    n_bench = args.bench if n_bench is None else n_bench
    n_train = args.train if n_train is None else n_train
    work = args.work / f"seed{args.seed}{tag}"
    work.mkdir(parents=True, exist_ok=True)
    data, init, stage = work / "world", work / "init", work / "sft_stage.json"
    if args.reuse_sft and stage.exists():
        done = json.loads(stage.read_text())
        gen_seconds, sft_s, sft_started = done["world_seconds"], done["seconds"], done["started"]
        sft_run = work / "runs" / "sft" / "version_0"
        log.info("reusing the world and the SFT run of %s", stage)
    else:
        t0 = time.perf_counter()
        world_mod.generate_world(data, seed=args.seed, n_train=n_train, n_bench=n_bench, n_rl=n_rl, options=options)
        world_mod.build_world_model(init, seed=args.seed, options=options)
        gen_seconds = time.perf_counter() - t0
        ckpt_cb = [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"filename": "{step}", "every_n_train_steps": args.val_every, "save_top_k": -1,
                                  "save_weights_only": True}},
                   {"class_path": "grasp_lightning.callbacks.eval_reports.EvalReports", "init_args": {"print_table": False}}]
        sft_overrides = run_overrides("sft", data, init, work, args.seed, steps, args.val_every, ckpt_cb)
        sft_run, sft_s, sft_started = fit("sft", "sft.yaml", sft_overrides, work, args.threads)
        if not scalars(sft_run, "val/acc/overall"):  # before the stage is recorded for --reuse-sft
            raise RuntimeError(f"{sft_run}: SFT logged no val/acc/overall (--sft-steps {steps} must be "
                               f">= --val-every {args.val_every})")
        stage.write_text(json.dumps({"world_seconds": gen_seconds, "seconds": sft_s, "started": sft_started}))
    acc = scalars(sft_run, "val/acc/overall")
    if not acc:
        raise RuntimeError(f"{sft_run}: SFT logged no val/acc/overall")
    # TensorBoard stores float32: 180/200 reads back as 0.8999999762, so compare with a tolerance
    hand = next((a for a in acc if a[1] >= args.handoff_acc - TOL), acc[-1])
    if by_prior:
        if options.shortcut is None:
            raise ValueError("a hand-off by the shortcut prior needs a world with J3 (WorldOptions.shortcut)")
        eligible = [a for a in acc if a[1] >= args.handoff_acc - TOL] or [hand]
        hand = max(eligible, key=lambda a: following_rate(sft_run, a[0] + 1, args.seed, options) or 0.0)
    handoff = summary(sft_run, sft_started, at_step=hand[0])
    export = export_policy(sft_run / "checkpoints" / f"step={hand[0] + 1}.ckpt", init, work / "sft_export")
    prior = None
    if options.shortcut is not None:
        entries = {split: [world_mod.make_world_entry(args.seed, split, k, options) for k in range(n)
                           if options.category(split, k) == "J3"]
                   for split, n in (("t", n_train), ("b", n_bench))}
        prior = {"train": world_mod.prior_accuracy(entries["t"]), "bench": world_mod.prior_accuracy(entries["b"]),
                 "train_targets_stating_it": round(sum(states_prior(e.response) for e in entries["t"])
                                                   / max(1, len(entries["t"])), 4)}
    return {"work": work, "data": data, "init": init, "sft_run": sft_run, "sft_started": sft_started,
            "sft_seconds": sft_s, "world_seconds": gen_seconds, "handoff": handoff, "export": export,
            "prior_acc": prior}


#: The RL arms of the shortcut world: name -> (recipes, label); equal budgets, the same SFT hand-off.
ARMS = {
    "grpo": (("grpo.yaml",), "GRPO (accuracy + format)"),
    "sgr": (("sgr.yaml",), "GRPO + SGR"),
    "sgr_temporal": (("sgr.yaml", "temporal.yaml"), "GRPO + SGR + temporal"),
    "sgr_modal": (("sgr.yaml", "sgr_modal.yaml"), "GRPO + SGR by modality"),
}


def base_sft(args: argparse.Namespace) -> dict:
    """The base world's SFT from scratch (target: held-out accuracy >= 0.90, T4 >= 0.85, within 10 minutes)."""
    stage = sft_handoff(args, n_rl=0)  # SFT only: no RL clips to write
    run, started = stage["sft_run"], stage["sft_started"]
    acc = scalars(run, "val/acc/overall")
    out = summary(run, started)
    out["run_seconds"] = round(stage["sft_seconds"], 1)
    out["world_seconds"] = round(stage["world_seconds"], 1)
    reached = [a for a in acc if a[1] >= 0.9 - TOL]
    out["seconds_to_90"] = round(reached[0][2] - started, 1) if reached else None
    out["steps_to_90"] = reached[0][0] + 1 if reached else None
    within = [a for a in acc if a[2] - started <= 600.0]  # the last validation within 10 minutes
    out["within_10_min"] = summary(run, started, at_step=within[-1][0]) if within else None
    return {"stage": stage, "summary": out}


def shortcut_rl(args: argparse.Namespace) -> dict:
    """On the shortcut (and temporal) world: SFT to the hand-off, then every arm of :data:`ARMS` from it."""
    from experiments.world.world import WorldOptions

    options = WorldOptions(shortcut=args.shortcut, temporal=not args.no_temporal,
                           shortcut_reasoning=args.shortcut_reasoning)
    stage = sft_handoff(args, options, tag="_shortcut", sft_steps=args.rl_sft_steps, n_bench=args.rl_bench,
                        n_train=args.rl_train, by_prior=args.handoff_by == "prior")
    work, data, export, handoff = stage["work"], stage["data"], stage["export"], stage["handoff"]
    out = {"prior_acc": stage["prior_acc"], "sft_handoff": dict(handoff, handoff_by=args.handoff_by),
           "sft": summary(stage["sft_run"], stage["sft_started"])}
    for key, run in (("sft_handoff", stage["sft_run"]), ("sft", stage["sft_run"])):
        out[key]["J3_following_point"] = following_rate(run, out[key]["step"], args.seed, options)
    runs = {}
    for name, (recipes, _) in ARMS.items():
        if name not in args.arms or (name == "sgr_temporal" and args.no_temporal):
            continue
        overrides = run_overrides(name, data, export, work, args.seed, args.rl_steps, args.rl_val_every)
        done = finished_run(name, work, args.rl_steps, handoff["step"]) if args.reuse_rl else None
        if done is None:
            done = fit(name, recipes, overrides, work, args.threads)
            record = work / f"{name}.done.json"
            record.write_text(json.dumps(dict(json.loads(record.read_text()), from_sft_step=handoff["step"])))
        run, secs, started = done
        out[name] = summary(run, started)
        out[name].update(run_seconds=round(secs, 1), from_sft_step=handoff["step"],
                         J3_following_point=following_rate(run, out[name]["step"], args.seed, options))
        runs[name] = run
    return {"summary": out, "runs": runs, "handoff": handoff, "sft_run": stage["sft_run"]}


def measured() -> dict:
    """Where a figure was measured: the commit (``git rev-parse --short HEAD``, with ``-dirty`` when a tracked
    file other than the committed results (``experiments/world/results``) differs from it: the first seed's
    JSON must not mark the later seeds of the same call as measured on changed code) and the processor
    (``/proc/cpuinfo``'s model name: machines of one kind differ in speed)."""
    try:
        git = dict(cwd=ROOT, capture_output=True, text=True, check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **git).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  f":(exclude){_RESULTS_IN_REPO}"], **git).stdout.strip()
        commit += "-dirty" if changed else ""
    except (OSError, subprocess.CalledProcessError):
        commit = None
    cpu = None
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None)
    except OSError:
        pass
    return {"commit": commit, "cpu": cpu}


def spread(values: list[float | None]) -> dict:
    """``{"min", "median", "max"}`` of the values that are not ``None`` (all ``None`` when there are none)."""
    present = [v for v in values if v is not None]
    if not present:
        return {"min": None, "median": None, "max": None}
    return {"min": round(min(present), 4), "median": round(statistics.median(present), 4), "max": round(max(present), 4)}


def _gap(a: dict, b: dict, key: str) -> float | None:
    """``a[key] - b[key]`` with ``key`` a top-level metric or ``"J3"``/``"T3"`` (a category), ``None`` if absent."""
    va = a["categories"].get(key) if key in ("J3", "T3") else a.get(key)
    vb = b["categories"].get(key) if key in ("J3", "T3") else b.get(key)
    return None if va is None or vb is None else round(va - vb, 4)


def summarise(per_seed: dict) -> dict:
    """The summary over seeds (min / median / max), with ``sft_acc_min`` and ``sgr_minus_grpo_acc_min``."""
    sft = [r["sft"] for r in per_seed.values() if "sft" in r]
    rl = [r["shortcut"] for r in per_seed.values() if "shortcut" in r]
    out = {"seeds": sorted(per_seed), "sft_acc": spread([s["acc"] for s in sft]),
           "sft_acc_within_10_min": spread([s["within_10_min"]["acc"] if s["within_10_min"] else None for s in sft]),
           "sft_T4_within_10_min": spread([s["within_10_min"]["categories"].get("T4") if s["within_10_min"] else None
                                           for s in sft]),
           "sft_seconds_to_90": spread([s["seconds_to_90"] for s in sft]),
           "sft_reached_90_within_10_min": sum(s["seconds_to_90"] is not None and s["seconds_to_90"] <= 600 for s in sft)}
    out["sft_acc_min"] = out["sft_acc_within_10_min"]["min"]
    if rl:
        out["prior_acc_train"] = spread([r["prior_acc"]["train"] for r in rl if r["prior_acc"]])
        out["prior_acc_bench"] = spread([r["prior_acc"]["bench"] for r in rl if r["prior_acc"]])
        for arm in ARMS:
            if all(arm in r for r in rl):
                out[f"{arm}_shortcut_acc"] = spread([r[arm]["categories"].get("J3") for r in rl])
                out[f"{arm}_grounding_precision"] = spread([r[arm]["grounding_precision"] for r in rl])
                out[f"{arm}_enumeration_rate"] = spread([r[arm]["enumeration_rate"] for r in rl])
                out[f"{arm}_J3_stating_prior"] = spread([r[arm].get("J3_stating_prior") for r in rl])
                out[f"{arm}_J3_following_point"] = spread([r[arm].get("J3_following_point") for r in rl])
        if all("sgr" in r for r in rl):
            out["sgr_minus_grpo_acc"] = spread([_gap(r["sgr"], r["grpo"], "J3") for r in rl])
            out["sgr_minus_grpo_acc_min"] = out["sgr_minus_grpo_acc"]["min"]
            out["sgr_minus_grpo_overall_acc"] = spread([_gap(r["sgr"], r["grpo"], "acc") for r in rl])
            out["sgr_minus_grpo_precision"] = spread([_gap(r["sgr"], r["grpo"], "grounding_precision") for r in rl])
        if all("sgr_modal" in r for r in rl):
            out["sgr_modal_minus_grpo_acc"] = spread([_gap(r["sgr_modal"], r["grpo"], "J3") for r in rl])
            out["sgr_modal_minus_grpo_acc_min"] = out["sgr_modal_minus_grpo_acc"]["min"]
            out["sgr_modal_minus_grpo_overall_acc"] = spread([_gap(r["sgr_modal"], r["grpo"], "acc") for r in rl])
        if all("sgr_temporal" in r and "sgr" in r for r in rl):
            out["temporal_minus_sgr_T3_acc"] = spread([_gap(r["sgr_temporal"], r["sgr"], "T3") for r in rl])
            out["temporal_minus_sgr_temporal_iou"] = spread([_gap(r["sgr_temporal"], r["sgr"], "temporal_iou")
                                                             for r in rl])
    return out


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(out: dict) -> str:
    """The tables of a :func:`main` result: base-world SFT per seed, then the shortcut world's arms per seed."""
    sft_rows = []
    for seed, r in out["per_seed"].items():
        if "sft" not in r:
            continue
        sft, ten = r["sft"], r["sft"]["within_10_min"] or {"acc": None, "step": "–", "seconds": "–", "categories": {}}
        first = f"{sft['steps_to_90']}, {sft['seconds_to_90']:.0f}" if sft["steps_to_90"] else "not reached"
        sft_rows.append(f"| {seed} | **{_f(ten['acc'])}** ({ten['step']}, {ten['seconds']}) "
                        f"| {_f(ten['categories'].get('T4'))} | {_f(ten['categories'].get('T1'))} "
                        f"| {_f(ten['categories'].get('G2'))} | {_f(sft['acc'])} ({sft['step']}, {sft['seconds']}) | {first} |")
    lines = []  # a call with no base-world SFT has no SFT table
    if sft_rows:
        lines = ["| seed | SFT accuracy at 10 min (step, s) | T4 | T1 | G2 | last validation (step, s) "
                 "| first ≥ 0.90 (step, s) |", "|---|---|---:|---:|---:|---|---|", *sft_rows]
    rl_rows = [(seed, r["shortcut"]) for seed, r in out["per_seed"].items() if "shortcut" in r]
    if rl_rows:
        lines += [""] if lines else []
        lines += ["| seed | stage (every arm from the same SFT checkpoint) | J3 shortcut split | J3 answering the point "
                      "| J3 stating the point | overall | grounding precision | enumeration rate | T3 time questions "
                      "| temporal IoU |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for seed, r in rl_rows:
            prior = r["prior_acc"] or {}
            lines.append(f"| {seed} | shortcut prior (\"the gaze follows the point\"): train {_f(prior.get('train'))}, "
                         f"bench {_f(prior.get('bench'))} | {_f(prior.get('bench'))} | "
                         f"| {_f(prior.get('train_targets_stating_it'))} (SFT targets) | | | | | |")
            by = " where the prior binds most" if r["sft_handoff"].get("handoff_by") == "prior" else ""
            for name, label in (("sft_handoff", f"SFT hand-off (step {r['sft_handoff']['step']}){by}"),
                                *((arm, f"+ {ARMS[arm][1]}") for arm in ARMS if arm in r)):
                a = r[name]
                lines.append(f"| {seed} | {label} | {_f(a['categories'].get('J3'))} | {_f(a.get('J3_following_point'))} "
                             f"| {_f(a.get('J3_stating_prior'))} "
                             f"| {_f(a['acc'])} "
                             f"| {_f(a['grounding_precision'])} | {_f(a['enumeration_rate'])} "
                             f"| {_f(a['categories'].get('T3'))} | {_f(a['temporal_iou'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sft_options(p, sft_steps=2400, work=Path("/tmp/grasp_world_bench"), val_every=160)
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run (default: --seed)")
    p.add_argument("--rl-seeds", type=int, nargs="*", default=None,
                   help="seeds of the shortcut-world RL comparison (default: the first three of --seeds)")
    p.add_argument("--rl-steps", type=int, default=80, help="optimizer steps of every RL arm (16 prompts x K=8)")
    p.add_argument("--rl-val-every", type=int, default=20, help="validate the RL arms every N steps")
    p.add_argument("--rl-train", type=int, default=4000, help="SFT clips (and as many RL clips) of the shortcut world")
    p.add_argument("--rl-sft-steps", type=int, default=2400,
                   help="SFT steps (batch 8) on the shortcut world, the hand-off among them; 2400 x 8 clips is the budget "
                        "of the measured 600 x 32 (with 300 x 32 seed 0 was at 0.29, near chance)")
    p.add_argument("--rl-bench", type=int, default=280, help="bench clips of the shortcut world (7 categories)")
    p.add_argument("--shortcut", type=float, default=0.7,
                   help="share of the shortcut world's training J3 clips in which the gaze follows the point")
    p.add_argument("--shortcut-reasoning", action=argparse.BooleanOptionalAction, default=True,
                   help="the training J3 targets state the prior where it holds (WorldOptions.shortcut_reasoning), "
                        "so SFT reasons from it as the paper's models do")
    p.add_argument("--no-temporal", action="store_true", help="leave T3 and the SGR + temporal arm out")
    p.add_argument("--handoff-by", choices=("accuracy", "prior"), default="accuracy",
                   help="shortcut world: hand off the first SFT checkpoint at --handoff-acc (accuracy) or, of those "
                        "at --handoff-acc or above, the one whose J3 answers follow the point most often (prior)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS),
                   help="RL arms of the shortcut-world comparison (default: all; grpo, the baseline, is required)")
    p.add_argument("--skip-sft", action="store_true",
                   help="run only the shortcut-world RL comparison (keeping the base-world SFT figures of an earlier "
                        "call found in --results, whose curves stay in world_seed<N>.png)")
    p.add_argument("--reuse-rl", action="store_true",
                   help="keep the RL arms of an earlier call with the same --work that ran all --rl-steps "
                        "(with --reuse-sft: add seeds or the base SFT runs to an earlier comparison)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where JSON and PNG go")
    args = p.parse_args(argv)
    if args.sft_steps < args.val_every or args.rl_sft_steps < args.val_every:
        p.error(f"--sft-steps {args.sft_steps} and --rl-sft-steps {args.rl_sft_steps} must be >= --val-every "
                f"{args.val_every}: SFT would never be validated")
    if "grpo" not in args.arms:
        p.error(f"--arms {' '.join(args.arms)}: grpo is the baseline every other arm is compared with; add it")
    if args.reuse_rl and not args.reuse_sft:
        p.error("--reuse-rl needs --reuse-sft: the RL arms start from the SFT hand-off they were run from")
    seeds = args.seeds if args.seeds is not None else [args.seed]
    rl_seeds = seeds[:3] if args.rl_seeds is None else args.rl_seeds
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    per_seed: dict[int, dict] = {}
    args.results.mkdir(parents=True, exist_ok=True)
    for seed in dict.fromkeys(seeds + rl_seeds):
        args.seed = seed
        result: dict = {"seed": seed, "threads": args.threads, "train": args.train}
        sft = rl = None
        earlier = args.results / f"world_seed{seed}.json"
        kept = json.loads(earlier.read_text()) if earlier.exists() else {}
        if seed in seeds and not args.skip_sft:
            base = base_sft(args)
            result["sft"], sft = base["summary"], (base["stage"]["sft_run"], base["stage"]["sft_started"])
            result["sft"]["measured"] = measured()
        elif args.skip_sft and "sft" in kept:
            # --skip-sft keeps the base-world SFT figures (and their curves) of an earlier call in --results
            result.update(sft=kept["sft"], curves_png=kept["curves_png"], train=kept.get("train", args.train),
                          threads=kept.get("threads", args.threads))  # the threads the kept SFT ran with
            log.info("seed %d: keeping the base-world SFT figures of %s", seed, earlier)
        if seed in rl_seeds:
            rl = shortcut_rl(args)
            result["shortcut"] = rl["summary"]
            result["shortcut"]["measured"] = measured()
            result["shortcut"]["threads"] = args.threads
        elif "shortcut" in kept and "shortcut_curves_png" in kept:
            # a seed whose RL comparison is not rerun keeps the one of an earlier call (its own curves)
            result.update(shortcut=kept["shortcut"], shortcut_curves_png=kept["shortcut_curves_png"])
            log.info("seed %d: keeping the shortcut-world RL figures of %s", seed, earlier)
        if sft is not None or rl is not None:  # a kept seed without RL keeps its figure as it is
            png = args.results / f"world_seed{seed}{'_shortcut' if 'curves_png' in result else ''}.png"
            plot(png, seed, sft, rl)
            shown = str(png.relative_to(ROOT)) if png.is_relative_to(ROOT) else str(png)
            result["shortcut_curves_png" if "curves_png" in result else "curves_png"] = shown
        (args.results / f"world_seed{seed}.json").write_text(json.dumps(result, indent=2) + "\n")
        per_seed[seed] = result
    out = {"per_seed": {str(k): v for k, v in per_seed.items()}, "summary": summarise(per_seed)}
    (args.results / "world.json").write_text(json.dumps(out, indent=2) + "\n")
    (args.results / "world.md").write_text(markdown(out))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
