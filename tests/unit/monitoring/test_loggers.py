"""grasp_lightning.monitoring.loggers against the real loggers, read back from what each one stores: TensorBoard's
event files (EventAccumulator), a W&B offline run (its ``.wandb`` transaction log and ``files/media/``), an
MLflow SQLite store (``MlflowClient``); then GRPO demo fits through the CLI with configs/wandb.yaml and
configs/mlflow.yaml. No network: W&B runs offline (``WANDB_MODE=offline``, files under ``tmp_path``)."""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import Counter
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from PIL import Image

from grasp_lightning.monitoring import loggers
from grasp_lightning.monitoring.loggers import log_histogram, log_image, log_table, log_text, run_dir
from tests.helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")

ROWS = [{"uid": "a", "k": 0, "reward": 0.5, "named": ["P1", "P2"], "completion": "x | y\nz"},
        {"uid": "a", "k": 1, "reward": 1.25, "named": [], "completion": "w"}]
KL = torch.linspace(0.0, 1.0, 101)
IMAGE = np.zeros((12, 20, 3), np.uint8)
IMAGE[:, :10, 0] = 255  # left half red
TEXT = "| cat | acc |\n|---|---|\n| T1 | 0.5 |"


def _trainer(tmp_path: Path, *logs: Logger) -> L.Trainer:
    return L.Trainer(logger=list(logs), accelerator="cpu", devices=1, default_root_dir=str(tmp_path),
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def _log_all(trainer: L.Trainer, step: int = 3) -> None:
    log_text(trainer, "bench/table", TEXT, step)
    log_table(trainer, "rollouts/samples", ROWS, step)
    log_histogram(trainer, "kl/per_token", KL, step)
    log_image(trainer, "bench/category_accuracy", IMAGE, step)


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B without network: offline mode, its files and settings under ``tmp_path``; the run finished after."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                       "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    yield
    import wandb

    if wandb.run is not None:
        wandb.run.finish()


# ---------------------------------------------------------------- reading what each logger stored
def _wandb_records(path: Path) -> list:
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


def _wandb_history(run_dir_: Path) -> list[dict]:
    """The history rows of a finished offline W&B run. ``run.finish()`` can return before W&B's service has
    flushed the file, so it is read again until it holds the run's ``exit`` record (30 s at most)."""
    (path,) = run_dir_.glob("run-*.wandb")
    deadline = time.monotonic() + 30
    records = _wandb_records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{path}: no exit record 30 s after run.finish()"
        time.sleep(0.2)
        records = _wandb_records(path)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def _wandb_media(rows: list[dict], tag: str) -> tuple[dict, int]:
    """The history fields of media ``tag`` (``{"path": ..., "_type": ...}``) and its ``trainer/global_step``."""
    (row,) = [r for r in rows if f"{tag}/_type" in r]
    return {k[len(tag) + 1:]: v for k, v in row.items() if k.startswith(tag + "/")}, row["trainer/global_step"]


def _mlflow_files(client, run_id: str, path: str | None = None) -> list[str]:
    out = []
    for info in client.list_artifacts(run_id, path):
        out += _mlflow_files(client, run_id, info.path) if info.is_dir else [info.path]
    return out


def _mlflow_logger(tmp_path: Path) -> MLFlowLogger:
    return MLFlowLogger(experiment_name="t", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                        artifact_location=str(tmp_path / "artifacts"))


# ---------------------------------------------------------------- the layer, one logger at a time
def test_tensorboard_gets_text_a_markdown_table_a_histogram_and_an_image(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(str(tmp_path), name="tb")
    trainer = _trainer(tmp_path, logger)
    _log_all(trainer)
    logger.experiment.flush()
    assert run_dir(trainer) == logger.log_dir
    acc = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    text = {t: acc.Tensors(t)[0] for t in ("bench/table/text_summary", "rollouts/samples/text_summary")}
    assert text["bench/table/text_summary"].tensor_proto.string_val[0].decode() == TEXT
    table = text["rollouts/samples/text_summary"].tensor_proto.string_val[0].decode().splitlines()
    assert table[0] == "| uid | k | reward | named | completion |"
    assert table[2] == '| a | 0 | 0.5 | ["P1", "P2"] | x \\| y z |' and table[3] == "| a | 1 | 1.25 | [] | w |"
    assert {e.step for e in text.values()} == {3}
    (hist,) = acc.Histograms("kl/per_token")
    assert (hist.step, hist.histogram_value.num, hist.histogram_value.max) == (3, 101, 1.0)
    assert hist.histogram_value.sum == pytest.approx(50.5)
    (image,) = acc.Images("bench/category_accuracy")
    assert (image.step, image.width, image.height) == (3, 20, 12)


def test_wandb_offline_gets_a_table_a_histogram_an_image_and_html_at_the_global_step(tmp_path, wandb_offline):
    logger = WandbLogger(save_dir=str(tmp_path), project="t", offline=True)
    trainer = _trainer(tmp_path, logger)
    _log_all(trainer, step=7)
    run_id = logger.experiment.id
    assert run_dir(trainer) == str(tmp_path / "t" / run_id)
    logger.experiment.finish()
    (run,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    rows = _wandb_history(run)
    table, step = _wandb_media(rows, "rollouts/samples")
    assert step == 7 and table["_type"] == "table-file" and table["nrows"] == 2
    stored = json.loads((run / "files" / table["path"]).read_text())
    assert stored["columns"] == ["uid", "k", "reward", "named", "completion"]
    assert stored["data"] == [["a", 0, 0.5, '["P1", "P2"]', "x | y\nz"], ["a", 1, 1.25, "[]", "w"]]
    hist, step = _wandb_media(rows, "kl/per_token")
    assert step == 7 and hist["_type"] == "histogram" and sum(hist["values"]) == 101
    assert hist["bins"][0] == 0.0 and hist["bins"][-1] == 1.0
    image, step = _wandb_media(rows, "bench/category_accuracy")
    assert step == 7 and (image["width"], image["height"]) == (20, 12)
    png = np.asarray(Image.open(run / "files" / image["path"]).convert("RGB"))
    np.testing.assert_array_equal(png, IMAGE)
    html, step = _wandb_media(rows, "bench/table")
    assert step == 7 and html["_type"] == "html-file"
    assert "<td>T1</td>" in (run / "files" / html["path"]).read_text()


def test_mlflow_gets_text_a_table_histogram_metrics_and_a_step_image(tmp_path):
    from mlflow.tracking import MlflowClient

    logger = _mlflow_logger(tmp_path)
    trainer = _trainer(tmp_path, logger)
    _log_all(trainer, step=3)
    _log_all(trainer, step=5)
    run_id, client = logger.run_id, MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert run_dir(trainer) == str(tmp_path / logger.experiment_id / run_id)
    files = _mlflow_files(client, run_id)
    assert Path(client.download_artifacts(run_id, "bench/table/step_5.md", str(tmp_path))).read_text() == TEXT
    table = json.loads(Path(client.download_artifacts(run_id, "rollouts/samples.json", str(tmp_path))).read_text())
    assert table["columns"] == ["step", "uid", "k", "reward", "named", "completion"]
    assert [row[:4] for row in table["data"]] == [[3, "a", 0, 0.5], [3, "a", 1, 1.25], [5, "a", 0, 0.5], [5, "a", 1, 1.25]]
    p50 = client.get_metric_history(run_id, "kl/per_token/p50")
    assert [(m.step, m.value) for m in p50] == [(3, pytest.approx(0.5)), (5, pytest.approx(0.5))]
    assert client.get_metric_history(run_id, "kl/per_token/max")[0].value == 1.0
    counts = json.loads(Path(client.download_artifacts(run_id, "kl/per_token/step_3.json", str(tmp_path))).read_text())
    assert sum(counts["counts"]) == 101 and len(counts["edges"]) == 65
    pngs = sorted(f for f in files if f.startswith("images/bench~category_accuracy+step+") and f.endswith(".png"))
    assert [f.split("+")[2] for f in pngs] == ["3", "5"]  # MLflow's per-step image series of the key
    png = np.asarray(Image.open(client.download_artifacts(run_id, pngs[0], str(tmp_path))).convert("RGB"))
    np.testing.assert_array_equal(png, IMAGE)


def test_csv_keeps_histogram_metrics_and_says_once_what_it_cannot_hold(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(loggers, "skipped", Counter())  # the process's count so far: from this test only
    logger = CSVLogger(str(tmp_path), name="csv")
    trainer = _trainer(tmp_path, logger)
    with caplog.at_level(logging.INFO, logger="grasp_lightning.monitoring.loggers"):
        _log_all(trainer)
        _log_all(trainer, step=4)
    logger.save()
    assert loggers.skipped == {("CSVLogger", "text"): 2, ("CSVLogger", "table"): 2, ("CSVLogger", "image"): 2}
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "CSVLogger has no" in r.getMessage()]
    assert [m.split(":")[0] for m in said] == ["CSVLogger has no text", "CSVLogger has no table",
                                              "CSVLogger has no image"]  # once each
    lines = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    p50 = [line.split(",")[header.index("kl/per_token/p50")] for line in lines[1:]]
    assert [float(v) for v in p50 if v] == [pytest.approx(0.5)] * 2


class _Elsewhere(Logger):
    """A logger type the layer does not know (scalars only)."""

    name, version = "elsewhere", 0

    def log_metrics(self, metrics, step=None) -> None:
        """Nothing."""

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """Nothing."""


def test_an_unknown_logger_type_gets_one_warning_naming_it_and_bad_images_raise(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(loggers, "_warned", set())
    trainer = _trainer(tmp_path, _Elsewhere())
    with caplog.at_level(logging.WARNING, logger="grasp_lightning.monitoring.loggers"):
        _log_all(trainer)
    warned = [r.getMessage() for r in caplog.records if "_Elsewhere" in r.getMessage()]
    assert len(warned) == 1 and "tests.unit.monitoring.test_loggers._Elsewhere is not supported" in warned[0]
    with pytest.raises(ValueError, match="'bench/x'.*uint8"):
        log_image(trainer, "bench/x", IMAGE.astype(np.float32), 1)


# ---------------------------------------------------------------- GRPO demo fits through the CLI
def _grpo_fit(logger_config: str, tmp_path: Path, *extra: str):
    """One GRPO-SGR step of the demo (K = 2) and a 4-item GRASP-Bench validation at its end, logged by
    ``configs/<logger_config>.yaml`` given last, as docs/training.md says."""
    return run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--config",
                    f"configs/{logger_config}.yaml", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
                    "--trainer.max_steps=1", "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8",
                    "--data.source.val_limit=4", "--trainer.limit_val_batches=1", "--model.evaluation.max_new_tokens=4",
                    *extra], tmp_path)


def _run_files(folder: Path) -> None:
    """The run's own files are in its folder: the config, the rollouts (2 groups x K = 2) and the bench reports."""
    assert (folder / "config.yaml").is_file() and (folder / "bench" / "latest" / "results.json").is_file()
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").open()]
    assert len(rows) == 4 and {row["step"] for row in rows} == {0}  # the first step: 0


def test_grpo_demo_with_configs_wandb_logs_rollouts_kl_and_bench_to_the_run(in_repo, tmp_path, wandb_offline):
    cli = _grpo_fit("wandb", tmp_path)
    logger = cli.trainer.logger
    assert isinstance(logger, WandbLogger) and logger.name == "grasp"  # the project
    run_id = logger.experiment.id
    folder = tmp_path / "grasp" / run_id
    assert cli.trainer.log_dir == str(folder)
    _run_files(folder)
    logger.experiment.finish()
    (run,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    rows = _wandb_history(run)
    table, step = _wandb_media(rows, "rollouts/samples")
    assert step == 0 and table["nrows"] == 4
    columns = json.loads((run / "files" / table["path"]).read_text())["columns"]
    assert columns[:3] == ["uid", "k", "target"] and "social_grounding" in columns and columns[-1] == "completion"
    hist, step = _wandb_media(rows, "kl/per_token")
    assert step == 0 and hist["_type"] == "histogram" and sum(hist["values"]) > 0
    image, _ = _wandb_media(rows, "bench/category_accuracy")
    assert image["_type"] == "image-file" and image["width"] > 100
    html, _ = _wandb_media(rows, "bench/table")
    assert "T1" in (run / "files" / html["path"]).read_text()
    assert any("train/loss" in r for r in rows) and any("val/acc/overall" in r for r in rows)


def test_grpo_demo_with_configs_mlflow_logs_rollouts_kl_and_bench_to_the_store(in_repo, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cli = _grpo_fit("mlflow", tmp_path, f"--trainer.logger.init_args.tracking_uri={uri}",
                    f"--trainer.logger.init_args.artifact_location={tmp_path / 'artifacts'}")
    logger = cli.trainer.logger
    assert isinstance(logger, MLFlowLogger)
    folder = tmp_path / logger.experiment_id / logger.run_id
    assert cli.trainer.log_dir == str(folder)
    _run_files(folder)
    client, run_id = MlflowClient(uri), logger.run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    table = json.loads(Path(client.download_artifacts(run_id, "rollouts/samples.json", str(tmp_path))).read_text())
    assert table["columns"][:3] == ["step", "uid", "k"] and len(table["data"]) == 4
    assert [(m.step, m.value >= 0) for m in client.get_metric_history(run_id, "kl/per_token/p50")] == [(0, True)]
    files = _mlflow_files(client, run_id)
    assert any(f.startswith("images/bench~category_accuracy+step+1+") and f.endswith(".png") for f in files)
    text = Path(client.download_artifacts(run_id, "bench/table/step_1.md", str(tmp_path))).read_text()
    assert "| T1 |" in text
    assert client.get_metric_history(run_id, "train/loss") and client.get_metric_history(run_id, "val/acc/overall")
