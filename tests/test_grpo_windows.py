"""GRPO across accumulation windows and ranks: rollout reuse after an optimizer step (num_iterations),
the dapo normaliser over the window and all ranks, the batch advantage std over all ranks, and the
overlong penalty modes. Hand-computed values; the cross-rank tests run 2 CPU processes over gloo."""

from __future__ import annotations

import math
import os
import socket
import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.windows import Window
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.generation import Completions, RolloutConfig
from grasp_lightning.task import CrossRank
from tasks.grpo import GRPOTask, Rollout

from .conftest import run_cli

MP_TIMEOUT = 120  # seconds: a rank that skipped a collective would hang the other one


# ----------------------------------------------------------------------------------- overlong
def _overlong_task(mode: str, advantage: str = "none", clip: float | None = None) -> GRPOTask:
    task = GRPOTask(rewards=["accuracy"], advantage=advantage, overlong_buffer=4, overlong_penalty=1.0,
                    overlong_mode=mode, advantage_clip=clip)
    return task  # K = 2, budget 8: passed to advantages()/overlong() below


def test_overlong_penalty_modes_by_hand():
    # budget 8, buffer 4: lengths [8, 8 | 6, 4] -> penalty [-1, -1 | -0.5, 0]; accuracy [1, 0 | 1, 1].
    # Group 1 is all-overlong (both rollouts hit the limit).
    terms = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    penalty = _overlong_task("reward").overlong(torch.tensor([8, 8, 6, 4]), 8)
    assert penalty.tolist() == [-1.0, -1.0, -0.5, 0.0]
    # reward (DAPO): rewards [0, -1 | 0.5, 1], centred: [0.5, -0.5 | -0.25, 0.25]; the all-overlong group's
    # equal penalties cancel.
    rewards, adv = _overlong_task("reward").advantages(terms, penalty, k=2)
    assert rewards.tolist() == [0.0, -1.0, 0.5, 1.0] and adv.tolist() == [0.5, -0.5, -0.25, 0.25]
    # group std (unbiased): group 1 std sqrt(0.5) -> ±0.5 / 0.70711 (+1e-4); group 2 likewise ±0.25 / 0.35355
    _, adv = _overlong_task("reward", "group").advantages(terms, penalty, k=2)
    torch.testing.assert_close(adv, torch.tensor([0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4),
                                                  -0.25 / (math.sqrt(0.125) + 1e-4), 0.25 / (math.sqrt(0.125) + 1e-4)]))
    # released (GRASP code): the raw penalty is added to the centred advantage, then clipped:
    # group 1: [0.5 - 1, -0.5 - 1] = [-0.5, -1.5] (the all-overlong group is penalised); group 2: [0 - 0.5, 0]
    rewards, adv = _overlong_task("released").advantages(terms, penalty, k=2)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0] and adv.tolist() == [-0.5, -1.5, -0.5, 0.0]
    _, adv = _overlong_task("released", clip=1.0).advantages(terms, penalty, k=2)
    assert adv.tolist() == [-0.5, -1.0, -0.5, 0.0]  # the penalty comes before the clip
    # advantage: released (each term centred) with the DAPO mode: the penalty is centred like a term
    _, adv = _overlong_task("reward", "released").advantages(terms, penalty, k=2)
    assert adv.tolist() == [0.5, -0.5, -0.25, 0.25]
    with pytest.raises(GraspConfigError, match="overlong_mode"):
        GRPOTask(overlong_mode="group")


# ----------------------------------------------------------------------------------- two ranks
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args) -> None:
    """Run ``fn(rank, port, *args)`` on 2 gloo processes; fail (not hang) after MP_TIMEOUT seconds."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, rank, port, args)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(MP_TIMEOUT)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} rank(s) still running after {MP_TIMEOUT} s: a collective was skipped"
    assert [p.exitcode for p in procs] == [0, 0]


def _entry(fn, rank: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def _batch(indices: list[int]) -> Batch:
    n = len(indices)
    return Batch(inputs={"input_ids": torch.ones(n, 2, dtype=torch.long)} if n else {}, items=[SimpleNamespace(participants=())] * n,
                 indices=indices, valid=torch.ones(n, dtype=torch.bool), prompt_lengths=torch.full((n,), 2))


def _window(batches: list[Batch]) -> None:
    for pos, b in enumerate(batches):
        b.window = Window(batches, pos, 0, 0)


class _ScriptedTask(GRPOTask):
    """GRPOTask whose rollouts are given (rewards, completion lengths) instead of sampled."""

    def __init__(self, script: dict, **kwargs):
        super().__init__(rewards=["accuracy"], beta=0.0, rollout_batch_prompts=1, **kwargs)
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
                       indices=list(batch.indices), rollout_seconds=0.0, loss_mask=mask)


# (g) rank 0 holds rewards [1, 0, 1, 1], rank 1 [0, 0 | 3, 1] (one micro-batch each, K = 2).
BATCH_SCRIPT = {(0, 1): ([1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1]), (2, 3): ([0.0, 0.0, 3.0, 1.0], [1, 1, 1, 1])}


def _batch_std_rank(rank: int) -> None:
    task = _ScriptedTask(BATCH_SCRIPT, advantage="batch", advantage_eps=0.0)
    module = SimpleNamespace(device=torch.device("cpu"), cross_rank=CrossRank(), tokenizer=None,
                             rollout_cfg=RolloutConfig(num_generations=2))
    batch = _batch([0, 1] if rank == 0 else [2, 3])
    task.prepare(module, batch)
    # all 8 rewards [1, 0, 1, 1, 0, 0, 3, 1]: mean 7/8, Σr² = 13, unbiased var = (13 - 49/8) / 7 = 55/56
    std = math.sqrt(55 / 56)
    ro = task._window_rollouts[0]
    expected = [0.5 / std, -0.5 / std, 0.0, 0.0] if rank == 0 else [0.0, 0.0, 1.0 / std, -1.0 / std]
    torch.testing.assert_close(ro.advantages, torch.tensor(expected))


def test_batch_advantage_std_is_over_all_ranks():
    _spawn(_batch_std_rank)


# (f) windows of 2 micro-batches. Rank 0: [A, B]; rank 1: [empty (every item skipped), C].
# Loss tokens: A 3 + 5, B 2 + 4, C 1 + 6 = 21 over the window and both ranks.
DAPO_SCRIPT = {(0,): ([1.0, 0.0], [3, 5]), (1,): ([0.0, 1.0], [2, 4]), (3,): ([1.0, 0.0], [1, 6])}


def _dapo_rank(rank: int, monkeypatch_score: bool = True) -> None:
    import tasks.grpo as grpo_task
    from grasp_lightning.module import GraspModule

    def fake_score(policy, prompt, ids, mask, k, temperature, shared, chunk_size=None, vision=None):
        logp = torch.zeros(ids.shape, requires_grad=True)
        return logp, torch.zeros(ids.shape)

    grpo_task.score_completions = fake_score
    task = _ScriptedTask(DAPO_SCRIPT, loss_type="dapo")
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
    for result, out in outs:
        if out is None:
            continue
        assert out.metrics["tokens/window_loss_tokens"] == 21.0
    # rank 0, micro-batch A: advantages ±0.5 (K = 2, centred then / std 0.7071), ratio 1:
    # token sum = -(a0 * 3 + a1 * 5) = -(0.7070 * 3 - 0.7070 * 5); normaliser 21 / (W 2 * A 2) = 5.25
    if rank == 0:
        a = 0.5 / (math.sqrt(0.5) + 1e-4)
        assert outs[0][0].item() == pytest.approx(-(a * 3 - a * 5) / 5.25, rel=1e-5)


def test_dapo_normaliser_is_the_window_over_ranks_and_an_empty_rank_does_not_hang():
    _spawn(_dapo_rank)


# ----------------------------------------------------------------------------------- reuse after a step
def test_num_iterations_reuses_rollouts_after_the_optimizer_step(in_repo, tmp_path, monkeypatch):
    """accumulate 2 x num_iterations 2: micro-batches w0 w1 w0 w1. The first use is on-policy (ratio 1),
    the second comes after an optimizer step (ratio != 1, against the cached old log-probs), and each
    prompt is sampled once."""
    import grasp_lightning.engines.base as engines_base
    import tasks.grpo as grpo_task

    calls: list[int] = []
    real = engines_base.sample_completions

    def counting(policy, tokenizer, prompt, **kwargs):
        calls.append(prompt["input_ids"].shape[0])
        return real(policy, tokenizer, prompt, **kwargs)

    monkeypatch.setattr(engines_base, "sample_completions", counting)
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
    run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.num_workers=0",
             "--trainer.enable_progress_bar=false", "--trainer.max_steps=4", "--trainer.limit_val_batches=0",
             "--trainer.accumulate_grad_batches=2", "--model.task.init_args.num_iterations=2",
             "--model.rollout.num_generations=4", "--model.rollout.max_new_tokens=8",
             "--model.optim.warmup_steps=0", "--model.optim.scheduler=constant_with_warmup",
             "--data.train_limit=8"], tmp_path)
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
def test_the_module_is_a_task_context_and_the_task_reads_k_from_it():
    from grasp_lightning.module import GraspModule
    from grasp_lightning.task import TaskContext

    module = GraspModule(GRPOTask(), rollout=RolloutConfig(num_generations=3))
    assert isinstance(module, TaskContext) and module.tokenizer is None  # before configure_model
    module.task.setup(module)  # checks, copies nothing
    assert not hasattr(module.task, "num_generations") and module.rollout_cfg.num_generations == 3
    with pytest.raises(GraspConfigError, match="num_generations must be >= 2"):  # when the module is built
        GraspModule(GRPOTask(), rollout=RolloutConfig(num_generations=1))
    with pytest.raises(GraspConfigError, match="num_generations must be >= 2"):  # and from any context
        GRPOTask().setup(types.SimpleNamespace(rollout_cfg=RolloutConfig(num_generations=1)))


def test_data_mode_comes_from_the_task_and_a_contradicting_one_is_an_error():
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(bench=None)
    assert dm.mode == "sft"  # stand-alone: no task connected
    dm.connect(mode="rl")
    assert dm.mode == "rl"
    GraspDataModule(bench=None, mode="rl").connect(mode="rl")  # an explicit, agreeing value is fine
    with pytest.raises(GraspConfigError, match=r"data.mode='sft' contradicts the task, which consumes 'rl'"):
        GraspDataModule(bench=None, mode="sft").connect(mode="rl")
    with pytest.raises(GraspConfigError, match="data.repeat_batches=2 was removed"):
        GraspDataModule(bench=None, repeat_batches=2)
