"""GRASP-Bench reports: results.json, a Markdown table laid out like the paper's Table 1, a bar chart.

All functions read the metric dict of :meth:`grasp_lightning.evaluation.grasp_score.BenchAccuracy.compute`
(accuracies in [0, 1], ``NaN`` where undefined) and the per-item records of
:func:`grasp_lightning.evaluation.grasp_score.score_completion`. Source of the layout and reference numbers:
GRASP paper (arXiv 2605.15764), Table 1; ``docs/data-format.md``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from grasp_lightning.data.records import CATEGORIES, GROUPS

log = logging.getLogger(__name__)

#: Category names as in the GRASP paper (``docs/data-format.md``, "The 16 categories").
CATEGORY_NAMES: dict[str, str] = {
    "T1": "Gaze target identification",
    "T2": "Gaze event classification",
    "T3": "Temporal gaze reasoning (duration, order)",
    "T4": "Mutual gaze recognition",
    "T5": "Gaze following and social influence",
    "T6": "Group attention dynamics",
    "G1": "Gesture recognition",
    "G2": "Gesture type classification (pointing / giving / showing / reaching)",
    "G3": "Gesture temporal reasoning",
    "G4": "Gesture frequency and distribution",
    "G5": "Gesture sequence chains",
    "G6": "Reciprocal gesture patterns",
    "J1": "Gaze–gesture temporal alignment",
    "J2": "Eye contact during interaction",
    "J3": "Gaze response to gesture",
    "J4": "Cross-modal person dynamics",
}

_ROWS: tuple[str, ...] = (*CATEGORIES, "gaze", "gesture", "joint", "overall")


def _reference(gaze: float, gesture: float, joint: float, overall: float) -> dict[str, float | None]:
    """A reference column: group and overall accuracies in %, per-category values unknown (None)."""
    column: dict[str, float | None] = {c: None for c in CATEGORIES}
    column.update(gaze=gaze, gesture=gesture, joint=joint, overall=overall)
    return column


#: Paper reference accuracies in % (Table 1), keyed by model then by row (category code, group
#: name or ``"overall"``). Per-category values are not in ``docs/data-format.md``: ``None``
#: (printed "–") until filled in from the paper.
PAPER_REFERENCE: dict[str, dict[str, float | None]] = {
    "Qwen3-VL-8B-Instruct": _reference(28.3, 52.7, 38.0, 38.3),
    "Qwen3-VL-8B + SGR": _reference(46.3, 58.0, 48.1, 50.4),
}


def _json_safe(value: Any) -> Any:
    """Replace non-finite floats (NaN, ±inf) by ``None`` recursively, so the file is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` atomically: a temporary file in the same folder, fsync, then
    ``os.replace``; a crash leaves the previous file. Parent folders are created.

    Raises:
        ValueError: ``data`` holds NaN or infinity (strict JSON; see :func:`write_results_json`).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, ensure_ascii=False, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def write_results_json(path: str | os.PathLike[str], metrics: dict[str, float], items: list[dict[str, Any]],
                       meta: dict[str, Any]) -> Path:
    """Write ``{"meta", "metrics", "items"}`` to ``path`` atomically (temp file in the same folder + ``os.replace``).

    NaN metric values (undefined accuracies) are written as ``null``; :func:`read_results_json`
    turns them back into NaN. Parent folders are created.

    Args:
        path: destination, e.g. ``<log_dir>/bench/results.json``.
        metrics: the dict of ``BenchAccuracy.compute()``.
        items: per-item records of ``score_completion``.
        meta: free-form run information (checkpoint, step, model, generation settings).

    Returns:
        The path written.

    Raises:
        TypeError: if a value is not JSON-serialisable (the destination is left untouched).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    payload = _json_safe({"meta": meta, "metrics": metrics, "items": items})
    write_json_atomic(dest, payload)
    log.info("wrote GRASP-Bench results for %d items to %s", len(items), dest)
    return dest


def read_results_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file of :func:`write_results_json`; ``null`` metric values come back as NaN."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    data["metrics"] = {k: math.nan if v is None else v for k, v in data["metrics"].items()}
    return data


def _pct(value: float | None) -> str:
    """A [0, 1] accuracy as ``"12.3"`` (%), or "–" when missing or NaN."""
    return "–" if value is None or math.isnan(value) else f"{100.0 * value:.1f}"


def _ref(value: float | None) -> str:
    """A reference value already in %, or "–"."""
    return "–" if value is None else f"{value:.1f}"


def _count(metrics: dict[str, float], key: str) -> str:
    value = metrics.get(key)
    return "–" if value is None or math.isnan(value) else str(int(value))


def markdown_table(metrics: dict[str, float], label: str = "ours") -> str:
    """Render a metric dict as a Markdown table laid out like the paper's Table 1.

    Rows: the 16 categories, then Gaze, Gesture, Joint (count-weighted) and Overall. Columns: code,
    name, our accuracy in % (header ``label``), each model of :data:`PAPER_REFERENCE` in %, and the
    item count n. Missing or NaN values print "–". Below the table: accuracy by difficulty,
    unparseable-answer rate, grounding precision (Figure 5), enumeration rate and temporal IoU.
    """
    refs = list(PAPER_REFERENCE)
    lines = [
        "| code | category | " + " | ".join([label, *refs]) + " | n |",
        "|---|---|" + "---:|" * (len(refs) + 2),
    ]
    for row in _ROWS:
        code, name = (row, CATEGORY_NAMES[row]) if row in CATEGORY_NAMES else ("", f"**{row.capitalize()}**")
        cells = [code, name, _pct(metrics.get(f"acc/{row}")), *(_ref(PAPER_REFERENCE[m].get(row)) for m in refs),
                 _count(metrics, f"n/{row}")]
        lines.append("| " + " | ".join(cells) + " |")
    diffs = " · ".join(f"{d} {_pct(metrics.get(f'acc/{d}'))}% (n={_count(metrics, f'n/{d}')})"
                       for d in ("easy", "medium", "hard"))
    lines += [
        "",
        f"Accuracy by difficulty: {diffs}.",
        f"Macro accuracy (mean over categories): {_pct(metrics.get('acc_macro/overall'))}%.",
        f"Unparseable answers: {_pct(metrics.get('unparseable_rate'))}% of {_count(metrics, 'n/overall')} items.",
        f"Grounding precision `|named ∩ gt| / |named|` (Figure 5): {_pct(metrics.get('grounding/precision'))}% "
        f"over {_count(metrics, 'grounding/n')} items naming someone; "
        f"named rate {_pct(metrics.get('grounding/named_rate'))}%.",
        f"Enumeration rate (naming every person shown): {_pct(metrics.get('grounding/enumeration_rate'))}%; "
        f"temporal IoU of the named event spans: {_pct(metrics.get('grounding/temporal_iou'))}%.",
    ]
    return "\n".join(lines) + "\n"


_GROUP_COLOURS = {"gaze": "#4C72B0", "gesture": "#DD8452", "joint": "#55A868"}


def category_bar_chart(metrics: dict[str, float], path: str | os.PathLike[str] | None = None,
                       title: str = "GRASP-Bench accuracy per category") -> np.ndarray:
    """Draw the 16 category accuracies (%) as bars coloured by group; categories without items show "–".

    Uses matplotlib's Agg canvas directly (no pyplot state, no display needed).

    Args:
        metrics: the dict of ``BenchAccuracy.compute()``.
        path: if given, also save the chart there as PNG (parent folders are created).
        title: the chart title.

    Returns:
        uint8 array ``(H, W, 3)``, RGB, for ``SummaryWriter.add_image(tag, img, dataformats="HWC")``.
    """
    return _bar_chart({group: list(cats) for group, cats in GROUPS.items()}, metrics, path, title,
                      colours=_GROUP_COLOURS, width=8.0)


def accuracy_bar_chart(categories: list[str], metrics: dict[str, float], path: str | os.PathLike[str] | None = None,
                       title: str = "accuracy per category") -> np.ndarray:
    """Any suite's category accuracies (%) (``acc/<category>`` of
    :class:`~grasp_lightning.evaluation.base.CategoryAccuracy`), one bar each in the given order, then the
    pooled ``overall``; categories without items show "–". Returns and saves as :func:`category_bar_chart`."""
    return _bar_chart({"categories": list(categories), "overall": ["overall"]}, metrics, path, title,
                      colours={"categories": _GROUP_COLOURS["gaze"], "overall": "#8C8C8C"}, legend=False)


def _bar_chart(groups: dict[str, list[str]], metrics: dict[str, float], path: str | os.PathLike[str] | None,
               title: str, *, colours: dict[str, str], legend: bool = True, width: float | None = None) -> np.ndarray:
    """Bars of ``metrics["acc/<category>"]`` (%) for each group's categories, in order, one colour per group."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    order = [c for cats in groups.values() for c in cats]
    fig = Figure(figsize=(width or max(4.0, min(12.0, 0.5 * len(order) + 1)), 3.2), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for group, cats in groups.items():
        values = [metrics.get(f"acc/{c}", math.nan) for c in cats]
        xs = [order.index(c) for c in cats]
        heights = [0.0 if math.isnan(v) else 100.0 * v for v in values]
        ax.bar(xs, heights, color=colours[group], label=group)
        for x, v, h in zip(xs, values, heights):
            ax.text(x, h + 1.5, "–" if math.isnan(v) else f"{h:.0f}", ha="center", fontsize=7)
    ax.set_xticks(range(len(order)), order, fontsize=8)
    ax.set_ylim(0, 125)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7, loc="upper center", ncols=3, frameon=False)
    fig.tight_layout()
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
        log.info("saved category bar chart to %s", path)
    return image
