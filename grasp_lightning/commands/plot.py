"""``python -m grasp_lightning plot RUN_DIR [RUN_DIR ...] --out FILE.png``: the training curves of one or
more ``fit`` run folders in one PNG, a line per run (e.g. SGR against plain GRPO).

Each run folder holds ``curves.jsonl`` (written during ``fit`` by
:class:`grasp_lightning.callbacks.watch.RunWatch`, whatever the logger); the panels are those of
:data:`grasp_lightning.monitoring.curves.PANELS` (reward and its terms, bench accuracy, KL, length, zero-variance
groups, loss, learning rate, step time). A missing folder, or one without metrics, is refused with one
line on stderr (exit status 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from grasp_lightning.monitoring.curves import CurvesError, plot_runs, read_history


def build_parser() -> argparse.ArgumentParser:
    """The ``plot`` command's parser."""
    from grasp_lightning.commands import COMMANDS

    parser = argparse.ArgumentParser(prog="python -m grasp_lightning plot", description=COMMANDS["plot"].description)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders of `fit` (holding curves.jsonl)")
    parser.add_argument("--out", default="curves.png", help="the PNG to write (default: curves.png)")
    parser.add_argument("--labels", nargs="+", default=None,
                        help="a label per run folder (default: each folder as given)")
    parser.add_argument("--title", default=None, help="the figure's title")
    return parser


def plot(runs: Sequence[str], out: str | Path, labels: Sequence[str] | None = None, title: str | None = None):
    """Draw the runs' curves into ``out``; return the matplotlib ``Figure``
    (:func:`grasp_lightning.monitoring.curves.plot_runs`).

    Raises:
        CurvesError: a folder is missing or has no metrics, or the labels do not match the folders.
    """
    if labels is not None and len(labels) != len(runs):
        raise CurvesError(f"--labels: {len(labels)} labels for {len(runs)} run folders")
    names = list(labels) if labels is not None else [str(run).rstrip("/") for run in runs]
    if len(set(names)) != len(names):
        raise CurvesError(f"run labels {names} repeat: give --labels")
    return plot_runs({name: read_history(run) for name, run in zip(names, runs)}, out, title=title)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m grasp_lightning plot``: write the PNG and print its path; a bad folder: one error line."""
    args = build_parser().parse_args(argv)
    try:
        plot(args.runs, args.out, args.labels, args.title)
    except CurvesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(args.out)
    return 0
