"""Parity of grasp_lightning.grpo_math with TRL 1.16's own GRPO code on identical tensors.

The loss comes from TRL's real ``GRPOTrainer._compute_loss``, called on an instance built with
``object.__new__`` (no model, no datasets) whose ``_get_per_token_logps_and_entropies`` is replaced
to return our log-prob tensor. TRL computes advantages inline in ``_generate_and_score_completions``
(not a separable function), so the test reproduces that block (``sum_then_normalize`` branch) with
TRL's own ``nanstd`` helper and compares.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402
from trl.trainer.utils import nanstd  # noqa: E402
from trl.trainer.utils import selective_log_softmax as trl_selective_log_softmax  # noqa: E402

from grasp_lightning.grpo_math import group_advantages, grpo_loss, selective_log_softmax  # noqa: E402

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


def make_trainer(loss_type: str, beta: float, logp: torch.Tensor, grad_accum: int = 1,
                 steps_per_generation: int = 1, epsilon_high: float = 0.28) -> GRPOTrainer:
    """A GRPOTrainer with only the attributes ``_compute_loss`` reads (token-level IS, no vLLM, no extras)."""
    trainer = object.__new__(GRPOTrainer)
    trainer.__dict__.update(
        model=SimpleNamespace(training=True), loss_type=loss_type, beta=beta, epsilon_low=0.2,
        epsilon_high=epsilon_high, temperature=1.0, importance_sampling_level="token",
        off_policy_mask_threshold=None, top_entropy_quantile=1.0, use_vllm=False,
        vllm_importance_sampling_correction=False, max_completion_length=MAX_LEN,
        current_gradient_accumulation_steps=grad_accum, _entropy_bonus_enabled=False, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=steps_per_generation),
        accelerator=SimpleNamespace(num_processes=1, reduce=lambda t, reduction="sum": t, gather=lambda t: t),
    )
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
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


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_trl_divides_by_accumulation_steps(batch: dict[str, torch.Tensor], loss_type: str) -> None:
    # TRL returns loss_mb / A for these types; ours is loss_mb (Lightning divides by A itself).
    advantages = group_advantages(batch["rewards"], K)
    trl_loss, _, _ = _trl_loss(batch, advantages, loss_type, 0.04, grad_accum=4, steps_per_generation=4)
    loss, _ = grpo_loss(batch["logp"], batch["old"], batch["ref"], advantages, batch["mask"], epsilon_high=0.28,
                        beta=0.04, loss_type=loss_type, max_completion_length=MAX_LEN)
    torch.testing.assert_close(loss / 4, trl_loss, **TOL)


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


def test_selective_log_softmax_matches_trl() -> None:
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 5, 13, generator=gen)
    ids = torch.randint(0, 13, (3, 5), generator=gen)
    torch.testing.assert_close(selective_log_softmax(logits, ids, temperature=0.8),
                               trl_selective_log_softmax(logits, ids, temperature=0.8), **TOL)
