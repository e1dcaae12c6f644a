"""Reading back what the experiment loggers stored: a W&B offline run's ``.wandb`` transaction log
(:func:`wandb_history`, :func:`wandb_media`) and an MLflow run's artifacts (:func:`mlflow_files`)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path


def wandb_records(path: Path) -> list:
    """The records of a ``run-<id>.wandb`` file: the LevelDB log format W&B writes, a 7-byte ``:W&B`` header
    then 32 KiB blocks of CRC/length/type-framed chunks, each record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunks, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if left < 7 or (kind == 0 and length == 0):  # block trailer / padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk still being written: the caller reads the file again
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk  # FULL/FIRST start a record, MIDDLE/LAST continue it
        if kind in (1, 4):
            records.append(pb.Record())
            records[-1].ParseFromString(chunks)
    return records


def wandb_history(run_dir_: Path) -> list[dict]:
    """The history rows of a finished offline W&B run. ``run.finish()`` can return before W&B's service has
    flushed the file, so it is read again until it holds the run's ``exit`` record (30 s at most)."""
    (path,) = run_dir_.glob("run-*.wandb")
    deadline = time.monotonic() + 30
    records = wandb_records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path}: no exit record 30 s after run.finish()"
        time.sleep(0.2)
        records = wandb_records(path)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def wandb_media(rows: list[dict], tag: str) -> tuple[dict, int]:
    """The history fields of media ``tag`` (``{"path": ..., "_type": ...}``) and its ``trainer/global_step``."""
    (row,) = [r for r in rows if f"{tag}/_type" in r]
    return {k[len(tag) + 1:]: v for k, v in row.items() if k.startswith(tag + "/")}, row["trainer/global_step"]


def mlflow_files(client, run_id: str, path: str | None = None) -> list[str]:
    """Every artifact path of MLflow run ``run_id`` under ``path`` (all of them when ``None``), folders walked."""
    out = []
    for info in client.list_artifacts(run_id, path):
        out += mlflow_files(client, run_id, info.path) if info.is_dir else [info.path]
    return out
