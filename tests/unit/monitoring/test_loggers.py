"""grasp_lightning.monitoring.loggers against the real loggers, read back from what each one stores: TensorBoard's
event files (EventAccumulator), a W&B offline run (its ``.wandb`` transaction log and ``files/media/``), an
MLflow SQLite store (``MlflowClient``). No network: W&B runs offline (``WANDB_MODE=offline``, files under
``tmp_path``). The GRPO demo fits with configs/wandb.yaml and configs/mlflow.yaml are in tests/cli/test_loggers.py."""

from __future__ import annotations

import json
import logging
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
from tests.helpers import mlflow_files, wandb_history, wandb_media

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
    rows = wandb_history(run)
    table, step = wandb_media(rows, "rollouts/samples")
    assert step == 7 and table["_type"] == "table-file" and table["nrows"] == 2
    stored = json.loads((run / "files" / table["path"]).read_text())
    assert stored["columns"] == ["uid", "k", "reward", "named", "completion"]
    assert stored["data"] == [["a", 0, 0.5, '["P1", "P2"]', "x | y\nz"], ["a", 1, 1.25, "[]", "w"]]
    hist, step = wandb_media(rows, "kl/per_token")
    assert step == 7 and hist["_type"] == "histogram" and sum(hist["values"]) == 101
    assert hist["bins"][0] == 0.0 and hist["bins"][-1] == 1.0
    image, step = wandb_media(rows, "bench/category_accuracy")
    assert step == 7 and (image["width"], image["height"]) == (20, 12)
    png = np.asarray(Image.open(run / "files" / image["path"]).convert("RGB"))
    np.testing.assert_array_equal(png, IMAGE)
    html, step = wandb_media(rows, "bench/table")
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
    files = mlflow_files(client, run_id)
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
