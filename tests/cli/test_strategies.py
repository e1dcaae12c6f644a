"""Strategy tier: 2 gloo ranks on CPU under DDP and DeepSpeed ZeRO-2, for SFT and GRPO-SGR, each equal to
a one-process run of the same global batch in every micro-batch's loss, every optimizer step's full
gradient and the weights after the last step. Select it with ``python -m pytest -q -m strategies``.

Same global batch, same normaliser: the recipes' shape (ranks x batch 1 x accumulate) at 2 ranks x batch 1
x accumulate 2 against 1 process x batch 1 x accumulate 4. The recipes' data sampler
(``use_distributed_sampler: false``) gives rank ``r`` positions ``r, r + 2, ...`` of the epoch's order, so
the 4 micro-batches of step ``s`` (positions ``4s .. 4s + 3``) are the one-process run's window ``s``, with
rank 0 taking ``4s`` and ``4s + 2``. Each loss is a per-micro-batch mean (SFT: over response tokens; GRPO
``loss_type: grpo``: over sequences of per-sequence token means), so a step's gradient is the mean of its 4
micro-batches' gradients in both runs: Lightning divides each loss by the accumulation, DDP and ZeRO-2
average the ranks' sums. A larger ``batch_size`` would not do: the SFT mean would weight samples by their
response lengths, and prompts would be left-padded to one length.

GRPO's rollouts are sampled: :class:`tests.cli.strategy_probe.PromptSeededGRPOTask` seeds each prompt's
sampling with its dataset index, one prompt per generation call (``rollout_batch_prompts: 1``), so both runs
sample identical completions wherever the prompt lands. The recipe's SGR rewards get a fifth term
(completion length / 100, weight 0.01) so that groups' advantages are not all zero: on the untrained tiny
policy the SGR terms are mostly 0 and the gradient would be 0 in both runs.

Tolerances (float32; the runs differ only in the order of float additions): micro-batch losses
``rtol 1e-5, atol 1e-7`` (a GRPO loss is ~1e-7 at step 0: advantages sum to 0 in a group); gradients
and weights ``max |a - b| <= 1e-5 * max |b| + 1e-7`` per tensor. Two optimizer steps per run, so step 2
runs with DDP's rebuilt gradient buckets (a crash in ``_rebuild_buckets`` at step 2 was reported once) and
with the KL term of GRPO away from 0.

FSDP is not in the tier: Lightning refuses it on CPU (``ValueError: The strategy `fsdp` requires a GPU
accelerator, but received `accelerator='cpu'```), and with that check passed by a subclass, torch's FSDP
itself does (``RuntimeError: FSDP needs a non-CPU accelerator device, but no accelerator device is
detected.``); Lightning's FSDP2 ``ModelParallelStrategy`` needs ``configure_model`` to shard the policy itself.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import launch_ranks, wait_ranks

from .strategy_probe import read_losses

pytestmark = [pytest.mark.strategies, pytest.mark.slow]

RUN_TIMEOUT = 240  # seconds per run: kills a hang (a rank blocked in a collective) and fails with the logs
STEPS = 2
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-7
ACCUMULATE = 2  # per rank; the one-process run accumulates 2 * ACCUMULATE micro-batches
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-7
TASKS = {
    "sft": ["--config", "configs/sft.yaml", "--config", "configs/demo.yaml"],
    "sgr": ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"],
}
#: The hybrid Qwen3.5 (Gated DeltaNet) in GRPO-SGR: the sequence-parallel runs only.
HYBRID_SGR = [*TASKS["sgr"], "--model.policy.name_or_path", "grasp_lightning/assets/tiny-qwen3_5"]
ZERO2 = {"class_path": "grasp_lightning.strategies.CPUDeepSpeedStrategy", "init_args": {
    "stage": 2, "overlap_comm": True, "contiguous_gradients": True, "allgather_bucket_size": 200000000,
    "reduce_bucket_size": 200000000}}
STRATEGIES = {"ddp": "ddp", "zero2": ZERO2}
TIMES: dict[str, float] = {}


def _overrides(run: Path, task: str, devices: int, strategy, accumulate: int, sp: int = 1) -> dict:
    trainer = {"devices": devices, "strategy": strategy, "accumulate_grad_batches": accumulate, "max_steps": STEPS,
               "max_epochs": 1, "limit_val_batches": 0, "enable_progress_bar": False, "enable_model_summary": False,
               "logger": False, "enable_checkpointing": False, "default_root_dir": str(run),
               "callbacks": [{"class_path": "tests.cli.strategy_probe.GradientProbe", "init_args": {"out_dir": str(run)}}]}
    model: dict = {}
    if task.startswith("sgr"):
        model = {"task": {"class_path": "tests.cli.strategy_probe.PromptSeededGRPOTask", "init_args": {
                     "reward": {"terms": ["accuracy", "format", "grounding_presence", "social_grounding",
                                           "tests.cli.strategy_probe:completion_length"],
                                 "weights": [1.0, 0.1, 0.05, 0.2, 0.01]},
                     "batching": {"rollout_batch_prompts": 1}}},
                 "rollout": {"num_generations": 4, "max_new_tokens": 16}}
    if sp > 1:
        model["sequence_parallel"] = sp
    return {"trainer": trainer, "model": model, "data": {"loader": {"batch_size": 1, "num_workers": 0}}}


def _run(root: Path, name: str, task: str, devices: int, strategy, accumulate: int, sp: int = 1) -> Path:
    run = root / name
    run.mkdir()
    (run / "run.yaml").write_text(yaml.safe_dump(_overrides(run, task, devices, strategy, accumulate, sp)))
    t0 = time.monotonic()
    args = HYBRID_SGR if task == "sgr-qwen3_5" else TASKS[task]
    procs = launch_ranks(["fit", *args, "--config", str(run / "run.yaml")], run / "log", world=devices)
    wait_ranks(procs, run / "log", RUN_TIMEOUT)
    TIMES[name] = time.monotonic() - t0
    return run


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategies")
    cache: dict[str, Path] = {}

    def get(task: str, strategy: str | None, sp: int = 1) -> Path:
        name = f"{task}-{strategy or 'single'}" + (f"-sp{sp}" if sp > 1 else "")
        if name not in cache:
            if strategy is None:
                cache[name] = _run(root, name, task, 1, "auto", 2 * ACCUMULATE)
            elif sp > 1:  # the group of 2 ranks holds one sample: each rank sees all 4 micro-batches of a step
                cache[name] = _run(root, name, task, 2, STRATEGIES[strategy], 2 * ACCUMULATE, sp)
            else:
                cache[name] = _run(root, name, task, 2, STRATEGIES[strategy], ACCUMULATE)
        return cache[name]

    yield get
    print("\n[strategy tier] " + ", ".join(f"{k} {v:.0f}s" for k, v in TIMES.items()))


def _max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-30)) for k in b)


def _assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: different weights"
    for k, w in want.items():
        bound = GRAD_RTOL * float(w.abs().max()) + GRAD_ATOL
        diff = float((got[k] - w).abs().max())
        assert diff <= bound, f"{what}: {k} differs by {diff:.3g} (bound {bound:.3g})"


def _compare(single: Path, ranks: Path, sp: int = 1) -> dict[str, float]:
    """Rank ``r``'s micro-batch ``m`` of step ``s`` against the one-process run's: without sequence parallelism
    position ``4s + 2m + r`` (Lightning divided the one-process loss by 4, the rank's by 2); with a group of 2
    ranks holding each sample, position ``4s + m`` on both ranks (both divide by 4; the rank's loss is scaled by
    2, the group's share of the gradient average)."""
    one = read_losses(single)
    two = [read_losses(ranks, r) for r in (0, 1)]
    per_step = 2 * ACCUMULATE
    per_rank = per_step if sp > 1 else ACCUMULATE
    assert len(one) == per_step * STEPS and all(len(rows) == per_rank * STEPS for rows in two)
    loss_diff = 0.0
    for r in (0, 1):
        for i, a in enumerate(two[r]):
            s, m = divmod(i, per_rank)
            b = one[per_step * s + m] if sp > 1 else one[per_step * s + 2 * m + r]
            assert a["indices"] == b["indices"] and a["global_step"] == b["global_step"] == s, (a, b)
            torch.testing.assert_close(torch.tensor(a["loss"]), torch.tensor(2 * b["loss"]), rtol=LOSS_RTOL,
                                       atol=LOSS_ATOL)
            loss_diff = max(loss_diff, abs(a["loss"] - 2 * b["loss"]))
    figures = {"loss_abs": loss_diff}
    for s in range(STEPS):
        want, got = torch.load(single / f"grads_step{s}.pt"), torch.load(ranks / f"grads_step{s}.pt")
        assert any(float(g.abs().max()) > 0 for g in want.values()), "all-zero gradients prove nothing"
        _assert_same_tensors(got, want, f"gradient of step {s}")
        figures[f"grad{s}"] = _max_rel(got, want)
    want, got = torch.load(single / "weights_end.pt"), torch.load(ranks / "weights_end.pt")
    _assert_same_tensors(got, want, "weights after the last step")
    figures["weights"] = _max_rel(got, want)
    print(f"\n[strategy tier] {ranks.name} vs {single.name}: max differences (loss absolute; gradients and "
          f"weights max |a - b| / max |b| over tensors) {figures}")
    return figures


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("task", list(TASKS))
def test_two_ranks_equal_one_process(tier, task, strategy):
    _compare(tier(task, None), tier(task, strategy))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("task", list(TASKS))
def test_two_ranks_splitting_each_sample_equal_one_process(tier, task, strategy):
    """``model.sequence_parallel: 2``: the 2 ranks split every sample's sequence (Ulysses) and equal the one-process
    run in every micro-batch's loss, every step's gradient and the final weights, under DDP and ZeRO-2."""
    _compare(tier(task, None), tier(task, strategy, sp=2), sp=2)


def test_two_ranks_splitting_the_hybrid_models_samples_equal_one_process(tier):
    """The same on the hybrid Qwen3.5 in GRPO-SGR under DDP: its Gated DeltaNet layers split by heads, the rollouts
    generated in eval mode between the split forwards (transformers re-kernelizes the layers at ``train()``)."""
    _compare(tier("sgr-qwen3_5", None), tier("sgr-qwen3_5", "ddp", sp=2), sp=2)


def test_wait_ranks_kills_a_hang_and_fails_with_the_logs(tmp_path):
    """The tier's timeout: a rank that never returns (as one blocked in a collective) is killed at the
    deadline, and the failure shows every rank's log tail; a rank that fails is reported with its exit code."""
    import subprocess
    import sys

    from tests.helpers import rank_log

    def start(code: str, rank: int) -> subprocess.Popen:
        with open(rank_log(tmp_path / "log", rank), "w") as out:
            return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)

    hang = "import sys, time; print('rank waiting in all_reduce', flush=True); time.sleep(600)"
    procs = [start("print('rank 0 done')", 0), start(hang, 1)]
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)still running after 3 s.*rank 0 done.*waiting in all_reduce"):
        wait_ranks(procs, tmp_path / "log", timeout=3)
    assert time.monotonic() - t0 < 30 and procs[1].poll() is not None  # killed, not left behind
    procs = [start("import sys; sys.exit('bad config')", 0), start("pass", 1)]
    with pytest.raises(AssertionError, match=r"(?s)exit codes \[1, 0\].*bad config"):
        wait_ranks(procs, tmp_path / "log", timeout=60)
