"""Evaluation reports: after each validation or test, every evaluation suite's ``results.json``
section, tables and figures (GRASP-Bench: the top level of ``results.json``, ``table.md`` laid out
like the paper's Table 1, and a bar chart of the 16 category accuracies; MMSI, TVQA+, HumanSense, ... of
``data.eval_suites``: a section and ``table_<name>.md`` each). The files, in ``<run folder>/bench/``
(:func:`grasp_lightning.monitoring.loggers.run_dir`), are the ground truth; every logger also gets each suite's
figures and texts (:func:`grasp_lightning.monitoring.loggers.log_image` and :func:`~grasp_lightning.monitoring.loggers.log_text`:
TensorBoard images and text, W&B ``wandb.Image`` and ``wandb.Html``, MLflow step images and ``.md``
artifacts; CSV none).

The numbers come from ``module.suites`` (:class:`~grasp_lightning.evaluation.suite.SuiteRunner`:
torchmetrics metrics synced across ranks) and the per-item records from every rank (gathered here);
what is written for a suite is its own :meth:`~grasp_lightning.evaluation.base.EvalSuite.report`
and :meth:`~grasp_lightning.evaluation.base.EvalSuite.figures`. ``validate`` prints the tables to
the terminal.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

import lightning as L
import torch.distributed as dist
from typing_extensions import override

from grasp_lightning.evaluation.suite_report import write_results
from grasp_lightning.monitoring.loggers import log_image, log_text, run_dir

log = logging.getLogger(__name__)


class EvalReports(L.Callback):
    """Evaluation reports of every suite, written into ``<run folder>/bench/step_<N>/`` and ``.../latest/``
    (``N``: the optimizer step; of the checkpoint for ``validate``/``test --ckpt_path``, named in the meta).

    Validation runs every ``trainer.val_check_interval`` training batches, at epoch ends, and —
    through this callback — once more at the end of fit when ``max_steps`` stops training
    mid-epoch (it raises ``trainer.should_stop`` on the last step, which makes Lightning validate
    before it stops).

    Args:
        label: column name of our model in tables that compare with reference models (GRASP-Bench's Table 1).
        print_table: print the tables to stdout after ``validate``/``test`` (not during fit).
    """

    def __init__(self, label: str = "ours", print_table: bool = True) -> None:
        self.label = label
        self.print_table = print_table
        self.last_dir: str | None = None

    @staticmethod
    def _gather(records: list[dict]) -> list[dict]:
        """Every rank's records, in rank order (a collective under DDP: all ranks call it)."""
        records = list(records)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, records)
            records = [r for part in gathered for r in part]
        return records

    def _report(self, trainer, pl_module) -> None:
        runner = getattr(pl_module, "suites", None)
        results = dict(runner.results) if runner is not None else {}
        if not results:
            return
        records = {name: self._gather(runner.records[name]) for name in results}  # collective: every rank
        if not trainer.is_global_zero:
            return
        suites = [runner.by_name(name) for name in results]
        reports = [suite.report(results[suite.name], records[suite.name], label=self.label) for suite in suites]
        root = os.path.join(run_dir(trainer), "bench")  # rank zero only: no collective (trainer.log_dir broadcasts)
        checkpoint, step = evaluated_checkpoint(trainer, pl_module)
        meta = {"step": step, "model": pl_module.policy_cfg.name_or_path, "checkpoint": checkpoint,
                "stage": str(trainer.state.stage),
                "decoding": {**dataclasses.asdict(pl_module.eval_cfg), "max_new_tokens": pl_module.eval_max_new_tokens}}
        images: dict = {}
        for sub in (f"step_{step}", "latest"):
            out = os.path.join(root, sub)
            _write_reports(out, meta, reports)
            for suite in suites:
                images[suite.name] = suite.figures(results[suite.name], out)
        self.last_dir = os.path.join(root, "latest")
        _log_to_loggers(trainer, reports, images)
        if self.print_table and not trainer.training and trainer.state.fn in ("validate", "test"):
            sys.stdout.write("".join(report.printout for report in reports))
        log.info("evaluation reports written to %s", self.last_dir)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True

    @override
    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._report(trainer, pl_module)

    @override
    def on_test_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module)


def evaluated_checkpoint(trainer, pl_module) -> tuple[str | None, int]:
    """The checkpoint a ``validate``/``test --ckpt_path`` evaluates and its optimizer step (the step its
    reports are filed under: ``bench/step_<N>/``); in ``fit``, or without a checkpoint, ``None`` and
    the trainer's ``global_step`` (Lightning restores no step counter outside ``fit``, so
    ``validate --ckpt_path`` read 0 there)."""
    if trainer.state.fn in ("validate", "test") and trainer.ckpt_path:
        restored = getattr(pl_module, "restored_step", None)
        return str(trainer.ckpt_path), int(restored) if restored is not None else trainer.global_step
    return None, trainer.global_step


def _write_reports(out: str, meta: dict, reports: list) -> None:
    """``results.json`` (every suite's section) and each suite's own files (tables) under ``out``."""
    write_results(os.path.join(out, "results.json"), meta, reports)
    for report in reports:
        for name, text in report.files.items():
            with open(os.path.join(out, name), "w", encoding="utf-8") as fh:
                fh.write(text)


def _log_to_loggers(trainer, reports: list, images: dict) -> None:
    """Each suite's figures (``images[suite name]``: tag -> ``(H, W, 3)`` uint8) and texts (``report.texts``:
    tag -> Markdown) to every logger of ``trainer`` at the current optimizer step."""
    for report in reports:
        for tag, image in images[report.name].items():
            log_image(trainer, tag, image, trainer.global_step)
        for tag, text in report.texts.items():
            log_text(trainer, tag, text, trainer.global_step)
