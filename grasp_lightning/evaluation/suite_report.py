"""``results.json`` with one section per evaluation suite, and the per-suite report files.

Layout (GRASP-Bench keeps the top level that :func:`grasp_lightning.evaluation.reports.write_results_json`
writes, so readers of GRASP-only results see no change)::

    {"meta": {...},
     "metrics": {GRASP-Bench metrics}, "items": [GRASP-Bench records],      # when GRASP-Bench ran
     "suites": {"mmsi": {"title", "metrics", "items", "table"}, ...}}       # the other suites

Without other suites the file is exactly :func:`~grasp_lightning.evaluation.reports.write_results_json`'s.
Each suite's :meth:`~grasp_lightning.evaluation.base.EvalSuite.report` says where its section goes
(:attr:`~grasp_lightning.evaluation.base.SuiteReport.top_level`) and which files it writes
(``table.md`` for GRASP-Bench, ``table_<name>.md`` for the others).
NaN metrics are written as ``null`` (strict JSON); :func:`read_sections` turns them back into NaN.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from grasp_lightning.evaluation.base import SuiteReport
from grasp_lightning.evaluation.reports import _json_safe, write_json_atomic

log = logging.getLogger(__name__)

#: Key of the sections of the suites other than the top-level one.
SECTIONS_KEY = "suites"


def write_results(path: str | os.PathLike, meta: dict[str, Any], reports: list[SuiteReport]) -> Path:
    """Write ``results.json`` atomically (temp file + ``os.replace``); parent folders are created.

    Args:
        path: destination.
        meta: run information (step, model, decoding).
        reports: the suites' reports, in order; a ``top_level`` one's section fills the top level,
            the others go under :data:`SECTIONS_KEY` by name.

    Raises:
        TypeError: a value is not JSON-serialisable (the destination is left untouched).
    """
    payload: dict[str, Any] = {"meta": meta}
    for report in reports:
        if report.top_level:
            payload.update(report.section)
    sections = {r.name: r.section for r in reports if not r.top_level}
    if sections:
        payload[SECTIONS_KEY] = sections
    elif "metrics" not in payload:  # nothing ran: the GRASP-only layout, empty
        payload.update(metrics={}, items=[])
    dest = write_json_atomic(path, _json_safe(payload))
    log.info("wrote the results of %d evaluation suites to %s", len(reports), dest)
    return dest


def read_sections(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """name -> section of a ``results.json`` (GRASP-Bench, if present, as ``"grasp_bench"``; the other suites
    from ``"suites"``); ``null`` metric values come back as NaN."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    out = {}
    if "metrics" in data:
        out["grasp_bench"] = {"metrics": data["metrics"], "items": data.get("items", [])}
    out.update(data.get(SECTIONS_KEY, {}))
    for section in out.values():
        section["metrics"] = {k: math.nan if v is None else v for k, v in section["metrics"].items()}
    return out
