"""``GRPOTask``'s off-policy settings (``loss.importance_sampling_*``, ``loss.off_policy_mask_threshold``) and GDPO
(``advantage.kind: normalize_then_sum``): the weights and metrics the task hands to the loss, and the refusals."""

from __future__ import annotations

import math
import types

import pytest
import torch

from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.tasks.grpo import AdvantageConfig, GRPOTask, LossConfig, RewardConfig

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
    weights = task._off_policy_mask(LOGP, ro, MASK, torch.full((2, 1), 0.5), metrics)
    # mean KL (sampler - policy): row 0 (-0.5 + 1.0) / 2 = 0.25 kept; row 1 -1.0 kept (both <= 0.4)
    assert weights.tolist() == [[0.5], [0.5]]
    ro.sampled_logp = torch.tensor([[0.0, -1.0, 0.0], [-0.5, 0.0, 0.0]])  # row 0 KL 1.0: dropped
    weights = task._off_policy_mask(LOGP, ro, MASK, None, metrics)
    assert weights.tolist() == [[0.0], [1.0]]
    assert float(metrics["off_policy/masked_fraction"]) == 0.5 and float(metrics["off_policy/masked_sequences"]) == 1
    assert GRPOTask()._off_policy_mask(LOGP, ro, MASK, None, metrics) is None


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
