"""End-to-end runs of the CLI on the tiny model and the sample data (SFT, GRPO-SGR, validate)."""

import json
import re

from .conftest import event_tags, run_cli, scalars

FAST = ["--data.num_workers=0", "--trainer.enable_progress_bar=false"]


def _log_dir(cli):
    return cli.trainer.log_dir


def test_sft_overfits_four_samples(in_repo, tmp_path):
    cli = run_cli(["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", *FAST,
                   "--data.train_limit=4", "--data.batch_size=4", "--trainer.max_steps=40", "--trainer.max_epochs=-1",
                   "--model.optim.lr=3e-3", "--model.optim.scheduler=constant_with_warmup", "--data.bench=null"],
                  tmp_path)
    loss = [v for _, v in scalars(_log_dir(cli))["train/loss"]]
    assert len(loss) == 40
    first, last = loss[0], sum(loss[-3:]) / 3
    assert last < 0.5 * first, (first, last)


class _Seen:
    """Records the dataset indices of every training batch."""

    def __new__(cls):
        from lightning.pytorch.callbacks import Callback

        class Seen(Callback):
            def __init__(self):
                self.indices = []

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self.indices.append(list(batch.indices))

        return Seen()


def _sft_run(tmp_path, max_steps, ckpt=None, save=None):
    import lightning as L

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import PolicyConfig
    from tasks.sft import SFTTask

    seen = _Seen()
    module = GraspModule(SFTTask(), policy=PolicyConfig(name_or_path="grasp_lightning/assets/tiny-qwen3vl",
                                                        dtype="float32"))
    dm = GraspDataModule(bench=None, batch_size=2, num_workers=0, max_frames=8, max_pixels=4096, seed=0)
    callbacks = [seen]
    if save:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(dirpath=save, save_last=True, every_n_train_steps=1))
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, max_steps=max_steps, logger=False, callbacks=callbacks,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, dm, ckpt_path=ckpt)
    return seen.indices


def test_resume_continues_with_the_next_unseen_samples(in_repo, tmp_path):
    full = _sft_run(tmp_path, 16)  # 24 rows / batch 2 = 12 batches per epoch: the run crosses into epoch 2
    first = _sft_run(tmp_path, 7, save=tmp_path / "ck")
    rest = _sft_run(tmp_path, 16, ckpt=str(tmp_path / "ck" / "last.ckpt"))
    assert len(full) == 16
    assert first == full[:7]
    assert rest == full[7:]
    assert sorted(i for b in full[:12] for i in b) == list(range(24))  # one epoch: each row exactly once
    assert full[12:] != full[:4]  # epoch 2 is reshuffled


GRPO_METRICS = [
    "train/loss", "train/reward/mean", "train/reward/std", "train/advantage/mean", "train/advantage/std",
    "train/kl", "train/clip_ratio", "train/completion_length/mean", "train/completion_length/max",
    "train/completion_length/truncated_fraction", "train/zero_variance_groups/fraction",
    "train/grounding/precision", "train/grounding/recall", "train/entropy",
    *[f"train/rewards/{n}/{s}" for n in ("accuracy", "format", "grounding_presence", "social_grounding")
      for s in ("mean", "std")],
    "kl/mean", "kl/max", "kl/clip_ratio", "kl/entropy",
    "val/acc/overall", "val/acc/gaze", "val/acc/gesture", "val/acc/joint", "val/unparseable_rate",
]


def test_sgr_demo_logs_every_metric_kl_section_rollouts_and_validation(in_repo, tmp_path):
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST,
                   "--trainer.max_steps=3", "--model.rollout.num_generations=4"], tmp_path)
    log_dir = _log_dir(cli)
    tags = event_tags(log_dir)
    missing = [m for m in GRPO_METRICS if m not in tags["scalars"]]
    assert not missing, missing
    assert "kl/per_token" in tags["histograms"]
    assert "rollouts/samples/text_summary" in tags["tensors"]
    assert "bench/category_accuracy" in tags["images"]
    series = scalars(log_dir)
    assert len(series["train/loss"]) == 3
    # Step 0 starts from the reference weights: the KL to the frozen copy is exactly zero.
    assert series["train/kl"][0][1] == 0.0
    rows = [json.loads(line) for line in open(f"{log_dir}/rollouts.jsonl")]
    assert len(rows) == 2 * 4 and {"rewards", "answer", "participants_named", "completion"} <= set(rows[0])


def test_validate_prints_the_table_and_writes_reports(in_repo, tmp_path, capsys):
    cli = run_cli(["validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", *FAST], tmp_path)
    out = capsys.readouterr().out
    for cat in ("T1", "T6", "G1", "G6", "J1", "J4"):
        assert re.search(rf"^\| {cat} \|", out, re.M), cat
    bench = f"{cli.trainer.log_dir}/bench/latest"
    results = json.load(open(f"{bench}/results.json"))
    assert results["metrics"]["n/overall"] == 32 and len(results["items"]) == 32
    assert open(f"{bench}/table.md").read().count("\n") > 20
    assert "bench/category_accuracy" in event_tags(cli.trainer.log_dir)["images"]
