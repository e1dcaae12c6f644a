"""The window's rollouts (grasp_lightning/grpo/sampling.py): generation calls, the split by position, and
the window cache's states."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import torch

from grasp_lightning.data.collate import Batch
from grasp_lightning.engines.decoding import Completions
from grasp_lightning.errors import GraspError
from grasp_lightning.grpo.rollouts import Rollout, SamplingStats
from grasp_lightning.grpo.sampling import CacheState, WindowCache, generation_calls, split_window

K = 2


def _batch(indices: list[int]) -> Batch:
    n = len(indices)
    inputs = {"input_ids": torch.arange(n * 2).reshape(n, 2), "attention_mask": torch.ones(n, 2, dtype=torch.long)}
    return Batch(inputs=inputs, items=[SimpleNamespace(uid=str(i)) for i in indices], indices=indices,
                 valid=torch.ones(n, dtype=torch.bool), prompt_lengths=torch.full((n,), 2), padding_side="left")


def _rollout(indices: list[int], rewards: list[float]) -> Rollout:
    """``len(indices)`` groups of K = 2 completions with the given rewards (group-major)."""
    n = len(rewards)
    r = torch.tensor(rewards)
    comp = Completions(ids=torch.full((n, 3), 5), mask=torch.ones(n, 3, dtype=torch.bool), texts=[""] * n,
                       truncated=torch.zeros(n, dtype=torch.bool))
    zero = r.view(-1, K).std(1) == 0
    return Rollout(prompt=_batch(indices).inputs, shared=False, completions=comp, terms=r[:, None], rewards=r,
                   advantages=r - r.mean(), old_logp=None, ref_logp=None, zero_variance=zero, indices=indices,
                   loss_mask=comp.mask.clone(), stats=SamplingStats(generation_s=1.5, prompt_tokens=8.0))


def test_generation_calls_merge_whole_micro_batches_up_to_the_cap():
    micro = [_batch([0, 1]), _batch([]), _batch([2]), _batch([3, 4])]
    assert [c.indices for c in generation_calls(micro, None, 0)] == [[0, 1, 2, 3, 4]]
    assert [c.indices for c in generation_calls(micro, 3, 0)] == [[0, 1, 2], [3, 4]]
    assert [c.indices for c in generation_calls(micro, 1, 0)] == [[0, 1], [2], [3, 4]]  # never splits a micro-batch
    assert generation_calls([_batch([])], None, 0) == []


def test_split_window_by_position_and_its_group_counts():
    ro = _rollout([7, 8, 9], [1.0, 0.0, 1.0, 1.0, 0.0, 2.0])  # group 8 degenerate
    batches = [_batch([7, 8]), _batch([]), _batch([9])]
    stats = SamplingStats()
    positions = split_window(ro, batches, "drop", K, stats)
    assert [None if p is None else p.indices for p in positions] == [[7, 8], None, [9]]
    assert (stats.groups_tried, stats.groups_kept, stats.groups_dropped, stats.groups_unused) == (3.0, 2.0, 1.0, 0.0)
    assert (stats.reward_sum_tried, stats.completions_tried) == (5.0, 6.0)
    refill = SamplingStats()
    positions = split_window(ro, [_batch([7]), _batch([9])], "refill", K, refill)  # 2 prompts: useful 7 and 9 first
    assert [p.indices for p in positions] == [[7], [9]]
    assert (refill.groups_kept, refill.groups_dropped, refill.groups_unused) == (2.0, 1.0, 0.0)


def test_sampling_stats_add_figure_by_figure():
    total = SamplingStats(generation_s=1.0, prompt_tokens=3.0) + SamplingStats(generation_s=0.5, rewards_s=2.0)
    assert (total.generation_s, total.rewards_s, total.prompt_tokens, total.groups_tried) == (1.5, 2.0, 3.0, 0.0)


def test_window_cache_states_and_the_prepare_handshake():
    cache = WindowCache()
    first, second = _batch([7]), _batch([8])
    key = (0, ((7,), (8,)))
    assert cache.state is CacheState.EMPTY and not cache.holds(key)
    cache.prepare(first, 0, 0, 2)
    cache.fill(key, [_rollout([7], [1.0, 0.0]), _rollout([8], [0.0, 1.0])], SamplingStats(resample_tries=1.0))
    assert cache.state is CacheState.SAMPLED and cache.holds(key) and not cache.holds((1, ((7,), (8,))))
    with pytest.raises(GraspError, match=r"micro-batch of dataset indices \[8\] was not prepared"):
        cache.take(second)
    assert [ro.indices for ro in cache.take(first)] == [[7], [8]]
    assert cache.state is CacheState.IN_USE
    with pytest.raises(GraspError, match="was not prepared"):
        cache.take(first)  # once per prepare
    # checkpointed between the two micro-batches: restored, then attached at the next one
    buf = io.BytesIO()
    torch.save(cache.state_dict(num_iterations=1), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert state["stats"]["resample_tries"] == 1.0 and state["window_indices"] == [[7], [8]]
    resumed = WindowCache()
    resumed.load_state_dict(state)
    assert resumed.state is CacheState.RESTORED and resumed.rollouts[1].prompt is None
    resumed.prepare(second, 1, 0, 2)
    with pytest.raises(GraspError, match="was not prepared"):
        resumed.take(second)  # restored rollouts have no prompts yet
    assert resumed.attach(None, [first, second], torch.device("cpu"), None)
    assert resumed.state is CacheState.IN_USE and resumed.rollouts[1].items[0].uid == "8"
    assert resumed.take(second)[1].prompt["input_ids"].tolist() == [[0, 1]]
    assert resumed.state_dict(num_iterations=1) == {}  # the window's last micro-batch: nothing would reuse it
    assert resumed.state_dict(num_iterations=2) != {}  # reused once more after the step
