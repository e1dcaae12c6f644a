"""GRPO demo fits through the CLI logged by configs/wandb.yaml and configs/mlflow.yaml (as docs/own-task.md shows),
read back from what each logger stored: a W&B offline run's ``.wandb`` transaction log and ``files/media/``,
an MLflow SQLite store (``MlflowClient``). No network: W&B runs offline (the ``wandb_offline`` fixture, files
under ``tmp_path``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from tests.helpers import mlflow_files, run_cli, wandb_history, wandb_media

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


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
    rows = wandb_history(run)
    table, step = wandb_media(rows, "rollouts/samples")
    assert step == 0 and table["nrows"] == 4
    columns = json.loads((run / "files" / table["path"]).read_text())["columns"]
    assert columns[:3] == ["uid", "k", "target"] and "social_grounding" in columns and columns[-1] == "completion"
    hist, step = wandb_media(rows, "kl/per_token")
    assert step == 0 and hist["_type"] == "histogram" and sum(hist["values"]) > 0
    image, _ = wandb_media(rows, "bench/category_accuracy")
    assert image["_type"] == "image-file" and image["width"] > 100
    html, _ = wandb_media(rows, "bench/table")
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
    files = mlflow_files(client, run_id)
    assert any(f.startswith("images/bench~category_accuracy+step+1+") and f.endswith(".png") for f in files)
    text = Path(client.download_artifacts(run_id, "bench/table/step_1.md", str(tmp_path))).read_text()
    assert "| T1 |" in text
    assert client.get_metric_history(run_id, "train/loss") and client.get_metric_history(run_id, "val/acc/overall")
