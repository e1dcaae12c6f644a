"""What the module keeps per validation/test epoch for the benchmarks other than GRASP-Bench.

The DataModule exposes ``val_benchmarks`` (every configured benchmark, loaded) whose entries with
items each got one validation dataloader, in order (:func:`routes`). :class:`BenchmarkSuite` maps a
``dataloader_idx`` to its benchmark, scores that benchmark's completions into its own
:class:`~grasp_lightning.evaluation.base.TaskAccuracy` (sum-reduced states: exact across ranks)
and keeps the per-item records for ``results.json``. GRASP-Bench batches stay on the module's
``bench_metric``/``bench_records`` path.
"""

from __future__ import annotations

from typing import Any

from grasp_lightning.evaluation.base import Benchmark


def routes(benchmarks: list[Benchmark]) -> list[Benchmark]:
    """The benchmarks that get a dataloader (those with items to evaluate), in dataloader order."""
    return [b for b in benchmarks if b.items]


class BenchmarkSuite:
    """Per-epoch scoring state of the configured benchmarks (see the module docstring).

    Attributes:
        benchmarks: every configured benchmark (also those with nothing to evaluate).
        metrics: name -> metric of each non-GRASP benchmark.
        records: name -> scored records of this rank (padding rows left out).
        results: name -> metric dict of the last :meth:`compute`.
    """

    def __init__(self) -> None:
        self.benchmarks: list[Benchmark] = []
        self.metrics: dict[str, Any] = {}
        self.records: dict[str, list[dict]] = {}
        self.results: dict[str, dict[str, float]] = {}

    def start(self, datamodule: Any, device: Any) -> None:
        """Reset for an epoch from ``datamodule.val_benchmarks`` (none: the GRASP-only path)."""
        self.benchmarks = list(getattr(datamodule, "val_benchmarks", None) or [])
        self.metrics = {b.name: b.metric().to(device) for b in self.benchmarks if not b.is_grasp}
        self.records = {name: [] for name in self.metrics}
        self.results = {}

    @property
    def active(self) -> bool:
        """True when the DataModule configured benchmarks (GRASP-Bench included)."""
        return bool(self.benchmarks)

    @property
    def has_grasp(self) -> bool:
        """True when GRASP-Bench is among the benchmarks with a dataloader."""
        return any(b.is_grasp for b in routes(self.benchmarks))

    def route(self, dataloader_idx: int) -> Benchmark | None:
        """The benchmark of a dataloader index, ``None`` outside the configured ones."""
        active = routes(self.benchmarks)
        return active[dataloader_idx] if 0 <= dataloader_idx < len(active) else None

    def by_name(self, name: str) -> Benchmark:
        """The benchmark called ``name`` (KeyError if none)."""
        for bench in self.benchmarks:
            if bench.name == name:
                return bench
        raise KeyError(name)

    def update(self, bench: Benchmark, completions: list[str], batch: Any) -> None:
        """Score a batch's completions with ``bench`` and count them (``batch.valid`` marks real rows)."""
        records = [bench.score(text, item) for text, item in zip(completions, batch.items)]
        self.metrics[bench.name].update(records, valid=batch.valid)
        self.records[bench.name].extend(r for r, ok in zip(records, batch.valid.tolist()) if ok)

    def compute(self) -> dict[str, dict[str, float]]:
        """name -> metric dict of every non-GRASP benchmark (collective under DDP: call on all ranks)."""
        self.results = {b.name: b.compute(self.metrics[b.name]) for b in self.benchmarks if not b.is_grasp}
        return self.results

    def tables(self) -> dict[str, str]:
        """name -> Markdown table of the last :meth:`compute`."""
        return {name: self.by_name(name).markdown(metrics) for name, metrics in self.results.items()}
