"""Rollout batches (tasks/grpo.py): one generation call for a whole accumulation window, the same
losses and gradients as per-micro-batch rollouts, an exact resume from the checkpointed cache, and
``dynamic_sampling: refill`` drawing prompts from the stream without losing or repeating one.

Sampling RNG differs between one call over ``A·B`` prompts and ``A`` calls over ``B``, so the
comparisons inject completions that depend only on each prompt's own tokens (``fake_sample``)."""

from __future__ import annotations

import contextlib
import copy
import io
from types import SimpleNamespace

import pytest
import torch

import grasp_lightning.engines.hf as engines_hf
import grasp_lightning.tasks.grpo as grpo_task
from grasp_lightning.data.collate import Batch
from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.data.sampler import ResumableBatchSampler, ResumableSampler
from grasp_lightning.data.windows import WindowCollate, WindowLoader, resume_position
from grasp_lightning.engines.decoding import Completions, RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.rollouts import even_split
from grasp_lightning.sequence_parallel import SequenceParallel
from grasp_lightning.task import CrossRank
from tests.helpers import SAMPLE, TINY

K = 3
TOL = dict(rtol=1e-5, atol=1e-6)
#: Completion lengths of a group (rotated per prompt). With rewards (0, 1, 0) the first step's DAPO loss is
#: -sum(A_j n_j) / sum(n_j), A = (-a, 2a, -a): no rotation of (2, 5, 6) makes it 0, as equal steps (2, 4, 6) would.
LENGTHS = (2, 5, 6)


# ----------------------------------------------------------------------------------- fixtures
def fake_sample(calls: list[int]):
    """``sample_completions`` stand-in: K completions per prompt seeded by the prompt's real tokens
    (independent of batching and padding), lengths :data:`LENGTHS` in a turn the seed picks; records the
    prompts of every call."""

    def sample(policy, tokenizer, prompt, *, num_return_sequences, **kwargs):
        calls.append(prompt["input_ids"].shape[0])
        rows, lengths = [], []
        for ids, mask in zip(prompt["input_ids"], prompt["attention_mask"]):
            real = ids[mask.bool()]
            seed = int((real * torch.arange(1, real.numel() + 1)).sum()) % (2 ** 31)
            g = torch.Generator().manual_seed(seed)
            turn = int(torch.randint(0, len(LENGTHS), (1,), generator=g))
            for j in range(num_return_sequences):
                n = LENGTHS[(j + turn) % len(LENGTHS)]
                rows.append(torch.randint(10, 200, (6,), generator=g))
                lengths.append(n)
        ids = torch.stack(rows)
        mask = torch.arange(6)[None] < torch.tensor(lengths)[:, None]
        ids = ids.masked_fill(~mask, tokenizer.pad_token_id)
        return Completions(ids=ids, mask=mask, texts=tokenizer.batch_decode(ids, skip_special_tokens=True),
                           truncated=torch.zeros(len(rows), dtype=torch.bool), prompt_opened_think=[False] * len(rows))

    return sample


def fake_rewards(degenerate: set[int] = frozenset()):
    """Rewards by row: row j of each group gets j % 2 (the same in any batching), except groups whose prompt's
    dataset index is in ``degenerate`` (all 1: zero variance)."""

    def rewards(texts, items, names, **kwargs):
        values = [[1.0 if items[i].uid in degenerate else float(i % K % 2)] * len(names) for i in range(len(texts))]
        return torch.tensor(values)

    return rewards


@pytest.fixture(scope="module")
def world():
    """The tiny policy (weights perturbed), a frozen reference copy, and the sample RL data module."""
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.datamodule import GraspDataModule

    torch.manual_seed(0)
    policy = AutoModelForImageTextToText.from_pretrained(str(TINY), dtype=torch.float32)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    reference = copy.deepcopy(policy).eval()
    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None, train_limit=12),
                         video=VideoConfig(max_frames=4, max_pixels=4096), prompt=PromptConfig(processor=str(TINY)),
                         loader=LoaderConfig(data_mode="rl", batch_size=1, num_workers=0))
    dm.setup("fit")
    return policy, reference, dm


def make_module(policy, reference, processor):
    @contextlib.contextmanager
    def ref():
        yield reference

    return SimpleNamespace(sequence_parallel=SequenceParallel(), policy=policy, tokenizer=processor.tokenizer, device=torch.device("cpu"),
                           rollout_cfg=RolloutConfig(num_generations=K, max_new_tokens=6), cross_rank=CrossRank(),
                           reference=ref, rollout_engine=engines_hf.HFEngine(), policy_version=0)


def make_task(**kwargs) -> grpo_task.GRPOTask:
    task = grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy"]),
                              loss=grpo_task.LossConfig(beta=0.05, type="dapo", num_iterations=2),
                              batching=grpo_task.BatchingConfig(**kwargs))
    return task  # K and the budget come from the context (make_module)


def windows(dm, window: int, repeat: int = 1, draws: bool = False):
    dm.connect(window=window, repeat=repeat, draws=draws)
    return iter(dm.train_dataloader())


def run_window(task, module, micro_batches) -> tuple[list[float], list[torch.Tensor]]:
    """prepare + training_step + backward of each micro-batch (loss / A, as Lightning); losses and grads."""
    module.policy.zero_grad(set_to_none=True)
    losses = []
    for b in micro_batches:
        task.prepare(module, b)
        out = task.training_step(module, b)
        (out.loss / len(micro_batches)).backward()
        losses.append(float(out.loss.detach()))
    grads = [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]
    return losses, grads


# ----------------------------------------------------------------------------------- equality
def test_one_generation_call_per_rollout_batch_same_losses_and_gradients(world, monkeypatch):
    policy, reference, dm = world
    module = make_module(policy, reference, dm.processor)
    calls: list[int] = []
    monkeypatch.setattr(engines_hf, "sample_completions", fake_sample(calls))
    monkeypatch.setattr(grpo_task, "compute_rewards", fake_rewards())
    it = windows(dm, window=4)
    micro = [next(it) for _ in range(4)]
    lengths = {int(b.inputs["input_ids"].shape[1]) for b in micro}
    assert len(lengths) > 1  # prompts of different lengths: the merged batch is left-padded
    batched = run_window(make_task(), module, micro)
    assert calls == [4]  # the 4 micro-batches' prompts in one call
    calls.clear()
    per_micro = run_window(make_task(rollout_batch_prompts=1), module, micro)
    assert calls == [1, 1, 1, 1]
    assert all(abs(x) > 1e-4 for x in batched[0])  # non-trivial losses
    torch.testing.assert_close(torch.tensor(batched[0]), torch.tensor(per_micro[0]), **TOL)
    assert len(batched[1]) == len(per_micro[1]) > 0
    for a, b in zip(batched[1], per_micro[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # rollout_batch_prompts=2: two calls of two prompts
    calls.clear()
    two = run_window(make_task(rollout_batch_prompts=2), module, micro)
    assert calls == [2, 2]
    torch.testing.assert_close(torch.tensor(two[0]), torch.tensor(batched[0]), **TOL)


def test_config_errors_name_the_keys():
    with pytest.raises(GraspConfigError, match="dynamic_sampling"):
        grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(dynamic_sampling="resample"))
    with pytest.raises(GraspConfigError, match=r"dynamic_sampling must be one of \('off', 'drop', 'refill'\), got None"):
        grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(dynamic_sampling=None))
    with pytest.raises(GraspConfigError, match="rollout_batch_prompts"):
        grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(rollout_batch_prompts=0))
    assert grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(dynamic_sampling="drop")).dynamic_sampling == "drop"
    assert grpo_task.GRPOTask().dynamic_sampling == "off"


def test_an_epoch_shorter_than_one_window_is_refused(world):
    """12 micro-batches cannot fill a window of 16: an error naming both keys, not a run that trains nothing."""
    _, _, dm = world
    with pytest.raises(GraspConfigError, match=r"12 micro-batches .* fill no window of 16 "
                                               r"\(trainer.accumulate_grad_batches\)"):
        windows(dm, window=16)
    assert len(list(windows(dm, window=12))) == 12  # exactly one window is fine


# ----------------------------------------------------------------------------------- resume
def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("mode", ["drop", "refill"])
def test_resume_inside_a_rollout_batch_continues_with_the_same_samples(world, monkeypatch, mode):
    """Uninterrupted: micro-batches 0 and 1 of a window. Interrupted after micro-batch 0: the task state
    goes through torch.save / torch.load(weights_only=True) into a fresh task, which continues with the
    same completions and loss without sampling (with refill, the drawn prompts are decoded again)."""
    policy, reference, dm = world
    module = make_module(policy, reference, dm.processor)
    calls: list[int] = []
    monkeypatch.setattr(engines_hf, "sample_completions", fake_sample(calls))
    it = windows(dm, window=2, draws=mode == "refill")
    micro = [next(it), next(it)]
    # the first window's two prompts are degenerate: refill must draw
    monkeypatch.setattr(grpo_task, "compute_rewards", fake_rewards({micro[0].items[0].uid, micro[1].items[0].uid}))
    task = make_task(dynamic_sampling=mode)
    sampled = task.prepare(module, micro[0])  # the rollout batch's figures, once
    first = task.training_step(module, micro[0])
    state = _roundtrip(task.state_dict())
    task.prepare(module, micro[1])  # the window's second micro-batch: its cached rollouts
    ref_out = task.training_step(module, micro[1])
    n_calls = len(calls)
    assert sampled["dynamic_sampling/groups_tried"] == (4.0 if mode == "refill" else 2.0)
    if mode == "refill":
        assert micro[0].window.draws == 1 and sampled["dynamic_sampling/groups_kept"] == 2.0
        assert sampled["dynamic_sampling/groups_dropped"] == 2.0 and sampled["dynamic_sampling/groups_unused"] == 0.0
        # tried: the two degenerate groups (every row 1) and two drawn ones (rows 0, 1, 0, ...); trained: the drawn
        drawn = sum(j % 2 for j in range(K)) / K
        assert sampled["dynamic_sampling/reward_mean_tried"] == pytest.approx((2 * 1.0 + 2 * drawn) / 4)
        assert float(first.metrics["reward/mean"]) == pytest.approx(drawn)
    else:  # drop: both groups tried are degenerate and masked; tried = trained, so no second reward series
        assert sampled["dynamic_sampling/groups_kept"] == 0.0 and "dynamic_sampling/groups_dropped" not in sampled
        assert "dynamic_sampling/reward_mean_tried" not in sampled
        assert first.metrics["zero_variance_groups/count"] == 1.0 and float(first.metrics["reward/mean"]) == 1.0
    resumed = make_task(dynamic_sampling=mode)
    resumed.load_state_dict(state)
    fresh_micro = micro[1]  # the resumed loader yields the same window again (its batches decoded anew)
    resumed.prepare(module, fresh_micro)
    out = resumed.training_step(module, fresh_micro)
    assert len(calls) == n_calls  # nothing sampled again
    assert out.rollout.completions == ref_out.rollout.completions
    assert float(out.loss) == pytest.approx(float(ref_out.loss), rel=1e-6)
    assert [it.uid for it in out.rollout.items] == [it.uid for it in ref_out.rollout.items]


# ----------------------------------------------------------------------------------- refill stream
def _int_loader(n: int, batch_size: int, window: int, start: tuple[int, int, int] | None = None):
    def collate(samples):
        return Batch(inputs={}, items=list(samples), indices=list(samples), valid=torch.ones(len(samples), dtype=bool),
                     prompt_lengths=torch.zeros(len(samples)))

    sampler = ResumableSampler(n, shuffle=True, seed=3)
    batches = ResumableBatchSampler(sampler, batch_size, window)
    first = skip = exclude = 0
    if start is not None:
        first, skip, exclude = start
        batches.set_start(0, first, exclude)
    loader = torch.utils.data.DataLoader(list(range(n)), batch_sampler=batches,
                                         collate_fn=WindowCollate(collate, batch_size))
    return WindowLoader(loader, window, 2, skip=skip, first_window=first, exclude=exclude)


def _consume(loader, draw_at: set[int], stop_after: int | None = None):
    """Iterate like a refill task: at the first micro-batch of window ``w`` in ``draw_at``, draw twice.
    Returns (indices trained or drawn at first use, micro-batches consumed, last window)."""
    seen, consumed, last = [], 0, None
    for batch in loader:
        w = batch.window
        if w.position == 0 and w.iteration == 0:
            seen += [i for b in w.batches for i in b.indices]
            if w.index in draw_at:
                for _ in range(2):
                    extra = w.draw()
                    if extra is not None:
                        seen += [i for b in extra for i in b.indices]
        consumed, last = consumed + 1, w
        if stop_after is not None and consumed == stop_after:
            break
    return seen, consumed, last


@pytest.mark.parametrize("stop_after", [None, 5, 8])
def test_refill_draws_never_lose_or_repeat_a_sample(stop_after):
    """24 samples, micro-batches of 2, windows of 2, 2 iterations; windows 0 and 5 draw two more each.
    Every index is seen exactly once over the epoch, also when the run stops after micro-batch 5 (inside
    a window that drew) or 8 (at a window boundary) and resumes from (consumed, window, draws)."""
    draw_at = {0, 5}
    seen, consumed, last = _consume(_int_loader(24, 2, 2), draw_at, stop_after)
    if stop_after is not None:
        start = resume_position(consumed, 2 * 2, last.index, last.draws)
        more, _, _ = _consume(_int_loader(24, 2, 2, start), draw_at)  # a re-yielded window starts past position 0
        seen += more
    assert sorted(seen) == list(range(24))


# ----------------------------------------------------------------------------------- refill on two ranks
class _IndexTask(grpo_task.GRPOTask):
    """GRPOTask whose rollouts are scripted by dataset index: K = 2 completions, rewards [1, 1] (a
    degenerate group) for indices in ``degenerate``, else [1, 0]."""

    def __init__(self, degenerate: set[int], num_iterations: int = 2, max_resample: int = 4):
        super().__init__(reward=grpo_task.RewardConfig(terms=["accuracy"]),
                         loss=grpo_task.LossConfig(beta=0.0, num_iterations=num_iterations),
                         batching=grpo_task.BatchingConfig(dynamic_sampling="refill", max_resample=max_resample))
        self.degenerate = degenerate  # K = 2: the context's model.rollout.num_generations

    def rollout(self, module, batch):
        n = 2 * len(batch)
        terms = torch.tensor([[1.0 if (i in self.degenerate or j == 0) else 0.0]
                              for i in batch.indices for j in range(2)])
        rewards, adv = self.advantages(terms, k=module.rollout_cfg.num_generations)
        mask = torch.ones(n, 1, dtype=torch.bool)
        comp = Completions(ids=torch.full((n, 1), 5), mask=mask, texts=[""] * n, truncated=torch.zeros(n, dtype=torch.bool),
                           prompt_opened_think=[False] * n)
        return grpo_task.Rollout(prompt={k: v for k, v in batch.inputs.items()}, shared=False, completions=comp,
                                 terms=terms, rewards=rewards, advantages=adv, old_logp=None, ref_logp=None,
                                 zero_variance=grpo_task.objective.zero_variance_groups(rewards, 2),
                                 indices=list(batch.indices), loss_mask=mask.clone(),
                                 items=list(batch.items))


class _CountingCrossRank(CrossRank):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def sum(self, values):
        self.calls += 1
        return super().sum(values)


N_TWO_RANKS = 24  # 12 per rank: micro-batches of 2, windows of 2 -> 3 windows per rank and epoch


def _two_rank_loader(rank: int, on_draw):
    def collate(indices):
        n = len(indices)
        return Batch(inputs={"input_ids": torch.tensor([[7, 8 + i] for i in indices]),
                             "attention_mask": torch.ones(n, 2, dtype=torch.long)},
                     items=list(indices), indices=list(indices), valid=torch.ones(n, dtype=torch.bool),
                     prompt_lengths=torch.full((n,), 2))

    sampler = ResumableSampler(N_TWO_RANKS, shuffle=True, seed=5, rank=rank, world_size=2)
    loader = torch.utils.data.DataLoader(list(range(N_TWO_RANKS)), batch_sampler=ResumableBatchSampler(sampler, 2, 2),
                                         collate_fn=WindowCollate(collate, 2))
    return WindowLoader(loader, 2, 2, on_draw=on_draw), sampler


def _refill_rank(rank: int) -> None:
    import torch.distributed as dist

    drawn: list[int] = []
    loader, sampler = _two_rank_loader(rank, lambda batches: drawn.extend(i for b in batches for i in b.indices))
    own = sampler.order()
    # rank 0's first window: 2 of its 4 prompts degenerate (short); rank 1's first window is full, but must
    # draw with rank 0. Rank 1's third window (if yielded) has one degenerate prompt.
    degenerate = {own[0], own[2], own[1 + 2 * 8]}
    task = _IndexTask(degenerate)
    cross = _CountingCrossRank()
    module = SimpleNamespace(sequence_parallel=SequenceParallel(), device=torch.device("cpu"), cross_rank=cross, tokenizer=None,
                             rollout_cfg=RolloutConfig(num_generations=2))
    steps, yielded, trained, unused = [], [], [], 0
    for batch in loader:
        w = batch.window
        calls = cross.calls
        sampled = task.prepare(module, batch)
        ro = task.cache.rollouts[w.position]
        steps.append((w.index, w.position, w.iteration, w.draws, cross.calls - calls))
        if sampled:
            unused += int(sampled["dynamic_sampling/groups_unused"])
        if w.iteration == 0:
            yielded += list(batch.indices)
            trained.append(list(ro.indices))
            assert len(ro.indices) == len(batch)  # trimmed to the window's size, split evenly: 2 per micro-batch
        else:
            assert list(ro.indices) == trained[len(trained) - 2 + w.position]  # reuse: the same rollouts
    report = {"steps": steps, "yielded": yielded, "drawn": drawn, "trained": trained, "calls": cross.calls,
              "degenerate": sorted(degenerate), "unused": unused}
    reports: list = [None, None]
    dist.all_gather_object(reports, report)
    r0, r1 = reports
    assert r0["steps"] == r1["steps"]  # same windows, positions, iterations, draws and collectives, in order
    assert r0["calls"] == r1["calls"]
    assert r0["steps"][0][3] == 1  # window 0 drew once on both ranks (only rank 0 was short)
    seen = [i for r in reports for i in r["yielded"] + r["drawn"]]
    assert sorted(seen) == list(range(N_TWO_RANKS))  # every dataset index exactly once over the epoch and ranks
    flat = [i for r in reports for t in r["trained"] for i in t]
    assert len(flat) == len(set(flat))  # no prompt trained twice
    bad = set(r0["degenerate"]) | set(r1["degenerate"])
    # no non-degenerate prompt lost: each is trained or counted as drawn and unused. Window 0 drew one window
    # on both ranks: rank 0 had 2 + 4 useful groups for 4 places (2 unused), rank 1 4 + 4 (4 unused).
    assert (r0["unused"], r1["unused"]) == (2, 4)
    assert len(set(range(N_TWO_RANKS)) - bad - set(flat)) == r0["unused"] + r1["unused"]


def test_refill_keeps_two_ranks_aligned_and_sees_every_index_once():
    """2 gloo processes: rank 0 is short of non-degenerate groups in window 0, rank 1 is not; both draw
    (one ``cross_rank.sum`` per try on both), the streams stay aligned (same window indices, draws and
    collective count per micro-batch), no rank hangs (timeout), each rollout batch is trimmed to its window's
    4 prompts (2 per micro-batch), and over the epoch every dataset index is yielded or drawn exactly once
    across the ranks, none trained twice, and every non-degenerate one trained or counted as unused."""
    from tests.helpers import spawn_two_ranks

    spawn_two_ranks(_refill_rank)


def test_refill_logs_how_much_shorter_the_epoch_ran(caplog):
    """24 samples, windows of 2 micro-batches x 2 iterations: 6 windows, 24 micro-batches announced by len();
    window 0 draws two: 4 windows yielded, 16 micro-batches run — the count is logged and kept."""
    loader = _int_loader(24, 2, 2)
    assert len(loader) == 24
    with caplog.at_level("WARNING", logger="grasp_lightning.data.windows"):
        seen, consumed, _ = _consume(loader, {0})
    assert consumed == 16 and loader.drawn_windows == 2 and sorted(seen) == list(range(24))
    messages = [r.getMessage() for r in caplog.records]
    assert any("drew 2 windows" in m and "16 of the 24 micro-batches" in m and "(8 of 12 optimizer steps)" in m
               for m in messages), messages


# ----------------------------------------------------------------------------------- refill: trim, split, empty rank
def _index_batch(indices: list[int], skipped: int = 0) -> Batch:
    """A micro-batch of prompts ``[7, 8 + i]`` for dataset indices ``indices`` (``skipped``: unreadable items
    left out of it, as ``on_bad_item: skip`` leaves them)."""
    from grasp_lightning.data.formats import SkipRecord

    n = len(indices)
    inputs = ({"input_ids": torch.tensor([[7, 8 + i] for i in indices]), "attention_mask": torch.ones(n, 2, dtype=torch.long)}
              if n else {})
    items = [SimpleNamespace(uid=f"row:{i}", participants=()) for i in indices]
    return Batch(inputs=inputs, items=items, indices=list(indices), valid=torch.ones(n, dtype=torch.bool),
                 prompt_lengths=torch.full((n,), 2), skipped=[SkipRecord(f"clip{j}.mp4", "unreadable") for j in range(skipped)])


def _refill_window(batches: list[Batch], draws: list[list[Batch]]) -> list[Batch]:
    from grasp_lightning.data.windows import Window, WindowSource

    source = WindowSource(iterator=iter(draws))
    for pos, b in enumerate(batches):
        b.window = Window(batches, pos, 0, 0, source)
    return batches


def _index_context(cross_rank=None) -> SimpleNamespace:
    return SimpleNamespace(sequence_parallel=SequenceParallel(), device=torch.device("cpu"), cross_rank=cross_rank or CrossRank(), tokenizer=None,
                           rollout_cfg=RolloutConfig(num_generations=2))


def test_refill_trims_to_the_window_and_splits_evenly():
    """A window of 2 micro-batches x 1 prompt (target 2 groups), prompt 0 degenerate: the draw brings prompts
    2 and 3, both useful. Trained: the first 2 useful groups in sampling order, one per micro-batch; prompt 3
    is drawn and unused (counted). Before the trim this trained 3 groups split [[1, 2], [3]]."""
    task = _IndexTask({0})
    window = _refill_window([_index_batch([0]), _index_batch([1])], [[_index_batch([2]), _index_batch([3])]])
    sampled = task.prepare(_index_context(), window[0])
    assert [ro.indices for ro in task.cache.rollouts] == [[1], [2]]
    assert {k.split("/")[1]: v for k, v in sampled.items() if k.startswith("dynamic_sampling/")} == {
        "groups_tried": 4.0, "groups_kept": 2.0, "groups_dropped": 1.0, "groups_unused": 1.0, "resample_tries": 1.0,
        "reward_mean_tried": pytest.approx((2 + 1 + 1 + 1) / 8)}
    # 2 x 2 prompts, 3 degenerate: one draw of 4 useful -> 5 useful for 4 places, 2 per micro-batch
    task = _IndexTask({0, 2, 3})
    window = _refill_window([_index_batch([0, 1]), _index_batch([2, 3])],
                            [[_index_batch([4, 5]), _index_batch([6, 7])]])
    sampled = task.prepare(_index_context(), window[0])
    assert [ro.indices for ro in task.cache.rollouts] == [[1, 4], [5, 6]]
    assert sampled["dynamic_sampling/groups_unused"] == 1.0 and sampled["dynamic_sampling/groups_kept"] == 4.0
    # a budget of no draws: the degenerate group is trained (masked by the task's rollout) after the useful one
    task = _IndexTask({0}, max_resample=0)
    window = _refill_window([_index_batch([0]), _index_batch([1])], [[_index_batch([2]), _index_batch([3])]])
    task.prepare(_index_context(), window[0])
    useful, filler = task.cache.rollouts
    assert (useful.indices, filler.indices) == ([1], [0]) and bool(filler.zero_variance.all())
    # a micro-batch with an item skipped: 3 prompts into 2 micro-batches, [2, 1]
    task = _IndexTask(set())
    window = _refill_window([_index_batch([0, 1]), _index_batch([2], skipped=1)], [])
    task.prepare(_index_context(), window[0])
    assert [ro.indices for ro in task.cache.rollouts] == [[0, 1], [2]]


def test_even_split_of_nothing_and_its_errors():
    assert even_split(5, 2) == [3, 2] and even_split(4, 4) == [1, 1, 1, 1] and even_split(0, 0) == []
    with pytest.raises(ValueError, match="cannot split 2 items into 0 parts"):
        even_split(2, 0)


def _empty_window_rank(rank: int) -> None:
    """Rank 0's whole window was skipped (2 empty micro-batches, every item unreadable); rank 1 is short (its
    prompt 10 is degenerate). Both go through ``GraspModule.training_step`` (no trainer: the step ends at the
    window's last micro-batch), both draw once, rank 0 trains nothing and no rank hangs."""
    import grasp_lightning.tasks.grpo as grpo_module
    from grasp_lightning.module import GraspModule

    def fake_score(policy, prompt, ids, mask, k, temperature, shared, *_, **__):
        return torch.zeros(ids.shape, requires_grad=True), torch.zeros(ids.shape)

    grpo_module.score_completions = fake_score
    task = _IndexTask({10})
    module = GraspModule(task, rollout=RolloutConfig(num_generations=2))
    if rank == 0:
        window = _refill_window([_index_batch([], skipped=1), _index_batch([], skipped=1)],
                                [[_index_batch([20]), _index_batch([21])]])
    else:
        window = _refill_window([_index_batch([10]), _index_batch([11])], [[_index_batch([12]), _index_batch([13])]])
    results = [module.training_step(b, i) for i, b in enumerate(window)]
    assert window[0].window.draws == 1
    if rank == 0:
        assert results == [None, None] and task.cache.rollouts == [None, None]
    else:
        assert [ro.indices for ro in task.cache.rollouts] == [[11], [12]]
    step = module.last_step_metrics  # the window over both ranks, reduced once
    assert step["data/skipped"] == 2.0
    assert step["train/dynamic_sampling/groups_tried"] == 6.0 and step["train/dynamic_sampling/groups_kept"] == 2.0
    assert step["train/dynamic_sampling/groups_unused"] == 3.0  # rank 0's two drawn groups, rank 1's prompt 13
    assert step["train/reward/mean"] == 0.5 and step["train/zero_variance_groups/fraction"] == 0.0


def test_refill_with_a_whole_window_skipped_on_one_rank_neither_crashes_nor_hangs():
    """2 gloo processes (timeout): ``even_split(n, 0)`` raised ZeroDivisionError on the empty rank, which then
    died while the other waited in its next collective."""
    from tests.helpers import spawn_two_ranks

    spawn_two_ranks(_empty_window_rank)


# ----------------------------------------------------------------------------------- rollout overlap
def test_overlap_settings_are_refused_by_name_and_turn_the_correction_on():
    """``model.rollout.overlap``: only 0 or 1, 1 only with ``engine: vllm``; ``num_iterations > 1`` and ``refill``
    refused naming both settings; the importance-sampling cap becomes 2.0 unless set."""
    with pytest.raises(GraspConfigError, match=r"model.rollout.overlap must be 0 or 1, got 2"):
        RolloutConfig(engine="vllm", overlap=2)
    with pytest.raises(GraspConfigError, match=r"model.rollout.overlap=1 needs model.rollout.engine=vllm \(got 'hf'\)"):
        RolloutConfig(overlap=1)
    cfg = RolloutConfig(engine="vllm", overlap=1, num_generations=K)
    with pytest.raises(GraspConfigError, match=r"model.rollout.overlap=1 with model.task.init_args.loss.num_iterations=2"):
        grpo_task.GRPOTask(loss=grpo_task.LossConfig(num_iterations=2)).check_settings(cfg)
    with pytest.raises(GraspConfigError, match=r"model.rollout.overlap=1 with model.task.init_args.batching.dynamic_sampling="
                                               r"refill"):
        grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(dynamic_sampling="refill")).check_settings(cfg)
    task = grpo_task.GRPOTask(batching=grpo_task.BatchingConfig(dynamic_sampling="drop"))
    task.check_settings(cfg)
    assert task.loss.importance_sampling_cap == 2.0
    kept = grpo_task.GRPOTask(loss=grpo_task.LossConfig(importance_sampling_cap=3.0))
    kept.check_settings(cfg)
    assert kept.loss.importance_sampling_cap == 3.0
    alternating = grpo_task.GRPOTask()
    alternating.check_settings(RolloutConfig(engine="vllm", num_generations=K))
    assert alternating.loss.importance_sampling_cap is None


def test_peek_reads_the_next_window_ahead_without_consuming_it():
    """``Window.peek``: the next window's batches, also after the loader already took it (Lightning fetches one
    micro-batch ahead), yielded next as the same objects; ``None`` after the epoch's last window; every index
    once."""
    it = iter(_int_loader(12, 2, 2))  # 3 windows of 2 micro-batches, each yielded twice (repeat 2)
    first = next(it)
    ahead = first.window.peek()
    assert ahead is not None and ahead is first.window.peek()  # held, not consumed
    windows_seen, last = [first.window.batches], first.window
    for b in it:  # a batch's ``window`` is set anew at each yield: read it as it comes
        if b.window.position == 0 and b.window.iteration == 0:
            windows_seen.append(b.window.batches)
        last = b.window
    assert len(windows_seen) == 3 and windows_seen[1] is ahead  # the peeked window is yielded next, same objects
    assert last.peek() is None  # the epoch's last window has nothing after it
    assert sorted(i for w in windows_seen for mb in w for i in mb.indices) == list(range(12))
    it = iter(_int_loader(12, 2, 2))
    a = next(it).window
    for _ in range(4):  # the rest of window 0 and the first micro-batch of window 1: the loader took window 1
        b = next(it)
    assert b.window.index == 1 and a.peek() is b.window.batches


def test_overlap_samples_the_next_window_during_the_step_one_step_stale(world, monkeypatch):
    """Three windows with ``overlap: 1`` on an engine that samples at submission (the HF stand-in): window 0 is
    sampled at its step, window ``t+1`` is submitted at step ``t`` with step ``t``'s weights before window ``t`` is
    scored, so staleness is 0 then 1; the request in flight is in the task state and a resumed task logs that it
    samples it again."""
    policy, reference, dm = world
    module = make_module(policy, reference, dm.processor)
    module.rollout_cfg = RolloutConfig(engine="vllm", overlap=1, num_generations=K, max_new_tokens=6)
    module.rollout_engine = engines_hf.HFEngine()
    versions: list[int] = []
    real_submit = engines_hf.RolloutEngine.submit

    def submit(self, policy, tokenizer, prompt, cfg, *, policy_version=0):
        versions.append(policy_version)
        return real_submit(self, policy, tokenizer, prompt, cfg, policy_version=policy_version)

    calls: list[int] = []
    monkeypatch.setattr(engines_hf, "sample_completions", fake_sample(calls))
    monkeypatch.setattr(engines_hf.RolloutEngine, "submit", submit)
    monkeypatch.setattr(grpo_task, "compute_rewards", fake_rewards())
    dm.connect(window=1, lookahead=True)
    it = iter(dm.train_dataloader())
    task = grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy"]), loss=grpo_task.LossConfig(beta=0.0))
    task.check_settings(module.rollout_cfg)
    staleness, trained = [], []
    for step in range(3):
        module.policy_version = step
        batch = next(it)
        sampled = task.prepare(module, batch)
        out = task.training_step(module, batch)
        staleness.append(float(sampled["rollout/staleness"]))
        trained.append(list(batch.indices))
        assert "sampling/importance_weight/mean" not in out.metrics  # the HF stand-in reports no log-probs
        assert task.prefetch.in_flight == (tuple(batch.window.peek()[0].indices),)
    assert versions == [0, 0, 1, 2] and staleness == [0.0, 1.0, 1.0]
    state = _roundtrip(task.state_dict())
    nxt = next(it)
    assert state["in_flight"] == [list(nxt.indices)]
    resumed = grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy"]), loss=grpo_task.LossConfig(beta=0.0))
    resumed.check_settings(module.rollout_cfg)
    resumed.load_state_dict(state)
    module.policy_version = 3
    versions.clear()
    with _caplog_of("grpo.overlap") as records:
        sampled = resumed.prepare(module, nxt)
    assert versions[0] == 3 and float(sampled["rollout/staleness"]) == 0.0  # sampled again, with the restored weights
    assert any("sampling it again now" in r.getMessage() for r in records)
    seen = [i for t in trained for i in t] + list(nxt.indices)
    assert len(seen) == len(set(seen)) == 4  # batch size 1: four windows, each index once


@contextlib.contextmanager
def _caplog_of(suffix: str):
    """The records of the logger whose name ends with ``suffix`` while the block runs."""
    import logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    name = next(n for n in logging.root.manager.loggerDict if n.endswith(suffix))
    logger, handler = logging.getLogger(name), Keep()
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def test_take_completion_keeps_one_row_per_group_with_the_group_advantage() -> None:
    from grasp_lightning.grpo.rollouts import Rollout, take_completion

    k, groups = 4, 2
    ids = torch.arange(groups * k * 3).reshape(groups * k, 3)
    comp = Completions(ids=ids, mask=torch.ones_like(ids, dtype=torch.bool), texts=[f"t{i}" for i in range(8)],
                       truncated=torch.zeros(8, dtype=torch.bool), prompt_opened_think=[])
    adv = torch.tensor([0.5, -0.5, 1.5, -1.5, 0.0, 0.0, 2.0, -2.0])
    ro = Rollout(prompt={}, shared=True, completions=comp, terms=adv[:, None], rewards=adv, advantages=adv,
                 old_logp=None, ref_logp=torch.zeros(8, 3), zero_variance=torch.tensor([False, False]),
                 indices=[7, 9])
    one = take_completion(ro, 2, k)  # completion 2 of each group: rows 2 and 6
    assert one.completions.texts == ["t2", "t6"] and one.advantages.tolist() == [1.5, 2.0]
    assert one.completions.ids.tolist() == [ids[2].tolist(), ids[6].tolist()] and one.ref_logp.shape == (2, 3)
    assert one.num_groups == 2 and one.num_generations == 1 and one.indices == [7, 9]
    with pytest.raises(ValueError, match="completion 4 of groups of 4"):
        take_completion(ro, 4, k)
    # which micro-batch of prompts and completion the f-th micro-batch of a window of A = 4 trains (K = 8)
    assert [grpo_task.GRPOTask.completion_of(p, i, 4, 8) for i in (0, 1, 2) for p in (0, 3)] == [
        (0, 0), (0, 3), (0, 4), (0, 7), (1, 0), (1, 3)]


@pytest.mark.parametrize("key, value", [("loss", {"num_iterations": 2}), ("loss", {"type": "dapo"}),
                                        ("batching", {"dynamic_sampling": "refill"})])
def test_the_rollout_micro_batch_refuses_what_does_not_apply(key, value) -> None:
    from grasp_lightning.grpo.config import BatchingConfig, LossConfig

    groups = {"loss": LossConfig(**(value if key == "loss" else {})),
              "batching": BatchingConfig(micro_batch="rollout", **(value if key == "batching" else {}))}
    task = grpo_task.GRPOTask(**groups)
    with pytest.raises(GraspConfigError, match="micro_batch=rollout"):
        task.check_settings(RolloutConfig(num_generations=8))
    with pytest.raises(GraspConfigError, match="micro_batch must be one of"):
        BatchingConfig(micro_batch="sequence")


# ----------------------------------------------------------------------------------- objective options in the task
def test_mask_truncated_leaves_truncated_completions_out_of_the_loss_and_its_normaliser(world, monkeypatch):
    """``loss.mask_truncated``: the completions that hit the budget without ending have no loss token, so they
    leave dapo's window normaliser too (TRL's mask_truncated_completions), and their count is logged."""
    policy, reference, dm = world
    module = make_module(policy, reference, dm.processor)
    sample = fake_sample([])

    def truncating(*args, **kwargs):
        out = sample(*args, **kwargs)
        out.truncated = torch.arange(len(out.texts)) % K == 0  # the first completion of each group
        return out

    monkeypatch.setattr(engines_hf, "sample_completions", truncating)
    monkeypatch.setattr(grpo_task, "compute_rewards", fake_rewards())
    results = {}
    for masked in (False, True):
        task = grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy"]),
                                  loss=grpo_task.LossConfig(beta=0.0, type="dapo", mask_truncated=masked))
        it = windows(dm, window=2)
        micro = [next(it), next(it)]
        task.prepare(module, micro[0])
        out = task.training_step(module, micro[0])
        ros = task.cache.rollouts
        results[masked] = (float(task.cache.tokens), out, ros)
    plain_tokens, _, ros = results[False]
    tokens, out, masked_ros = results[True]
    truncated_tokens = sum(float(ro.completions.mask[ro.completions.truncated].sum()) for ro in ros)
    assert truncated_tokens > 0 and tokens == plain_tokens - truncated_tokens
    for ro in masked_ros:
        assert float(ro.loss_mask[ro.completions.truncated].sum()) == 0.0
        assert torch.equal(ro.loss_mask[~ro.completions.truncated], ro.completions.mask[~ro.completions.truncated])
    assert out.metrics["masked/truncated_completions"] == 1.0  # one prompt of K = 3 per micro-batch
    assert "masked/truncated_completions" not in results[False][1].metrics


def test_adaptive_entropy_coefficient_is_stepped_logged_and_checkpointed(world, monkeypatch):
    """``loss.adaptive_entropy``: the first step applies no bonus (no entropy measured yet); the next step's
    coefficient rose by entropy_coef_delta (entropy below the target) and acts; the controller's state goes
    through torch.save / torch.load(weights_only=True) into a fresh task that continues with it."""
    policy, reference, dm = world
    module = make_module(policy, reference, dm.processor)
    monkeypatch.setattr(engines_hf, "sample_completions", fake_sample([]))
    monkeypatch.setattr(grpo_task, "compute_rewards", fake_rewards())
    loss = grpo_task.LossConfig(beta=0.0, entropy_coef=0.1, adaptive_entropy=True, entropy_coef_delta=0.05,
                                entropy_target=100.0, top_entropy_quantile=0.5)

    def make():
        return grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy"]), loss=loss)

    task = make()
    it = windows(dm, window=2)
    first = []
    for _ in range(2):
        b = next(it)
        task.prepare(module, b)
        first.append(task.training_step(module, b))
    assert [o.metrics["entropy/coef_applied"] for o in first] == [0.0, 0.0]
    assert first[0].metrics["entropy/coef"] == 0.1 and first[0].metrics["masked/low_entropy_tokens"] > 0
    state = _roundtrip(task.state_dict())
    assert state["entropy_control"]["pending"][1] > 0  # the step's entropy sums, reduced at the next step
    resumed = make()
    resumed.load_state_dict(state)
    b = next(it)
    for t in (task, resumed):
        t.prepare(module, b)
    outs = [t.training_step(module, b) for t in (task, resumed)]
    for out, t in zip(outs, (task, resumed)):
        assert out.metrics["entropy/coef"] == pytest.approx(0.15)
        assert out.metrics["entropy/coef_applied"] == pytest.approx(0.15)
        assert 0 < t.entropy_control.last_entropy < 100.0
    assert float(outs[0].loss.detach()) == pytest.approx(float(outs[1].loss.detach()), rel=1e-6)


@pytest.mark.parametrize("settings, key", [
    (dict(type="ppo"), "loss.type"), (dict(ratio_level="group"), "loss.ratio_level"),
    (dict(type="cispo"), "loss.epsilon_high"), (dict(type="sapo", delta=2.0), "loss.delta"),
    (dict(delta=0.9), "loss.delta"), (dict(type="vespo", ratio_level="sequence"), "loss.ratio_level"),
    (dict(top_entropy_quantile=1.5), "loss.top_entropy_quantile"), (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg"),
    (dict(entropy_coef_min=0.5, entropy_coef_max=0.1), "loss.entropy_coef_min"), (dict(entropy_coef=-1.0), "entropy_coef"),
])
def test_objective_settings_are_refused_by_name(settings, key):
    with pytest.raises(GraspConfigError, match=key.replace(".", r"\.")):
        grpo_task.LossConfig(**settings)
