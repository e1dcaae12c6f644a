"""A run's training curves: the per-step history a ``fit`` keeps in its run folder, and the picture of it.

:class:`grasp_lightning.callbacks.watch.RunWatch` appends one JSON line per logged step to
``<run folder>/curves.jsonl`` (:data:`HISTORY_FILE`): ``{"step": s, "<tag>": value, ...}`` with the tags of
``docs/metrics.md`` (``train/...``, ``val/acc/...``, ``time/optimizer_step_s``) and ``lr``, whatever the
logger (TensorBoard, CSV, W&B, MLflow). :func:`plot_runs` draws one or more runs' histories into one PNG
(matplotlib's Agg backend, no display), one panel per quantity (:data:`PANELS`), a line per run and tag;
``python -m grasp_lightning plot`` (:mod:`grasp_lightning.commands.plot`) calls it on run folders.
"""

from __future__ import annotations

import fnmatch
import json
import math
from pathlib import Path

from grasp_lightning.errors import GraspError

#: The history file in a run folder, one JSON object per logged step.
HISTORY_FILE = "curves.jsonl"
#: The picture ``fit`` writes beside it.
PICTURE_FILE = "curves.png"

#: Panels of the picture: title and the tags drawn in it (``fnmatch`` patterns), in order. A panel
#: without any of its tags in any run is left out.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("train/reward/mean", "train/rewards/*/mean")),
    ("GRASP-Bench accuracy", ("val/acc/overall", "val/acc/gaze", "val/acc/gesture", "val/acc/joint")),
    ("KL to the reference (nats/token)", ("train/kl",)),
    ("completion length (tokens)", ("train/completion_length/mean", "train/completion_length/max")),
    ("zero-variance groups (fraction)", ("train/zero_variance_groups/fraction",)),
    ("loss", ("train/loss",)),
    ("learning rate", ("lr",)),
    ("step time (s)", ("time/optimizer_step_s",)),
)

#: Line styles of the first, second, ... run of a comparison.
LINE_STYLES = ("-", "--", ":", "-.")


class CurvesError(GraspError):
    """A run folder without a readable curves history."""


def read_history(run: str | Path) -> list[dict[str, float]]:
    """The records of ``run``'s :data:`HISTORY_FILE` (``run`` is the run folder or the file itself).

    Returns:
        One dict per line, ``"step"`` (int, 0-based optimizer step) and the logged tags (floats).

    Raises:
        CurvesError: the folder or file does not exist, holds no history, or a line is not a JSON object.
    """
    path = Path(run)
    if not path.exists():
        raise CurvesError(f"{path}: no such run folder")
    file = path / HISTORY_FILE if path.is_dir() else path
    if not file.is_file():
        raise CurvesError(f"{path}: no {HISTORY_FILE} (a run folder of `fit` keeps its metrics there)")
    records = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise CurvesError(f"{file}:{number}: not a JSON line ({e.msg})") from None
        if not isinstance(record, dict) or "step" not in record:
            raise CurvesError(f"{file}:{number}: expected an object with a 'step', got {line[:80]!r}")
        records.append(record)
    if not records:
        raise CurvesError(f"{file}: no metrics recorded yet")
    return records


def series(records: list[dict[str, float]], tag: str) -> tuple[list[int], list[float]]:
    """Steps and finite values of ``tag`` in ``records``, in step order (a later record of a step wins)."""
    points: dict[int, float] = {}
    for record in records:
        value = record.get(tag)
        if isinstance(value, (int, float)) and math.isfinite(value):
            points[int(record["step"])] = float(value)
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def _tags(records: list[dict[str, float]], patterns: tuple[str, ...]) -> list[str]:
    present = sorted({k for r in records for k in r if k != "step"})
    out: list[str] = []
    for pattern in patterns:
        out += [t for t in present if fnmatch.fnmatchcase(t, pattern) and t not in out]
    return out


def plot_runs(runs: dict[str, list[dict[str, float]]], out: str | Path | None = None, title: str | None = None):
    """Draw the histories of ``runs`` (label -> records) into one figure, and save it as PNG at ``out``.

    Every panel of :data:`PANELS` with data gets a line per run and tag, labelled ``"<run>: <tag>"``
    (``"<tag>"`` alone for a single run), a colour per tag and a line style per run (solid, dashed, dotted,
    dash-dot); a series of one point is drawn as a marker.

    Returns:
        The matplotlib ``Figure`` (closed from pyplot's registry; its axes and lines stay readable).

    Raises:
        CurvesError: no run has any of the panels' tags.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [(name, {label: _tags(records, patterns) for label, records in runs.items()})
              for name, patterns in PANELS]
    panels = [(name, tags) for name, tags in panels if any(tags.values())]
    if not panels:
        raise CurvesError(f"{', '.join(runs)}: none of the plotted metrics ({', '.join(p for _, ps in PANELS for p in ps)})")
    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (name, tags) in zip(axes.flat, panels):
        order = list(dict.fromkeys(t for run_tags in tags.values() for t in run_tags))
        for index, (label, run_tags) in enumerate(tags.items()):
            for tag in run_tags:  # a colour per tag, a line style per run
                steps, values = series(runs[label], tag)
                line_label = tag if len(runs) == 1 else f"{label}: {tag}"
                ax.plot(steps, values, label=line_label, color=colors[order.index(tag) % len(colors)],
                        linestyle=LINE_STYLES[index % len(LINE_STYLES)], marker="o" if len(steps) < 2 else None,
                        markersize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    plt.close(fig)
    return fig
