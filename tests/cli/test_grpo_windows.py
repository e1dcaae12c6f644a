"""GRPO across accumulation windows and ranks: rollout reuse after an optimizer step (num_iterations),
the dapo normaliser over the window and all ranks, the batch advantage std over all ranks, a run stopped
and resumed inside a rollout batch, and refill's validation settings. Hand-computed values; the cross-rank
tests run 2 CPU processes over gloo."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import grasp_lightning.engines.hf as engines_hf
import grasp_lightning.tasks.grpo as grpo_task
from grasp_lightning.data.collate import Batch
from grasp_lightning.data.windows import Window
from grasp_lightning.engines.decoding import Completions, RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.config import AdvantageConfig, BatchingConfig, LossConfig, RewardConfig
from grasp_lightning.sequence_parallel import SequenceParallel
from grasp_lightning.task import CrossRank
from grasp_lightning.tasks.grpo import GRPOTask, Rollout
from tests.helpers import REPO, free_port, run_cli, scalars, spawn_two_ranks

# ----------------------------------------------------------------------------------- overlong


def test_an_overlong_buffer_over_the_budget_is_refused_at_load(in_repo):
    from grasp_lightning.commands.config import config_args, load_run

    # a budget shrunk to 32 tokens (as configs/demo.yaml does): a 256-token buffer cannot fit (the fraction can)
    with pytest.raises(GraspConfigError, match="overlong_buffer=256 must be in 1 … model.rollout.max_new_tokens=32"):
        load_run(config_args(["configs/sgr.yaml", "configs/demo.yaml"],
                             {"model.task.init_args.reward.overlong_buffer": 256, "model.rollout.max_new_tokens": 32}))


def _batch(indices: list[int]) -> Batch:
    n = len(indices)
    return Batch(inputs={"input_ids": torch.ones(n, 2, dtype=torch.long)} if n else {}, items=[SimpleNamespace(participants=())] * n,
                 indices=indices, valid=torch.ones(n, dtype=torch.bool), prompt_lengths=torch.full((n,), 2))


def _window(batches: list[Batch]) -> None:
    for pos, b in enumerate(batches):
        b.window = Window(batches, pos, 0, 0)


class _ScriptedTask(GRPOTask):
    """GRPOTask whose rollouts are given (rewards, completion lengths) instead of sampled."""

    def __init__(self, script: dict, loss: LossConfig | None = None, **kwargs):
        super().__init__(reward=RewardConfig(terms=["accuracy"]), loss=loss or LossConfig(beta=0.0),
                         batching=BatchingConfig(rollout_batch_prompts=1), **kwargs)
        self.script = script  # K = 2: the context's model.rollout.num_generations

    def rollout(self, module, batch):
        rewards, lengths = self.script[tuple(batch.indices)]
        n, width = len(lengths), max(lengths)
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        terms = torch.tensor(rewards)[:, None]
        r, adv = self.advantages(terms, k=module.rollout_cfg.num_generations)
        comp = Completions(ids=torch.full((n, width), 5), mask=mask, texts=[""] * n, truncated=torch.zeros(n, dtype=bool))
        return Rollout(prompt=batch.inputs, shared=False, completions=comp, terms=terms, rewards=r, advantages=adv,
                       old_logp=None, ref_logp=None, zero_variance=torch.zeros(n // 2, dtype=torch.bool),
                       indices=list(batch.indices), loss_mask=mask)


# (g) rank 0 holds rewards [1, 0, 1, 1], rank 1 [0, 0 | 3, 1] (one micro-batch each, K = 2).
BATCH_SCRIPT = {(0, 1): ([1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1]), (2, 3): ([0.0, 0.0, 3.0, 1.0], [1, 1, 1, 1])}


def _batch_std_rank(rank: int) -> None:
    task = _ScriptedTask(BATCH_SCRIPT, advantage=AdvantageConfig(kind="batch", eps=0.0))
    module = SimpleNamespace(sequence_parallel=SequenceParallel(), device=torch.device("cpu"), cross_rank=CrossRank(), tokenizer=None,
                             rollout_cfg=RolloutConfig(num_generations=2))
    batch = _batch([0, 1] if rank == 0 else [2, 3])
    task.prepare(module, batch)
    # all 8 rewards [1, 0, 1, 1, 0, 0, 3, 1]: mean 7/8, Σr² = 13, unbiased var = (13 - 49/8) / 7 = 55/56
    std = math.sqrt(55 / 56)
    ro = task.cache.rollouts[0]
    expected = [0.5 / std, -0.5 / std, 0.0, 0.0] if rank == 0 else [0.0, 0.0, 1.0 / std, -1.0 / std]
    torch.testing.assert_close(ro.advantages, torch.tensor(expected))


def test_batch_advantage_std_is_over_all_ranks():
    spawn_two_ranks(_batch_std_rank)


# (f) windows of 2 micro-batches. Rank 0: [A, B]; rank 1: [empty (every item skipped), C].
# Loss tokens: A 3 + 5, B 2 + 4, C 1 + 6 = 21 over the window and both ranks.
DAPO_SCRIPT = {(0,): ([1.0, 0.0], [3, 5]), (1,): ([0.0, 1.0], [2, 4]), (3,): ([1.0, 0.0], [1, 6])}


def _dapo_rank(rank: int, monkeypatch_score: bool = True) -> None:
    import grasp_lightning.tasks.grpo as grpo_task
    from grasp_lightning.module import GraspModule

    def fake_score(policy, prompt, ids, mask, k, temperature, shared, chunk_size=None, vision=None, **_):
        logp = torch.zeros(ids.shape, requires_grad=True)
        return logp, torch.zeros(ids.shape)

    grpo_task.score_completions = fake_score
    task = _ScriptedTask(DAPO_SCRIPT, loss=LossConfig(type="dapo", beta=0.0))
    module = GraspModule(task, rollout=RolloutConfig(num_generations=2))
    batches = [_batch([0]), _batch([1])] if rank == 0 else [_batch([]), _batch([3])]
    _window(batches)
    outs = []
    for b in batches:
        module.last_task_output = None
        result = module.training_step(b, 0)  # the empty micro-batch returns early, after the collectives
        outs.append((result, module.last_task_output))
    if rank == 1:
        assert outs[0] == (None, None)
    assert float(task.cache.tokens) == 21.0  # the dapo normaliser: the window's loss tokens on both ranks
    # the step (the window, no trainer) logged once over both ranks: 6 completions of lengths 3 5 2 4 1 6
    assert module.last_step_metrics["train/completion_length/mean"] == pytest.approx(21 / 6)
    # rank 0, micro-batch A: advantages ±0.5 (K = 2, centred then / std 0.7071), ratio 1:
    # token sum = -(a0 * 3 + a1 * 5) = -(0.7070 * 3 - 0.7070 * 5); normaliser 21 / (W 2 * A 2) = 5.25
    if rank == 0:
        a = 0.5 / (math.sqrt(0.5) + 1e-4)
        assert outs[0][0].item() == pytest.approx(-(a * 3 - a * 5) / 5.25, rel=1e-5)


def test_dapo_normaliser_is_the_window_over_ranks_and_an_empty_rank_does_not_hang():
    spawn_two_ranks(_dapo_rank)


# ----------------------------------------------------------------------------------- reuse after a step
def test_num_iterations_reuses_rollouts_after_the_optimizer_step(in_repo, tmp_path, monkeypatch):
    """accumulate 2 x num_iterations 2: micro-batches w0 w1 w0 w1. The first use is on-policy (ratio 1),
    the second comes after an optimizer step (ratio != 1, against the cached old log-probs), and each
    prompt is sampled once."""
    import grasp_lightning.engines.hf as engines_hf
    import grasp_lightning.tasks.grpo as grpo_task

    calls: list[int] = []
    real = engines_hf.sample_completions

    def counting(policy, tokenizer, prompt, **kwargs):
        calls.append(prompt["input_ids"].shape[0])
        return real(policy, tokenizer, prompt, **kwargs)

    monkeypatch.setattr(engines_hf, "sample_completions", counting)
    # the untrained tiny model earns no reward: alternate them so advantages, hence the update, are non-zero
    monkeypatch.setattr(grpo_task, "compute_rewards", lambda texts, items, names, **kw: torch.tensor(
        [[float(i % 2)] * len(names) for i in range(len(texts))]))
    seen: list[tuple[list[int], float, float, int]] = []
    step = grpo_task.GRPOTask.training_step

    def recording(self, module, batch):
        out = step(self, module, batch)
        seen.append((list(batch.indices), float(out.metrics["ratio/mean"]), float(out.metrics["rollout/iteration"]),
                     module.trainer.global_step))
        return out

    monkeypatch.setattr(grpo_task.GRPOTask, "training_step", recording)
    run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
             "--trainer.enable_progress_bar=false", "--trainer.max_steps=4", "--trainer.limit_val_batches=0",
             "--trainer.accumulate_grad_batches=2", "--model.task.init_args.loss.num_iterations=2",
             "--model.rollout.num_generations=4", "--model.rollout.max_new_tokens=8",
             "--model.optim.warmup_steps=0", "--model.optim.scheduler=constant_with_warmup",
             "--data.source.train_limit=8"], tmp_path)
    assert len(seen) == 8
    indices = [s[0] for s in seen]
    assert indices[0:2] == indices[2:4] and indices[4:6] == indices[6:8] and indices[0] != indices[4]
    assert [s[2] for s in seen] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [s[3] for s in seen] == [0, 0, 1, 1, 2, 2, 3, 3]  # optimizer steps before each micro-batch
    for _, ratio, iteration, _ in seen:
        if iteration == 0:
            assert ratio == pytest.approx(1.0, abs=1e-6)
        else:
            assert abs(ratio - 1.0) > 1e-4
    # one generate per rollout batch (the window's 2 micro-batches x 2 prompts), never for a reused window
    assert calls == [4, 4]


# ----------------------------------------------------------------------------------- context and shared values


def _launch_ranks(args: list[str], run: Path, timeout: float) -> None:
    """``python -m grasp_lightning <args>`` once per rank (2 ranks, as ``torchrun`` starts them); every
    process is killed and the test fails after ``timeout`` seconds."""
    port, procs = str(free_port()), []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "NODE_RANK": "0", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        log = open(run / f"rank{rank}.log", "w")  # noqa: SIM115 (closed when the process ends)
        procs.append(subprocess.Popen([sys.executable, "-m", "grasp_lightning", *args], cwd=REPO, env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise AssertionError(f"2-rank run still running after {timeout} s (a collective was skipped?)") from None
    tails = "\n----\n".join((run / f"rank{r}.log").read_text()[-3000:] for r in range(2))
    assert [p.returncode for p in procs] == [0, 0], tails


def test_logged_step_metrics_are_the_whole_step_on_both_ranks(tmp_path):
    """GRPO-SGR on 2 gloo ranks (Lightning DDP), accumulate 4, one prompt per micro-batch, K = 2, refill
    without draws (``max_resample: 0``: the window's degenerate groups are trained, masked, after the useful
    ones, so a rank's last micro-batch is often filler). Every logged step value equals the value computed
    here from both ranks' recorded micro-batches: reward mean over the 16 completions, zero-variance
    fraction over the 8 groups, KL and entropy over all loss tokens, token counts summed, the loss the mean
    of the 8 micro-batch losses. One point per step, none from a single (filler) micro-batch."""
    run = tmp_path
    args = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--trainer.accelerator=cpu",
            "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accumulate_grad_batches=4",
            "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", f"--trainer.logger.init_args.save_dir={run}",
            f"--trainer.default_root_dir={run}", "--trainer.callbacks+=tests.helpers.StepMetricsRecorder",
            f"--trainer.callbacks.init_args.out_dir={run / 'rec'}", "--data.loader.batch_size=1", "--data.loader.num_workers=0",
            "--data.source.train_limit=16", "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=6",
            "--model.task.init_args.reward.terms=[accuracy, tests.helpers.half_degenerate_reward]",
            "--model.task.init_args.reward.weights=[1.0, 1.0]", "--model.task.init_args.batching.dynamic_sampling=refill",
            "--model.task.init_args.batching.max_resample=0", "--model.optim.warmup_steps=0"]
    _launch_ranks(args, run, timeout=240)
    rows = [json.loads(line) for r in range(2)
            for line in (run / "rec" / f"steps_rank{r}.jsonl").read_text().splitlines()]
    (log_dir,) = {p.parent for p in run.rglob("events.out.tfevents.*")}
    logged = scalars(log_dir)
    for tag in ("train/reward/mean", "train/kl", "train/loss", "train/tokens/loss"):
        assert [s for s, _ in logged[tag]] == [0, 1], tag  # one point per optimizer step
    filler_last = 0
    for step in (0, 1):
        mine = [r for r in rows if r["step"] == step]
        assert len(mine) == 8  # 4 micro-batches on each of the 2 ranks
        rewards = [x for r in mine for x in r["rewards"]]
        groups = [z for r in mine for z in r["zero_variance"]]
        kl = [x for r in mine for x in r["kl"]]
        entropy = [x for r in mine for x in r["entropy"]]
        lengths = [x for r in mine for x in r["lengths"]]
        expected = {
            "train/reward/mean": sum(rewards) / len(rewards),
            "train/zero_variance_groups/fraction": sum(groups) / len(groups),
            "train/zero_variance_groups/count": float(sum(groups)),
            "train/kl": sum(kl) / len(kl), "train/entropy": sum(entropy) / len(entropy),
            "train/tokens/loss": float(len(kl)), "train/tokens/generated": float(sum(lengths)),
            "train/completion_length/mean": sum(lengths) / len(lengths),
            "train/completion_length/truncated_fraction": sum(t for r in mine for t in r["truncated"]) / len(lengths),
            "train/loss": sum(r["loss"] for r in mine) / len(mine),
            "train/dynamic_sampling/groups_tried": 8.0, "train/dynamic_sampling/groups_unused": 0.0,
        }
        assert len(rewards) == 16 and 0 < sum(groups) < 8  # both useful and degenerate (filler) groups
        for tag, value in expected.items():
            assert dict(logged[tag])[step] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, tag)
        last = [r for r in mine if r["position"] == 3]
        filler_last += sum(all(r["zero_variance"]) for r in last)
    # the filler a rank trained last (reward 0.5 or 1.5, zero-variance 1, no KL/entropy) is not what was logged
    assert filler_last >= 1


# ----------------------------------------------------------------------------------- step warnings
class _TruncationTask(GRPOTask):
    """GRPOTask whose rollouts are given by dataset index: K = 2 rewards and whether each completion was cut off."""

    def __init__(self, script: dict):
        super().__init__(reward=RewardConfig(terms=["accuracy"]), loss=LossConfig(beta=0.0))
        self.script = script

    def rollout(self, module, batch):
        rewards = [r for i in batch.indices for r in self.script[i][0]]
        truncated = torch.tensor([t for i in batch.indices for t in self.script[i][1]])
        n = len(rewards)
        terms = torch.tensor(rewards)[:, None]
        r, adv = self.advantages(terms, k=2)
        mask = torch.ones(n, 3, dtype=torch.bool)
        comp = Completions(ids=torch.full((n, 3), 5), mask=mask, texts=[""] * n, truncated=truncated)
        return Rollout(prompt=batch.inputs, shared=False, completions=comp, terms=terms, rewards=r, advantages=adv,
                       old_logp=None, ref_logp=None, zero_variance=objective.zero_variance_groups(r, 2),
                       indices=list(batch.indices), loss_mask=mask)


@pytest.mark.parametrize(("script", "expected"), [
    # every completion cut off, every group with equal rewards: both warnings
    ({0: ([1.0, 1.0], [True, True]), 1: ([0.0, 0.0], [True, True])}, {"truncated", "zero variance"}),
    # cut off everywhere, but one group's rewards differ: the truncation warning only
    ({0: ([1.0, 0.0], [True, True]), 1: ([0.0, 0.0], [True, True])}, {"truncated"}),
    # the first micro-batch all cut off, the last one all degenerate, the step neither: no warning
    ({0: ([1.0, 0.0], [True, True]), 1: ([1.0, 1.0], [False, True])}, set()),
])
def test_step_warnings_for_all_truncated_and_all_zero_variance_steps(script, expected, monkeypatch, caplog):
    """A window of 2 micro-batches (1 prompt, K = 2): the warnings describe the whole step and name the
    settings to change."""
    import grasp_lightning.tasks.grpo as grpo_task
    from grasp_lightning.module import GraspModule

    monkeypatch.setattr(grpo_task, "score_completions", lambda policy, prompt, ids, mask, k, t, shared, *_, **__: (
        torch.zeros(ids.shape, requires_grad=True), torch.zeros(ids.shape)))
    module = GraspModule(_TruncationTask(script), rollout=RolloutConfig(num_generations=2, max_new_tokens=3))
    batches = [_batch([0]), _batch([1])]
    _window(batches)
    with caplog.at_level("WARNING", logger="grasp_lightning.module"):
        for b in batches:
            module.training_step(b, 0)
    messages = [r.getMessage() for r in caplog.records]
    fired = set()
    for m in messages:
        if "was cut off at model.rollout.max_new_tokens=3 tokens" in m:
            assert "Raise model.rollout.max_new_tokens" in m
            fired.add("truncated")
        if "every group of this step has equal rewards" in m:
            assert "model.rollout.temperature" in m and "model.task.init_args.reward.terms" in m
            fired.add("zero variance")
    assert fired == expected and len(messages) == len(expected), messages


# ----------------------------------------------------------------------------------- CLI stop / resume
K = 3  # completions per prompt of the CLI runs below

# sgr.yaml + demo.yaml on the tiny model: 12 RL rows, 2 prompts per micro-batch, accumulate 2 x
# num_iterations 2 (micro-batches w0 w1 w0 w1, then the next window), K = 3 real sampled completions.
CLI = ["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
       "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.limit_val_batches=0",
       "--trainer.accumulate_grad_batches=2", "--model.task.init_args.loss.num_iterations=2",
       f"--model.rollout.num_generations={K}", "--model.rollout.max_new_tokens=6", "--data.source.train_limit=12",
       "--model.task.init_args.loss.type=dapo", "--model.optim.warmup_steps=0"]  # lr > 0 from step 0 (cosine)



def cli_rewards(texts, items, names, **kwargs):
    """Deterministic rewards: groups of rows 1, 4, 7, 10 of the file are degenerate (all 1), the others
    alternate by completion (so advantages, hence the updates, are non-zero)."""
    bad = {f"data_rl:{n}" for n in (1, 4, 7, 10)}
    return torch.tensor([[1.0 if items[i].uid in bad else float(i % K % 2)] * len(names) for i in range(len(texts))])



def _record_cli(monkeypatch) -> tuple[list[dict], list[int]]:
    """Record every GRPO micro-batch (step, the loader's and the trained dataset indices, completions, loss)
    and the prompts of every generate call."""
    rows: list[dict] = []
    calls: list[int] = []
    real_sample, step = engines_hf.sample_completions, grpo_task.GRPOTask.training_step

    def counting(policy, tokenizer, prompt, **kwargs):
        calls.append(int(prompt["input_ids"].shape[0]))
        return real_sample(policy, tokenizer, prompt, **kwargs)

    def recording(self, module, batch):
        out = step(self, module, batch)
        w = batch.window
        rows.append({"step": module.trainer.global_step, "batch": list(batch.indices),
                     "trained": list(self.cache.rollouts[w.position].indices), "window": w.index,
                     "iteration": w.iteration, "texts": list(out.rollout.completions),
                     "loss": float(out.loss.detach()), "ratio": float(out.metrics["ratio/mean"]),
                     "tries": self.cache.stats.resample_tries, "calls": len(calls)})
        return out

    monkeypatch.setattr(engines_hf, "sample_completions", counting)
    monkeypatch.setattr(grpo_task, "compute_rewards", cli_rewards)
    monkeypatch.setattr(grpo_task.GRPOTask, "training_step", recording)
    return rows, calls



@pytest.mark.parametrize("mode", ["drop", "refill"])
def test_cli_stopped_between_the_two_uses_of_a_rollout_batch_resumes_exactly(in_repo, tmp_path, monkeypatch, mode):
    """An uninterrupted run saves a checkpoint after every optimizer step; a second CLI run resumes from the
    one after step 1 — inside window 0's reuse, between its two uses — and must train the same samples
    (loader and trained dataset indices per micro-batch), with the same completions and losses (float32),
    sampling nothing for the reused window."""
    from tests.helpers import run_cli

    rows, calls = _record_cli(monkeypatch)
    ckpts = tmp_path / "ckpts"
    every_step = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  f"--trainer.callbacks.init_args.dirpath={ckpts}", "--trainer.callbacks.init_args.every_n_train_steps=1",
                  "--trainer.callbacks.init_args.save_top_k=-1", "--trainer.callbacks.init_args.filename={step}"]
    args = [*CLI, f"--model.task.init_args.batching.dynamic_sampling={mode}"]
    run_cli([*args, *every_step], tmp_path / "full")
    full, full_calls = list(rows), list(calls)
    assert [r["step"] for r in full[:4]] == [0, 0, 1, 1] and [r["iteration"] for r in full[:4]] == [0, 0, 1, 1]
    assert full[0]["batch"] == full[2]["batch"] and full[0]["texts"] == full[2]["texts"]  # reused after step 0
    assert abs(full[2]["ratio"] - 1.0) > 1e-4  # the second use is off-policy
    trained = [i for r in full if r["iteration"] == 0 for i in r["trained"]]
    assert len(trained) == len(set(trained))  # no prompt trained twice in the epoch
    if mode == "refill":
        assert full[0]["tries"] >= 1  # window 0 drew further prompts: the resume must exclude and re-decode them
        assert [r["trained"] for r in full[:2]] != [r["batch"] for r in full[:2]]
    for stop in (1, 2, 3):  # 1 and 3: between the two uses of window 0 / of the next window; 2: a window boundary
        ckpt = ckpts / f"step={stop}.ckpt"
        assert ckpt.exists(), sorted(p.name for p in ckpts.iterdir())
        rows.clear(), calls.clear()
        run_cli([*args, f"--ckpt_path={ckpt}"], tmp_path / f"resumed{stop}")
        resumed, done = list(rows), 2 * stop
        assert len(resumed) == len(full) - done
        for got, want in zip(resumed, full[done:]):
            assert {k: got[k] for k in ("step", "batch", "trained", "window", "iteration", "texts")} == \
                   {k: want[k] for k in ("step", "batch", "trained", "window", "iteration", "texts")}
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-6), (stop, got["step"], got["loss"])
        # a window already sampled before the checkpoint is not sampled again
        sampled_before = len(full_calls) - len(calls)
        assert sampled_before == full[done - 1]["calls"] >= 1 and calls == full_calls[sampled_before:]



def test_refill_refuses_validation_placed_as_a_share_of_the_epoch(in_repo, tmp_path):
    """Refill ends epochs early, so ``val_check_interval: null`` (configs/demo.yaml: once per epoch, at the
    announced length) would never validate: refused at setup, naming the key and the fix."""
    from tests.helpers import run_cli

    per_epoch = [a for a in CLI if a != "--trainer.limit_val_batches=0"]
    with pytest.raises(GraspConfigError, match=r"val_check_interval=1.0 .*would never run.*in micro-batches"):
        run_cli([*per_epoch, "--model.task.init_args.batching.dynamic_sampling=refill"], tmp_path / "epoch")
    with pytest.raises(GraspConfigError, match=r"val_check_interval=0.5"):
        run_cli([*per_epoch, "--model.task.init_args.batching.dynamic_sampling=refill", "--trainer.val_check_interval=0.5"],
                tmp_path / "half")



def test_refill_runs_with_validation_off_by_bench_null(in_repo, tmp_path):
    """The fix the refusal names: ``--data.source.bench null`` (no GRASP-Bench, no other suite) leaves nothing to
    validate, so ``refill`` with the per-epoch ``val_check_interval`` of configs/demo.yaml runs (it read a
    ``bench`` key the grouped data options no longer have, and refused)."""
    from tests.helpers import run_cli

    per_epoch = [a for a in CLI if a != "--trainer.limit_val_batches=0"]
    cli = run_cli([*per_epoch, "--model.task.init_args.batching.dynamic_sampling=refill", "--data.source.bench=null",
                   "--trainer.max_steps=1"], tmp_path)
    assert cli.trainer.global_step == 1 and cli.trainer.val_check_interval == 1.0
    assert cli.datamodule.val_suites == []
