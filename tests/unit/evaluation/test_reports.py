"""Tests of grasp_lightning.evaluation.reports: Markdown table, results.json round trip, bar chart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from grasp_lightning.data.records import CATEGORIES
from grasp_lightning.evaluation.grasp_score import BenchAccuracy
from grasp_lightning.evaluation.reports import (
    CATEGORY_NAMES,
    PAPER_REFERENCE,
    category_bar_chart,
    markdown_table,
    read_results_json,
    write_results_json,
)
from tests.helpers import golden_records


@pytest.fixture(scope="module")
def scored() -> tuple[dict[str, float], list[dict]]:
    records = golden_records()
    metric = BenchAccuracy()
    metric.update_from_records(records)
    return metric.compute(), records


def _partial_metrics() -> dict[str, float]:
    """Only T1 scored: every other category is NaN."""
    metric = BenchAccuracy()
    metric.update(["A", None], ["A", "B"], ["T1", "T1"], ["easy", "easy"], [frozenset({0}), None],
                  [frozenset({0, 1}), frozenset()], None)
    return metric.compute()


def test_markdown_table_rows_and_references(scored: tuple[dict[str, float], list[dict]]) -> None:
    metrics, _ = scored
    table = markdown_table(metrics, label="tiny")
    lines = table.splitlines()
    assert lines[0] == "| code | category | tiny | Qwen3-VL-8B-Instruct | Qwen3-VL-8B + SGR | n |"
    for code in CATEGORIES:
        assert sum(line.startswith(f"| {code} | {CATEGORY_NAMES[code]} |") for line in lines) == 1, code
    # T1 2/3 = 66.7%, 3 items; per-category references unknown
    assert "| T1 | Gaze target identification | 66.7 | – | – | 3 |" in lines
    assert "|  | **Gaze** | 77.8 | 28.3 | 46.3 | 9 |" in lines  # 7/9
    assert "|  | **Gesture** | 57.1 | 52.7 | 58.0 | 7 |" in lines  # 4/7
    assert "|  | **Joint** | 40.0 | 38.0 | 48.1 | 5 |" in lines  # 2/5
    assert "|  | **Overall** | 61.9 | 38.3 | 50.4 | 21 |" in lines  # 13/21
    assert "Unparseable answers: 19.0% of 21 items." in table  # 4/21
    assert "Figure 5): 77.3% over 11 items naming someone; named rate 73.3%." in table  # 8.5/11, 11/15
    # enumeration 1/11, temporal IoU (1 + 0 + 0.5) / 3
    assert "Enumeration rate (naming every person shown): 9.1%; temporal IoU of the named event spans: 50.0%." in table
    assert len([line for line in lines if line.startswith("|")]) == 2 + 16 + 4


def test_markdown_table_dashes_for_missing() -> None:
    table = markdown_table(_partial_metrics())
    assert "| G1 | Gesture recognition | – | – | – | 0 |" in table
    assert "| T1 | Gaze target identification | 50.0 | – | – | 2 |" in table
    assert "|  | **Joint** | – | 38.0 | 48.1 | 0 |" in table
    assert "| T1 | Gaze target identification | – |" in markdown_table({})
    assert "Enumeration rate (naming every person shown): –%; temporal IoU of the named event spans: –%." in \
        markdown_table(_partial_metrics())


def test_paper_reference_has_every_row() -> None:
    for column in PAPER_REFERENCE.values():
        assert set(column) == {*CATEGORIES, "gaze", "gesture", "joint", "overall"}
    assert PAPER_REFERENCE["Qwen3-VL-8B + SGR"]["overall"] == 50.4


def test_results_json_round_trip(tmp_path: Path, scored: tuple[dict[str, float], list[dict]]) -> None:
    metrics, records = scored
    path = tmp_path / "bench" / "results.json"
    meta = {"checkpoint": "last.ckpt", "step": 12}
    assert write_results_json(path, metrics, records, meta) == path
    data = read_results_json(path)
    assert data["meta"] == meta and data["items"] == records and data["metrics"] == metrics
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    partial = _partial_metrics()
    write_results_json(path, partial, [], meta)  # overwrites; NaN becomes null (strict JSON)
    raw = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert raw["metrics"]["acc/G1"] is None
    assert math.isnan(read_results_json(path)["metrics"]["acc/G1"])


def test_results_json_failure_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_results_json(path, {"acc/overall": 0.5}, [], {})
    with pytest.raises(TypeError):
        write_results_json(path, {"acc/overall": 0.5}, [{"bad": object()}], {})
    assert read_results_json(path)["metrics"] == {"acc/overall": 0.5}
    assert list(tmp_path.iterdir()) == [path]


def test_category_bar_chart(tmp_path: Path, scored: tuple[dict[str, float], list[dict]]) -> None:
    metrics, _ = scored
    png = tmp_path / "charts" / "categories.png"
    image = category_bar_chart(metrics, path=png)
    assert image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    partial = category_bar_chart(_partial_metrics())
    assert partial.shape == image.shape
