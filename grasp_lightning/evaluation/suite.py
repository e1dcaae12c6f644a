"""What the module keeps per validation/test epoch for the evaluation suites, GRASP-Bench included.

The DataModule exposes ``val_suites`` (GRASP-Bench of ``data.source.bench`` first, then ``data.eval_suites``,
loaded) whose entries with items each got one validation dataloader, in order (:func:`routes`).
:class:`SuiteRunner` maps a ``dataloader_idx`` to its suite, scores that suite's completions with
the suite's own :meth:`~grasp_lightning.evaluation.base.EvalSuite.score` into the suite's own metric
(sum-reduced states: exact across ranks) and keeps the per-item records for ``results.json``.
"""

from __future__ import annotations

from typing import Any

from grasp_lightning.evaluation.base import EvalSuite


def routes(suites: list[EvalSuite]) -> list[EvalSuite]:
    """The suites that get a dataloader (those with items to evaluate), in dataloader order."""
    return [s for s in suites if s.items]


class SuiteRunner:
    """Per-epoch scoring state of the evaluation suites (see the module docstring).

    Attributes:
        suites: every configured suite (also those with nothing to evaluate).
        metrics: name -> metric of each suite.
        records: name -> scored records of this rank (padding rows left out).
        results: name -> metric dict of the last :meth:`compute`.
    """

    def __init__(self) -> None:
        self.suites: list[EvalSuite] = []
        self.metrics: dict[str, Any] = {}
        self.records: dict[str, list[dict]] = {}
        self.results: dict[str, dict[str, float]] = {}

    def start(self, suites: list[EvalSuite], device: Any) -> None:
        """Reset for an epoch over ``suites`` (the DataModule's ``val_suites``), metrics on ``device``."""
        self.suites = list(suites)
        self.metrics = {s.name: s.metric().to(device) for s in self.suites}
        self.records = {name: [] for name in self.metrics}
        self.results = {}

    def route(self, dataloader_idx: int) -> EvalSuite | None:
        """The suite of a dataloader index, ``None`` outside the configured ones."""
        active = routes(self.suites)
        return active[dataloader_idx] if 0 <= dataloader_idx < len(active) else None

    def by_name(self, name: str) -> EvalSuite:
        """The suite called ``name`` (KeyError if none)."""
        for suite in self.suites:
            if suite.name == name:
                return suite
        raise KeyError(name)

    def update(self, suite: EvalSuite, completions: list[str], batch: Any) -> None:
        """Score a batch's completions with ``suite`` and count them (``batch.valid`` marks real rows)."""
        records = [suite.score(text, item) for text, item in zip(completions, batch.items)]
        self.metrics[suite.name].update_from_records(records, valid=batch.valid)
        self.records[suite.name].extend(r for r, ok in zip(records, batch.valid.tolist()) if ok)

    def compute(self) -> dict[str, dict[str, float]]:
        """name -> metric dict of every suite (collective under DDP: call on all ranks)."""
        self.results = {s.name: s.compute(self.metrics[s.name]) for s in self.suites}
        return self.results
