"""The GRPO task (``tasks/grpo.py``): its setting checks (refusals by key), the flags the module reads, the
rewards and advantages it computes, the overlong penalty, its checkpointed state, the off-policy settings
(``loss.importance_sampling_*``, ``loss.off_policy_mask_threshold``) and GDPO (``advantage.kind:
normalize_then_sum``): the weights and metrics the task hands to the loss, and the refusals."""

from __future__ import annotations

import math
import types
from dataclasses import asdict

import pytest
import torch

from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.config import AdvantageConfig, BatchingConfig, ComputeConfig, LossConfig, RewardConfig
from grasp_lightning.grpo.rollouts import SamplingStats
from grasp_lightning.grpo.sampling import CacheState
from grasp_lightning.tasks.grpo import GRPOTask


def _overlong_task(mode: str, advantage: str = "none", clip: float | None = None) -> GRPOTask:
    task = GRPOTask(reward=RewardConfig(terms=["accuracy"], overlong_buffer=4, overlong_penalty=1.0, overlong_mode=mode),
                    advantage=AdvantageConfig(kind=advantage, clip=clip))
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
        GRPOTask(reward=RewardConfig(overlong_mode="group"))



def test_overlong_buffer_fraction_follows_the_budget():
    # 0.25 of the released 1,024-token budget is the released 256-token buffer; of demo.yaml's 32, 8 tokens
    task = GRPOTask(reward=RewardConfig(terms=["accuracy"], overlong_buffer_fraction=0.25, overlong_mode="released"))
    assert (task.overlong_buffer_tokens(1024), task.overlong_buffer_tokens(32), task.overlong_buffer_tokens(2)) == \
        (256, 8, 1)  # rounded down, at least one token
    # budget 8, fraction 0.5 -> buffer 4: the penalties of the hand-worked case above
    half = GRPOTask(reward=RewardConfig(terms=["accuracy"], overlong_buffer_fraction=0.5))
    assert half.overlong(torch.tensor([8, 8, 6, 4]), 8).tolist() == [-1.0, -1.0, -0.5, 0.0]
    assert GRPOTask(reward=RewardConfig(terms=["accuracy"])).overlong_buffer_tokens(1024) is None
    with pytest.raises(GraspConfigError, match="not both"):
        GRPOTask(reward=RewardConfig(overlong_buffer=256, overlong_buffer_fraction=0.25))
    with pytest.raises(GraspConfigError, match=r"overlong_buffer_fraction must be in \(0, 1\]"):
        GRPOTask(reward=RewardConfig(overlong_buffer_fraction=1.5))


def test_declared_flags_follow_the_settings():
    plain = GRPOTask()
    assert (plain.data_mode, plain.window_batches, plain.samples_rollouts) == ("rl", True, True)
    assert (plain.needs_reference, plain.draws_prompts, plain.shares_prompt, plain.num_iterations) == (True, False, True, 1)
    task = GRPOTask(loss=LossConfig(beta=0.0, num_iterations=2), batching=BatchingConfig(dynamic_sampling="refill"),
                    compute=ComputeConfig(share_prompt=False, logprob_chunk_size=64))
    assert (task.needs_reference, task.draws_prompts, task.shares_prompt, task.num_iterations,
            task.logprob_chunk_size) == (False, True, False, 2, 64)


def test_check_settings_refuses_by_key():
    with pytest.raises(GraspConfigError, match="model.rollout.num_generations must be >= 2"):
        GRPOTask().check_settings(RolloutConfig(num_generations=1))
    over = GRPOTask(reward=RewardConfig(overlong_buffer=64))
    with pytest.raises(GraspConfigError, match="reward.overlong_buffer=64 must be in 1 … model.rollout.max_new_tokens=32"):
        over.check_settings(RolloutConfig(num_generations=2, max_new_tokens=32))
    over.check_settings(RolloutConfig(num_generations=2, max_new_tokens=64))  # the buffer fits the budget exactly


def test_a_flat_setting_in_place_of_a_group_is_refused_naming_its_keys():
    with pytest.raises(GraspConfigError, match=r"model.task.init_args.advantage is a setting group \(kind, "):
        GRPOTask(advantage="group")


def test_two_reward_terms_with_one_metric_name_are_refused():
    with pytest.raises(GraspConfigError, match="two terms share a metric name"):
        GRPOTask(reward=RewardConfig(terms=["accuracy", "accuracy"], weights=[1.0, 1.0]))


def test_weighted_rewards_and_group_advantages_by_hand():
    """K = 2, terms (accuracy, format) weighted 1.0 and 0.1: rewards [1.1, 0.1 | 0.1, 0.1]; group 1 centred
    ±0.5 over its unbiased std sqrt(0.5) (+1e-4); group 2's equal rewards give exactly 0."""
    task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format"], weights=[1.0, 0.1]))
    terms = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    rewards, adv = task.advantages(terms, k=2)
    torch.testing.assert_close(rewards, torch.tensor([1.1, 0.1, 0.1, 0.1]))
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, -a, 0.0, 0.0]))
    _, clipped = GRPOTask(reward=RewardConfig(terms=["accuracy", "format"], weights=[1.0, 0.1]),
                          advantage=AdvantageConfig(clip=0.5)).advantages(terms, k=2)
    torch.testing.assert_close(clipped, torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_a_fresh_task_checkpoints_no_window_and_an_empty_state_restores_nothing():
    task = GRPOTask()
    state = task.state_dict()
    assert "window_index" not in state and "rollouts" not in state
    task.load_state_dict({})
    assert task.state_dict() == state
    assert task.cache.state is CacheState.EMPTY and not task.cache.done_at(1)  # nothing prepared yet


def test_a_saved_window_is_restored_and_saved_again_unchanged():
    """A state holding a window without rollouts (every micro-batch's entry None): load, then save, gives it back."""
    task = GRPOTask()
    state = {**task.state_dict(), "window_index": 3, "window_indices": [[4, 5], [6, 7]], "window_tokens": 17.0,
             "stats": {"generation_s": 1.5}, "rollouts": [None, None]}
    restored = GRPOTask()
    restored.load_state_dict(state)
    again = restored.state_dict()
    assert (again["window_index"], again["window_indices"], again["window_tokens"], again["stats"], again["rollouts"]) == \
        (3, [[4, 5], [6, 7]], 17.0, asdict(SamplingStats(generation_s=1.5)), [None, None])


def test_completion_of_lists_the_rollout_micro_batches_prompt_major():
    """A window of 2 micro-batches of prompts, K = 3: the 6 micro-batches train completions 0, 1, 2 of micro-batch
    0, then of micro-batch 1."""
    order = [GRPOTask.completion_of(position, iteration, 2, 3) for iteration in range(3) for position in range(2)]
    assert order == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


# --- the off-policy settings and GDPO ---------------------------------------------------------------
MASK = torch.tensor([[True, True, False], [True, False, False]])
LOGP = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
SAMPLED = torch.tensor([[-1.5, -1.0, 0.0], [-1.5, 0.0, 0.0]])  # gaps +0.5, -1.0 | +1.0


def test_sequence_mask_weights_and_their_metrics() -> None:
    ro = types.SimpleNamespace(sampled_logp=SAMPLED, old_logp=None)
    task = GRPOTask(loss=LossConfig(importance_sampling_mode="sequence_mask", importance_sampling_cap=2.0))
    out = task._sampler_correction(LOGP, ro, MASK)
    # sequence sums: -0.5 -> e^-0.5 kept; +1.0 -> e = 2.718 > 2 masked
    torch.testing.assert_close(out["weights"], torch.tensor([[math.exp(-0.5)], [0.0]]))
    assert float(out["sampling/importance_weight/mean"]) == pytest.approx(math.exp(-0.5) / 2)
    assert float(out["sampling/importance_weight/min"]) == 0.0
    assert float(out["sampling/importance_masked_sequences"]) == 1
    token = GRPOTask(loss=LossConfig(importance_sampling_mode="token_mask", importance_sampling_floor=0.5,
                                     importance_sampling_cap=2.0))._sampler_correction(LOGP, ro, MASK)
    torch.testing.assert_close(token["weights"][:, :2], torch.tensor([[math.exp(0.5), 0.0], [0.0, 1.0]]))
    assert float(token["sampling/importance_masked_tokens"]) == 2  # e^-1 < 0.5 and e^1 > 2


def test_off_policy_mask_drops_negative_advantage_sequences_far_from_the_sampler() -> None:
    ro = types.SimpleNamespace(sampled_logp=SAMPLED, old_logp=None, advantages=torch.tensor([-1.0, -1.0]))
    task = GRPOTask(loss=LossConfig(off_policy_mask_threshold=0.4))
    metrics: dict = {}
    keep = task._off_policy_mask(LOGP, ro, MASK, metrics)
    # mean KL (sampler - policy): row 0 (-0.5 + 1.0) / 2 = 0.25 kept; row 1 -1.0 kept (both <= 0.4)
    assert keep.tolist() == [[1.0], [1.0]]
    ro.sampled_logp = torch.tensor([[0.0, -1.0, 0.0], [-0.5, 0.0, 0.0]])  # row 0 KL 1.0: dropped
    keep = task._off_policy_mask(LOGP, ro, MASK, metrics)
    assert keep.tolist() == [[0.0], [1.0]]
    assert float(metrics["off_policy/masked_fraction"]) == 0.5 and float(metrics["off_policy/masked_sequences"]) == 1
    assert GRPOTask()._off_policy_mask(LOGP, ro, MASK, metrics) is None


def test_off_policy_settings_are_refused_where_they_have_nothing_to_act_on() -> None:
    hf = RolloutConfig(num_generations=2)
    with pytest.raises(GraspConfigError, match=r"loss.importance_sampling_cap / importance_sampling_floor correct for "
                                               r"the sampler's own log-probs, which only model.rollout.engine=vllm"):
        GRPOTask(loss=LossConfig(importance_sampling_cap=2.0)).check_settings(hf)
    with pytest.raises(GraspConfigError, match=r"loss.off_policy_mask_threshold masks sequences sampled off-policy"):
        GRPOTask(loss=LossConfig(off_policy_mask_threshold=0.5)).check_settings(hf)
    GRPOTask(loss=LossConfig(off_policy_mask_threshold=0.5, num_iterations=2)).check_settings(hf)  # reuse: off-policy
    with pytest.raises(GraspConfigError, match=r"loss.importance_sampling_mode='sequence_mask' has no bound"):
        LossConfig(importance_sampling_mode="sequence_mask")
    with pytest.raises(GraspConfigError, match=r"loss.importance_sampling_mode must be one of"):
        LossConfig(importance_sampling_mode="sequence", importance_sampling_cap=2.0)
    with pytest.raises(GraspConfigError, match=r"loss.importance_sampling_floor must be in \(0, 1\] or null, got 2"):
        LossConfig(importance_sampling_floor=2)
    with pytest.raises(GraspConfigError, match=r"loss.off_policy_mask_threshold must be a number > 0 or null"):
        LossConfig(off_policy_mask_threshold=0)
    with pytest.raises(GraspConfigError, match=r"loss.kl_bias_correction acts on the KL"):
        LossConfig(beta=0.0, kl_bias_correction=True)
    overlap = GRPOTask(loss=LossConfig(importance_sampling_floor=0.5))
    overlap.check_settings(RolloutConfig(num_generations=2, engine="vllm", overlap=1))
    assert overlap.loss.importance_sampling_cap is None  # a floor alone is a correction: no default cap added


def test_normalize_then_sum_advantages_of_the_task() -> None:
    terms = torch.tensor([[1.0, 0.2], [0.0, 0.0], [1.0, 0.5], [1.0, 0.1]])
    penalty = torch.tensor([0.0, -0.5, 0.0, 0.0])
    task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format"], weights=[1.0, 0.5], overlong_buffer=4),
                    advantage=AdvantageConfig(kind="normalize_then_sum"))
    rewards, adv = task.advantages(terms, penalty, k=2)
    torch.testing.assert_close(rewards, terms @ torch.tensor([1.0, 0.5]) + penalty)  # logged as TRL logs it
    expected = objective.normalize_then_sum(torch.cat([terms, penalty[:, None]], 1), torch.tensor([1.0, 0.5, 1.0]), 2)
    torch.testing.assert_close(adv, expected)
    moments = task.gdpo_moments(types.SimpleNamespace(terms=terms, penalty=penalty), 2)
    torch.testing.assert_close(task.advantages(terms, penalty, moments, k=2)[1], expected)


def test_the_overlay_docs_training_shows_builds() -> None:
    import yaml

    from tests.helpers import REPO

    text = (REPO / "docs/training.md").read_text()
    section = text[text.index("### Off-policy corrections and the reference update"):]
    block = section[section.index("```yaml") + 7:section.index("```", section.index("```yaml") + 7)]
    overlay = yaml.safe_load(block)["model"]
    assert overlay["rollout"] == {"engine": "vllm"}
    groups = overlay["task"]["init_args"]
    task = GRPOTask(advantage=AdvantageConfig(**groups["advantage"]), loss=LossConfig(**groups["loss"]))
    task.check_settings(RolloutConfig(num_generations=2, engine="vllm"))
    assert task.loss.sampler_correction and [type(c).__name__ for c in task.callbacks()] == ["ReferenceSync"]


def test_sequence_parallel_refuses_background_sampling_and_refills_by_key():
    from grasp_lightning.module import GraspModule

    task = GRPOTask()
    task.check_sequence_parallel(1, RolloutConfig(engine="vllm", overlap=1))  # no split: nothing refused
    task.check_sequence_parallel(2, RolloutConfig())
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 2 with model.rollout.overlap: 1 is refused"):
        GraspModule(task=GRPOTask(), rollout=RolloutConfig(engine="vllm", overlap=1), sequence_parallel=2)
    refill = GRPOTask(batching=BatchingConfig(dynamic_sampling="refill"))
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel: 4 with model.task.init_args.batching.dynamic_sampling: refill is refused"):
        refill.check_sequence_parallel(4, RolloutConfig())
    with pytest.raises(GraspConfigError, match=r"model.sequence_parallel must be an integer >= 1"):
        GraspModule(task=GRPOTask(), sequence_parallel=0)
    assert GraspModule(task=GRPOTask(), sequence_parallel=2).hparams["sequence_parallel"] == 2
