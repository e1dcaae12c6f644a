"""GRASP-Bench as an evaluation suite: reading (:func:`~grasp_lightning.data.formats.read_bench`),
scoring under the run's evaluation protocol (:mod:`grasp_lightning.evaluation.protocol`: ours,
:func:`~grasp_lightning.evaluation.grasp_score.score_completion`, or the released one),
:class:`~grasp_lightning.evaluation.grasp_score.BenchAccuracy`, and its reports: the Table-1 layout
(:func:`~grasp_lightning.evaluation.reports.markdown_table`), the category bar chart and, with the
released protocol, the released ``metric_report`` printout.

The DataModule wraps ``data.source.bench`` in this suite itself (first validation dataloader, name
``grasp_bench``, the top level of ``results.json``); list it under ``data.eval_suites`` only to
validate on a second GRASP-Bench copy (give it another ``name``: it then gets a section of its own).
"""

from __future__ import annotations

import os
from typing import Any

from torchmetrics import Metric

from grasp_lightning.data.formats import ReadResult, bench_store, read_bench
from grasp_lightning.data.records import CATEGORIES, GraspItem
from grasp_lightning.evaluation.grasp_score import BenchAccuracy
from grasp_lightning.evaluation.protocol import GraspProtocol, make_protocol
from grasp_lightning.evaluation.reports import CATEGORY_NAMES, category_bar_chart, markdown_table

from .base import EvalSuite, SuiteReport

#: The values logged as ``val/<key>`` (the category accuracies go to ``val_category/<code>``).
LOGGED_KEYS = ("acc/overall", "acc/gaze", "acc/gesture", "acc/joint", "acc_macro/overall", "unparseable_rate",
               "grounding/precision", "grounding/enumeration_rate", "grounding/temporal_iou")


class GraspBench(EvalSuite):
    """GRASP-Bench (``grasp_bench.tar`` or its extracted folder): 16 categories, Table 1 of the paper.

    Args:
        path: the bench tar or folder.
        name: key in logs and ``results.json`` (default ``grasp_bench``: the top-level keys).
        limit: use only the first N items.
        system_prompt: ``None`` keeps the DataModule's (GRASP) system prompt.

    Attribute ``protocol``: the evaluation protocol that encodes and scores the items
    (:meth:`use_protocol`; ours until the DataModule hands over ``model.evaluation.protocol``).
    """

    default_name = "grasp_bench"
    title = "GRASP-Bench"
    category_names = dict(CATEGORY_NAMES)

    def __init__(self, path: str, name: str | None = None, limit: int | None = None,
                 system_prompt: str | None = None) -> None:
        super().__init__(path, name=name, limit=limit)
        self.system_prompt = system_prompt  # None: the DataModule's GRASP prompt
        self.protocol: GraspProtocol = make_protocol("grasp")

    @classmethod
    def from_items(cls, path: str, items: list[GraspItem], **kwargs: Any) -> GraspBench:
        """A suite around items the DataModule already read from ``path``."""
        bench = cls(path, **kwargs)
        bench.items = list(items)
        bench.categories = list(CATEGORIES)
        return bench

    @property
    def top_level(self) -> bool:
        """True for the default name: its metrics and items are ``results.json``'s top level."""
        return self.name == self.default_name

    def read(self, on_error: str = "raise") -> ReadResult:
        """:func:`~grasp_lightning.data.formats.read_bench` of the path."""
        return read_bench(self.paths[0], on_error=on_error)

    def load(self, on_error: str = "raise", audio_unavailable: str | None = None) -> None:
        """Read the bench; the table always lists all 16 categories."""
        super().load(on_error, audio_unavailable)
        self.categories = list(CATEGORIES)

    def store(self):
        """:func:`~grasp_lightning.data.formats.bench_store` of the path."""
        return bench_store(self.paths[0])

    def use_protocol(self, protocol: GraspProtocol | None) -> None:
        """Encode and score with ``protocol`` (``None`` keeps the current one)."""
        if protocol is not None:
            self.protocol = protocol

    def encoder(self, processor: Any):
        """The protocol's encoder for ``processor`` (``None``: the DataModule's own path, or no processor)."""
        return self.protocol.bench_encoder(processor) if processor is not None else None

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """The protocol's record (ours: :func:`~grasp_lightning.evaluation.grasp_score.score_completion`)."""
        return self.protocol.score(completion, item)

    def metric(self) -> Metric:
        """:class:`~grasp_lightning.evaluation.grasp_score.BenchAccuracy`."""
        return BenchAccuracy()

    def compute(self, metric: Metric) -> dict[str, float]:
        """``BenchAccuracy.compute()``."""
        return metric.compute()

    def _prefix(self, kind: str) -> str:
        """``val/`` / ``val_category/`` (default name), else with ``<name>/`` appended."""
        return f"{kind}/" if self.top_level else f"{kind}/{self.name}/"

    def log_values(self, metrics: dict[str, float]) -> dict[str, float]:
        """``val/<key>`` for :data:`LOGGED_KEYS` and ``val_category/<code>`` for the 16 categories (NaN left out)."""
        out = {f"{self._prefix('val')}{key}": float(metrics[key]) for key in LOGGED_KEYS
               if key in metrics and metrics[key] == metrics[key]}
        out.update({f"{self._prefix('val_category')}{key[4:]}": float(value) for key, value in metrics.items()
                    if key.startswith("acc/") and len(key) == 6 and value == value})
        return out

    def summary(self, metrics: dict[str, float]) -> str | None:
        """The protocol's report (released: its ``metric_report`` printout; ours: none)."""
        return self.protocol.report(metrics)

    def markdown(self, metrics: dict[str, float], label: str = "ours") -> str:
        """:func:`~grasp_lightning.evaluation.reports.markdown_table` (the paper's Table 1 layout)."""
        return markdown_table(metrics, label=label)

    def report(self, metrics: dict[str, float], records: list[dict], label: str = "ours") -> SuiteReport:
        """``{"metrics", "items"}`` for ``results.json``, ``table.md`` (Table 1, ``label`` the column of
        our model), ``report_released.txt`` with the released protocol, the TensorBoard text
        ``bench/table`` and the printed table. A suite with another name gets a section and
        ``table_<name>.md`` / ``bench/<name>/table`` instead."""
        table = self.markdown(metrics, label=label)
        if self.top_level:
            file, tag, section = "table.md", "bench/table", {"metrics": metrics, "items": records}
        else:
            file, tag = f"table_{self.name}.md", f"bench/{self.name}/table"
            section = {"title": self.title, "metrics": metrics, "items": records, "table": file}
        files = {file: table + "\n"}
        released = self.summary(metrics)
        if released:
            files["report_released.txt" if self.top_level else f"report_released_{self.name}.txt"] = \
                released.strip("\n") + "\n"
        return SuiteReport(self.name, section, top_level=self.top_level, files=files, texts={tag: table},
                           printout=table + "\n")

    def figures(self, metrics: dict[str, float], folder: str | os.PathLike) -> dict[str, Any]:
        """``bench/category_accuracy``: :func:`~grasp_lightning.evaluation.reports.category_bar_chart`, saved as
        ``categories.png`` (another name: ``bench/<name>/category_accuracy``, ``categories_<name>.png``)."""
        tag, png = (("bench/category_accuracy", "categories.png") if self.top_level
                    else (f"bench/{self.name}/category_accuracy", f"categories_{self.name}.png"))
        return {tag: category_bar_chart(metrics, path=os.path.join(folder, png))}
