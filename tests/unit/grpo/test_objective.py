"""Tests of grasp_lightning.grpo.objective against hand-computed values, under bad inputs, and against TRL.

The objective family (every ``loss_type``, the sequence-level ratio, ``delta``, the sampler weights, the
high-entropy mask, the entropy bonus, fixed and adaptive) is compared with TRL's ``_compute_loss`` on log-probs
and entropies that both sides take from the same logits, so the gradients compared are the logits' (through
the entropy too).

Parity with TRL 1.16's own GRPO code on identical tensors: the loss comes from TRL's real
``GRPOTrainer._compute_loss``, called on an instance built with ``object.__new__`` (no model, no datasets) whose ``_get_per_token_logps_and_entropies`` is replaced
to return our log-prob tensor. TRL computes advantages inline in ``_generate_and_score_completions``
(not a separable function), so the test reproduces that block (``sum_then_normalize`` branch) with
TRL's own ``nanstd`` helper and compares.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

try:  # TRL 1.16 (setup.cfg [test]); without it only the parity tests skip
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import entropy_from_logits as trl_entropy_from_logits
    from trl.trainer.utils import nanstd
    from trl.trainer.utils import selective_log_softmax as trl_selective_log_softmax
except ImportError:
    GRPOTrainer = None

from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.config import LossConfig
from grasp_lightning.grpo.objective import (
    EntropyControl,
    adapt_entropy_coef,
    clip_advantages,
    group_advantages,
    grpo_loss,
    high_entropy_mask,
    importance_weighted_kl,
    k3_kl,
    normalize_then_sum,
    off_policy_mask,
    released_advantages,
    reward_moments,
    sampler_importance_weights,
    selective_log_softmax,
    std_from_moments,
    term_normalised_sum,
    zero_variance_groups,
)
from grasp_lightning.grpo.scoring import logps_and_entropy
from grasp_lightning.task import CrossRank

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


# --- parity with TRL 1.16 --------------------------------------------------------------------------
needs_trl = pytest.mark.skipif(GRPOTrainer is None, reason="trl is not installed (setup.cfg [test])")
K, G, L, MAX_LEN = 4, 3, 7, 7
TOL = dict(rtol=1e-5, atol=1e-5)


def trl_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """TRL 1.16 ``_generate_and_score_completions`` advantage block, one reward function, one process."""
    mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    if scale_rewards in ("group", "none"):
        std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
    else:
        std = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean
    if scale_rewards != "none":
        advantages = advantages / (std + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


#: TRL 1.16 GRPOConfig's defaults of the options the trainer stand-in reads from ``args``.
TRL_ARGS = dict(use_bias_correction_kl=False, delta=None, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0, entropy_target=0.2,
                entropy_coef_min=0.0, entropy_coef_max=1.0, entropy_coef_delta=0.005)


def make_trainer(loss_type: str, beta: float, logp: torch.Tensor, grad_accum: int = 1,
                 steps_per_generation: int = 1, epsilon_high: float = 0.28, entropies: torch.Tensor | None = None,
                 importance_sampling_level: str = "token", top_entropy_quantile: float = 1.0,
                 entropy_coef: float = 0.0, use_adaptive_entropy: bool = False, is_ratio: bool = False,
                 **args) -> GRPOTrainer:
    """A GRPOTrainer with only the attributes ``_compute_loss`` reads (one process, no extras beyond the
    options given; ``args``: GRPOConfig fields of :data:`TRL_ARGS`; ``is_ratio``: vLLM's importance sampling
    correction on, the ratio from the inputs)."""
    trainer = object.__new__(GRPOTrainer)
    trainer.__dict__.update(
        model=SimpleNamespace(training=True), loss_type=loss_type, beta=beta, epsilon_low=0.2,
        epsilon_high=epsilon_high, temperature=1.0, importance_sampling_level=importance_sampling_level,
        off_policy_mask_threshold=None, top_entropy_quantile=top_entropy_quantile, use_vllm=is_ratio,
        vllm_importance_sampling_correction=is_ratio, max_completion_length=MAX_LEN,
        current_gradient_accumulation_steps=grad_accum, aux_loss_enabled=False,
        entropy_coef=entropy_coef, use_adaptive_entropy=use_adaptive_entropy,
        _entropy_bonus_enabled=entropy_coef != 0.0 or use_adaptive_entropy, _last_world_entropy=float("inf"),
        _entropy_window_stats=None,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(**{**TRL_ARGS, **args}, steps_per_generation=steps_per_generation),
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda t, reduction="sum": t, gather=lambda t: t,
                                    pad_across_processes=lambda t, dim=0, pad_index=0: t, sync_gradients=True),
    )
    ent = torch.zeros_like(logp) if entropies is None else entropies
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    return trainer


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    """Random rollouts: G groups of K, varied completion lengths, one group with equal rewards."""
    gen = torch.Generator().manual_seed(1234)
    n = G * K
    old = -torch.rand(n, L, generator=gen) * 3
    logp = old + 0.4 * torch.randn(n, L, generator=gen)  # ratios spread across both clip edges
    ref = old + 0.5 * torch.randn(n, L, generator=gen)
    lengths = torch.tensor([7, 1, 4, 6, 2, 7, 3, 5, 7, 7, 1, 2])
    mask = (torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)).int()
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.25, 0.3, 0.3, 0.3, 0.3, 0.0, 2.0, 1.2, 0.7])
    return dict(old=old, logp=logp, ref=ref, mask=mask, rewards=rewards)


@needs_trl
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_match_trl(batch: dict[str, torch.Tensor], scale: str) -> None:
    ours = group_advantages(batch["rewards"], K, scale=scale)
    theirs = trl_advantages(batch["rewards"], K, scale)
    torch.testing.assert_close(ours, theirs, **TOL)
    assert torch.equal(ours[K:2 * K], torch.zeros(K))  # the equal-reward group


def _trl_loss(batch: dict[str, torch.Tensor], advantages: torch.Tensor, loss_type: str, beta: float,
              **kwargs: int) -> tuple[torch.Tensor, dict[str, list[float]], torch.Tensor]:
    logp = batch["logp"].clone().requires_grad_(True)
    trainer = make_trainer(loss_type, beta, logp, **kwargs)
    inputs = {
        "prompt_ids": torch.zeros(logp.shape[0], 2, dtype=torch.long),
        "prompt_mask": torch.ones(logp.shape[0], 2, dtype=torch.long),
        "completion_ids": torch.zeros(logp.shape, dtype=torch.long), "completion_mask": batch["mask"],
        "advantages": advantages, "old_per_token_logps": batch["old"], "ref_per_token_logps": batch["ref"],
        "num_items_in_batch": batch["mask"].sum(),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), trainer._metrics["train"], logp.grad


@needs_trl
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_and_grad_match_trl(batch: dict[str, torch.Tensor], loss_type: str, beta: float) -> None:
    advantages = group_advantages(batch["rewards"], K)
    torch.testing.assert_close(advantages, trl_advantages(batch["rewards"], K, "group"), **TOL)
    trl_loss, trl_metrics, trl_grad = _trl_loss(batch, advantages, loss_type, beta)

    logp = batch["logp"].clone().requires_grad_(True)
    loss, metrics = grpo_loss(
        logp, batch["old"], batch["ref"], advantages, batch["mask"], epsilon=0.2, epsilon_high=0.28, beta=beta,
        loss_type=loss_type, max_completion_length=MAX_LEN, num_items_in_batch=float(batch["mask"].sum()),
    )
    loss.backward()
    torch.testing.assert_close(loss.detach(), trl_loss, **TOL)
    torch.testing.assert_close(logp.grad, trl_grad, **TOL)
    assert metrics["clip_ratio"].item() == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert metrics["clip_ratio_low"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=1e-6)
    assert 0.0 < metrics["clip_ratio"].item() < 1.0  # the data really exercises the clip
    if beta:
        assert metrics["kl_mean"].item() == pytest.approx(trl_metrics["kl"][0], abs=1e-6)


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_trl_divides_by_accumulation_steps(batch: dict[str, torch.Tensor], loss_type: str) -> None:
    # TRL returns loss_mb / A for these types; ours is loss_mb (Lightning divides by A itself).
    advantages = group_advantages(batch["rewards"], K)
    trl_loss, _, _ = _trl_loss(batch, advantages, loss_type, 0.04, grad_accum=4, steps_per_generation=4)
    loss, _ = grpo_loss(batch["logp"], batch["old"], batch["ref"], advantages, batch["mask"], epsilon_high=0.28,
                        beta=0.04, loss_type=loss_type, max_completion_length=MAX_LEN)
    torch.testing.assert_close(loss / 4, trl_loss, **TOL)


@needs_trl
@pytest.mark.parametrize("grad_accum, steps_per_generation", [(4, 4), (4, 2)])
def test_dapo_normaliser_under_accumulation(batch: dict[str, torch.Tensor], grad_accum: int,
                                            steps_per_generation: int) -> None:
    # TRL's dapo divides by num_items_in_batch * A / S (one process) and never by A again.
    advantages = group_advantages(batch["rewards"], K)
    trl_loss, _, _ = _trl_loss(batch, advantages, "dapo", 0.0, grad_accum=grad_accum,
                               steps_per_generation=steps_per_generation)
    tokens = float(batch["mask"].sum())
    loss, _ = grpo_loss(batch["logp"], batch["old"], None, advantages, batch["mask"], epsilon_high=0.28,
                        loss_type="dapo", num_items_in_batch=tokens * grad_accum / steps_per_generation)
    torch.testing.assert_close(loss, trl_loss, **TOL)


@needs_trl
def test_selective_log_softmax_matches_trl() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 5, 13, generator=gen)
    ids = torch.randint(0, 13, (3, 5), generator=gen)
    torch.testing.assert_close(selective_log_softmax(logits, ids, temperature=0.8),
                               trl_selective_log_softmax(logits, ids, temperature=0.8), **TOL)


def test_kl_clamp_is_the_released_clamp_and_off_by_default() -> None:
    # d = ref - logp: 3 -> e^3 - 3 - 1 = 16.0855; -20 -> e^-20 + 19 = 19.0; 0.5 -> e^0.5 - 1.5 = 0.1487
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[3.0, -20.0, 0.5]])
    assert k3_kl(logp, ref).tolist()[0] == pytest.approx([math.exp(3) - 4, math.exp(-20) + 19, math.exp(0.5) - 1.5])
    # released (socialmllm/train/reasoning/trainer.py:196): clamped to +-10, zero gradient beyond
    assert k3_kl(logp, ref, 10.0).tolist()[0] == pytest.approx([10.0, 10.0, math.exp(0.5) - 1.5])
    mask, adv = torch.ones(1, 3), torch.zeros(1)
    ours, m = grpo_loss(logp, None, ref, adv, mask, beta=0.05, loss_type="grpo")
    clamped, mc = grpo_loss(logp, None, ref, adv, mask, beta=0.05, loss_type="grpo", kl_clamp=10.0)
    assert float(m["kl_mean"]) == pytest.approx((math.exp(3) - 4 + math.exp(-20) + 19 + math.exp(0.5) - 1.5) / 3)
    assert float(mc["kl_mean"]) == pytest.approx((20 + math.exp(0.5) - 1.5) / 3)
    assert float(clamped) == pytest.approx(0.05 * float(mc["kl_mean"]))
    clamped.backward()
    # d/dlogp of exp(d) - d - 1 is 1 - exp(d): only the unclamped token has a gradient
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, 0.05 / 3 * (1 - math.exp(0.5))])


# --- the objective family against TRL 1.16 ---------------------------------------------------------
V = 11


@pytest.fixture(scope="module")
def family_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Logits ``(N, L, V)`` whose log-probs are about ``batch``'s old log-probs ± 0.4 (ratios on both clip edges),
    entropies of varied size (logits scaled per row), the sampler's importance weights (1 on padding, as TRL's)."""
    gen = torch.Generator().manual_seed(99)
    n = G * K
    scale = torch.linspace(0.3, 3.0, n)[:, None, None]
    logits = torch.randn(n, L, V, generator=gen) * scale
    ids = torch.randint(0, V, (n, L), generator=gen)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[..., None])[..., 0]
    old = logp + 0.4 * torch.randn(n, L, generator=gen)
    ref = logp + 0.5 * torch.randn(n, L, generator=gen)
    weights = torch.exp(0.3 * torch.randn(n, L, generator=gen)).clamp(max=2.0)
    weights = torch.where(batch["mask"].bool(), weights, torch.ones_like(weights))
    return dict(logits=logits, ids=ids, old=old, ref=ref, mask=batch["mask"], rewards=batch["rewards"],
                weights=weights)


def _trl_family(data: dict, loss_type: str, beta: float, is_ratio: bool = False, grad_accum: int = 1,
                trainer: GRPOTrainer | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor, dict, GRPOTrainer]:
    """TRL's ``_compute_loss`` on log-probs and entropies of ``data["logits"]`` (TRL's own functions)."""
    logits = data["logits"].clone().requires_grad_(True)
    logp = trl_selective_log_softmax(logits, data["ids"])
    ent = trl_entropy_from_logits(logits)
    if trainer is None:
        trainer = make_trainer(loss_type, beta, logp, entropies=ent, is_ratio=is_ratio, grad_accum=grad_accum,
                               steps_per_generation=grad_accum, **kwargs)
    else:
        trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, ent, None)
    n = logp.shape[0]
    inputs = {"prompt_ids": torch.zeros(n, 2, dtype=torch.long), "prompt_mask": torch.ones(n, 2, dtype=torch.long),
              "completion_ids": data["ids"], "completion_mask": data["mask"],
              "advantages": group_advantages(data["rewards"], K), "old_per_token_logps": data["old"],
              "ref_per_token_logps": data["ref"], "num_items_in_batch": data["mask"].sum() * grad_accum,
              "importance_sampling_ratio": data["weights"] if is_ratio else None}
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), logits.grad, trainer._metrics["train"], trainer


def _our_family(data: dict, loss_type: str, beta: float, is_ratio: bool = False, epsilon_high: float = 0.28,
                **kwargs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Our :func:`grpo_loss` on the log-probs and entropies of ``data["logits"]`` (our scoring function)."""
    logits = data["logits"].clone().requires_grad_(True)
    logp, ent = logps_and_entropy(logits, data["ids"], 1.0, entropy_grad=True)
    loss, metrics = grpo_loss(logp, data["old"], data["ref"], group_advantages(data["rewards"], K), data["mask"],
                              epsilon=0.2, epsilon_high=epsilon_high, beta=beta, loss_type=loss_type,
                              max_completion_length=MAX_LEN, num_items_in_batch=float(data["mask"].sum()),
                              token_weights=data["weights"] if is_ratio else None, entropies=ent, **kwargs)
    loss.backward()
    return loss.detach(), logits.grad, metrics


def _assert_same(ours: tuple, theirs: tuple) -> None:
    torch.testing.assert_close(ours[0], theirs[0], **TOL)
    scale = float(theirs[1].abs().max())
    assert scale > 0, "zero gradient: nothing compared"
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-5, atol=1e-5 * scale)


FAMILY = [(t, "token") for t in ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")] + [
    (t, "sequence") for t in ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo")]


@needs_trl
@pytest.mark.parametrize("loss_type, level", FAMILY)
def test_each_objective_matches_trl(family_batch: dict, loss_type: str, level: str) -> None:
    """Loss and logits gradient of every loss type at both ratio levels, with the KL term (cispo's cap 1.3)."""
    eps_high = 1.3 if loss_type == "cispo" else 0.28
    theirs = _trl_family(family_batch, loss_type, 0.04, importance_sampling_level=level, epsilon_high=eps_high)
    ours = _our_family(family_batch, loss_type, 0.04, ratio_level=level, epsilon_high=eps_high)
    _assert_same(ours, theirs)
    trl_metrics, metrics = theirs[2], ours[2]
    if level == "token" and loss_type in ("grpo", "bnpo", "dapo", "dr_grpo", "luspo"):
        assert metrics["clip_ratio_low"].item() == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=1e-6)
        assert metrics["clip_ratio_high"].item() == pytest.approx(trl_metrics["clip_ratio/high_mean"][0], abs=1e-6)
        assert 0.0 < metrics["clip_ratio"].item() < 1.0
    if loss_type == "cispo":
        assert metrics["clip_ratio_high"].item() == pytest.approx(trl_metrics["cispo_clip_ratio"][0], abs=1e-6)
        assert level == "sequence" or metrics["clip_ratio_high"].item() > 0.0  # the cap really acts
    if loss_type in ("sapo", "vespo"):
        assert "clip_ratio" not in metrics
    if loss_type == "vespo":  # TRL: mean over sequences; ours: over loss tokens (each sequence per token)
        assert 0.0 < metrics["vespo_weight_mean"].item()


def test_sequence_ratio_by_hand() -> None:
    # GSPO: one ratio per sequence, exp(mean of the token log-ratios). seq0 log-ratios [ln 1.5, 0] -> sqrt(1.5) = 1.2247,
    # A = +1, clipped at 1.2; seq1 [ln 0.5] -> 0.5, A = -1, clipped at 0.8 -> +0.8. grpo: mean(-1.2, 0.8) = -0.2
    logp, old, mask, adv = _inputs()
    loss, metrics = grpo_loss(logp, old, None, adv, mask, loss_type="grpo", ratio_level="sequence")
    assert loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert metrics["clip_ratio"].item() == pytest.approx(1.0)  # both sequences clipped: every loss token
    assert metrics["ratio_mean"].item() == pytest.approx((2 * math.sqrt(1.5) + 0.5) / 3, abs=1e-6)
    loss.backward()
    assert logp.grad.abs().sum().item() == 0.0  # both clipped: no gradient
    # luspo: the sequence's sum, not mean: seq0 -1.2 * 2 tokens, seq1 0.8 * 1 -> (-2.4 + 0.8) / 2 = -0.8
    logp, old, mask, adv = _inputs()
    loss, _ = grpo_loss(logp, old, None, adv, mask, loss_type="luspo", ratio_level="sequence")
    assert loss.item() == pytest.approx(-0.8, abs=1e-6)


@needs_trl
@pytest.mark.parametrize("loss_type, level, delta", [("grpo", "token", 1.5), ("dapo", "token", 1.5),
                                                      ("luspo", "sequence", 1.05)])
def test_delta_two_sided_clip_matches_trl(family_batch: dict, loss_type: str, level: str, delta: float) -> None:
    # sequence ratios (means of the token log-ratios) stay near 1: a delta closer to 1 reaches them
    theirs = _trl_family(family_batch, loss_type, 0.0, importance_sampling_level=level, delta=delta)
    ours = _our_family(family_batch, loss_type, 0.0, ratio_level=level, delta=delta)
    _assert_same(ours, theirs)
    plain = _our_family(family_batch, loss_type, 0.0, ratio_level=level)
    assert abs(float(plain[0]) - float(ours[0])) > 1e-4  # delta really acts on this data
    if level == "token":
        assert ours[2]["clip_ratio_delta"].item() > 0.0


def test_delta_by_hand() -> None:
    # A = -1, ratio 3: -min(3 * -1, 1.2 * -1) = 3; with delta 2: -min(2 * -1, -1.2) = 2 (gradient 0 beyond delta)
    logp = torch.tensor([[math.log(3.0)]], requires_grad=True)
    args = (logp, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1))
    assert grpo_loss(*args, loss_type="bnpo")[0].item() == pytest.approx(3.0)
    loss, metrics = grpo_loss(*args, loss_type="bnpo", delta=2.0)
    assert loss.item() == pytest.approx(2.0) and metrics["clip_ratio_delta"].item() == 1.0
    loss.backward()
    assert logp.grad.item() == 0.0


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "vespo"])
def test_sampler_weights_match_trl(family_batch: dict, loss_type: str) -> None:
    """The sampler's importance weights: a factor of each token's policy term; vespo folds them into its weight."""
    _assert_same(_our_family(family_batch, loss_type, 0.04, is_ratio=True),
                 _trl_family(family_batch, loss_type, 0.04, is_ratio=True))


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "sapo"])
@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_high_entropy_mask_matches_trl(family_batch: dict, loss_type: str, quantile: float) -> None:
    _assert_same(_our_family(family_batch, loss_type, 0.04, top_entropy_quantile=quantile),
                 _trl_family(family_batch, loss_type, 0.04, top_entropy_quantile=quantile))


@needs_trl
def test_high_entropy_mask_is_trls() -> None:
    gen = torch.Generator().manual_seed(3)
    entropies = torch.rand(5, 6, generator=gen) * 4
    mask = (torch.arange(6)[None] < torch.tensor([6, 2, 0, 5, 3])[:, None]).int()
    trainer = make_trainer("grpo", 0.0, torch.zeros(5, 6))
    for quantile in (0.0, 0.2, 0.5, 1.0):
        ours = high_entropy_mask(entropies, mask, quantile)
        assert torch.equal(ours, GRPOTrainer.get_high_entropy_mask(trainer, entropies, mask, 1 - quantile))
    # 16 loss tokens, top 25%: 4 of them (no ties), never padding
    kept = high_entropy_mask(entropies, mask, 0.25)
    assert int(kept.sum()) == 4 and not bool((kept & ~mask.bool()).any())
    assert not bool(high_entropy_mask(entropies, torch.zeros_like(mask), 0.5).any())
    with pytest.raises(GraspConfigError, match="top_entropy_quantile"):
        high_entropy_mask(entropies, mask, 1.5)


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "cispo", "luspo"])
@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_entropy_bonus_matches_trl(family_batch: dict, loss_type: str, quantile: float) -> None:
    """loss - coef * mean entropy of the (kept) loss tokens; the gradient flows through the entropy."""
    eps_high = 1.3 if loss_type == "cispo" else 0.28
    theirs = _trl_family(family_batch, loss_type, 0.0, entropy_coef=0.05, top_entropy_quantile=quantile,
                         epsilon_high=eps_high)
    ours = _our_family(family_batch, loss_type, 0.0, entropy_coef=0.05, top_entropy_quantile=quantile,
                       epsilon_high=eps_high)
    _assert_same(ours, theirs)
    without = _our_family(family_batch, loss_type, 0.0, top_entropy_quantile=quantile, epsilon_high=eps_high)
    assert float(without[0] - ours[0]) == pytest.approx(0.05 * float(ours[2]["entropy_effective"]), rel=1e-5)


@needs_trl
def test_adaptive_entropy_coefficient_follows_trl_over_steps(family_batch: dict) -> None:
    """Three optimizer steps of two micro-batches each (grpo, A = 2): every micro-batch's loss equals TRL's
    (times A: Lightning divides by A), and the coefficient after each step is TRL's; the controller's state
    survives a checkpoint in the middle."""
    a, target = 2, 1.2
    settings = dict(entropy_coef=0.1, adaptive_entropy=True, entropy_coef_delta=0.05, entropy_target=target,
                    entropy_coef_min=0.02, entropy_coef_max=0.2)
    cfg = LossConfig(**settings)
    control = EntropyControl(cfg)
    ctx = SimpleNamespace(cross_rank=CrossRank(), device=torch.device("cpu"))
    trainer = make_trainer("grpo", 0.0, torch.zeros(1, 1), grad_accum=a, steps_per_generation=a,
                           use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05, entropy_target=target,
                           entropy_coef_min=0.02, entropy_coef_max=0.2)
    scales = [1.0, 0.2, 3.0, 3.0, 0.1, 0.1]  # logits sharper/flatter: steps below and above the target entropy
    coefs, applied = [], []
    for i, scale in enumerate(scales):
        data = {**family_batch, "logits": family_batch["logits"] * scale}
        if i % a == 0:
            control.step(ctx)
            if i == 2 * a:  # resume from a checkpoint taken at the end of the second step
                state = control.state_dict()
                control = EntropyControl(cfg)
                control.load_state_dict(state)
        trainer.accelerator.sync_gradients = i % a == a - 1  # TRL's optimizer-step boundary
        theirs = _trl_family(data, "grpo", 0.0, grad_accum=a, trainer=trainer)
        logits = data["logits"].clone().requires_grad_(True)
        logp, ent = logps_and_entropy(logits, data["ids"], 1.0, entropy_grad=True)
        loss, metrics = grpo_loss(logp, data["old"], data["ref"], group_advantages(data["rewards"], K), data["mask"],
                                  epsilon_high=0.28, loss_type="grpo", **control.loss_kwargs(ent))
        (loss / a).backward()
        recorded = control.record(metrics, data["mask"])
        applied.append(recorded["entropy/coef_applied"])
        torch.testing.assert_close(loss.detach() / a, theirs[0], **TOL)
        torch.testing.assert_close(logits.grad, theirs[1], rtol=1e-5, atol=1e-6)
        if i % a == a - 1:
            coefs.append(trainer.entropy_coef)
    control.step(ctx)
    assert applied[:2] == [0.0, 0.0]  # no step measured yet: the bonus is off (TRL: last entropy = inf)
    assert control.coef == pytest.approx(coefs[-1])
    assert control.last_entropy == pytest.approx(trainer._last_world_entropy, rel=1e-6)
    assert len(set(coefs)) > 1 and any(c > 0 for c in applied)  # it moved, and the bonus acted


def test_adapt_entropy_coef_rule() -> None:
    rule = dict(target=0.5, delta=0.1, low=0.0, high=0.25)
    assert adapt_entropy_coef(0.2, 0.5, **rule) == pytest.approx(0.25)  # at the target: up, capped
    assert adapt_entropy_coef(0.05, 0.9, **rule) == 0.0  # above: down, floored
    assert adapt_entropy_coef(0.1, 0.1, **rule) == pytest.approx(0.2)


def test_entropy_control_fixed_and_off() -> None:
    off = EntropyControl(LossConfig())
    assert not off.enabled and off.loss_kwargs(torch.zeros(1, 1)) == {} and off.state_dict() == {}
    fixed = EntropyControl(LossConfig(entropy_coef=0.01))
    assert fixed.enabled and fixed.applied == 0.01 and fixed.state_dict() == {}
    assert fixed.record({"entropy_effective": torch.tensor(1.0)}, torch.ones(1, 2)) == {"entropy/coef": 0.01}
    with pytest.raises(GraspConfigError, match="entropies"):
        grpo_loss(torch.zeros(1, 1), None, None, torch.zeros(1), torch.ones(1, 1), entropy_coef=0.1)


@needs_trl
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_task_advantages_with_weighted_terms_match_trl(batch: dict[str, torch.Tensor], scale: str) -> None:
    """``GRPOTask.advantages`` (weighted reward terms, TRL's sum_then_normalize) for every advantage.kind TRL has,
    the batch std from two ranks' reward moments as ``prepare`` sums them (TRL gathers every process's rewards)."""
    from grasp_lightning.grpo.config import AdvantageConfig, RewardConfig
    from grasp_lightning.tasks.grpo import GRPOTask

    gen = torch.Generator().manual_seed(5)
    terms = torch.rand(G * K, 2, generator=gen).round(decimals=1)
    terms[K:2 * K] = terms[K]  # one group with equal rewards
    weights = torch.tensor([1.0, 0.3])
    task = GRPOTask(reward=RewardConfig(terms=["accuracy", "format"], weights=weights.tolist()),
                    advantage=AdvantageConfig(kind=scale))
    half = G * K // 2 // K * K
    rewards = terms @ weights
    std = std_from_moments(reward_moments(rewards[:half]) + reward_moments(rewards[half:]))
    ours_rewards, ours = task.advantages(terms, batch_std=std if scale == "batch" else None, k=K)
    torch.testing.assert_close(ours_rewards, rewards)
    torch.testing.assert_close(ours, trl_advantages(rewards, K, scale), **TOL)
# --- off-policy corrections and GDPO: TRL 1.16 parity --------------------------------------------

def trl_sampler_ratio(old: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor, mode: str,
                      clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL 1.16 ``_generate_and_score_completions``'s ``vllm_importance_sampling_ratio``
    (``trl/trainer/grpo_trainer.py:2660-2708``), line for line (no tool mask)."""
    per_token_logps_diff = torch.nan_to_num((old - sampled) * mask, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def trl_normalize_then_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int) -> torch.Tensor:
    """TRL 1.16's ``normalize_then_sum`` block (``trl/trainer/grpo_trainer.py:2790-2800`` and the NaN fill at
    ``:2810``), line for line, one process."""
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.shape[1])
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    std_rewards = nanstd(rewards).expand_as(rewards)
    return torch.nan_to_num((rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4), nan=0.0)


@pytest.fixture(scope="module")
def sampled(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The sampler's log-probs: the old policy's plus noise (ratios on both sides of 1, sequence sums up to ~2)."""
    gen = torch.Generator().manual_seed(99)
    return batch["old"] + 0.3 * torch.randn(batch["old"].shape, generator=gen)


SAMPLER_CASES = [("token_truncate", None, 2.0), ("token_truncate", 0.5, 1.5), ("token_mask", 0.5, 2.0),
                 ("token_mask", None, 1.2), ("sequence_truncate", 0.5, 3.0), ("sequence_mask", 0.7, 2.5),
                 ("sequence_mask", None, 1.0)]


@needs_trl
@pytest.mark.parametrize("mode, clip_min, clip_max", SAMPLER_CASES)
def test_sampler_importance_weights_match_trl(batch, sampled, mode: str, clip_min, clip_max) -> None:
    ours = sampler_importance_weights(batch["old"], sampled, batch["mask"], mode, clip_min, clip_max)
    theirs = trl_sampler_ratio(batch["old"], sampled, batch["mask"], mode, clip_min, clip_max)
    assert ours.shape == theirs.shape == ((12, 1) if mode.startswith("sequence") else (12, L))
    torch.testing.assert_close(ours, theirs, **TOL)
    if mode.endswith("mask"):  # the inputs exercise both the kept and the masked weights
        live = ours if mode.startswith("sequence") else ours[batch["mask"].bool()]
        assert 0 < int((live == 0).sum()) < live.numel() and float(live.max()) != 1.0


def test_sampler_importance_weights_by_hand() -> None:
    old = torch.tensor([[0.0, -1.0, 0.0]])
    sampled = torch.tensor([[-0.5, -0.5, 5.0]])  # gaps +0.5, -0.5 and a padded token
    mask = torch.tensor([[1, 1, 0]])
    e = math.exp(0.5)
    assert sampler_importance_weights(old, sampled, mask, "token_truncate", None, 1.2)[0].tolist() == \
        pytest.approx([1.2, 1 / e, 1.0])
    assert sampler_importance_weights(old, sampled, mask, "token_mask", 0.7, 2.0)[0].tolist() == \
        pytest.approx([e, 0.0, 1.0])
    assert sampler_importance_weights(old, sampled, mask, "sequence_truncate", None, 2.0).tolist() == [[1.0]]
    assert sampler_importance_weights(old + 0.2, sampled, mask, "sequence_mask", None, 1.2).tolist() == [[0.0]]
    assert sampler_importance_weights(old + 0.2, sampled, mask, "sequence_mask", None, 1.5).item() == \
        pytest.approx(math.exp(0.4))  # 0.2 + 0.2 on the two tokens, the padded one left out
    with pytest.raises(GraspConfigError, match="unknown importance sampling mode 'token'"):
        sampler_importance_weights(old, sampled, mask, "token")


@needs_trl
def test_off_policy_mask_matches_trl(batch, sampled) -> None:
    advantages = group_advantages(batch["rewards"], K)
    for threshold in (0.01, 0.05, 0.5):
        ours = off_policy_mask(batch["logp"], sampled, advantages, batch["mask"], threshold)
        theirs = GRPOTrainer.get_off_policy_mask(advantages.unsqueeze(1), batch["logp"], sampled, batch["mask"].float(),
                                                 threshold)
        assert torch.equal(ours, theirs.float()), threshold
    # by hand: mean KL (sampler - policy) 0.3 over two tokens; dropped only with A < 0 and KL > threshold
    logp = torch.zeros(3, 2)
    behaviour = torch.tensor([[0.1, 0.5], [0.1, 0.5], [0.1, 0.5]])
    keep = off_policy_mask(logp, behaviour, torch.tensor([1.0, -1.0, -1.0]), torch.tensor([[1, 1], [1, 1], [1, 0]]), 0.2)
    assert keep.tolist() == [[1.0], [0.0], [1.0]]  # row 3: only its first token, KL 0.1


def _trl_corrected_loss(batch, sampled, advantages, loss_type: str, beta: float, mode: str, clip_min, clip_max,
                        threshold, bias_correction_kl: bool):
    logp = batch["logp"].clone().requires_grad_(True)
    trainer = make_trainer(loss_type, beta, logp)
    trainer.__dict__.update(use_vllm=True, vllm_importance_sampling_correction=True, off_policy_mask_threshold=threshold)
    trainer.args.use_bias_correction_kl = bias_correction_kl
    inputs = {
        "prompt_ids": torch.zeros(logp.shape[0], 2, dtype=torch.long),
        "prompt_mask": torch.ones(logp.shape[0], 2, dtype=torch.long),
        "completion_ids": torch.zeros(logp.shape, dtype=torch.long), "completion_mask": batch["mask"],
        "advantages": advantages, "old_per_token_logps": batch["old"], "ref_per_token_logps": batch["ref"],
        "num_items_in_batch": batch["mask"].sum(), "sampling_per_token_logps": sampled,
        "importance_sampling_ratio": trl_sampler_ratio(batch["old"], sampled, batch["mask"], mode, clip_min, clip_max),
    }
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.detach(), trainer._metrics["train"], logp.grad


@needs_trl
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("mode, clip_min, clip_max, threshold, bias_correction_kl", [
    ("token_truncate", None, 2.0, None, False), ("token_mask", 0.5, 2.0, 0.02, True),
    ("sequence_truncate", 0.5, 3.0, 0.05, False), ("sequence_mask", 0.7, 2.5, None, True)])
def test_corrected_loss_and_grad_match_trl(batch, sampled, loss_type: str, mode: str, clip_min, clip_max, threshold,
                                           bias_correction_kl: bool) -> None:
    """The sampler weights, the off-policy mask and the bias-corrected KL, in TRL's own ``_compute_loss``."""
    advantages = group_advantages(batch["rewards"], K)
    trl_loss, trl_metrics, trl_grad = _trl_corrected_loss(batch, sampled, advantages, loss_type, 0.04, mode, clip_min,
                                                          clip_max, threshold, bias_correction_kl)
    logp = batch["logp"].clone().requires_grad_(True)
    weights = sampler_importance_weights(batch["old"], sampled, batch["mask"], mode, clip_min, clip_max)
    if threshold is not None:
        keep = off_policy_mask(logp, sampled, advantages, batch["mask"], threshold)
        assert 0 < int((keep == 0).sum()) < keep.numel()  # the threshold really drops some sequences
        weights = weights * keep
    loss, metrics = grpo_loss(logp, batch["old"], batch["ref"], advantages, batch["mask"], epsilon_high=0.28, beta=0.04,
                              loss_type=loss_type, max_completion_length=MAX_LEN,
                              num_items_in_batch=float(batch["mask"].sum()), token_weights=weights,
                              bias_correction_kl=bias_correction_kl)
    loss.backward()
    torch.testing.assert_close(loss.detach(), trl_loss, **TOL)
    torch.testing.assert_close(logp.grad, trl_grad, **TOL)
    assert metrics["kl_mean"].item() == pytest.approx(trl_metrics["kl"][0], abs=1e-6)


def test_bias_corrected_kl_changes_the_on_policy_gradient_only() -> None:
    # on-policy the ratio is 1, so the value is the plain KL; its gradient gains kl * d(ratio)/d(logp) = kl
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-0.5, -2.5]])
    mask, adv = torch.ones(1, 2), torch.zeros(1)
    plain, _ = grpo_loss(logp, None, ref, adv, mask, beta=1.0, loss_type="bnpo")
    (g_plain,) = torch.autograd.grad(plain, logp)
    corrected, m = grpo_loss(logp, None, ref, adv, mask, beta=1.0, loss_type="bnpo", bias_correction_kl=True)
    (g_corr,) = torch.autograd.grad(corrected, logp)
    kl = k3_kl(logp.detach(), ref)
    assert float(corrected) == pytest.approx(float(plain))
    torch.testing.assert_close(g_corr, g_plain + kl / 2)  # bnpo: mean over the 2 tokens
    torch.testing.assert_close(importance_weighted_kl(kl, torch.tensor([[2.0]])), 2 * kl)


@needs_trl
def test_normalize_then_sum_matches_trl() -> None:
    gen = torch.Generator().manual_seed(5)
    terms = torch.cat([torch.randint(0, 2, (G * K, 1), generator=gen).float(), torch.rand(G * K, 2, generator=gen)], 1)
    terms[K:2 * K, 0] = 1.0  # a term equal across one group
    weights = torch.tensor([1.0, 0.1, 0.2])
    ours = normalize_then_sum(terms, weights, K)
    torch.testing.assert_close(ours, trl_normalize_then_sum(terms, weights, K), **TOL)
    # across ranks: the batch moments of the term-normalised sums summed over two halves give the same
    halves = [reward_moments(term_normalised_sum(part, weights, K)) for part in (terms[:K], terms[K:])]
    torch.testing.assert_close(torch.cat([normalize_then_sum(terms[:K], weights, K, batch_moments=sum(halves)),
                                          normalize_then_sum(terms[K:], weights, K, batch_moments=sum(halves))]),
                               ours, **TOL)


def test_normalize_then_sum_against_released_by_hand() -> None:
    # one group of 2, terms [1, 0] and [0.2, 0.0]: released centres ([0.5, -0.5] and [0.1, -0.1]) and weights;
    # GDPO divides each by its group std (0.7071 and 0.1414), so both terms give +-0.7071 before the weights
    terms = torch.tensor([[1.0, 0.2], [0.0, 0.0]])
    weights = torch.tensor([1.0, 1.0])
    torch.testing.assert_close(released_advantages(terms, weights, 2), torch.tensor([0.6, -0.6]))
    s = term_normalised_sum(terms, weights, 2, eps=0.0)
    torch.testing.assert_close(s, torch.tensor([2 / math.sqrt(2), -2 / math.sqrt(2)]))
    # then over the batch: mean 0, unbiased std of [1.414, -1.414] = 2, so A = s / 2
    torch.testing.assert_close(normalize_then_sum(terms, weights, 2, eps=0.0), s / 2)
