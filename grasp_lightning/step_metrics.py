"""Metrics of one optimizer step: parts from every micro-batch of the accumulation window on every rank,
merged by one collective and logged once per step.

A task returns, per micro-batch, values that say how they combine over the step's ``A`` micro-batches and
``W`` ranks:

* :class:`Mean` ``(total, count)``: ``Σ total / Σ count`` — a true mean over every completion, group or
  token of the step on all ranks (e.g. reward over completions, KL over loss tokens); left out of the
  step when ``Σ count`` is 0.
* :class:`Sum`: ``Σ`` over micro-batches and ranks (skipped items, non-finite losses, tokens).
* :class:`RankMean`: ``Σ`` over the rank's micro-batches, mean over ranks (seconds of one rank's work).
* :class:`Max`, :class:`Min`: extremes over the step.
* :class:`Std`: population standard deviation over every value of the step (from ``n, Σx, Σx²``).

A plain number or 0-d tensor counts as ``Mean(value, 1)``: the mean over the step's micro-batches and
ranks (e.g. an SFT micro-batch's loss). Each kind is a ``float`` whose value is the micro-batch's own
(``float(Mean(6, 3)) == 2.0``), so code reading one micro-batch's metrics works unchanged.

:class:`StepMetrics` collects the parts and, at the step's last micro-batch, merges every rank's with
one ``all_gather_object`` (:meth:`grasp_lightning.task.CrossRank.gather`), whatever keys each rank has: a
rank whose whole window was skipped joins with what it has. Lightning's ``self.log(on_step=True)``
instead keeps the last micro-batch's value of one rank, and per-metric ``sync_dist`` would cost one
collective per metric and need the same keys on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from typing_extensions import override

__all__ = ["Max", "Mean", "Min", "RankMean", "StepMetrics", "StepValue", "Std", "Sum", "combine"]


def _number(x: Any) -> float:
    return float(x.detach().float().sum()) if isinstance(x, torch.Tensor) else float(x)


class StepValue(float):
    """One micro-batch's part of a step metric (a ``float`` with the micro-batch's own value).

    Subclasses define ``kind``, how two parts of one rank merge (:meth:`merge`) and the step's value
    from every part (:meth:`final`, given the number of ranks).
    """

    kind = ""
    state: tuple[float, ...]

    def __new__(cls, *state: float):
        """A part from its state (numbers or 0-d tensors; see the subclass)."""
        state = tuple(_number(s) for s in state)
        value = cls.final(state, 1)
        obj = super().__new__(cls, 0.0 if value is None else value)
        obj.state = state
        return obj

    @classmethod
    def merge(cls, a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
        """Two parts' states as one (elementwise sum unless overridden)."""
        return tuple(x + y for x, y in zip(a, b))

    @classmethod
    def final(cls, state: tuple[float, ...], ranks: int) -> float | None:
        """The step's value from the merged state of all parts (``None``: nothing to report)."""
        return state[0]

    def __reduce__(self):
        return (type(self), self.state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.state}"


class Mean(StepValue):
    """``Mean(total, count)``: ``Σ total / Σ count`` over the step (``None`` when ``Σ count`` is 0)."""

    kind = "mean"

    @classmethod
    def of(cls, values: torch.Tensor) -> Mean:
        """The mean over the elements of ``values`` (any shape; bool counts as 0/1)."""
        values = values.detach().double()
        return cls(values.sum(), values.numel())

    @classmethod
    @override
    def final(cls, state, ranks):
        total, count = state
        return total / count if count else None


class Sum(StepValue):
    """``Σ`` over the step's micro-batches and ranks."""

    kind = "sum"


class RankMean(StepValue):
    """``Σ`` over a rank's micro-batches, mean over the ranks (e.g. seconds one rank spent)."""

    kind = "rank_mean"

    @classmethod
    @override
    def final(cls, state, ranks):
        return state[0] / max(1, ranks)


class Max(StepValue):
    """The largest value of the step."""

    kind = "max"

    @classmethod
    def of(cls, values: torch.Tensor) -> Max:
        """The largest element of a non-empty ``values``."""
        return cls(values.detach().float().max())

    @classmethod
    @override
    def merge(cls, a, b):
        return (max(a[0], b[0]),)


class Min(StepValue):
    """The smallest value of the step."""

    kind = "min"

    @classmethod
    def of(cls, values: torch.Tensor) -> Min:
        """The smallest element of a non-empty ``values``."""
        return cls(values.detach().float().min())

    @classmethod
    @override
    def merge(cls, a, b):
        return (min(a[0], b[0]),)


class Std(StepValue):
    """``Std(n, Σx, Σx²)``: the population standard deviation of every value of the step."""

    kind = "std"

    @classmethod
    def of(cls, values: torch.Tensor) -> Std:
        """The moments of the elements of ``values``."""
        values = values.detach().double()
        return cls(values.numel(), values.sum(), (values * values).sum())

    @classmethod
    @override
    def final(cls, state, ranks):
        n, s1, s2 = state
        if not n:
            return None
        mean = s1 / n
        return math.sqrt(max(0.0, s2 / n - mean * mean))


def _part(name: str, value: Any) -> StepValue:
    if isinstance(value, StepValue):
        return value
    if isinstance(value, (int, float, torch.Tensor)):
        return Mean(_number(value), 1.0)
    raise TypeError(f"metric {name!r}: expected a number, a 0-d tensor or a StepValue, got {type(value).__name__}")


def _merge_into(acc: dict[str, tuple[type[StepValue], tuple[float, ...]]], name: str, part: StepValue) -> None:
    cls = type(part)
    if name not in acc:
        acc[name] = (cls, part.state)
        return
    have, state = acc[name]
    if have.kind != cls.kind:
        raise ValueError(f"metric {name!r} is reported as {have.kind} and as {cls.kind} in one step")
    acc[name] = (have, have.merge(state, part.state))


def combine(*metrics: Mapping[str, Any]) -> dict[str, StepValue]:
    """Several micro-batch metric dicts of one rank as one (parts of the same name merged by their kind).

    Raises:
        ValueError: one name reported as two kinds. TypeError: a value that is not a number.
    """
    acc: dict = {}
    for m in metrics:
        for name, value in m.items():
            _merge_into(acc, name, _part(name, value))
    return {name: cls(*state) for name, (cls, state) in acc.items()}


class StepMetrics:
    """The parts of one optimizer step's metrics on this rank, reduced over ranks once per step."""

    def __init__(self) -> None:
        self._acc: dict[str, tuple[type[StepValue], tuple[float, ...]]] = {}

    def add(self, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Add one micro-batch's metrics (names prefixed with ``prefix``).

        Raises:
            ValueError: a name reported as two kinds in one step. TypeError: a value that is not a number.
        """
        for name, value in metrics.items():
            _merge_into(self._acc, prefix + name, _part(name, value))

    def clear(self) -> None:
        """Forget the parts (a new step starts)."""
        self._acc = {}

    def reduce(self, cross_rank) -> dict[str, float]:
        """The step's values over every rank, then :meth:`clear`. Collective: every rank calls it once per step
        (one ``cross_rank.gather``), also with no parts.

        Args:
            cross_rank: a :class:`grasp_lightning.task.CrossRank` (``gather`` of a picklable object).

        Returns:
            ``{name: value}`` sorted by name; names whose value is undefined (a mean over nothing) are left out.

        Raises:
            ValueError: ranks report one name as two kinds.
        """
        local = {name: (cls, state) for name, (cls, state) in self._acc.items()}
        self.clear()
        every = cross_rank.gather(local)
        acc: dict = {}
        for rank_parts in every:
            for name, (cls, state) in rank_parts.items():
                _merge_into(acc, name, cls(*state))
        out = {}
        for name in sorted(acc):
            cls, state = acc[name]
            value = cls.final(state, len(every))
            if value is not None:
                out[name] = float(value)
        return out
