"""``results.json`` with one section per benchmark, and the per-benchmark Markdown files.

Layout (GRASP-Bench keeps the top level that :func:`grasp_lightning.evaluation.reports.write_results_json`
writes, so readers of GRASP-only results see no change)::

    {"meta": {...},
     "metrics": {GRASP-Bench metrics}, "items": [GRASP-Bench records],      # when GRASP-Bench ran
     "benchmarks": {"mmsi": {"title", "metrics", "items", "table"}, ...}}   # the other benchmarks

Without other benchmarks the file is exactly :func:`~grasp_lightning.evaluation.reports.write_results_json`'s.
Tables: ``table.md`` (GRASP-Bench, Table 1 layout) and ``table_<name>.md`` per other benchmark.
NaN metrics are written as ``null`` (strict JSON); :func:`read_sections` turns them back into NaN.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from grasp_lightning.evaluation.reports import _json_safe, write_json_atomic, write_results_json


def write_results(path: str | os.PathLike, meta: dict[str, Any], grasp: tuple[dict, list] | None,
                  sections: dict[str, dict[str, Any]]) -> Path:
    """Write ``results.json`` atomically (temp file + ``os.replace``); parent folders are created.

    Args:
        path: destination.
        meta: run information (step, model, decoding).
        grasp: ``(metrics, records)`` of GRASP-Bench, or ``None`` when it did not run.
        sections: name -> ``{"title", "metrics", "items", "table"}`` of the other benchmarks.

    Raises:
        TypeError: a value is not JSON-serialisable (the destination is left untouched).
    """
    if not sections:
        return write_results_json(path, *(grasp or ({}, [])), meta)
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"meta": meta}
    if grasp is not None:
        payload.update(metrics=grasp[0], items=grasp[1])
    payload["benchmarks"] = sections
    return write_json_atomic(dest, _json_safe(payload))


def read_sections(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """name -> section of a ``results.json`` (GRASP-Bench, if present, as ``"grasp_bench"``); ``null``
    metric values come back as NaN."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    out = {}
    if "metrics" in data:
        out["grasp_bench"] = {"metrics": data["metrics"], "items": data.get("items", [])}
    out.update(data.get("benchmarks", {}))
    for section in out.values():
        section["metrics"] = {k: math.nan if v is None else v for k, v in section["metrics"].items()}
    return out


def write_tables(folder: str | os.PathLike, tables: dict[str, str]) -> list[Path]:
    """Write ``table_<name>.md`` for each benchmark; return the paths."""
    paths = []
    for name, table in tables.items():
        path = Path(folder) / f"table_{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(table, encoding="utf-8")
        paths.append(path)
    return paths
