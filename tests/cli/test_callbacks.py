"""The observer callbacks act once per optimizer step, on that step's data (callbacks/step_window.py).

One GRPO-SGR demo fit with ``accumulate_grad_batches`` 4 (one prompt per micro-batch, K = 2, two
optimizer steps): :class:`WindowRecorder` keeps what every micro-batch exposed (its step at the
start, the loss tokens' k3 KL and entropy, the clip fraction, the prompts), and the test recomputes
each logged value by hand from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import REPO, run_cli, scalars

ACCUMULATE, STEPS, K = 4, 2, 2


@pytest.fixture(scope="module")
def accumulated_fit(tmp_path_factory):
    """The SGR demo, accumulate 4, batch 1, K = 2, 2 steps; a second RolloutSamples writes every step."""
    tmp_path = tmp_path_factory.mktemp("accumulate")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml",
                       "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false", "--data.source.bench=null",
                       f"--trainer.max_steps={STEPS}", f"--trainer.accumulate_grad_batches={ACCUMULATE}",
                       "--data.loader.batch_size=1", f"--model.rollout.num_generations={K}",
                       "--model.rollout.max_new_tokens=8", "--model.optim.warmup_steps=0",
                       "--trainer.callbacks+=grasp_lightning.callbacks.rollout_samples.RolloutSamples",
                       "--trainer.callbacks.every_n_steps=1", "--trainer.callbacks.filename=every_step.jsonl",
                       "--trainer.callbacks+=tests.helpers.WindowRecorder"], tmp_path)
    finally:
        os.chdir(cwd)
    return cli


def _callback(cli, name: str, **attrs):
    return next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == name
                and all(getattr(cb, k) == v for k, v in attrs.items()))


def _windows(cli) -> dict[int, list[dict]]:
    rows = _callback(cli, "WindowRecorder").rows
    assert len(rows) == ACCUMULATE * STEPS
    return {s: [r for r in rows if r["step"] == s] for s in range(STEPS)}


def test_kl_logging_writes_one_point_per_step_over_the_whole_window(accumulated_fit):
    cli = accumulated_fit
    log_dir = cli.trainer.log_dir
    series = scalars(log_dir)
    for step, window in _windows(cli).items():
        assert len(window) == ACCUMULATE
        kl = torch.cat([r["kl"] for r in window]).double()
        entropy = torch.cat([r["entropy"] for r in window]).double()
        tokens = [r["entropy"].numel() for r in window]
        clip = sum(r["clip"] * n for r, n in zip(window, tokens)) / sum(tokens)
        # kl/max from KLLogging; the step's token means are the module's train/ series (one name per series)
        expected = {"train/kl": float(kl.mean()), "kl/max": float(kl.max()), "train/entropy": float(entropy.mean()),
                    "train/clip_ratio": clip}
        for tag, value in expected.items():
            assert [s for s, _ in series[tag]] == list(range(STEPS)), tag  # one point per step, at its index
            assert dict(series[tag])[step] == pytest.approx(value, rel=2e-6, abs=1e-12), (tag, step)
        # the window's token mean is not its last micro-batch's (what was logged before)
        assert abs(float(entropy.mean()) - float(window[-1]["entropy"].double().mean())) > 1e-4
    assert dict(series["train/kl"])[0] == 0.0  # step 0 starts from the reference weights
    assert dict(series["train/kl"])[1] > 0.0
    assert not {"kl/mean", "kl/entropy", "kl/clip_ratio"} & set(series)  # the same series as train/...
    assert [s for s, _ in series["train/loss"]] == list(range(STEPS))  # the module's points: the same steps
    acc = EventAccumulator(str(log_dir), size_guidance={"histograms": 0})
    acc.Reload()
    hist = acc.Histograms("kl/per_token")
    assert [h.step for h in hist] == list(range(STEPS))
    assert [h.histogram_value.num for h in hist] == [sum(r["kl"].numel() for r in w) for w in _windows(cli).values()]


def test_rollout_samples_dump_once_per_configured_step(accumulated_fit):
    cli = accumulated_fit
    windows = _windows(cli)
    log_dir = cli.trainer.log_dir
    # sgr.yaml's RolloutSamples (every 50 steps): step 0 only; 2 groups taken over the window's first two
    # micro-batches (one prompt each), K completions per group
    recipe = [json.loads(line) for line in open(f"{log_dir}/rollouts.jsonl")]
    assert {r["step"] for r in recipe} == {0} and len(recipe) == 2 * K
    assert [r["uid"] for r in recipe] == [u for r in windows[0][:2] for u in r["uids"] for _ in range(K)]
    assert [r["group"] for r in recipe] == [0] * K + [1] * K
    every = [json.loads(line) for line in open(f"{log_dir}/every_step.jsonl")]
    assert [r["step"] for r in every] == [0] * 2 * K + [1] * 2 * K
    assert [r["uid"] for r in every if r["step"] == 1] == [u for r in windows[1][:2] for u in r["uids"]
                                                          for _ in range(K)]
    assert _callback(cli, "RolloutSamples", filename="every_step.jsonl").dumps == [0, 1]


def test_step_timing_writes_one_record_per_step_summing_its_micro_batches(accumulated_fit):
    cli = accumulated_fit
    series = scalars(cli.trainer.log_dir)
    timing = _callback(cli, "StepTiming")
    assert len(timing.history) == ACCUMULATE * STEPS and len(timing.step_history) == STEPS
    for key in ("time/step_s", "time/data_wait_s", "time/optimizer_step_s", "throughput/samples_per_s"):
        assert [s for s, _ in series[key]] == list(range(STEPS)), key
    for step in range(STEPS):
        micro = timing.history[step * ACCUMULATE:(step + 1) * ACCUMULATE]
        record = timing.step_history[step]
        step_s = sum(r["time/step_s"] for r in micro)
        wait = sum(r["time/data_wait_s"] for r in micro)
        assert record["time/step_s"] == pytest.approx(step_s, rel=1e-9)
        assert record["time/optimizer_step_s"] == pytest.approx(step_s + wait, rel=1e-9)
        assert dict(series["time/step_s"])[step] == pytest.approx(step_s, rel=1e-6)
        assert record["throughput/samples_per_s"] == pytest.approx(ACCUMULATE * K / (step_s + wait), rel=1e-9)
        assert "throughput/prompt_tokens_per_step" not in record  # the task's train/tokens/prompt_forwarded


def test_kl_logging_reduces_the_step_over_both_ranks(tmp_path):
    """Two gloo ranks (DDP), accumulate 2: each KL point is the token mean over both ranks' windows, and
    the histogram holds every rank's loss tokens (a collective every rank joins; a hang fails the timeout)."""
    record = tmp_path / "rows"
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", "configs/sgr.yaml", "--config",
           "configs/demo.yaml", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false", "--data.source.bench=null",
           "--trainer.max_steps=2", "--trainer.accumulate_grad_batches=2", "--data.loader.batch_size=1",
           "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8", "--model.optim.warmup_steps=0",
           "--trainer.devices=2", "--trainer.strategy=ddp", f"--trainer.logger.init_args.save_dir={tmp_path}",
           "--trainer.callbacks+=tests.helpers.WindowRecorder", f"--trainer.callbacks.path={record}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(f"{record}.rank{r}") for r in range(2)]
    (log_dir,) = (tmp_path / "demo").glob("version_*")
    series = scalars(log_dir)
    acc = EventAccumulator(str(log_dir), size_guidance={"histograms": 0})
    acc.Reload()
    counts = [h.histogram_value.num for h in acc.Histograms("kl/per_token")]
    for step in range(2):
        window = [row for rows in ranks for row in rows if row["step"] == step]
        assert len(window) == 2 * 2  # 2 micro-batches on each rank
        entropy = torch.cat([row["entropy"] for row in window]).double()
        kl = torch.cat([row["kl"] for row in window]).double()
        assert dict(series["train/entropy"])[step] == pytest.approx(float(entropy.mean()), rel=2e-6)
        assert dict(series["train/kl"])[step] == pytest.approx(float(kl.mean()), rel=2e-6, abs=1e-12)
        assert dict(series["kl/max"])[step] == pytest.approx(float(kl.max()), rel=2e-6, abs=1e-12)
        assert counts[step] == kl.numel() > sum(row["kl"].numel() for row in ranks[0] if row["step"] == step)
