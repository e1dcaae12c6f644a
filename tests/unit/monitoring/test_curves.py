"""grasp_lightning/monitoring/curves.py: reading a run's curves.jsonl and drawing it."""

from __future__ import annotations

import json

import pytest

from grasp_lightning.monitoring.curves import CurvesError, plot_runs, read_history, series


def test_series_orders_steps_keeps_the_later_record_and_drops_non_finite(tmp_path) -> None:
    rows = [{"step": 2, "train/kl": 0.3}, {"step": 0, "train/kl": 0.1}, {"step": 2, "train/kl": 0.4},
            {"step": 1, "train/kl": float("nan")}, {"step": 3, "val/acc/overall": 0.5}]
    (tmp_path / "curves.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert series(read_history(tmp_path), "train/kl") == ([0, 2], [0.1, 0.4])


def test_a_bad_line_names_the_file_and_line(tmp_path) -> None:
    (tmp_path / "curves.jsonl").write_text('{"step": 0, "train/loss": 1.0}\n[1, 2]\n')
    with pytest.raises(CurvesError, match=r"curves.jsonl:2: expected an object with a 'step'"):
        read_history(tmp_path)


def test_one_run_draws_only_the_panels_with_data_labelled_by_tag() -> None:
    records = [{"step": s, "train/loss": 2.0 - s, "lr": 1e-5} for s in range(3)]
    fig = plot_runs({"sft": records})
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["loss", "learning rate"]
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "train/loss" and list(line.get_ydata()) == [2.0, 1.0, 0.0]


def test_no_plotted_tag_is_an_error() -> None:
    with pytest.raises(CurvesError, match="none of the plotted metrics"):
        plot_runs({"x": [{"step": 0, "data/skipped": 0.0}]})
