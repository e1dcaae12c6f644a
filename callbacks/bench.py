"""GRASP-Bench reports: after each validation or test, ``results.json``, a Markdown table laid out
like the paper's Table 1, and a bar chart of the 16 category accuracies in TensorBoard. The other
benchmarks of ``data.benchmarks`` (MMSI, TVQA+, HumanSense, ...) get their own ``results.json``
section and ``table_<name>.md`` (:mod:`grasp_lightning.evaluation.suite_report`).

The numbers come from ``module.bench_metric`` (a torchmetrics metric synced across ranks) and the
per-item records from every rank (gathered here). ``validate`` prints the table to the terminal.
"""

from __future__ import annotations

import logging
import os
import sys

import lightning as L
import torch.distributed as dist

from grasp_lightning.evaluation.reports import category_bar_chart, markdown_table
from grasp_lightning.evaluation.suite_report import write_results, write_tables

log = logging.getLogger(__name__)


class GraspBenchReport(L.Callback):
    """GRASP-Bench validation reports, written into ``<log_dir>/bench/step_<N>/`` and ``.../latest/``.

    Validation runs every ``trainer.val_check_interval`` training batches, at epoch ends, and —
    through this callback — once more at the end of fit when ``max_steps`` stops training
    mid-epoch (it raises ``trainer.should_stop`` on the last step, which makes Lightning validate
    before it stops).

    Args:
        label: column name of our model in the Markdown table.
        print_table: print the table to stdout after ``validate``/``test`` (not during fit).
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

    def _records(self, pl_module) -> list[dict]:
        return self._gather(pl_module.bench_records)

    def _report(self, trainer, pl_module) -> None:
        metrics = getattr(pl_module, "bench_results", None)
        suite = getattr(pl_module, "benchmark_suite", None)
        others = dict(suite.results) if suite is not None else {}  # the other benchmarks (data.benchmarks)
        if metrics is None and not others:
            return
        records = self._records(pl_module) if metrics is not None else []
        other_records = {name: self._gather(suite.records[name]) for name in others}
        if not trainer.is_global_zero:
            return
        root = os.path.join(trainer.log_dir or trainer.default_root_dir, "bench")
        table = markdown_table(metrics, label=self.label) if metrics is not None else ""
        tables = suite.tables() if others else {}
        sections = {name: {"title": suite.by_name(name).title, "metrics": values, "items": other_records[name],
                           "table": f"table_{name}.md"} for name, values in others.items()}
        meta = {"step": trainer.global_step, "model": pl_module.policy_cfg.name_or_path,
                "stage": str(trainer.state.stage),
                "decoding": {**vars(pl_module.eval_cfg), "max_new_tokens": pl_module.eval_max_new_tokens}}
        image = None
        for sub in (f"step_{trainer.global_step}", "latest"):
            out = os.path.join(root, sub)
            write_results(os.path.join(out, "results.json"), meta,
                          (metrics, records) if metrics is not None else None, sections)
            write_tables(out, tables)
            if metrics is not None:
                with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as fh:
                    fh.write(table + "\n")
                image = category_bar_chart(metrics, path=os.path.join(out, "categories.png"))
            report = getattr(pl_module, "bench_report", None)  # the released metric_report printout, if chosen
            if report:
                with open(os.path.join(out, "report_released.txt"), "w", encoding="utf-8") as fh:
                    fh.write(report.strip("\n") + "\n")
        self.last_dir = os.path.join(root, "latest")
        for logger in trainer.loggers:
            exp = getattr(logger, "experiment", None)
            if exp is not None and hasattr(exp, "add_image"):
                if image is not None:
                    exp.add_image("bench/category_accuracy", image, global_step=trainer.global_step, dataformats="HWC")
                    exp.add_text("bench/table", table, global_step=trainer.global_step)
                for name, text in tables.items():
                    exp.add_text(f"bench/{name}/table", text, global_step=trainer.global_step)
        if self.print_table and not trainer.training and trainer.state.fn in ("validate", "test"):
            sys.stdout.write((table + "\n" if table else "") + "".join(f"\n{t}\n" for t in tables.values()))
        log.info("benchmark reports written to %s", self.last_dir)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._report(trainer, pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self._report(trainer, pl_module)
