"""GRPO task with configurable rewards: plain GRPO (accuracy + format) or GRPO-SGR (GRASP stage 2).

Per micro-batch of B prompts: sample K completions per prompt (a group), score every completion
with the configured reward terms, turn the weighted sum into group-normalised advantages, and
minimise the clipped-ratio objective with a k3 KL to the frozen reference model (GRASP Sec. 3.3,
Eq. for ``r_gnd``; DeepSeekMath GRPO; TRL 1.16 ``GRPOTrainer`` for the option names).

``num_iterations`` > 1 reuses a batch's rollouts for that many optimizer steps with the old
log-probs of the sampling policy; the DataModule repeats each batch (``data.repeat_batches``).

A group's shared work (vision encoder, prompt prefill, the prompt part of the policy, old-policy
and reference log-prob forwards) runs once per prompt (``share_prompt``, default; exact, see
:mod:`grasp_lightning.rollout`); ``share_prompt: false`` repeats each prompt K times like TRL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from grasp_lightning import grpo
from grasp_lightning.data.collate import Batch
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.generation import Completions, sample_completions
from grasp_lightning.parsing import extract_answer, extract_participants, reasoning_text
from grasp_lightning.rewards import REWARDS, compute_rewards, grounding_precision_recall
from grasp_lightning.rollout import (
    completion_logps,  # noqa: F401 (re-exported: the naive scoring of repeated rows)
    prompt_tokens_forwarded,
    repeat_prompts,
    score_completions,
    sharing_unsupported_reason,
)
from grasp_lightning.task import Task, TaskOutput

log = logging.getLogger(__name__)

ADVANTAGES = ("group", "batch", "released", "none")


@dataclass
class Rollout:
    """The K completions of each prompt in a batch, scored, and the tensors the loss needs.

    Shapes: ``N = B * K`` rows, ``Lp`` prompt and ``Lc`` completion tokens.

    Attributes:
        prompt: model inputs of the ``B`` prompts (left-padded ``(B, Lp)``, vision inputs once).
        shared: the group's prompt work is shared (see :mod:`grasp_lightning.rollout`), else naive rows.
        completions: the sampled completions (``ids`` ``(N, Lc)``, ``mask`` ``(N, Lc)``).
        terms: ``(N, T)`` reward terms; ``rewards``: ``(N,)`` weighted sum.
        advantages: ``(N,)``; ``old_logp``/``ref_logp``: ``(N, Lc)`` or ``None``.
        zero_variance: ``(B,)`` bool, groups whose rewards are all equal.
        indices: dataset indices of the B prompts (to recognise a repeated batch).
        iterations_left: optimizer steps this rollout may still serve.
        rollout_seconds: wall time of sampling, rewards and the old/reference log-probs.
        prompt_tokens: prompt tokens run through the language model by the rollout (generation and
            old/reference scoring, padding included).
    """

    prompt: dict[str, torch.Tensor]
    shared: bool
    completions: Completions
    terms: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    zero_variance: torch.Tensor
    indices: list[int]
    iterations_left: int
    rollout_seconds: float
    prompt_tokens: int = 0


def repeat_video_inputs(inputs: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Repeat each prompt's rows and vision patches K times (naive rows).

    Kept for callers of the old name; see :func:`grasp_lightning.rollout.repeat_prompts`.
    """
    return repeat_prompts(inputs, k)


class GRPOTask(Task):
    """GRPO with a weighted list of reward terms (SGR when ``social_grounding`` is among them).

    Sampling settings (K, temperature, top-p, budget) come from ``model.rollout``
    (:class:`grasp_lightning.module.RolloutConfig`), so ``configs/demo.yaml`` can shrink them for
    any recipe.

    Args:
        rewards: reward term names from :data:`grasp_lightning.rewards.REWARDS`.
        reward_weights: one weight per term (SGR recipe: 1.0, 0.1, 0.05, 0.2).
        advantage: ``group`` (r − mean) / (std + eps) per group (paper); ``batch`` (std over the
            batch); ``released`` (each term mean-centred per group, then weighted: released code);
            ``none`` (centred, not scaled).
        advantage_eps: the eps of the std division (TRL: 1e-4).
        advantage_clip: clip advantages to ±this (released recipe: 5), ``None`` for no clip.
        epsilon: lower clip range of the ratio.
        epsilon_high: upper clip range (``None``: same as ``epsilon``).
        beta: KL coefficient (recipe: 0.05); 0 skips the reference model entirely.
        loss_type: ``grpo``, ``bnpo``, ``dapo`` or ``dr_grpo`` (see :func:`grasp_lightning.grpo.grpo_loss`).
        num_iterations: optimizer steps per rollout (needs ``data.repeat_batches`` equal to it).
        drop_zero_variance_groups: leave groups whose rewards are all equal out of the loss
            (their advantages are 0; with ``beta > 0`` they would still pull towards the reference).
        overlong_buffer: soft overlong penalty over the last this-many tokens of the budget
            (released recipe: 256), ``None`` for none.
        overlong_penalty: the penalty at the budget's end (linear from 0 at the buffer start).
        share_prompt: encode each group's clip and prefill its prompt once for sampling and for the
            policy/old/reference scoring (exact; :mod:`grasp_lightning.rollout`). ``False`` repeats
            every prompt K times as separate rows, like TRL (for ablations). Models or prompts
            where sharing is not exact fall back to the naive rows with a warning.
    """

    data_mode = "rl"

    def __init__(self, rewards: list[str] | None = None, reward_weights: list[float] | None = None,
                 advantage: str = "group", advantage_eps: float = 1e-4, advantage_clip: float | None = None,
                 epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.05,
                 loss_type: str = "grpo", num_iterations: int = 1, drop_zero_variance_groups: bool = False,
                 overlong_buffer: int | None = None, overlong_penalty: float = 1.0,
                 share_prompt: bool = True) -> None:
        self.rewards = list(rewards or ["accuracy", "format"])
        self.reward_weights = list(reward_weights or [1.0] * len(self.rewards))
        if len(self.rewards) != len(self.reward_weights):
            raise GraspConfigError(f"{len(self.rewards)} rewards but {len(self.reward_weights)} reward_weights")
        unknown = [r for r in self.rewards if r not in REWARDS]
        if unknown:
            raise GraspConfigError(f"unknown rewards {unknown}; known: {sorted(REWARDS)}")
        if advantage not in ADVANTAGES:
            raise GraspConfigError(f"advantage must be one of {ADVANTAGES}, got {advantage!r}")
        if loss_type not in grpo.LOSS_TYPES:
            raise GraspConfigError(f"loss_type must be one of {grpo.LOSS_TYPES}, got {loss_type!r}")
        if num_iterations < 1:
            raise GraspConfigError("num_iterations must be >= 1")
        self.num_generations = 8
        self.temperature = 1.0
        self.max_new_tokens = 1024
        self.advantage = advantage
        self.advantage_eps = advantage_eps
        self.advantage_clip = advantage_clip
        self.epsilon = epsilon
        self.epsilon_high = epsilon_high
        self.beta = beta
        self.loss_type = loss_type
        self.num_iterations = num_iterations
        self.drop_zero_variance_groups = drop_zero_variance_groups
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty = overlong_penalty
        self.share_prompt = share_prompt
        self._warned_no_sharing = False
        self._cached: Rollout | None = None
        self.zero_variance_groups_total = 0
        self.rows_without_participants_total = 0

    @property
    def needs_reference(self) -> bool:
        """A reference model is only needed when the KL term is on."""
        return self.beta != 0.0

    def setup(self, module) -> None:
        """Read the rollout settings from the module and check the data repeats batches as needed.

        Raises:
            GraspConfigError: K < 2, or ``data.repeat_batches`` differs from ``num_iterations``.
        """
        cfg = module.rollout_cfg
        if cfg.num_generations < 2:
            raise GraspConfigError("model.rollout.num_generations must be >= 2: a group of one has no advantage")
        self.num_generations = cfg.num_generations
        self.temperature = cfg.temperature
        self.max_new_tokens = cfg.max_new_tokens
        dm = getattr(getattr(module, "trainer", None), "datamodule", None) if module._trainer else None
        repeat = getattr(getattr(dm, "hparams", None), "repeat_batches", 1)
        if repeat != self.num_iterations:
            raise GraspConfigError(f"task num_iterations={self.num_iterations} needs data.repeat_batches="
                                   f"{self.num_iterations}, got {repeat}")

    # ------------------------------------------------------------------ rollouts
    def advantages(self, terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted rewards ``(N,)`` and advantages ``(N,)`` from reward terms ``(N, T)``."""
        weights = torch.tensor(self.reward_weights, dtype=terms.dtype, device=terms.device)
        rewards = terms @ weights
        k = self.num_generations
        if self.advantage == "released":
            adv = grpo.released_advantages(terms, weights, k)
        else:
            adv = grpo.group_advantages(rewards, k, scale={"none": "none"}.get(self.advantage, self.advantage),
                                        eps=self.advantage_eps)
        return rewards, grpo.clip_advantages(adv, self.advantage_clip)

    def overlong(self, lengths: torch.Tensor) -> torch.Tensor:
        """Soft overlong penalty ``(N,)`` (≤ 0) for completion lengths in tokens (DAPO Eq. 13)."""
        if not self.overlong_buffer:
            return torch.zeros_like(lengths, dtype=torch.float32)
        start = self.max_new_tokens - self.overlong_buffer
        return -self.overlong_penalty * ((lengths.float() - start) / self.overlong_buffer).clamp(0, 1)

    @torch.no_grad()
    def rollout(self, module, batch: Batch) -> Rollout:
        """Sample K completions per prompt, score them and compute advantages and reference log-probs."""
        t0 = time.perf_counter()
        k = self.num_generations
        policy = module.policy
        was_training = policy.training
        policy.eval()
        cfg = module.rollout_cfg
        prompt = {name: v for name, v in batch.inputs.items() if name != "labels"}
        share = self._share(policy, prompt)
        completions = sample_completions(
            policy, module.tokenizer, prompt, num_return_sequences=k, max_new_tokens=cfg.max_new_tokens,
            do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            stop_strings=("</answer>",) if cfg.stop_at_answer else (), share_prompt=share)
        policy.train(was_training)
        prompt_tokens = prompt_tokens_forwarded(prompt, k, share, generation=True)
        items = [item for item in batch.items for _ in range(k)]
        terms = compute_rewards(completions.texts, items, self.rewards).to(completions.ids.device)
        rewards, adv = self.advantages(terms)
        penalty = self.overlong(completions.mask.sum(1)).to(rewards.device)
        if self.overlong_buffer:
            rewards = rewards + penalty
            adv = grpo.clip_advantages(adv + grpo.group_advantages(penalty, k, scale="none"), self.advantage_clip)
        zero_var = grpo.zero_variance_groups(rewards, k)
        old_logp = None
        if self.num_iterations > 1:
            old_logp, _ = score_completions(policy, prompt, completions.ids, completions.mask, k, self.temperature,
                                            share)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        ref_logp = None
        if self.beta != 0.0:
            with module.reference() as ref:
                ref_logp, _ = score_completions(ref, prompt, completions.ids, completions.mask, k, self.temperature,
                                                share)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        return Rollout(prompt=prompt, shared=share, completions=completions, terms=terms, rewards=rewards,
                       advantages=adv, old_logp=old_logp, ref_logp=ref_logp, zero_variance=zero_var,
                       indices=list(batch.indices), iterations_left=self.num_iterations,
                       rollout_seconds=time.perf_counter() - t0, prompt_tokens=prompt_tokens)

    def _share(self, model, prompt: dict[str, torch.Tensor]) -> bool:
        """Whether this batch's group work is shared: asked for and exact for this model and these prompts."""
        if not self.share_prompt:
            return False
        reason = sharing_unsupported_reason(model, prompt)
        if reason is not None and not self._warned_no_sharing:
            log.warning("GRPO share_prompt: falling back to repeated prompt rows: %s", reason)
            self._warned_no_sharing = True
        return reason is None

    def _get_rollout(self, module, batch: Batch) -> Rollout:
        cached = self._cached
        if cached is not None and cached.iterations_left > 0 and cached.indices == list(batch.indices):
            return cached
        self._cached = self.rollout(module, batch)
        return self._cached

    # ------------------------------------------------------------------ objective
    def training_step(self, module, batch: Batch) -> TaskOutput:
        """Rollouts (or the cached ones), then the clipped GRPO loss with the k3 KL."""
        ro = self._get_rollout(module, batch)
        fresh = ro.iterations_left == self.num_iterations
        ro.iterations_left -= 1
        t0 = time.perf_counter()
        mask = ro.completions.mask.clone()
        if self.drop_zero_variance_groups:
            mask &= ~ro.zero_variance.repeat_interleave(self.num_generations)[:, None]
        logp, entropy = score_completions(module.policy, ro.prompt, ro.completions.ids, ro.completions.mask,
                                          self.num_generations, self.temperature, ro.shared)
        num_items = None
        if self.loss_type == "dapo":
            num_items = module.trainer.strategy.reduce(mask.sum().float(), reduce_op="mean") if module._trainer \
                else mask.sum().float()
        loss, lm = grpo.grpo_loss(logp, ro.old_logp, ro.ref_logp, ro.advantages, mask, epsilon=self.epsilon,
                                  epsilon_high=self.epsilon_high, beta=self.beta, loss_type=self.loss_type,
                                  max_completion_length=self.max_new_tokens, num_items_in_batch=num_items)
        metrics = self.metrics(batch, ro, lm, entropy, mask)
        metrics["time/scoring_s"] = time.perf_counter() - t0
        prompt_tokens = prompt_tokens_forwarded(ro.prompt, self.num_generations, ro.shared)
        if fresh:
            metrics["time/rollout_s"] = ro.rollout_seconds
            prompt_tokens += ro.prompt_tokens
            metrics["tokens/generated"] = float(ro.completions.mask.sum())
        metrics["tokens/prompt_forwarded"] = float(prompt_tokens)
        metrics["rollout/shared_prompt"] = float(ro.shared)
        kl_tokens = None
        if ro.ref_logp is not None:
            kl_tokens = grpo.k3_kl(logp.detach(), ro.ref_logp)[mask.bool()]
        extras = {"completions": ro.completions.texts, "terms": ro.terms, "reward_names": self.rewards,
                  "rewards": ro.rewards, "advantages": ro.advantages, "items": batch.items,
                  "num_generations": self.num_generations, "kl_tokens": kl_tokens,
                  "entropy_tokens": entropy[mask.bool()]}
        return TaskOutput(loss=loss, metrics=metrics, extras=extras)

    def metrics(self, batch: Batch, ro: Rollout, lm: dict, entropy: torch.Tensor, mask: torch.Tensor) -> dict:
        """Per-step metrics: reward terms, advantages, KL, clipping, lengths, zero-variance groups, grounding."""
        m: dict[str, torch.Tensor | float] = {}
        for j, name in enumerate(self.rewards):
            m[f"rewards/{name}/mean"] = ro.terms[:, j].mean()
            m[f"rewards/{name}/std"] = ro.terms[:, j].std(unbiased=False)
        m["reward/mean"] = ro.rewards.mean()
        m["reward/std"] = ro.rewards.std(unbiased=False)
        m["advantage/mean"] = ro.advantages.mean()
        m["advantage/std"] = ro.advantages.std(unbiased=False)
        m["advantage/max"] = ro.advantages.max()
        m["advantage/min"] = ro.advantages.min()
        m["kl"] = lm.get("kl_mean", torch.tensor(0.0))
        m["clip_ratio"] = lm["clip_ratio"]
        m["clip_ratio/low"] = lm["clip_ratio_low"]
        m["clip_ratio/high"] = lm["clip_ratio_high"]
        m["entropy"] = (entropy * mask).sum() / mask.sum().clamp(min=1)
        lengths = ro.completions.mask.sum(1).float()
        m["completion_length/mean"] = lengths.mean()
        m["completion_length/max"] = lengths.max()
        m["completion_length/truncated_fraction"] = ro.completions.truncated.float().mean()
        n_zero = int(ro.zero_variance.sum())
        self.zero_variance_groups_total += n_zero
        m["zero_variance_groups/fraction"] = n_zero / max(1, ro.zero_variance.numel())
        m["zero_variance_groups/count"] = float(n_zero)
        precisions, recalls, no_gt = [], [], 0
        for text, item in zip(ro.completions.texts, [it for it in batch.items for _ in range(self.num_generations)]):
            gt = item.participants
            if not gt:
                no_gt += 1
                continue
            p, r = grounding_precision_recall(extract_participants(reasoning_text(text)), gt)
            precisions.append(p)
            recalls.append(r)
        if precisions:
            m["grounding/precision"] = sum(precisions) / len(precisions)
            m["grounding/recall"] = sum(recalls) / len(recalls)
        rows_no_gt = no_gt // self.num_generations
        self.rows_without_participants_total += rows_no_gt
        m["grounding/rows_without_participants"] = float(rows_no_gt)
        parsed = [extract_answer(t) is not None for t in ro.completions.texts]
        m["answer/parsed_fraction"] = sum(parsed) / len(parsed)
        return m
