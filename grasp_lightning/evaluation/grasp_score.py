"""GRASP-Bench scoring: per-item prediction records and a DDP-exact accuracy metric.

Answers are letters extracted by :func:`grasp_lightning.parsing.extract_answer` (first A-D inside
``<answer>``, then ``\\boxed{}``, then ``A)``/``A.``, then a leading letter). Accuracy is reported
per category, per group (gaze T1-T6, gesture G1-G6, joint J1-J4), per difficulty and overall, as in
the GRASP paper's Table 1 (arXiv 2605.15764); grounding precision follows the paper's Figure 5.

Definitions (the contract of :meth:`BenchAccuracy.compute`):

- An item is *correct* when its extracted letter equals the target letter. An item whose answer
  cannot be parsed (prediction ``None``) counts as wrong and in ``unparseable_rate``.
- ``acc/<group>`` and ``acc/overall`` are count-weighted (correct / items over the pooled items);
  ``acc_macro/<group>`` and ``acc_macro/overall`` are unweighted means of the category accuracies
  over the categories that have at least one item.
- Grounding precision of one item is ``|named ∩ gt| / |named|`` (paper, Figure 5), with ``named``
  the people the reasoning mentions and ``gt`` the participants of the item's ground-truth
  events. Items without ground-truth participants, or whose ``named`` is ``None`` (not computed),
  are not grounding-eligible. An eligible item naming nobody has no defined precision: it is left
  out of the ``grounding/precision`` mean and lowers ``grounding/named_rate`` (eligible items
  naming at least one person / eligible items) instead.
- ``grounding/enumeration_rate``: among the naming eligible items (those in ``grounding/n``) whose
  shown people are known, the share that *enumerate*: the named set covers every person the item
  shows, and it shows at least two (:func:`grasp_lightning.grpo.rewards.enumerates`). The people an item
  shows are those named in its question and options plus its ground-truth participants
  (:func:`grasp_lightning.data.formats.persons_shown`). It counts directly the failure that the
  SGR's precision penalises ("enumerating every visible person lowers P").
- ``grounding/temporal_iou``: the mean, over the items with at least one ground-truth event span
  (``start_seconds``/``end_seconds``), of the ``temporal_grounding`` score of the completion
  (:func:`grasp_lightning.grpo.rewards.temporal_grounding`; 0 when it names no span). The project's own
  metric: the paper names temporal alignment as future work.
- A value with nothing to average over (a category, difficulty or group without items, precision
  without any naming item) is ``NaN``; the key set of :meth:`BenchAccuracy.compute` is always the
  same, so logs and reports line up across runs. Reports print ``NaN`` as "–".
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from grasp_lightning import parsing
from grasp_lightning.data.formats import persons_shown
from grasp_lightning.data.records import (
    CATEGORIES,
    DIFFICULTIES,
    GROUPS,
    GraspItem,
    normalise_category,
)
from grasp_lightning.errors import GraspDataError
from grasp_lightning.grpo.rewards import enumerates, temporal_grounding

_CAT_INDEX = {c: i for i, c in enumerate(CATEGORIES)}
_DIFF_INDEX = {d: i for i, d in enumerate(DIFFICULTIES)}


def _target_letter(target: str, where: str) -> str:
    """Return the single upper-case target letter; raise :class:`GraspDataError` otherwise."""
    letter = str(target).strip().upper()
    if len(letter) != 1 or not letter.isalpha():
        raise GraspDataError(where, f"target {target!r} is not a single option letter (open-ended items cannot be scored)")
    return letter


def _precision(named: frozenset[int] | None, gt: frozenset[int]) -> float | None:
    """``|named ∩ gt| / |named|`` (paper, Figure 5); ``None`` when undefined (no gt, nobody named)."""
    if named is None or not gt or not named:
        return None
    return len(named & gt) / len(named)


def score_completion(completion: str, item: GraspItem) -> dict[str, Any]:
    """Score one model completion against one GRASP-Bench item; the record written to results.json.

    Args:
        completion: the generated text (``<think>…</think><answer>B</answer>`` or anything else).
        item: the bench item; ``item.answer`` must be an option letter and ``item.category`` set.

    Returns:
        A JSON-ready dict: ``uid``, ``category`` (canonical ``T1``..``J4``), ``difficulty``
        (``easy``/``medium``/``hard`` or ``None``), ``target`` (letter), ``predicted`` (letter or
        ``None`` when unparseable), ``correct`` (bool), ``participants_named`` (sorted person ids
        mentioned in the reasoning), ``participants_gt`` (sorted ids of the ground-truth events),
        ``precision`` (``|named ∩ gt| / |named|`` or ``None`` when there is no ground truth or
        nobody is named), ``participants_visible`` (sorted ids the item shows:
        :func:`~grasp_lightning.data.formats.persons_shown`), ``temporal_iou`` (the
        ``temporal_grounding`` score in ``[0, 1]``, ``None`` when no event of the item has a time
        span) and ``completion`` (the text). :meth:`BenchAccuracy.update_from_records`
        consumes a list of these.

    Raises:
        GraspDataError: naming ``item.origin`` when the item has no category or a non-letter answer.
    """
    target = _target_letter(item.answer, item.origin)
    predicted = parsing.extract_answer(completion)
    return make_record(completion, item, target=target, predicted=predicted,
                       correct=predicted is not None and predicted.strip().upper() == target)


def make_record(completion: str, item: GraspItem, *, target: str, predicted: str | None,
                correct: bool) -> dict[str, Any]:
    """The results.json record of one scored completion (keys of :func:`score_completion`).

    The caller decides ``predicted`` and ``correct`` (an evaluation protocol's answer extraction and
    rule, e.g. :mod:`grasp_lightning.evaluation.protocol`); participants and grounding precision are
    computed here from the completion's reasoning.

    Raises:
        GraspDataError: naming ``item.origin`` when the item has no category.
    """
    if item.category is None:
        raise GraspDataError(item.origin, "bench item has no category")
    category = normalise_category(item.category, item.origin)
    named = frozenset(parsing.extract_participants(parsing.reasoning_text(completion)))
    gt = item.participants
    has_spans = any(event.span is not None for event in item.events)
    return {
        "uid": item.uid,
        "category": category,
        "difficulty": item.difficulty,
        "target": target,
        "predicted": predicted,
        "correct": bool(correct),
        "participants_named": sorted(named),
        "participants_gt": sorted(gt),
        "precision": _precision(named, gt),
        "participants_visible": sorted(persons_shown(item)),
        "temporal_iou": temporal_grounding(completion, item) if has_spans else None,
        "completion": completion,
    }


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """Element-wise ``num / den`` as float64, ``NaN`` where ``den == 0``."""
    num, den = num.double(), den.double()
    return torch.where(den > 0, num / den.clamp(min=1), torch.full_like(num, math.nan))


class BenchAccuracy(Metric):
    """GRASP-Bench accuracy per category, group, difficulty and overall, plus grounding precision,
    enumeration rate and temporal IoU.

    All states are sum-reduced tensors (counts as int64, the precision and IoU sums as float64), so
    ``compute()`` under DDP, and :meth:`merge_state` of per-rank metrics, give the same numbers as
    one process scoring every item. Rows with ``valid=False`` (padding that a distributed sampler
    adds to even out ranks) are not counted. Definitions: module docstring; source: GRASP paper,
    Table 1 (accuracies) and Figure 5 (grounding precision).

    Log the dict of :meth:`compute` (``self.log_dict(metric.compute())``), not the metric object:
    it returns many values.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    cat_correct: Tensor
    cat_total: Tensor
    diff_correct: Tensor
    diff_total: Tensor
    unparseable: Tensor
    precision_sum: Tensor
    precision_count: Tensor
    grounding_eligible: Tensor
    enumerating: Tensor
    enumeration_count: Tensor
    temporal_sum: Tensor
    temporal_count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        n_cat, n_diff = len(CATEGORIES), len(DIFFICULTIES)
        self.add_state("cat_correct", torch.zeros(n_cat, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("cat_total", torch.zeros(n_cat, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("diff_correct", torch.zeros(n_diff, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("diff_total", torch.zeros(n_diff, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("unparseable", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("precision_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("precision_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("grounding_eligible", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("enumerating", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("enumeration_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("temporal_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("temporal_count", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(
        self,
        predictions: list[str | None],
        targets: list[str],
        categories: list[str],
        difficulties: list[str | None],
        named: list[frozenset[int] | None],
        gt: list[frozenset[int]],
        valid: Tensor | None = None,
        correct: list[bool] | None = None,
        visible: list[frozenset[int] | None] | None = None,
        temporal: list[float | None] | None = None,
    ) -> None:
        """Count one batch of B scored items.

        Args:
            predictions: B extracted letters, ``None`` where the answer could not be parsed.
            targets: B target letters.
            categories: B category codes (``T1``..``J4``; ``C1``..``C4`` are read as ``J1``..``J4``).
            difficulties: B of ``easy``/``medium``/``hard`` (case-insensitive), or ``None`` (then the item counts in
                every tally except the per-difficulty ones).
            named: B sets of person ids named in the reasoning, ``None`` when not computed.
            gt: B sets of ground-truth participant ids (empty when the item carries no events).
            valid: bool ``(B,)``; ``False`` marks sampler padding, which is skipped. ``None``: all valid.
            correct: B verdicts decided by the caller (an evaluation protocol's rule, which may score
                open-ended items); ``None``: a row is correct when its prediction equals its target letter.
            visible: B sets of person ids the item shows (:func:`~grasp_lightning.data.formats.persons_shown`;
                ``gt`` is added), ``None`` where unknown; ``None``: all unknown (no enumeration counted).
            temporal: B ``temporal_grounding`` scores in ``[0, 1]``, ``None`` for an item without event
                time spans; ``None``: none has spans.

        Raises:
            ValueError: if the lists and ``valid`` differ in length.
            GraspDataError: naming the batch row for an unknown category/difficulty, or a non-letter target
                when ``correct`` is ``None``.
        """
        size = len(predictions)
        visible = [None] * size if visible is None else visible
        temporal = [None] * size if temporal is None else temporal
        lengths = {len(targets), len(categories), len(difficulties), len(named), len(gt), len(visible), len(temporal),
                   *(() if correct is None else (len(correct),))}
        if lengths != {size} or (valid is not None and tuple(valid.shape) != (size,)):
            raise ValueError(f"BenchAccuracy.update: inputs differ in length (predictions {size}, others {sorted(lengths)}, "
                             f"valid {None if valid is None else tuple(valid.shape)})")
        keep = [True] * size if valid is None else [bool(v) for v in valid.tolist()]
        cat_idx, cat_ok, diff_idx, diff_ok = [], [], [], []
        unparseable = eligible = n_prec = n_enum = enum_hits = n_tmp = 0
        prec_sum = tmp_sum = 0.0
        for row in range(size):
            if not keep[row]:
                continue
            where = f"batch row {row}"
            if correct is not None:
                ok = bool(correct[row])
            else:
                ok = predictions[row] is not None and predictions[row].strip().upper() == _target_letter(targets[row], where)
            cat_idx.append(_CAT_INDEX[normalise_category(categories[row], where)])
            cat_ok.append(ok)
            if difficulties[row] is not None:
                diff = str(difficulties[row]).strip().lower()
                if diff not in _DIFF_INDEX:
                    raise GraspDataError(where, f"unknown difficulty {difficulties[row]!r} (expected easy/medium/hard)")
                diff_idx.append(_DIFF_INDEX[diff])
                diff_ok.append(ok)
            unparseable += predictions[row] is None
            if temporal[row] is not None:
                n_tmp += 1
                tmp_sum += float(temporal[row])
            if named[row] is None or not gt[row]:
                continue
            eligible += 1
            p = _precision(named[row], gt[row])
            if p is None:
                continue
            n_prec += 1
            prec_sum += p
            if visible[row] is not None:
                n_enum += 1
                enum_hits += enumerates(named[row], frozenset(visible[row]) | gt[row])
        self._tally(self.cat_correct, self.cat_total, cat_idx, cat_ok)
        self._tally(self.diff_correct, self.diff_total, diff_idx, diff_ok)
        self.unparseable += unparseable
        self.grounding_eligible += eligible
        self.precision_count += n_prec
        self.precision_sum += prec_sum
        self.enumeration_count += n_enum
        self.enumerating += enum_hits
        self.temporal_count += n_tmp
        self.temporal_sum += tmp_sum

    @staticmethod
    def _tally(correct: Tensor, total: Tensor, index: list[int], ok: list[bool]) -> None:
        """Add per-bin counts in place: ``total[index[i]] += 1``, ``correct[index[i]] += ok[i]``."""
        if not index:
            return
        idx = torch.tensor(index, dtype=torch.long, device=total.device)
        hit = torch.tensor(ok, dtype=torch.bool, device=total.device)
        total += torch.bincount(idx, minlength=total.numel())
        correct += torch.bincount(idx[hit], minlength=correct.numel())

    def update_from_records(self, records: list[dict[str, Any]], valid: Tensor | None = None) -> None:
        """:meth:`update` from records of :func:`score_completion` or :func:`make_record` (``valid``: bool
        ``(B,)`` or ``None``); each record's ``correct`` is the verdict counted. A record without
        ``participants_visible`` or ``temporal_iou`` (a results.json written before they existed) counts
        in neither of those metrics."""
        self.update(
            [r["predicted"] for r in records],
            [r["target"] for r in records],
            [r["category"] for r in records],
            [r["difficulty"] for r in records],
            [frozenset(r["participants_named"]) for r in records],
            [frozenset(r["participants_gt"]) for r in records],
            valid,
            [bool(r["correct"]) for r in records],
            [None if r.get("participants_visible") is None else frozenset(r["participants_visible"]) for r in records],
            [r.get("temporal_iou") for r in records],
        )

    def compute(self) -> dict[str, float]:
        """Return the metric dict (accuracies in [0, 1], counts as floats, ``NaN`` where undefined).

        Keys: ``acc/<cat>`` and ``n/<cat>`` for the 16 categories; ``acc/<group>`` (count-weighted),
        ``acc_macro/<group>`` and ``n/<group>`` for gaze/gesture/joint; ``acc/<difficulty>`` and
        ``n/<difficulty>``; ``acc/overall``, ``acc_macro/overall``, ``n/overall``;
        ``unparseable_rate`` (unparseable / items); ``grounding/precision`` (mean over naming
        items), ``grounding/named_rate`` (naming / eligible items), ``grounding/n`` (naming items);
        ``grounding/enumeration_rate`` (enumerating / naming items whose shown people are known) and
        ``grounding/temporal_iou`` (mean ``temporal_grounding`` over the items with event time spans).
        """
        out: dict[str, float] = {}
        cat_acc = _ratio(self.cat_correct, self.cat_total)
        for i, cat in enumerate(CATEGORIES):
            out[f"acc/{cat}"] = float(cat_acc[i])
            out[f"n/{cat}"] = float(self.cat_total[i])
        for group, cats in GROUPS.items():
            idx = torch.tensor([_CAT_INDEX[c] for c in cats], device=self.cat_total.device)
            out[f"acc/{group}"] = float(_ratio(self.cat_correct[idx].sum(), self.cat_total[idx].sum()))
            out[f"acc_macro/{group}"] = _nanmean(cat_acc[idx])
            out[f"n/{group}"] = float(self.cat_total[idx].sum())
        diff_acc = _ratio(self.diff_correct, self.diff_total)
        for i, diff in enumerate(DIFFICULTIES):
            out[f"acc/{diff}"] = float(diff_acc[i])
            out[f"n/{diff}"] = float(self.diff_total[i])
        total = self.cat_total.sum()
        out["acc/overall"] = float(_ratio(self.cat_correct.sum(), total))
        out["acc_macro/overall"] = _nanmean(cat_acc)
        out["n/overall"] = float(total)
        out["unparseable_rate"] = float(_ratio(self.unparseable, total))
        out["grounding/precision"] = float(_ratio(self.precision_sum, self.precision_count))
        out["grounding/named_rate"] = float(_ratio(self.precision_count, self.grounding_eligible))
        out["grounding/n"] = float(self.precision_count)
        out["grounding/enumeration_rate"] = float(_ratio(self.enumerating, self.enumeration_count))
        out["grounding/temporal_iou"] = float(_ratio(self.temporal_sum, self.temporal_count))
        return out


def _nanmean(values: Tensor) -> float:
    """Mean of the non-NaN entries of a 1-D tensor; ``NaN`` when all are NaN."""
    present = values[~torch.isnan(values)]
    return float(present.mean()) if present.numel() else math.nan
