"""docs/metrics.md's "What healthy looks like": every row names a logged tag of the page's tables and a
source, and the thresholds it states for the GRPO step warnings are the code's
(``tasks/grpo.py``: ``WARN_TRUNCATED_FRACTION``, ``WARN_ZERO_VARIANCE_FRACTION``)."""

import re
from pathlib import Path

import grasp_lightning.tasks.grpo as grpo_task

METRICS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
SECTION = "### What healthy looks like"


def healthy_rows() -> dict[str, list[str]]:
    """Tag -> the cells after it, of the table under the section's heading."""
    lines = METRICS.read_text(encoding="utf-8").splitlines()
    start = lines.index(SECTION)
    rows = {}
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if m := re.match(r"\| `([^`]+)` \|(.*)\|\s*$", line):
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    return rows


def warning_threshold(cell: str) -> float | None:
    """The number of a ``WARNING at ≥ X`` cell, ``None`` when the cell states no warning."""
    m = re.search(r"WARNING at ≥ ([0-9.]+)", cell)
    return float(m.group(1)) if m else None


def test_the_documented_warning_thresholds_are_the_codes():
    rows = healthy_rows()
    assert warning_threshold(rows["train/completion_length/truncated_fraction"][1]) == grpo_task.WARN_TRUNCATED_FRACTION
    assert warning_threshold(rows["train/zero_variance_groups/fraction"][1]) == grpo_task.WARN_ZERO_VARIANCE_FRACTION
    warned = {tag for tag, cells in rows.items() if warning_threshold(cells[1]) is not None}
    assert warned == {"train/completion_length/truncated_fraction", "train/zero_variance_groups/fraction"}


def test_every_healthy_row_is_a_listed_tag_with_a_range_and_a_source():
    text = METRICS.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([^`]+)` \|", text.split(SECTION)[0], flags=re.M))
    rows = healthy_rows()
    for tag in ("train/kl", "train/reward/mean", "train/zero_variance_groups/fraction",
                "train/completion_length/truncated_fraction", "train/clip_ratio", "train/sampling/logp_difference/mean",
                "train/sampling/importance_weight/mean"):
        assert tag in rows, tag
    for tag, (healthy, stop, source) in rows.items():
        assert tag in listed, f"{tag}: not a tag of docs/metrics.md's tables"
        assert healthy and stop and source, tag
