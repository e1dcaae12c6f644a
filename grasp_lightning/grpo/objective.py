"""GRPO maths on tensors: group advantages, per-token log-probabilities, the k3 KL and the clipped loss.

Pure functions, mirroring TRL 1.16's ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``:
``_generate_and_score_completions`` for advantages, ``_compute_loss`` for the loss) so results can be
checked side by side (``tests/unit/grpo/test_objective.py``), plus the released GRASP variant of the
advantage (each reward term centred within its group, then weighted), and the entropy bonus's adaptive
coefficient (:class:`EntropyControl`, the one piece with state).

Layout: ``N = G * K`` rows, where the ``K`` rollouts of one prompt are consecutive rows, and ``L``
completion tokens per row (right-padded; ``mask`` marks real tokens).

Gradient accumulation, and how our normalisers relate to TRL's
--------------------------------------------------------------
TRL sets ``loss_is_scaled_for_ga = True`` and scales in ``_compute_loss`` itself, with ``A`` =
``current_gradient_accumulation_steps`` (micro-batches per optimizer step), ``W`` = number of processes
and ``S`` = ``steps_per_generation`` (defaults to ``A``):

* ``grpo``, ``bnpo``, ``dr_grpo``: TRL returns ``loss_mb / A`` where ``loss_mb`` is the micro-batch
  value :func:`grpo_loss` returns (TRL logs it as ``policy_loss``). The optimizer step thus sees the
  mean of the micro-batch losses. In Lightning, automatic optimisation with
  ``accumulate_grad_batches=A`` divides the returned loss by ``A`` itself, so return our loss as is.
* ``dapo``: TRL divides the masked token sum by ``num_items_in_batch / W * A / S``, where
  ``num_items_in_batch`` is the number of loss tokens gathered over all processes for the whole
  generation batch; it does **not** divide by ``A`` again. With ``S == A`` that is
  ``tokens_global / W``: summed over the ``A`` micro-batches and averaged over ``W`` ranks by DDP /
  DeepSpeed it gives exactly ``Σ token losses / tokens_global``, independent of how the batch is split.
  :func:`grpo_loss` divides by the ``num_items_in_batch`` it is given. To match TRL, pass
  ``tokens_global / W`` and, under Lightning's automatic accumulation (which divides by ``A`` again),
  multiply the returned loss by ``A`` (or pass ``tokens_global / (W * A)``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grasp_lightning.errors import GraspConfigError

__all__ = [
    "EntropyControl",
    "LOG_RATIO_CLAMP",
    "adapt_entropy_coef",
    "aggregate",
    "LOSS_TYPES",
    "RATIO_LEVELS",
    "WINDOW_TOKEN_TYPES",
    "SAMPLER_CORRECTION_MODES",
    "clip_advantages",
    "group_advantages",
    "importance_weighted_kl",
    "normalize_then_sum",
    "off_policy_mask",
    "sampler_importance_weights",
    "term_normalised_sum",
    "grpo_loss",
    "high_entropy_mask",
    "k3_kl",
    "overlong_penalty",
    "policy_loss_per_token",
    "released_advantages",
    "reward_moments",
    "std_from_moments",
    "selective_log_softmax",
    "vespo_weights",
    "zero_variance_groups",
]

#: Log-ratios are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp`` (e^20 ≈ 4.9e8 fits bf16).
LOG_RATIO_CLAMP = 20.0
#: Token aggregations supported by :func:`grpo_loss` (names as in TRL's ``GRPOConfig.loss_type``).
LOSS_TYPES: tuple[str, ...] = ("grpo", "bnpo", "dapo", "dr_grpo", "cispo", "sapo", "luspo", "vespo")
#: Loss types normalised by the loss tokens of the whole generation batch (TRL's ``num_items_in_batch``).
WINDOW_TOKEN_TYPES: tuple[str, ...] = ("dapo", "cispo", "vespo")
#: Where the importance ratio is taken: per token, or one length-normalised ratio per sequence (GSPO).
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence")
#: How :func:`sampler_importance_weights` corrects for the sampler's log-probs (TRL's ``vllm_importance_sampling_mode``).
SAMPLER_CORRECTION_MODES: tuple[str, ...] = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def _grouped(values: Tensor, group_size: int) -> Tensor:
    """View ``(N, ...)`` as ``(G, K, ...)``; raises GraspConfigError/ValueError on a bad size."""
    if group_size < 1:
        raise GraspConfigError(f"group_size must be >= 1, got {group_size}")
    if values.shape[0] % group_size != 0:
        raise ValueError(f"{values.shape[0]} rows do not split into groups of {group_size}")
    return values.reshape(values.shape[0] // group_size, group_size, *values.shape[1:])


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Which groups have all rewards equal (no learning signal; TRL logs their share as ``frac_reward_zero_std``).

    Args:
        rewards: ``(N,)`` float rewards, ``N = G * group_size``.
        group_size: ``K``, rollouts per prompt.

    Returns:
        ``(G,)`` bool tensor, True where every reward of the group is exactly equal.

    Raises:
        GraspConfigError: ``group_size < 1``. ValueError: ``N`` not divisible by ``group_size``.
    """
    grouped = _grouped(rewards, group_size)
    return grouped.amax(dim=1) == grouped.amin(dim=1)


def group_advantages(rewards: Tensor, group_size: int, scale: str = "group", eps: float = 1e-4,
                     batch_std: Tensor | float | None = None) -> Tensor:
    """Group-relative advantages of GRPO: reward minus its group mean, optionally divided by a std.

    ``scale="group"``: ``(r - mean_g) / (std_g + eps)`` with the unbiased group std, exactly TRL 1.16's
    ``scale_rewards="group"``; ``"batch"``: divided by the unbiased std over all ``N`` rewards (TRL's
    ``"batch"``, still centred per group); ``"none"``: centred only (Dr. GRPO). A group whose rewards are
    all equal gets exactly 0 (never NaN), also when ``K == 1`` (TRL uses a zero std there).

    Args:
        rewards: ``(N,)`` total reward per rollout (float), ``N = G * group_size``.
        group_size: ``K``, rollouts per prompt (consecutive rows).
        scale: ``"group"``, ``"batch"`` or ``"none"``.
        eps: added to the std before dividing (TRL uses 1e-4).
        batch_std: for ``scale="batch"``, the std to divide by, e.g. over every rank's rewards of the
            accumulation window (:func:`std_from_moments`; TRL gathers the rewards of all processes);
            ``None`` uses the unbiased std of ``rewards``.

    Returns:
        ``(N,)`` advantages, same dtype as ``rewards``.

    Raises:
        GraspConfigError: unknown ``scale`` or ``group_size < 1``. ValueError: ``rewards`` not 1-D or
        ``N`` not divisible by ``group_size``.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if scale not in ("group", "batch", "none"):
        raise GraspConfigError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        centred = centred / (std + eps)
    elif scale == "batch":
        if batch_std is None:
            std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        else:
            std = torch.as_tensor(batch_std, dtype=rewards.dtype, device=rewards.device)
        centred = centred / (std + eps)
    flat = zero_variance_groups(rewards, group_size).repeat_interleave(group_size)
    return torch.where(flat, torch.zeros_like(rewards), centred.reshape(-1))


def reward_moments(rewards: Tensor) -> Tensor:
    """``(3,)`` float64 ``[count, Σ r, Σ r²]`` of ``rewards`` (any shape), to be summed over ranks.

    An empty tensor gives zeros, so a rank whose batch was skipped still contributes (and joins the
    collective). See :func:`std_from_moments`.
    """
    r = rewards.detach().double().reshape(-1)
    return torch.stack([r.new_tensor(float(r.numel())), r.sum(), (r * r).sum()])


def std_from_moments(moments: Tensor) -> Tensor:
    """Unbiased std from ``[n, Σ r, Σ r²]`` (:func:`reward_moments` summed over ranks), float64 scalar.

    ``sqrt((Σ r² - (Σ r)² / n) / (n - 1))``, the same value as ``torch.std`` of all the rewards
    (TRL 1.16 ``scale_rewards="batch"`` over the gathered rewards); 0 when ``n < 2``. Negative
    round-off is clamped to 0.
    """
    n, s, ss = moments.double().unbind()
    if n < 2:
        return moments.new_zeros((), dtype=torch.float64)
    return ((ss - s * s / n) / (n - 1)).clamp(min=0.0).sqrt()


def overlong_penalty(lengths: Tensor, max_new_tokens: int, buffer: int | None, penalty: float = 1.0) -> Tensor:
    """Soft overlong penalty ``(N,)`` float32, ≤ 0, for completion lengths in tokens (DAPO Eq. 13).

    ``-penalty * clamp((L - (max_new_tokens - buffer)) / buffer, 0, 1)``: 0 up to the buffer's start,
    linear to ``-penalty`` at the budget. The released GRASP code computes the same value
    (``overlong_buffer_len``, ``overlong_penalty_factor``). ``buffer`` ``None`` or 0: zeros.

    Raises:
        GraspConfigError: ``buffer`` is negative or larger than ``max_new_tokens``.
    """
    if not buffer:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if buffer < 0 or buffer > max_new_tokens:
        raise GraspConfigError(f"overlong_buffer={buffer} must be in 1 … max_new_tokens={max_new_tokens}")
    start = max_new_tokens - buffer
    return -penalty * ((lengths.float() - start) / buffer).clamp(0, 1)


def _check_terms(term_rewards: Tensor, weights: Tensor) -> None:
    """``term_rewards`` ``(N, T)`` and ``weights`` ``(T,)``, else ``ValueError`` naming both shapes."""
    if term_rewards.dim() != 2 or weights.shape != (term_rewards.shape[1],):
        raise ValueError(f"term_rewards (N, T) and weights (T,) expected, got {tuple(term_rewards.shape)} "
                         f"and {tuple(weights.shape)}")


def released_advantages(term_rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
    """Released GRASP advantage: each reward term mean-centred within its group, then weighted and summed.

    ``A_i = Σ_t w_t (r_{i,t} - mean_{j in group(i)} r_{j,t})``; no std division. A term that is equal
    across a group contributes exactly 0. Clip the result with :func:`clip_advantages` (±5 in the
    released recipe).

    Args:
        term_rewards: ``(N, T)`` per-term rewards, ``N = G * group_size``.
        weights: ``(T,)`` term weights (1.0, 0.1, 0.05, 0.2 in the GRASP recipe).
        group_size: ``K``, rollouts per prompt.

    Returns:
        ``(N,)`` advantages, dtype of ``term_rewards``.

    Raises:
        ValueError: shapes do not match or ``N`` not divisible by ``group_size``.
        GraspConfigError: ``group_size < 1``.
    """
    _check_terms(term_rewards, weights)
    grouped = _grouped(term_rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    flat = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return (centred.reshape(term_rewards.shape) * weights.to(term_rewards.dtype)).sum(dim=1)


def clip_advantages(adv: Tensor, bound: float | None) -> Tensor:
    """Clamp advantages to ``[-bound, bound]``; ``None`` returns ``adv`` unchanged (released GRASP code: 5).

    Args:
        adv: advantages of any shape.
        bound: positive bound or ``None``.

    Raises:
        GraspConfigError: ``bound <= 0``.
    """
    if bound is None:
        return adv
    if bound <= 0:
        raise GraspConfigError(f"advantage clip bound must be > 0 or None, got {bound}")
    return adv.clamp(-bound, bound)


def term_normalised_sum(term_rewards: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4) -> Tensor:
    """GDPO's aggregated reward: each reward term normalised within its group, then weighted and summed.

    ``s_i = Σ_t w_t (r_{i,t} - mean_g r_{·,t}) / (std_g r_{·,t} + eps)`` with the unbiased group std (0 when
    ``K == 1``), as TRL 1.16 ``multi_objective_aggregation="normalize_then_sum"``
    (``trl/trainer/grpo_trainer.py:2790-2795``). Each group's ``s`` has mean 0 up to rounding.

    Args:
        term_rewards: ``(N, T)`` per-term rewards, ``N = G * group_size``.
        weights: ``(T,)`` term weights.
        group_size: ``K``, rollouts per prompt.
        eps: added to each term's group std (TRL: 1e-4).

    Returns:
        ``(N,)`` float, dtype of ``term_rewards``.

    Raises:
        ValueError: shapes do not match or ``N`` not divisible by ``group_size``.
        GraspConfigError: ``group_size < 1``.
    """
    _check_terms(term_rewards, weights)
    grouped = _grouped(term_rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    normalised = ((grouped - mean) / (std + eps)).reshape(term_rewards.shape)
    return (normalised * weights.to(term_rewards.dtype)).sum(dim=1)


def normalize_then_sum(term_rewards: Tensor, weights: Tensor, group_size: int, eps: float = 1e-4,
                       batch_moments: Tensor | None = None) -> Tensor:
    """GDPO advantages (Group reward-Decoupled normalisation, arXiv 2601.05242): :func:`term_normalised_sum`,
    then centred and scaled over the whole batch: ``A_i = (s_i - mean(s)) / (std(s) + eps)``.

    TRL 1.16 ``multi_objective_aggregation="normalize_then_sum"`` (``trl/trainer/grpo_trainer.py:2790-2800``),
    where the batch is every process's generation batch and ``scale_rewards`` is not used. Unlike the released
    GRASP advantage (:func:`released_advantages`: each term centred, never scaled, so a term's spread sets its
    weight), each term here is divided by its group std, so every term moves the advantage by the same amount
    per unit of its weight whatever its scale.

    Args:
        term_rewards: ``(N, T)`` per-term rewards.
        weights: ``(T,)`` term weights.
        group_size: ``K``, rollouts per prompt.
        eps: TRL's 1e-4, both for each term's group std and for the batch std.
        batch_moments: ``[n, Σ s, Σ s²]`` of ``s`` over every rank (:func:`reward_moments` of
            :func:`term_normalised_sum`, summed over ranks); ``None``: this batch's own.

    Returns:
        ``(N,)`` advantages, dtype of ``term_rewards``.

    Raises:
        ValueError / GraspConfigError: as :func:`term_normalised_sum`.
    """
    s = term_normalised_sum(term_rewards, weights, group_size, eps)
    moments = reward_moments(s) if batch_moments is None else batch_moments.double()
    n = moments[0].clamp(min=1.0)
    mean = (moments[1] / n).to(s.dtype)
    std = std_from_moments(moments).to(s.dtype)
    return (s - mean) / (std + eps)


def selective_log_softmax(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each chosen token under ``softmax(logits / temperature)``, computed in float32.

    One row at a time, so only an ``(L, V)`` float32 copy exists at once (never the full ``(N, L, V)``
    log-softmax). Mirrors TRL's ``selective_log_softmax`` (logits divided by the sampling temperature).

    Args:
        logits: ``(N, L, V)`` logits (any float dtype) aligned with the tokens they predict.
        token_ids: ``(N, L)`` int64 token ids.
        temperature: sampling temperature, > 0.

    Returns:
        ``(N, L)`` float32 log-probs; differentiable w.r.t. ``logits``.

    Raises:
        GraspConfigError: ``temperature <= 0``. ValueError: shapes do not match.
    """
    if temperature <= 0:
        raise GraspConfigError(f"temperature must be > 0, got {temperature}")
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(f"logits (N, L, V) and token_ids (N, L) expected, got {tuple(logits.shape)} "
                         f"and {tuple(token_ids.shape)}")
    rows = []
    for row_logits, row_ids in zip(logits, token_ids):
        row = row_logits.float() / temperature
        chosen = row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        rows.append(chosen - torch.logsumexp(row, dim=-1))
    if not rows:
        return logits.new_zeros(logits.shape[:2], dtype=torch.float32)
    return torch.stack(rows)


def k3_kl(logp: Tensor, ref_logp: Tensor, clamp: float | None = None) -> Tensor:
    """Per-token k3 KL estimator ``exp(d) - d - 1`` with ``d = ref_logp - logp`` (Schulman; TRL's ``per_token_kl``).

    ``d`` is clamped to ``[-20, 20]`` so ``exp`` cannot overflow in bf16/fp32 (e^20 ≈ 4.9e8); the
    clamp has zero gradient outside that range. TRL does not clamp; values agree whenever
    ``|d| <= 20``.

    Args:
        logp: ``(N, L)`` policy log-probs.
        ref_logp: ``(N, L)`` reference-model log-probs.
        clamp: ``None``: as above. A number ``c``: each estimate is then clamped to ``[-c, c]`` (zero
            gradient beyond): the released GRASP code clamps to ±10 (``socialmllm/train/reasoning/trainer.py:196``;
            its ``d`` is clamped to ±20 first, at ``:195``, as here).

    Returns:
        ``(N, L)`` non-negative estimates, dtype of the inputs.
    """
    d = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = torch.exp(d) - d - 1
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def sampler_importance_weights(old_logp: Tensor, sampled_logp: Tensor, mask: Tensor, mode: str = "token_truncate",
                               clip_min: float | None = None, clip_max: float | None = None) -> Tensor:
    """Importance weights that correct for a sampler whose log-probs differ from the trainer's (TIS / MIS).

    ``d = (old_logp - sampled_logp) * mask`` per token (NaN gaps count 0); the token modes weigh each token by
    ``w = exp(d)``, the sequence modes each sequence by ``w = exp(Σ_t d_t)`` (a sum, not a mean). ``*_truncate``
    clamps ``w`` to ``[clip_min, clip_max]`` (truncated IS, TIS); ``*_mask`` sets ``w`` to 0 outside that range
    and keeps it inside (masked IS, MIS); a ``None`` bound is open. Exactly TRL 1.16's
    ``vllm_importance_sampling_ratio`` (``trl/trainer/grpo_trainer.py:2660-2708``), except that the log
    weight is clamped to ``[-20, 20]`` before ``exp`` (equal whenever ``|d| <= 20``; TRL's can reach ``inf``).
    The weights multiply each token's policy loss (not the KL), no gradient.

    Args:
        old_logp: ``(N, L)`` the trainer's log-probs of the sampled tokens under the sampling weights.
        sampled_logp: ``(N, L)`` the sampler's (e.g. vLLM's) log-probs of the same tokens.
        mask: ``(N, L)`` 1 for completion tokens that count.
        mode: one of :data:`SAMPLER_CORRECTION_MODES`.
        clip_min: lower bound ``C_min`` or ``None``.
        clip_max: upper bound ``C_max`` or ``None``.

    Returns:
        ``(N, L)`` (token modes) or ``(N, 1)`` (sequence modes) float32 weights, detached.

    Raises:
        GraspConfigError: unknown ``mode``. ValueError: shapes do not match.
    """
    if mode not in SAMPLER_CORRECTION_MODES:
        raise GraspConfigError(f"unknown importance sampling mode {mode!r}; expected one of {list(SAMPLER_CORRECTION_MODES)}")
    if old_logp.shape != sampled_logp.shape or mask.shape != old_logp.shape:
        raise ValueError(f"old_logp, sampled_logp and mask must share one (N, L) shape, got {tuple(old_logp.shape)}, "
                         f"{tuple(sampled_logp.shape)}, {tuple(mask.shape)}")
    diff = torch.nan_to_num((old_logp.detach().float() - sampled_logp.float()) * mask.float(), nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    weights = torch.exp(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if mode.endswith("truncate"):
        return weights.clamp(min=clip_min, max=clip_max)
    low = -float("inf") if clip_min is None else clip_min
    high = float("inf") if clip_max is None else clip_max
    return weights.masked_fill((weights < low) | (weights > high), 0.0)


def off_policy_mask(logp: Tensor, behaviour_logp: Tensor, advantages: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """Off-policy sequence mask (DeepSeek-V3.2, arXiv 2512.02556, Eq. 9): drop a sequence whose advantage is
    negative and whose mean KL from the sampling policy is above ``threshold``.

    ``kl_i = Σ_t (behaviour_logp - logp)_t m_t / max(Σ_t m_t, 1)`` (NaN counts 0); keep where ``A_i >= 0`` or
    ``kl_i <= threshold``. TRL 1.16 ``GRPOTrainer.get_off_policy_mask`` (``trl/trainer/grpo_trainer.py:2945-2969``),
    which ``_compute_loss`` feeds the sampler's log-probs (vLLM's) where it has them, else the old policy's
    (``:3068-3081``); multiplies each token's policy loss, not the KL.

    Args:
        logp: ``(N, L)`` the policy's log-probs (detached here).
        behaviour_logp: ``(N, L)`` log-probs of the policy that sampled the tokens.
        advantages: ``(N,)`` one advantage per sequence.
        mask: ``(N, L)`` 1 for completion tokens that count.
        threshold: ``δ`` in nats per token, > 0.

    Returns:
        ``(N, 1)`` float32, 1.0 keep, 0.0 drop.

    Raises:
        GraspConfigError: ``threshold <= 0``. ValueError: shapes do not match.
    """
    if not threshold > 0:
        raise GraspConfigError(f"off-policy mask threshold must be > 0, got {threshold}")
    if behaviour_logp.shape != logp.shape or mask.shape != logp.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"logp (N, L), behaviour_logp (N, L), mask (N, L), advantages (N,) expected, got "
                         f"{tuple(logp.shape)}, {tuple(behaviour_logp.shape)}, {tuple(mask.shape)}, {tuple(advantages.shape)}")
    m = mask.float()
    kl = torch.nan_to_num(behaviour_logp.float() - logp.detach().float(), nan=0.0)
    mean_kl = (kl * m).sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages.unsqueeze(1) >= 0) | (mean_kl <= threshold)).float()


def importance_weighted_kl(kl: Tensor, ratio: Tensor) -> Tensor:
    """The KL with the importance-sampling bias correction (DeepSeek-V3.2, arXiv 2512.02556): ``kl * ratio``.

    ``ratio`` is the policy's ratio to the sampling policy, with its gradient: on-policy it equals 1 yet
    changes the KL's gradient, which then is the unbiased reverse-KL gradient for tokens sampled from the old
    policy. TRL 1.16 ``use_bias_correction_kl`` (``trl/trainer/grpo_trainer.py:3102-3105``: ``per_token_kl *
    coef_1``, both token- or sequence-level).

    Args:
        kl: ``(N, L)`` per-token k3 estimates (:func:`k3_kl`).
        ratio: ``(N, L)`` token ratios or ``(N, 1)`` sequence ratios.

    Returns:
        ``(N, L)``.
    """
    return kl * ratio


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the masked tokens (0 when the mask is empty); detached. ``x`` may be ``(N, 1)``
    (one value per sequence, counted once per loss token of its sequence)."""
    return ((x * mask).sum() / mask.sum().clamp(min=1.0)).detach()


def high_entropy_mask(entropies: Tensor, mask: Tensor, top_quantile: float) -> Tensor:
    """The tokens among the top ``top_quantile`` of entropy (Wang et al. 2025, "Beyond the 80/20 Rule";
    TRL 1.16 ``GRPOTrainer.get_high_entropy_mask`` with ``threshold = 1 - top_entropy_quantile``).

    The threshold is ``torch.quantile`` (linear interpolation) at ``1 - top_quantile`` of the entropies of
    the masked tokens; a token is kept when its entropy is at or above it. TRL pools the tokens of the
    micro-batch of every process; this function sees the tokens it is given (one rank's micro-batch).

    Args:
        entropies: ``(N, L)`` per-token entropies (nats; any float dtype; gradient not used).
        mask: ``(N, L)`` loss tokens (bool, int or float).
        top_quantile: in ``[0, 1]``; 1 keeps every loss token, 0 only the highest-entropy ones.

    Returns:
        ``(N, L)`` bool, False on padding; all False when the mask is empty.

    Raises:
        GraspConfigError: ``top_quantile`` outside ``[0, 1]``.
    """
    if not 0.0 <= top_quantile <= 1.0:
        raise GraspConfigError(f"top_entropy_quantile must be in [0, 1], got {top_quantile}")
    keep = mask.bool()
    values = entropies.detach()[keep].float()
    if values.numel() == 0:
        return torch.zeros_like(keep)
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return (entropies.detach().float() * keep.float() >= threshold) & keep


def vespo_weights(log_ratio: Tensor, mask: Tensor, advantages: Tensor, is_weights: Tensor | None = None, *,
                  k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
                  lambda_neg: float = 2.0) -> Tensor:
    """VESPO's gamma weight of each sequence, ``phi(w) = exp(lambda + k log w - lambda w)`` (``phi(1) = 1``),
    no gradient (VESPO, arXiv 2602.10693; TRL 1.16 ``GRPOTrainer.get_gamma_weights``).

    ``log w = clamp(sum_t clamp(log_ratio_t, -20, 20) + sum_t log is_t, log 1e-8, 20)`` over the loss tokens:
    the sequence's whole (not length-normalised) log-ratio, plus the log of the sampler correction
    (each clamped to ``[log 1e-8, 20]``) where there is one. ``k, lambda`` are the ``_pos`` pair for ``A >= 0``,
    else the ``_neg`` pair; lambda is floored at 1e-4; a NaN or infinite weight becomes 0.

    Args:
        log_ratio: ``(N, L)`` ``logp - old_logp``.
        mask: ``(N, L)`` loss tokens (float).
        advantages: ``(N, 1)``.
        is_weights: ``(N, L)`` the sampler's importance weights (``GRPOTask``'s ``importance_sampling_cap``), or
            ``None``; padding is left out (TRL's weight there is exactly 1).

    Returns:
        ``(N, 1)`` float32 weights.

    Raises:
        ValueError: ``is_weights`` is not per token ``(N, L)``.
    """
    with torch.no_grad():
        lower = math.log(1e-8)
        seq = (log_ratio.detach().float().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * mask).sum(-1, keepdim=True)
        if is_weights is not None:
            if is_weights.shape != log_ratio.shape:
                raise ValueError(f"vespo needs per-token importance weights {tuple(log_ratio.shape)}, "
                                 f"got {tuple(is_weights.shape)}")
            seq = seq + (torch.log(is_weights.float()).clamp(lower, LOG_RATIO_CLAMP) * mask).sum(-1, keepdim=True)
        log_w = seq.clamp(lower, LOG_RATIO_CLAMP)
        nonneg = advantages >= 0
        k = torch.where(nonneg, k_pos, k_neg)
        lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_loss_per_token(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str = "grpo",
    ratio_level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo: dict[str, float] | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The policy term of each token for every loss type, before masking and aggregation (TRL 1.16
    ``GRPOTrainer._compute_loss``, from ``log_ratio`` to ``per_token_loss``).

    With ``r`` the importance ratio (per token; with ``ratio_level="sequence"``, GSPO's
    ``exp(mean_t log r_t)`` over the sequence's loss tokens, one per sequence) and ``A`` the advantage:

    * ``grpo``, ``bnpo``, ``dapo``, ``dr_grpo``, ``luspo``: ``-min(r' A, clip(r, 1 - epsilon, 1 + epsilon_high) A)``
      with ``r' = min(r, delta)`` when ``delta`` is set (INTELLECT-2's two-sided clip), else ``r``;
    * ``cispo``: ``-sg(min(r, epsilon_high)) A logp`` (MiniMax-M1; ``epsilon_high`` is the weight's cap);
    * ``sapo``: ``-(4 / tau) sigmoid(tau (r - 1)) A`` with ``tau`` = ``sapo_temperature_pos`` for ``A > 0``, else
      ``_neg`` (SAPO);
    * ``vespo``: ``-phi A logp`` with :func:`vespo_weights` ``phi`` (the sampler weights ``is_weights`` go into
      ``phi``).

    Args:
        logp: ``(N, L)`` float32 policy log-probs (with grad).
        old_logp: ``(N, L)`` float32 sampling-policy log-probs.
        advantages: ``(N, 1)`` float32.
        mask: ``(N, L)`` float32 loss tokens.
        loss_type: one of :data:`LOSS_TYPES`.
        ratio_level: ``"token"`` or ``"sequence"`` (TRL's ``importance_sampling_level``).
        epsilon, epsilon_high: the clip range (``epsilon_high`` already resolved).
        delta: the upper bound of the ratio for ``A < 0``, or ``None``.
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures.
        vespo: ``k_pos, lambda_pos, k_neg, lambda_neg`` of :func:`vespo_weights`, or ``None``: its defaults.
        is_weights: ``(N, L)`` sampler importance weights, used by ``vespo`` only.

    Returns:
        ``(per_token, ratio, metrics)``: ``per_token`` ``(N, L)`` or ``(N, 1)`` (sequence level: broadcast over
        the tokens), ``ratio`` ``(N, L)`` or ``(N, 1)`` (after ``delta``), and detached masked means (a
        sequence's value counted once per loss token): ``ratio_mean`` (before ``delta``), ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high`` (clipping types), ``clip_ratio_delta``
        (``delta`` set: ratio above delta with ``A < 0``), ``clip_ratio``/``clip_ratio_high`` for ``cispo``
        (weights capped with ``A > 0``, TRL's ``cispo_clip_ratio``), ``vespo_weight_mean``.

    Raises:
        GraspConfigError: unknown ``loss_type`` or ``ratio_level``.
    """
    if loss_type not in LOSS_TYPES:
        raise GraspConfigError(f"unknown loss_type {loss_type!r}; expected one of {list(LOSS_TYPES)}")
    if ratio_level not in RATIO_LEVELS:
        raise GraspConfigError(f"unknown ratio_level {ratio_level!r}; expected one of {list(RATIO_LEVELS)}")
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if ratio_level == "sequence":
        log_ratio_used = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_ratio_used = log_ratio
    ratio = torch.exp(log_ratio_used)
    metrics: dict[str, Tensor] = {"ratio_mean": _masked_mean(ratio, mask)}
    if loss_type == "cispo":
        per_token = -ratio.clamp(max=epsilon_high).detach() * advantages * logp
        capped = ((ratio > epsilon_high) & (advantages > 0)).float()
        metrics["clip_ratio"] = metrics["clip_ratio_high"] = _masked_mean(capped, mask)
    elif loss_type == "sapo":
        tau = torch.where(advantages > 0, sapo_temperature_pos, sapo_temperature_neg)
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages
    elif loss_type == "vespo":
        phi = vespo_weights(log_ratio, mask, advantages, is_weights, **(vespo or {}))
        per_token = -phi * advantages * logp
        metrics["vespo_weight_mean"] = _masked_mean(phi, mask)
    else:
        clipped = ratio.clamp(1 - epsilon, 1 + epsilon_high)
        if delta is not None:
            metrics["clip_ratio_delta"] = _masked_mean(((ratio > delta) & (advantages < 0)).float(), mask)
            ratio = ratio.clamp(max=delta)
        per_token = -torch.min(ratio * advantages, clipped * advantages)
        low = (ratio < 1 - epsilon) & (advantages < 0)
        high = (ratio > 1 + epsilon_high) & (advantages > 0)
        metrics["clip_ratio"] = _masked_mean((low | high).float(), mask)
        metrics["clip_ratio_low"] = _masked_mean(low.float(), mask)
        metrics["clip_ratio_high"] = _masked_mean(high.float(), mask)
    return per_token, ratio, metrics


def aggregate(per_token: Tensor, mask: Tensor, loss_type: str, max_completion_length: int | None = None,
              num_items_in_batch: float | Tensor | None = None) -> Tensor:
    """One micro-batch's loss from the per-token losses, by loss type (TRL 1.16 ``_compute_loss``, before its
    division by the accumulation steps; see :func:`grpo_loss`).

    Args:
        per_token: ``(N, L)`` or ``(N, 1)`` (sequence level: broadcast over the tokens) float32 losses.
        mask: ``(N, L)`` float32 loss tokens.
        loss_type: one of :data:`LOSS_TYPES`.
        max_completion_length: ``dr_grpo``'s budget in tokens.
        num_items_in_batch: the normaliser of :data:`WINDOW_TOKEN_TYPES`; ``None``: this micro-batch's tokens.

    Returns:
        A float32 scalar.
    """
    masked = per_token * mask
    if loss_type in ("grpo", "sapo"):
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "luspo":
        return masked.sum(-1).mean()
    if loss_type == "bnpo" or (loss_type in WINDOW_TOKEN_TYPES and num_items_in_batch is None):
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type in WINDOW_TOKEN_TYPES:
        return masked.sum() / torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=mask.device).clamp(min=1.0)
    return masked.sum() / (mask.shape[0] * max_completion_length)  # dr_grpo


def _check_loss_inputs(logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor, *, beta: float,
                       loss_type: str, max_completion_length: int | None, entropies: Tensor | None,
                       top_entropy_quantile: float, entropy_coef: float) -> None:
    """:func:`grpo_loss`'s argument checks (its ``Raises:``)."""
    if loss_type not in LOSS_TYPES:
        raise GraspConfigError(f"unknown loss_type {loss_type!r}; expected one of {list(LOSS_TYPES)}")
    if loss_type == "dr_grpo" and not max_completion_length:
        raise GraspConfigError("loss_type 'dr_grpo' needs max_completion_length (the generation budget in tokens)")
    if beta != 0.0 and ref_logp is None:
        raise GraspConfigError(f"beta={beta} needs reference log-probs (ref_logp is None)")
    if (top_entropy_quantile < 1.0 or entropy_coef != 0.0) and entropies is None:
        raise GraspConfigError("top_entropy_quantile < 1 and entropy_coef need the per-token entropies")
    if logp.dim() != 2 or mask.shape != logp.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"logp (N, L), mask (N, L), advantages (N,) expected, got {tuple(logp.shape)}, "
                         f"{tuple(mask.shape)}, {tuple(advantages.shape)}")


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    ref_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    beta: float = 0.0,
    loss_type: str = "grpo",
    max_completion_length: int | None = None,
    num_items_in_batch: float | Tensor | None = None,
    token_weights: Tensor | None = None,
    kl_clamp: float | None = None,
    ratio_level: str = "token",
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo: dict[str, float] | None = None,
    entropies: Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    entropy_coef: float = 0.0,
    bias_correction_kl: bool = False,
    sequence_mask: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective family with an optional k3 KL penalty and entropy bonus, as in TRL 1.16
    ``GRPOTrainer._compute_loss``.

    Per token: the policy term of :func:`policy_loss_per_token` (``loss_type``, ``ratio_level``, ``delta``,
    SAPO's and VESPO's settings), times the high-entropy mask (:func:`high_entropy_mask`, when
    ``top_entropy_quantile < 1``), times ``token_weights`` (not for ``vespo``, whose weights take them), plus
    ``beta * k3_kl(logp, ref_logp)``. Computed in float32. Aggregation over the masked tokens:

    * ``"grpo"``, ``"sapo"``: mean over each sequence's tokens, then mean over sequences;
    * ``"bnpo"``: sum over all tokens / number of tokens in this micro-batch;
    * ``"dapo"``, ``"cispo"``, ``"vespo"`` (:data:`WINDOW_TOKEN_TYPES`): sum / ``num_items_in_batch`` when given,
      else as ``"bnpo"``;
    * ``"dr_grpo"``: sum / (``N * max_completion_length``);
    * ``"luspo"``: sum over each sequence's tokens, then mean over sequences.

    Then, with ``entropy_coef != 0``, the entropy bonus: minus ``entropy_coef`` times the mean entropy over
    the loss tokens (the high-entropy ones only, with the mask), whatever the loss type's normaliser (TRL:
    ``loss - coef * H``). The value is one micro-batch's loss, not divided by the accumulation factor;
    see the module docstring for how it relates to TRL's scaling under gradient accumulation.

    Args:
        logp: ``(N, L)`` policy log-probs of the completion tokens (with grad; any float dtype).
        old_logp: ``(N, L)`` log-probs of the sampling policy, or ``None`` (on-policy: ``logp.detach()``).
        ref_logp: ``(N, L)`` reference-model log-probs, or ``None`` (required when ``beta != 0``).
        advantages: ``(N,)`` one advantage per rollout.
        mask: ``(N, L)`` 1 for completion tokens that count, 0 for padding (bool, int or float).
        epsilon: lower clip range ``ε_low``; also the upper one when ``epsilon_high`` is None.
        epsilon_high: upper clip range (DAPO's clip-higher; ``cispo``: the weight's cap), or ``None``.
        beta: KL coefficient (0.05 in the released GRASP recipe, 0.0 in TRL by default).
        loss_type: one of :data:`LOSS_TYPES`.
        max_completion_length: the generation budget in tokens; required for ``"dr_grpo"``.
        num_items_in_batch: the normaliser of :data:`WINDOW_TOKEN_TYPES`, the number of loss tokens they average over.
        token_weights: ``(N, L)`` or ``(N, 1)`` detached weights of the policy term, or ``None``: the sampler
            correction (:func:`sampler_importance_weights`) times the off-policy sequence mask
            (:func:`off_policy_mask`); TRL 1.16 multiplies ``per_token_loss`` by both before adding the KL term;
            ``vespo`` folds them into its sequence weights instead.
        kl_clamp: clamp each token's k3 estimate to ±this (:func:`k3_kl`; released GRASP: 10), in the loss and
            in ``kl_mean``; ``None``: no clamp.
        ratio_level: ``"token"`` or ``"sequence"`` (GSPO; TRL's ``importance_sampling_level``).
        delta: INTELLECT-2's upper bound on the ratio of negative-advantage tokens, or ``None``.
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures.
        vespo: VESPO's ``k_pos, lambda_pos, k_neg, lambda_neg`` (:func:`vespo_weights`), or ``None``: defaults.
        bias_correction_kl: multiply each token's KL by the ratio (:func:`importance_weighted_kl`; TRL's
            ``use_bias_correction_kl``), in the loss and in ``kl_mean``.
        sequence_mask: ``(N, 1)`` 0/1 factor of each sequence's policy term (:func:`off_policy_mask`), every loss
            type included (TRL 1.16 multiplies ``per_token_loss`` by its ``off_policy_mask``), or ``None``.
        entropies: ``(N, L)`` per-token policy entropies (nats); with grad for the bonus. Required when
            ``top_entropy_quantile < 1`` or ``entropy_coef != 0``.
        top_entropy_quantile: keep only this top share of the loss tokens by entropy in the policy term.
        entropy_coef: the entropy bonus's coefficient (0: none).

    Returns:
        ``(loss, metrics)``: a float32 scalar loss, and detached float32 scalars: ``kl_mean`` (masked mean of
        k3; only when ``ref_logp`` is given), the clip fractions and ``ratio_mean`` of
        :func:`policy_loss_per_token` (``clip_ratio``: ratio < 1-ε with A < 0, or ratio > 1+ε_high with A > 0,
        TRL's ``clip_ratio/region_mean``), ``low_entropy_tokens`` (``top_entropy_quantile < 1``; a count: loss
        tokens the high-entropy mask leaves out) and, when ``entropies`` are given, ``entropy_effective`` (their
        mean over the tokens the bonus acts on: the loss tokens the high-entropy mask keeps).

    Raises:
        GraspConfigError: unknown ``loss_type`` or ``ratio_level``; ``dr_grpo`` without ``max_completion_length``;
        ``beta != 0`` without ``ref_logp``; the entropy options without ``entropies``. ValueError: mismatched
        shapes.
    """
    _check_loss_inputs(logp, ref_logp, advantages, mask, beta=beta, loss_type=loss_type,
                       max_completion_length=max_completion_length, entropies=entropies,
                       top_entropy_quantile=top_entropy_quantile, entropy_coef=entropy_coef)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    logp32 = logp.float()
    old32 = logp32.detach() if old_logp is None else old_logp.float()
    mask32 = mask.float()
    adv = advantages.float().unsqueeze(1)
    weights = None if token_weights is None else token_weights.detach().float()

    per_token, ratio, metrics = policy_loss_per_token(
        logp32, old32, adv, mask32, loss_type=loss_type, ratio_level=ratio_level, epsilon=epsilon,
        epsilon_high=eps_high, delta=delta, sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg, vespo=vespo, is_weights=weights if loss_type == "vespo" else None)
    effective = mask32
    if top_entropy_quantile < 1.0:
        keep = high_entropy_mask(entropies, mask32, top_entropy_quantile)
        per_token = per_token * keep
        effective = mask32 * keep
        metrics["low_entropy_tokens"] = (mask32.sum() - effective.sum()).detach()
    if weights is not None and loss_type != "vespo":
        per_token = per_token * weights
    if sequence_mask is not None:
        per_token = per_token * sequence_mask.detach().float()
    if ref_logp is not None:
        kl = k3_kl(logp32, ref_logp.float(), kl_clamp)
        if bias_correction_kl:
            kl = importance_weighted_kl(kl, ratio)
        metrics["kl_mean"] = _masked_mean(kl, mask32)
        if beta != 0.0:
            per_token = per_token + beta * kl

    loss = aggregate(per_token, mask32, loss_type, max_completion_length, num_items_in_batch)
    if entropies is not None:
        h = entropies.float()
        bonus = (h * effective).sum() / effective.sum().clamp(min=1.0)
        metrics["entropy_effective"] = bonus.detach()
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * bonus
    return loss, metrics


def adapt_entropy_coef(coef: float, entropy: float, *, target: float, delta: float, low: float,
                       high: float) -> float:
    """Skywork-OR1's adaptive entropy coefficient after one optimizer step (TRL 1.16 ``_compute_loss``):
    ``min(coef + delta, high)`` when the step's mean entropy is at or below ``target``, else
    ``max(coef - delta, low)``."""
    return min(coef + delta, high) if entropy <= target else max(coef - delta, low)


class EntropyControl:
    """The entropy bonus's coefficient over a run: fixed (``loss.entropy_coef``) or adaptive
    (``loss.adaptive_entropy``, Skywork-OR1), and the keyword arguments it gives :func:`grpo_loss`.

    Adaptive, as TRL 1.16 does it: every micro-batch of an optimizer step applies the coefficient and the
    gate decided after the step before (the bonus acts only while that step's mean entropy was at or below
    the target; before any step, never); each micro-batch adds ``[Σ entropy, tokens]`` over the tokens the
    bonus acts on to its rank's running sum; at the step's end the sums of every rank give the step's
    mean entropy, and :func:`adapt_entropy_coef` the next coefficient. Here the end of step ``t`` is
    handled at the first micro-batch of step ``t + 1`` (:meth:`step`, called by ``GRPOTask.prepare`` on
    every rank, so its one all-reduce lines up), which gives every step the same coefficient as TRL's.
    The coefficient, the last entropy and the pending sums are this object's state
    (:meth:`state_dict`), saved in checkpoints with the task's.

    Args:
        loss: the ``LossConfig`` (``entropy_coef``, ``adaptive_entropy``, ``entropy_coef_min/max/delta``,
            ``entropy_target``, ``top_entropy_quantile``).
    """

    def __init__(self, loss) -> None:
        self.cfg = loss
        self.coef = float(loss.entropy_coef)
        self.last_entropy = math.inf  # no step measured yet: the adaptive bonus is off
        self.pending = [0.0, 0.0]  # this rank's [Σ entropy, tokens] of the step so far
        self.started = False  # a step has run since the start (or the checkpoint): step() has sums to reduce

    @property
    def enabled(self) -> bool:
        """A bonus is in the loss (the entropies then need their gradient)."""
        return self.cfg.entropy_coef != 0.0 or self.cfg.adaptive_entropy

    @property
    def applied(self) -> float:
        """The coefficient this step's micro-batches multiply the bonus by (0 while adaptive and above target)."""
        if self.cfg.adaptive_entropy and not self.last_entropy <= self.cfg.entropy_target:
            return 0.0
        return self.coef

    def loss_kwargs(self, entropies: Tensor) -> dict:
        """``entropies``, ``top_entropy_quantile`` and ``entropy_coef`` for :func:`grpo_loss` (empty when no
        entropy option is on)."""
        if not self.enabled and self.cfg.top_entropy_quantile >= 1.0:
            return {}
        return {"entropies": entropies, "top_entropy_quantile": self.cfg.top_entropy_quantile,
                "entropy_coef": self.applied}

    def record(self, metrics: dict[str, Tensor], mask: Tensor) -> dict[str, float]:
        """Add one micro-batch's entropy over the bonus's tokens (``metrics`` of :func:`grpo_loss`, ``mask`` its
        ``(N, L)`` loss tokens) to the step's sums; returns its coefficient metrics: ``entropy/coef`` (the
        controller's value this step) and, adaptive, ``entropy/coef_applied``."""
        out: dict[str, float] = {}
        if self.cfg.adaptive_entropy and "entropy_effective" in metrics:
            tokens = float(mask.float().sum()) - float(metrics.get("low_entropy_tokens", 0.0))
            self.pending[0] += float(metrics["entropy_effective"]) * tokens
            self.pending[1] += tokens
            out["entropy/coef_applied"] = self.applied
        if self.enabled:
            out["entropy/coef"] = self.coef
        return out

    def step(self, ctx) -> None:
        """At an optimizer step's first micro-batch (every rank): adapt the coefficient to the last step's mean
        entropy over all ranks (``ctx.cross_rank.sum``, one all-reduce), then start the new step's sums."""
        if not self.cfg.adaptive_entropy:
            return
        if self.started:
            total = ctx.cross_rank.sum(torch.tensor(self.pending, dtype=torch.float64, device=ctx.device)).cpu()
            entropy = float(total[0] / total[1].clamp(min=1.0))
            self.coef = adapt_entropy_coef(self.coef, entropy, target=self.cfg.entropy_target,
                                           delta=self.cfg.entropy_coef_delta, low=self.cfg.entropy_coef_min,
                                           high=self.cfg.entropy_coef_max)
            self.last_entropy = entropy
        self.pending = [0.0, 0.0]
        self.started = True

    def state_dict(self) -> dict:
        """The adaptive controller's state (empty when not adaptive): plain numbers."""
        if not self.cfg.adaptive_entropy:
            return {}
        return {"entropy_control": {"coef": self.coef, "last_entropy": self.last_entropy,
                                    "pending": list(self.pending), "started": self.started}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a state without it, e.g. from a run without adaptive entropy, keeps the start)."""
        own = state.get("entropy_control")
        if not own or not self.cfg.adaptive_entropy:
            return
        self.coef, self.last_entropy = float(own["coef"]), float(own["last_entropy"])
        self.pending, self.started = [float(x) for x in own["pending"]], bool(own["started"])
