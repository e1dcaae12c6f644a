"""Tests of grasp_lightning.grpo_math against hand-computed values and under bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo_math import (
    clip_advantages,
    group_advantages,
    grpo_loss,
    k3_kl,
    released_advantages,
    selective_log_softmax,
    zero_variance_groups,
)

# --- advantages ------------------------------------------------------------------------------------

def test_group_advantages_by_hand() -> None:
    # group 1: [1, 0, 0, 1]: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    # group 2: [2, 2, 2, 2]: flat -> exactly 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, 4, eps=0.0)
    s = 1 / math.sqrt(3)
    torch.testing.assert_close(adv, torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0]))
    # "none": centred only
    torch.testing.assert_close(group_advantages(rewards, 4, scale="none"),
                               torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    # "batch": all 8 rewards mean 1.25, var = (2*0.0625 + 2*1.5625 + 4*0.5625) / 7 = 5.5/7
    batch_std = math.sqrt(5.5 / 7)
    torch.testing.assert_close(group_advantages(rewards, 4, scale="batch", eps=0.0)[:2],
                               torch.tensor([0.5 / batch_std, -0.5 / batch_std]))


def test_equal_rewards_give_exact_zero() -> None:
    # 0.1 is not exact in binary; a naive (r - mean) could leave ~1e-8 / 1e-4 = 1e-4 behind.
    for value in (0.1, 0.3, 1.0 / 3.0, 0.0):
        rewards = torch.full((8,), value)
        for scale in ("group", "batch", "none"):
            adv = group_advantages(rewards, 8, scale=scale)
            assert torch.equal(adv, torch.zeros(8)), (value, scale)
    assert torch.equal(group_advantages(torch.tensor([0.7, 0.2]), 1), torch.zeros(2))  # K = 1


def test_zero_variance_groups() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])
    assert zero_variance_groups(rewards, 2).tolist() == [True, False, True]


def test_released_advantages_by_hand() -> None:
    # two terms, one group of 2: term0 [1, 0] -> centred [0.5, -0.5]; term1 [0.2, 0.2] -> [0, 0]
    # weights [1.0, 0.2] -> [0.5, -0.5]; second group term1 [2, 0] -> [1, -1] * 0.2
    terms = torch.tensor([[1.0, 0.2], [0.0, 0.2], [1.0, 2.0], [1.0, 0.0]])
    adv = released_advantages(terms, torch.tensor([1.0, 0.2]), 2)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.2, -0.2]))
    assert torch.equal(clip_advantages(torch.tensor([-9.0, 0.3, 7.0]), 5.0), torch.tensor([-5.0, 0.3, 5.0]))
    assert clip_advantages(adv, None) is adv


def test_advantage_bad_inputs() -> None:
    with pytest.raises(GraspConfigError):
        group_advantages(torch.zeros(4), 2, scale="rank")
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(GraspConfigError):
        clip_advantages(torch.zeros(2), 0.0)


# --- log-probs and KL ------------------------------------------------------------------------------

def test_selective_log_softmax_matches_full_log_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.bfloat16)
    ids = torch.randint(0, 11, (3, 5))
    out = selective_log_softmax(logits, ids, temperature=0.7)
    ref = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    torch.testing.assert_close(out, ref)
    # by hand: logits [0, ln 3] -> probs [1/4, 3/4]
    two = torch.tensor([[[0.0, math.log(3.0)]]])
    torch.testing.assert_close(selective_log_softmax(two, torch.tensor([[1]])), torch.tensor([[math.log(0.75)]]))


def test_k3_kl_values() -> None:
    # d = ref - logp = ln 2: 2 - ln 2 - 1 = 0.30685; d = 0 -> 0
    out = k3_kl(torch.tensor([0.0, -1.0]), torch.tensor([math.log(2.0), -1.0]))
    torch.testing.assert_close(out, torch.tensor([1 - math.log(2.0), 0.0]))
    # d = 50 is clamped to 20: e^20 - 21
    assert k3_kl(torch.tensor([-50.0]), torch.tensor([0.0])).item() == pytest.approx(math.exp(20) - 21, rel=1e-6)


# --- loss -------------------------------------------------------------------------------------------

def _inputs():
    # two sequences, lengths 2 and 1 (third token padding)
    logp = torch.tensor([[math.log(1.5), 0.0, 0.0], [math.log(0.5), 0.0, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    return logp, old, mask, adv


def test_grpo_loss_by_hand() -> None:
    logp, old, mask, adv = _inputs()
    # ratios: seq0 [1.5, 1.0], seq1 [0.5]; eps 0.2
    # seq0 A=+1: token0 min(1.5, 1.2) = 1.2 -> -1.2 (high-clipped); token1 -> -1.0
    # seq1 A=-1: min(-0.5, -0.8) = -0.8 -> +0.8 (low-clipped)
    # grpo: mean(-2.2/2, 0.8/1) = (-1.1 + 0.8)/2 = -0.15
    # bnpo / dapo: (-2.2 + 0.8) / 3 = -0.46667; dapo with 7 tokens: -1.4/7 = -0.2; dr_grpo: -1.4 / (2*4)
    expected = {"grpo": -0.15, "bnpo": -1.4 / 3, "dapo": -1.4 / 3, "dr_grpo": -1.4 / 8}
    for loss_type, value in expected.items():
        loss, metrics = grpo_loss(logp, old, None, adv, mask, loss_type=loss_type, max_completion_length=4)
        assert loss.item() == pytest.approx(value, abs=1e-6), loss_type
    loss, metrics = grpo_loss(logp, old, None, adv, mask, loss_type="dapo", num_items_in_batch=7)
    assert loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert metrics["clip_ratio"].item() == pytest.approx(2 / 3)
    assert metrics["clip_ratio_high"].item() == pytest.approx(1 / 3)
    assert metrics["ratio_mean"].item() == pytest.approx(3.0 / 3)  # (1.5 + 1 + 0.5) / 3
    assert "kl_mean" not in metrics
    # epsilon_high 0.6 lifts the clip of token0: -1.5 - 1.0 + 0.8 = -1.7 over 3 tokens
    loss, metrics = grpo_loss(logp, old, None, adv, mask, epsilon_high=0.6, loss_type="bnpo")
    assert loss.item() == pytest.approx(-1.7 / 3, abs=1e-6)
    assert metrics["clip_ratio_high"].item() == 0.0


def test_grpo_loss_kl_term() -> None:
    logp, old, mask, adv = _inputs()
    ref = logp.detach() + torch.tensor([[math.log(2.0), 0.0, 5.0], [0.0, 0.0, 0.0]])
    # k3 on the 3 real tokens: [1 - ln 2, 0, 0]; padded token ignored. bnpo: (-1.4 + 0.1*(1 - ln 2)) / 3
    loss, metrics = grpo_loss(logp, old, ref, adv, mask, beta=0.1, loss_type="bnpo")
    assert loss.item() == pytest.approx((-1.4 + 0.1 * (1 - math.log(2))) / 3, abs=1e-6)
    assert metrics["kl_mean"].item() == pytest.approx((1 - math.log(2)) / 3, abs=1e-6)
    # beta 0 with a reference: KL is logged, not added
    loss, metrics = grpo_loss(logp, old, ref, adv, mask, beta=0.0, loss_type="bnpo")
    assert loss.item() == pytest.approx(-1.4 / 3, abs=1e-6) and "kl_mean" in metrics


def test_on_policy_gradient_is_advantage() -> None:
    # old_logp None: ratio 1, d loss / d logp_t = -A / n_tokens for bnpo
    logp, _, mask, adv = _inputs()
    loss, _ = grpo_loss(logp, None, None, adv, mask, loss_type="bnpo")
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("sign", [50.0, -50.0])
def test_extreme_log_ratios_bf16_are_finite(loss_type: str, sign: float) -> None:
    old = torch.zeros(4, 6, dtype=torch.bfloat16)
    logp = (old + sign).requires_grad_(True)
    ref = old - sign
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])
    mask = torch.ones(4, 6)
    loss, metrics = grpo_loss(logp, old, ref, adv, mask, beta=0.04, loss_type=loss_type, max_completion_length=6)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad.float()).all()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_empty_mask_and_bad_config() -> None:
    logp, old, _, adv = _inputs()
    loss, metrics = grpo_loss(logp, old, None, adv, torch.zeros(2, 3), loss_type="grpo")
    assert loss.item() == 0.0 and metrics["clip_ratio"].item() == 0.0
    with pytest.raises(GraspConfigError):
        grpo_loss(logp, old, None, adv, torch.ones(2, 3), loss_type="ppo")
    with pytest.raises(GraspConfigError):
        grpo_loss(logp, old, None, adv, torch.ones(2, 3), loss_type="dr_grpo")
    with pytest.raises(GraspConfigError):
        grpo_loss(logp, old, None, adv, torch.ones(2, 3), beta=0.1)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, None, adv[:1], torch.ones(2, 3))
