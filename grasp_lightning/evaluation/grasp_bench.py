"""GRASP-Bench as a benchmark plugin: :func:`~grasp_lightning.data.formats.read_bench`,
:func:`~grasp_lightning.evaluation.grasp_score.score_completion`, :class:`~grasp_lightning.evaluation.grasp_score.BenchAccuracy` and
:func:`~grasp_lightning.evaluation.reports.markdown_table`, unchanged.

The DataModule wraps ``data.bench`` in this plugin itself (first validation dataloader); list it
under ``data.benchmarks`` only to validate on a second GRASP-Bench copy. The module keeps scoring
it into ``module.bench_metric`` / ``module.bench_records`` and ``callbacks.bench.GraspBenchReport``
writes its Table-1 report, as before.
"""

from __future__ import annotations

from typing import Any

from torchmetrics import Metric

from grasp_lightning.data.formats import ReadResult, bench_store, read_bench
from grasp_lightning.data.records import CATEGORIES, GraspItem
from grasp_lightning.evaluation.grasp_score import BenchAccuracy, score_completion
from grasp_lightning.evaluation.reports import CATEGORY_NAMES, markdown_table

from .base import Benchmark


class GraspBench(Benchmark):
    """GRASP-Bench (``grasp_bench.tar`` or its extracted folder): 16 categories, Table 1 of the paper.

    Args:
        path: the bench tar or folder.
        name: key in logs and ``results.json`` (default ``grasp_bench``).
        limit: use only the first N items.
        label: column name of our model in the Markdown table.
        system_prompt: ``None`` keeps the DataModule's (GRASP) system prompt.
    """

    default_name = "grasp_bench"
    title = "GRASP-Bench"
    task_names = dict(CATEGORY_NAMES)
    is_grasp = True

    def __init__(self, path: str, name: str | None = None, limit: int | None = None, label: str = "ours",
                 system_prompt: str | None = None) -> None:
        super().__init__(path, name=name, limit=limit)
        self.system_prompt = system_prompt  # None: the DataModule's GRASP prompt
        self.label = label

    @classmethod
    def from_items(cls, path: str, items: list[GraspItem], **kwargs: Any) -> "GraspBench":
        """A plugin around items the DataModule already read from ``path``."""
        bench = cls(path, **kwargs)
        bench.items = list(items)
        bench.tasks = list(CATEGORIES)
        return bench

    def read(self, on_error: str = "raise") -> ReadResult:
        """:func:`~grasp_lightning.data.formats.read_bench` of the path."""
        return read_bench(self.paths[0], on_error=on_error)

    def load(self, on_error: str = "raise", audio_unavailable: str | None = None) -> None:
        """Read the bench; every category is a task (the table always lists all 16)."""
        super().load(on_error, audio_unavailable)
        self.tasks = list(CATEGORIES)

    def store(self):
        """:func:`~grasp_lightning.data.formats.bench_store` of the path."""
        return bench_store(self.paths[0])

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """:func:`~grasp_lightning.evaluation.grasp_score.score_completion`."""
        return score_completion(completion, item)

    def metric(self) -> Metric:
        """:class:`~grasp_lightning.evaluation.grasp_score.BenchAccuracy`."""
        return BenchAccuracy()

    def compute(self, metric: Metric) -> dict[str, float]:
        """``BenchAccuracy.compute()``."""
        return metric.compute()

    def markdown(self, metrics: dict[str, float]) -> str:
        """:func:`~grasp_lightning.evaluation.reports.markdown_table` (the paper's Table 1 layout)."""
        return markdown_table(metrics, label=self.label)
