"""Multi-stage recipes: ``python -m grasp_lightning pipeline --config configs/grasp_pipeline.yaml``.

A pipeline is a list of stages, each a normal ``fit`` configuration (``--config`` files plus
overrides). Every stage starts from the previous stage's exported policy
(``model.policy.name_or_path``), so the reference model of a GRPO stage — the starting policy when
``model.reference.name_or_path`` is unset — is the previous stage's policy, as in the paper's
SFT → SGR recipe. HumanSense-style progressions (video only → audio → video + audio, or an
easy → hard curriculum) are the same thing with other stage configs or data files.

Layout of ``<run_dir>``::

    pipeline_state.json                 stage status, attempts, exports (written atomically)
    stages/<name>/logs/version_N/       the stage's TensorBoard logs, checkpoints, bench reports
    stages/<name>/export/               the stage's policy + processor (``grasp_lightning.commands.export``)
    stages/<name>/stage_result.json     what the stage produced (written when it finished)
    final/...                           the optional final ``validate`` (``final_validate``)
    results.json, table*.md             the last stage's (or final validate's) evaluation report

Re-running the same command skips finished stages and resumes an interrupted one from its newest
``last.ckpt`` (written by ``ModelCheckpoint(save_last=True)`` or ``grasp_lightning.callbacks.control.preemption.Preemption``)
at the step where it stopped. ``launcher: subprocess`` (default) runs each stage in a fresh
``python -m grasp_lightning pipeline ... --only <stage>`` process (clean accelerator memory,
multi-GPU launchers work as for ``fit``); ``inprocess`` runs them in this process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grasp_lightning.commands.config import override_args
from grasp_lightning.errors import GraspConfigError, GraspError
from grasp_lightning.evaluation.reports import write_json_atomic
from grasp_lightning.paths import resolve_config_args

log = logging.getLogger(__name__)

STATE_FILE = "pipeline_state.json"
RESULT_FILE = "stage_result.json"
FINAL = "final"  #: name of the optional final validate run
INTERRUPTED_EXIT = 3  #: exit status of an interrupted pipeline (re-run the command to resume)


class PipelineInterrupted(GraspError):
    """A stage stopped before its end (preemption signal, Ctrl-C); re-run the pipeline to resume."""


@dataclass
class Stage:
    """One stage: a ``fit`` of ``configs`` (+ the pipeline's ``common_configs``) with overrides.

    Attributes:
        name: the stage's folder under ``<run_dir>/stages/`` (unique).
        configs: ``--config`` files, in order (e.g. ``[configs/sft.yaml]``).
        overrides: ``{"model.optim.lr": 1.0e-5, ...}``, given as ``--key=value`` after the configs.
        args: further raw command-line arguments (e.g. ``--trainer.callbacks+=...``).
        init_from_previous: start from the previous stage's export (``model.policy.name_or_path``).
    """

    name: str
    configs: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    init_from_previous: bool = True


@dataclass
class DemoSettings:
    """What ``--demo true`` changes: another run folder, configs appended to every stage (e.g.
    ``configs/demo.yaml``), overrides, and the final validate's configs.

    Attributes:
        run_dir: the demo's run folder, instead of run_dir (configs/grasp_pipeline.yaml's).
        configs: configs appended to every stage's.
        overrides: overrides of every stage, after common_overrides.
        final_validate: the final validate's configs; null: final_validate's.
    """

    run_dir: str = "runs/grasp_pipeline_demo"
    configs: list[str] = field(default_factory=lambda: ["configs/demo.yaml"])
    overrides: dict[str, Any] = field(default_factory=dict)
    final_validate: list[str] | None = None


def read_json(path: Path) -> dict:
    """The JSON object at ``path``, ``{}`` when the file does not exist."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete ``last.ckpt`` under ``folder`` (file, or DeepSpeed directory with its marker)."""
    from grasp_lightning.checkpointing import require_complete

    found = []
    for path in folder.rglob("last.ckpt"):
        if any(part.startswith(".partial") for part in path.parts) or "export" in path.relative_to(folder).parts:
            continue
        try:
            require_complete(path)
        except GraspError:
            log.warning("pipeline: ignoring the incomplete checkpoint %s", path)
            continue
        found.append(path)
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


# ---------------------------------------------------------------------------------- one stage
def _stage_cli(args: list[str], root: Path):
    """The training CLI (:func:`~grasp_lightning.commands.train.build_cli`) parsed and instantiated for
    ``args``, with every output under ``root``; the config's ``ckpt_path`` is ignored (the pipeline
    resumes from the stage's own ``last.ckpt``) and its ``weights_only`` applies to that resume."""
    from grasp_lightning.commands.train import build_cli

    return build_cli(args, run=False, run_dir=root)


def _fit_stage(args: list[str], root: Path, resume: Path | None) -> dict:
    """Fit, save the final weights and export them; the stage result (rank 0; other ranks: ``{}``)."""
    from lightning.pytorch.trainer.states import TrainerStatus

    from grasp_lightning.commands.export import export_checkpoint, plain_config

    cli = _stage_cli(args, root)
    trainer, module = cli.trainer, cli.model
    final = root / "final.ckpt"
    try:
        trainer.fit(module, datamodule=cli.datamodule, ckpt_path=str(resume) if resume else None,
                    weights_only=cli.config.get("weights_only"))  # the recipe's setting, as `fit` would use
    except SystemExit as e:  # Lightning's SIGTERMException after grasp_lightning.callbacks.control.preemption.Preemption saved last.ckpt
        raise PipelineInterrupted(f"stage {root.name} stopped at step {trainer.global_step} "
                                  f"({type(e).__name__})") from e
    if trainer.interrupted or trainer.state.status != TrainerStatus.FINISHED:
        raise PipelineInterrupted(f"stage {root.name} stopped at step {trainer.global_step} ({trainer.state.status})")
    trainer.save_checkpoint(final, weights_only=True)
    if not trainer.is_global_zero:
        return {}
    export = export_checkpoint(final, root / "export", module.policy_cfg, module.lora_cfg, overwrite=True,
                               config=plain_config(cli.config), run=Path(trainer.log_dir or root))  # with its card
    if final.is_dir():  # DeepSpeed saves a folder
        shutil.rmtree(final)
    else:
        final.unlink(missing_ok=True)
    results = Path(trainer.log_dir or root) / "bench" / "latest" / "results.json"
    return {"log_dir": str(trainer.log_dir), "global_step": int(trainer.global_step), "export": str(export),
            "resumed_from": str(resume) if resume else None,
            "results": str(results) if results.is_file() else None, "finished_at": time.time()}


def _validate(args: list[str], root: Path) -> dict:
    """``validate`` with ``args``; the result (log dir and ``results.json``) on rank 0."""
    cli = _stage_cli(args, root)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule)
    if not cli.trainer.is_global_zero:
        return {}
    results = Path(cli.trainer.log_dir or root) / "bench" / "latest" / "results.json"
    return {"log_dir": str(cli.trainer.log_dir), "results": str(results) if results.is_file() else None,
            "finished_at": time.time()}


def _run_forwarding_signals(cmd: list[str]) -> int:
    """Run ``cmd`` and wait for it; SIGTERM/SIGUSR1 sent to this process are passed on to it (its
    ``Preemption`` callback then checkpoints and stops), so this process stays to record the state."""
    import signal

    child = subprocess.Popen(cmd)
    forward = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}

    def handler(signum, frame) -> None:  # noqa: ARG001 (signal API)
        if child.poll() is None:
            child.send_signal(signum)

    try:
        for sig in forward:
            signal.signal(sig, handler)
        return child.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)


# ---------------------------------------------------------------------------------- the pipeline
class Pipeline:
    """Runs the stages in order, records progress in ``pipeline_state.json``, resumes interrupted runs.

    Args:
        stages: the stages, in order.
        run_dir: the run folder (see the module docstring).
        common_configs: configs appended to every stage's (e.g. ``configs/demo.yaml``).
        common_overrides: overrides for every stage (before the stage's own).
        final_validate: if set, after the last stage run ``validate`` of the last export with the last
            stage's configs plus these (e.g. ``[configs/eval_suites.yaml]``); its report becomes the
            run's ``results.json``. ``None``: the last stage's end-of-fit report is used.
        launcher: ``subprocess`` (one process per stage) or ``inprocess``.
        command: how to start this pipeline in a child process (subprocess launcher).
    """

    def __init__(self, stages: list[Stage], run_dir: str | Path, common_configs: list[str] | None = None,
                 common_overrides: dict[str, Any] | None = None, final_validate: list[str] | None = None,
                 launcher: str = "subprocess", command: list[str] | None = None) -> None:
        if not stages:
            raise GraspConfigError("pipeline: no stages")
        names = [s.name for s in stages]
        if len(set(names)) != len(names) or FINAL in names:
            raise GraspConfigError(f"pipeline: stage names must be unique and not {FINAL!r}, got {names}")
        if launcher not in ("subprocess", "inprocess"):
            raise GraspConfigError(f"pipeline: launcher must be 'subprocess' or 'inprocess', got {launcher!r}")
        self.stages = stages
        self.run_dir = Path(run_dir)
        self.common_configs = list(common_configs or [])
        self.common_overrides = dict(common_overrides or {})
        self.final_validate = final_validate
        self.launcher = launcher
        self.command = command or []
        self.state_path = self.run_dir / STATE_FILE

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        """The state file's content (``{"stages": {name: {...}}}``)."""
        state = read_json(self.state_path)
        state.setdefault("stages", {})
        return state

    def _update(self, name: str, **fields: Any) -> dict:
        state = self.state()
        entry = state["stages"].setdefault(name, {})
        entry.update(fields)
        state["run_dir"] = str(self.run_dir)
        state["order"] = [s.name for s in self.stages] + ([FINAL] if self.final_validate is not None else [])
        write_json_atomic(self.state_path, state)
        return entry

    def done(self, name: str) -> bool:
        """True when ``name`` finished and its export (or results) is still there."""
        entry = self.state()["stages"].get(name, {})
        if entry.get("status") != "done":
            return False
        path = entry.get("export") or entry.get("results")
        if path and not Path(path).exists():
            log.warning("pipeline: %s is marked done but %s is gone; running it again", name, path)
            return False
        return True

    def restart_from(self, name: str) -> None:
        """Forget the state of stage ``name`` and of the stages after it (their files stay; a stage
        with a ``last.ckpt`` resumes from it — delete its folder to start it from scratch)."""
        names = [s.name for s in self.stages] + [FINAL]
        if name not in names:
            raise GraspConfigError(f"pipeline: --restart_from {name!r} is not a stage ({names})")
        state = self.state()
        for later in names[names.index(name):]:
            state["stages"].pop(later, None)
        write_json_atomic(self.state_path, state)

    # ------------------------------------------------------------------ arguments
    def stage_args(self, stage: Stage, previous_export: str | None, extra_configs: list[str] = ()) -> list[str]:
        """The ``fit`` arguments of ``stage``: its configs, the common configs, ``extra_configs``, the
        common then the stage's overrides and args, and the start policy (the previous export)."""
        args: list[str] = []
        for config in [*stage.configs, *self.common_configs, *extra_configs]:
            args += ["--config", config]
        args += override_args(self.common_overrides) + override_args(stage.overrides) + list(stage.args)
        if previous_export and stage.init_from_previous:
            args.append(f"--model.policy.name_or_path={previous_export}")
        return args

    def _previous_export(self, index: int) -> str | None:
        if index == 0:
            return None
        entry = self.state()["stages"].get(self.stages[index - 1].name, {})
        return entry.get("export")

    # ------------------------------------------------------------------ running
    def run_one(self, name: str) -> dict:
        """Run stage ``name`` (or the final validate) in this process and write its ``stage_result.json``."""
        root = self.run_dir / ("final" if name == FINAL else f"stages/{name}")
        if name == FINAL:
            last = self.stages[-1]
            export = self.state()["stages"].get(last.name, {}).get("export")
            last = dataclasses.replace(last, init_from_previous=True)
            result = _validate(self.stage_args(last, export, extra_configs=self.final_validate or []), root)
        else:
            index = [s.name for s in self.stages].index(name)
            resume = latest_checkpoint(root) if root.exists() else None
            if resume:
                log.info("pipeline: resuming stage %s from %s", name, resume)
            result = _fit_stage(self.stage_args(self.stages[index], self._previous_export(index)), root, resume)
        if result:
            write_json_atomic(root / RESULT_FILE, result)
        return result

    def _launch(self, name: str) -> dict:
        """Run one stage with the configured launcher; its result, or raise."""
        root = self.run_dir / ("final" if name == FINAL else f"stages/{name}")
        (root / RESULT_FILE).unlink(missing_ok=True)
        if self.launcher == "inprocess":
            return self.run_one(name)
        cmd = [sys.executable, "-m", "grasp_lightning", "pipeline", *self.command, "--only", name]
        log.info("pipeline: %s", " ".join(cmd))
        code = _run_forwarding_signals(cmd)
        result = read_json(root / RESULT_FILE)
        if code == INTERRUPTED_EXIT or (code == 0 and not result):
            raise PipelineInterrupted(f"stage {name} stopped before its end (exit status {code})")
        if code != 0:
            raise GraspError(f"pipeline: stage {name} failed with exit status {code}; see its log above")
        return result

    def run(self) -> Path | None:
        """Run every unfinished stage in order; return the run's ``results.json`` (``None`` if no report).

        Raises:
            PipelineInterrupted: a stage stopped early (state ``interrupted``; re-run to resume).
        """
        names = [s.name for s in self.stages] + ([FINAL] if self.final_validate is not None else [])
        for name in names:
            if self.done(name):
                log.info("pipeline: stage %s already finished, skipping", name)
                continue
            entry = self.state()["stages"].get(name, {})
            self._update(name, status="running", attempts=int(entry.get("attempts", 0)) + 1, started_at=time.time())
            try:
                result = self._launch(name)
            except PipelineInterrupted:
                self._update(name, status="interrupted")
                raise
            except BaseException as e:
                self._update(name, status="failed", error=f"{type(e).__name__}: {e}")
                raise
            self._update(name, status="done", **result)
            log.info("pipeline: stage %s done%s", name,
                     f", exported to {result['export']}" if "export" in result else "")
        return self.collect_results(names[-1])

    def collect_results(self, name: str) -> Path | None:
        """Copy the report of stage ``name`` (``results.json`` and its tables) into the run folder."""
        results = self.state()["stages"].get(name, {}).get("results")
        if not results:
            log.warning("pipeline: the last stage wrote no evaluation report (no data.source.bench?); no results.json")
            return None
        source = Path(results).parent
        for file in [source / "results.json", *sorted(source.glob("table*.md"))]:
            shutil.copyfile(file, self.run_dir / file.name)
        log.info("pipeline: results in %s", self.run_dir / "results.json")
        return self.run_dir / "results.json"


# ---------------------------------------------------------------------------------- command line
def build_parser():
    """The ``pipeline`` command's parser (jsonargparse; ``--config`` reads a pipeline YAML)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    from grasp_lightning.commands import COMMANDS

    parser = ArgumentParser(prog="python -m grasp_lightning pipeline", default_env=False,
                            description=f"{COMMANDS['pipeline'].description} configs/grasp_pipeline.yaml: SFT -> "
                                        "export -> SGR; --demo true runs it on the CPU, in its demo_settings.run_dir.")
    parser.add_argument("--config", action=ActionConfigFile, help="pipeline YAML (configs/grasp_pipeline.yaml)")
    parser.add_argument("--stages", type=list[Stage], required=True, help="the stages, in order")
    parser.add_argument("--run_dir", type=str, default="runs/pipeline", help="the run folder")
    parser.add_argument("--common_configs", type=list[str], default=[], help="configs appended to every stage's")
    parser.add_argument("--common_overrides", type=dict[str, Any], default={}, help="overrides of every stage")
    parser.add_argument("--final_validate", type=list[str] | None, default=None,
                        help="configs of a final validate of the last export (None: no final validate)")
    parser.add_argument("--launcher", type=str, default="subprocess", help="subprocess or inprocess")
    parser.add_argument("--demo", type=bool, default=False, help="apply demo_settings (CPU demo)")
    parser.add_argument("--demo_settings", type=DemoSettings, default=DemoSettings(), help="what --demo true changes")
    parser.add_argument("--restart_from", type=str | None, default=None,
                        help="forget the state of this stage and the later ones, and run them again")
    parser.add_argument("--only", type=str | None, default=None, help="internal: run this one stage here")
    return parser


def pipeline_from_args(argv: list[str]) -> tuple[Pipeline, str | None]:
    """``(pipeline, only)`` from command-line arguments (``--demo true`` applied)."""
    parser = build_parser()
    cfg = parser.instantiate_classes(parser.parse_args(resolve_config_args(argv)))
    demo: DemoSettings = cfg.demo_settings
    run_dir, common_configs = cfg.run_dir, list(cfg.common_configs)
    common_overrides, final_validate = dict(cfg.common_overrides), cfg.final_validate
    if cfg.demo:
        explicit = any(a == "--run_dir" or a.startswith("--run_dir=") for a in argv)
        run_dir = run_dir if explicit else demo.run_dir  # a --run_dir on the command line wins
        common_configs += list(demo.configs)
        common_overrides.update(demo.overrides)
        final_validate = demo.final_validate if demo.final_validate is not None else final_validate
    command = list(argv)  # the children run this same pipeline with --only <stage>
    pipeline = Pipeline(list(cfg.stages), run_dir, common_configs, common_overrides, final_validate,
                        launcher=cfg.launcher, command=command)
    if cfg.restart_from is not None and cfg.only is None:
        pipeline.restart_from(cfg.restart_from)
    return pipeline, cfg.only


def main(argv: list[str]) -> int:
    """``python -m grasp_lightning pipeline ...``: run the pipeline (or, with ``--only``, one stage).

    Returns the exit status: 0 done, :data:`INTERRUPTED_EXIT` when a stage stopped early.
    """
    pipeline, only = pipeline_from_args(argv)
    try:
        if only is not None:
            pipeline.run_one(only)
        else:
            results = pipeline.run()
            where = f", results in {results}" if results else ""
            sys.stdout.write(f"pipeline finished: {pipeline.run_dir}{where}\n")
    except PipelineInterrupted as e:
        log.warning("pipeline interrupted: %s; run the same command again to resume", e)
        return INTERRUPTED_EXIT
    return 0
