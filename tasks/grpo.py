"""GRPO task with configurable rewards: plain GRPO (accuracy + format) or GRPO-SGR (GRASP stage 2).

Per rollout batch (the B·A prompts of an accumulation window): sample K completions per prompt (a
group), score every completion with the configured reward terms, turn the weighted sum into group-normalised advantages, and
minimise the clipped-ratio objective with a k3 KL to the frozen reference model (GRASP Sec. 3.3,
Eq. for ``r_gnd``; DeepSeekMath GRPO; TRL 1.16 ``GRPOTrainer`` for the option names).

**Rollout batches.** The prompts of a whole accumulation window (``batch.window``,
:mod:`grasp_lightning.data.windows`) are sampled at its first micro-batch in *one* generation call
per rank (``B·A`` prompts × K, each prompt prefilled once and its cache expanded K times), scored
once (old/reference log-probs) and cached; the optimizer then runs over the ``A`` micro-batches of
those rollouts (TRL 1.16 ``generation_batch_size``/``steps_per_generation``; verl's rollout batch vs
PPO micro-batch). ``batching.rollout_batch_prompts`` caps the prompts per generation call (whole
micro-batches per call; ``B`` gives the old per-micro-batch sampling). The ``dapo`` normaliser (loss
tokens of the window over all ranks, TRL's ``num_items_in_batch``) and the ``batch`` advantage std
(all ranks' rewards) are known before the first loss. The cache is checkpointed
(:meth:`GRPOTask.state_dict`), so a run resumed inside a window continues with the same samples; a
checkpoint at the end of a window's last use holds no rollouts (nothing would reuse them), and none
holds vision features (data-derived; the restored prompts are encoded again at their first forward).

**Dynamic sampling** (DAPO Sec. 3.2, ``batching.dynamic_sampling``): ``off``; ``drop`` masks groups whose rewards are all equal out
of the loss's numerator; ``refill`` also draws further windows of prompts from the data stream
(``Window.draw``: the next windows the loader would have yielded, consumed) and samples them until the
rollout batch holds as many groups with distinct rewards as the window has prompts, at most
``batching.max_resample`` draws. The rollout batch is then trimmed to the window's prompt count (DAPO, verl):
the first useful groups in sampling order, then, if the budget ran out, masked degenerate groups
(:func:`grasp_lightning.grpo.rollouts.refill_selection`), split evenly over the window's non-empty micro-batches
(never more than ``B`` prompts in one). Useful groups drawn beyond that are *drawn and unused*: sampled
and scored (their rewards count in ``dynamic_sampling/reward_mean_tried``), not trained, not returned to
the stream, and counted in ``dynamic_sampling/groups_unused``. In that sense no prompt is lost or seen
twice within the epoch: each is yielded or drawn exactly once, and each drawn one is trained or counted.
Every rank draws when any rank is short, so the streams of all ranks stay aligned; a rank whose whole
window was skipped draws too (its draws are all unused) and joins every collective. Drawn windows are
not yielded again, so the epoch runs ``A·num_iterations`` micro-batches fewer per drawn window than
``len()`` of the loader (and the LR schedule) expects; the loader logs the count at the epoch's end (see
:mod:`grasp_lightning.data.windows` for a schedule given in steps). ``loss.num_iterations`` > 1 reuses a window's rollouts for that many optimizer
steps with the old log-probs of the sampling policy: the DataModule yields each window that many
times (``w0 … w(A-1)`` then again), so every reuse comes after an optimizer step.

**Overlap** (``model.rollout.overlap: 1``, vLLM engine): the next window is sampled by the server while
this one trains, one step stale (:mod:`grasp_lightning.grpo.overlap`); ``num_iterations > 1`` and
``refill`` are refused with it, and the importance-sampling correction is always on.

**Metrics** are the optimizer step's: each micro-batch returns its parts (means with their counts,
sums; :mod:`grasp_lightning.step_metrics`), the sampling figures come once per rollout batch from
:meth:`GRPOTask.prepare`, and the module reduces them over the window and the ranks once per step
(``docs/metrics.md`` lists every tag).

A group's shared work (vision encoder, prompt prefill, the prompt part of the policy, old-policy
and reference log-prob forwards) runs once per prompt (``compute.share_prompt``, default; exact, see
:mod:`grasp_lightning.grpo.scoring`); ``false`` repeats each prompt K times like TRL.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from typing_extensions import override

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.formats import persons_shown
from grasp_lightning.data.records import GraspItem
from grasp_lightning.engines import engine_of
from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.config import (  # noqa: F401 (the value lists are re-exported)
    ADVANTAGES,
    DYNAMIC_SAMPLING,
    KEY,
    OVERLONG_MODES,
    AdvantageConfig,
    BatchingConfig,
    ComputeConfig,
    LossConfig,
    RewardConfig,
)
from grasp_lightning.grpo.overlap import DEFAULT_OVERLAP_CAP, RolloutPrefetch, check_overlap
from grasp_lightning.grpo.rewards import compute_rewards, enumerates, grounding_precision_recall, resolve_reward
from grasp_lightning.grpo.rollouts import (  # noqa: F401 (Rollout and the helpers are re-exported)
    ROW_TENSORS,
    TOKEN_TENSORS,
    Rollout,
    cat_rollouts,
    even_split,
    merge_batches,
    refill_selection,
    rollout_from_state,
    rollout_state,
    take_completion,
    take_groups,
)
from grasp_lightning.grpo.scoring import (
    completion_logps,  # noqa: F401 (re-exported: the naive scoring of repeated rows)
    prompt_tokens_forwarded,
    score_completions,
    sharing_unsupported_reason,
)
from grasp_lightning.grpo.vision import VisionFeatures, reuse_vision
from grasp_lightning.parsing import extract_answer, extract_participants, reasoning_text
from grasp_lightning.step_metrics import Max, Mean, Min, RankMean, Std, Sum, combine
from grasp_lightning.task import RolloutRecord, Task, TaskContext, TaskOutput

log = logging.getLogger(__name__)

#: :meth:`GRPOTask.step_warnings` warns at or above these step values: every completion cut off at the budget
#: (``completion_length/truncated_fraction``), every group with equal rewards (``zero_variance_groups/fraction``).
#: docs/metrics.md's "What healthy looks like" states them (``tests/test_healthy_ranges.py`` checks they agree).
WARN_TRUNCATED_FRACTION = 1.0
WARN_ZERO_VARIANCE_FRACTION = 1.0


class GRPOTask(Task):
    """GRPO with a weighted list of reward terms (SGR when ``social_grounding`` is among them).

    Sampling settings (K, temperature, top-p, budget) are read, when needed, from the context's
    ``model.rollout`` (:class:`grasp_lightning.engines.decoding.RolloutConfig`, ``ctx.rollout_cfg``), never
    copied, so ``configs/demo.yaml`` can shrink them for any recipe. The task's own settings come in
    groups (:mod:`grasp_lightning.grpo.config`), each kept as the attribute of its name
    (``task.loss.beta``).

    Args:
        reward: the reward: weighted reward terms, and DAPO's soft overlong penalty (off by default).
        advantage: how rewards become advantages: the group normalisation and the clip.
        loss: the clipped objective: loss type, clip range, KL coefficient, rollout reuse, sampler correction.
        batching: dynamic sampling (groups whose rewards are all equal) and prompts per generation call.
        compute: exact savings of time and memory: shared prompts, vision encoded once, chunked log-probs.

    Raises:
        GraspConfigError: two reward terms share a metric name; the groups' own checks (the message
            names the key, e.g. ``model.task.init_args.loss.num_iterations``).
    """

    data_mode = "rl"

    def __init__(self, reward: RewardConfig = RewardConfig(), advantage: AdvantageConfig = AdvantageConfig(),  # noqa: B008
                 loss: LossConfig = LossConfig(), batching: BatchingConfig = BatchingConfig(),  # noqa: B008
                 compute: ComputeConfig = ComputeConfig()) -> None:  # noqa: B008 (the groups are copied below)
        _check_groups(reward=(reward, RewardConfig), advantage=(advantage, AdvantageConfig), loss=(loss, LossConfig),
                      batching=(batching, BatchingConfig), compute=(compute, ComputeConfig))
        self.reward = dataclasses.replace(reward)
        self.advantage = dataclasses.replace(advantage)
        self.loss = dataclasses.replace(loss)
        self.batching = dataclasses.replace(batching)
        self.compute = dataclasses.replace(compute)
        # resolved and checked here (grasp_lightning.grpo.rewards.resolve_reward): a bad entry fails at start-up
        self.reward_terms = [resolve_reward(entry, key=KEY + "reward.terms") for entry in self.reward.terms]
        labels = [term.label for term in self.reward_terms]
        if len(set(labels)) != len(labels):
            raise GraspConfigError(f"{KEY}reward.terms: two terms share a metric name in {labels} "
                                   f"(entries {self.reward.terms}); give the functions distinct names")
        self.reward_labels = labels
        self.reward_weights = self.reward.term_weights  # resolved: one per term
        self.dynamic_sampling = self.batching.dynamic_sampling  # off, drop or refill
        self._warned_no_sharing = False
        self._window_rollouts: list[Rollout | None] = []  # the current window's rollouts, by position
        self._window_key: tuple | None = None  # (window index, dataset indices of its micro-batches)
        self._window_tokens = torch.tensor(0.0)  # loss tokens of the window over all ranks
        self._ready: tuple | None = None  # the micro-batch prepare() ran for
        self._progress: tuple[int, int, int] | None = None  # (position, iteration, A) of the last micro-batch prepared
        self._window_stats: dict[str, float] = {}  # the rollout batch's sampling figures (logged once)
        self._restored = False  # the cache came from a checkpoint: prompts and items still to attach
        self.zero_variance_groups_total = 0
        self.rows_without_participants_total = 0
        self.prefetch = RolloutPrefetch()  # model.rollout.overlap: the next window's request in flight
        self._num_generations = 0  # model.rollout.num_generations, known from check_settings (micro_batch: rollout)

    window_batches = True  # rollouts are sampled per accumulation window (batch.window)
    samples_rollouts = True

    @property
    def shares_prompt(self) -> bool:
        """``compute.share_prompt``: each group's prompt is prefilled once (the memory planner reads this)."""
        return self.compute.share_prompt

    @property
    def num_iterations(self) -> int:
        """Optimizer steps per rollout batch (the module passes it to the DataModule, which yields each window that
        many times): ``loss.num_iterations``; K with ``batching.micro_batch: rollout`` (the window's A x K
        one-completion micro-batches, A per step)."""
        return self._num_generations if self.splits_groups else self.loss.num_iterations

    @property
    def splits_groups(self) -> bool:
        """``batching.micro_batch: rollout``: a micro-batch trains one completion per prompt, and the epoch ends
        after as many micro-batches as the loader has micro-batches of prompts (the module tells the DataModule)."""
        return self.batching.micro_batch == "rollout"

    @property
    def logprob_chunk_size(self) -> int | None:
        """``compute.logprob_chunk_size`` (the memory planner reads this)."""
        return self.compute.logprob_chunk_size

    @property
    def draws_prompts(self) -> bool:
        """``refill`` draws further windows from the data stream (the DataModule records the draws)."""
        return self.dynamic_sampling == "refill"

    @property
    def needs_reference(self) -> bool:
        """A reference model is only needed when the KL term is on."""
        return self.loss.beta != 0.0

    @override
    def check_settings(self, rollout_cfg: RolloutConfig) -> None:
        """The rollout settings are read from the context wherever they are used, never copied.

        With ``model.rollout.overlap: 1`` and no ``importance_sampling_cap``, the cap becomes
        :data:`~grasp_lightning.grpo.overlap.DEFAULT_OVERLAP_CAP` (TRL's default, 2.0): the correction is
        on whenever rollouts are a step stale.

        Raises:
            GraspConfigError: ``model.rollout.num_generations`` < 2; an overlong buffer longer than
                ``model.rollout.max_new_tokens``; ``model.rollout.overlap: 1`` with ``num_iterations > 1`` or
                ``dynamic_sampling: refill`` (:func:`~grasp_lightning.grpo.overlap.check_overlap`).
        """
        self._num_generations = rollout_cfg.num_generations
        if self.splits_groups:
            _check_split(self.loss, self.dynamic_sampling, getattr(rollout_cfg, "overlap", 0))
        if getattr(rollout_cfg, "overlap", 0):
            check_overlap(self.num_iterations, self.dynamic_sampling)
            if self.loss.importance_sampling_cap is None:
                log.info("model.rollout.overlap=1: model.task.init_args.loss.importance_sampling_cap set to %g (unset)",
                         DEFAULT_OVERLAP_CAP)
                self.loss.importance_sampling_cap = DEFAULT_OVERLAP_CAP
        if rollout_cfg.num_generations < 2:
            raise GraspConfigError("model.rollout.num_generations must be >= 2: a group of one has no advantage")
        buffer = self.overlong_buffer_tokens(rollout_cfg.max_new_tokens)
        if buffer is not None and not 0 < buffer <= rollout_cfg.max_new_tokens:
            raise GraspConfigError(f"{KEY}reward.overlong_buffer={buffer} must be in 1 … "
                                   f"model.rollout.max_new_tokens={rollout_cfg.max_new_tokens} (a budget shrunk by "
                                   f"an overlay, e.g. configs/demo.yaml, shrinks reward.overlong_buffer_fraction's "
                                   f"buffer with it)")

    @override
    def setup(self, ctx: TaskContext) -> None:
        """Check the context's rollout settings again (a context may differ from the module's)."""
        self.check_settings(ctx.rollout_cfg)

    # ------------------------------------------------------------------ rollouts
    def advantages(self, terms: torch.Tensor, penalty: torch.Tensor | None = None,
                   batch_std: torch.Tensor | None = None, *, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted rewards ``(N,)`` and advantages ``(N,)`` from reward terms ``(N, T)``.

        Args:
            terms: ``(N, T)`` reward terms, ``N = B * k`` rows, group-major.
            penalty: ``(N,)`` overlong penalty (≤ 0) or ``None``. ``reward.overlong_mode: reward`` adds it to
                the reward before the normalisation (with ``advantage.kind: released``, which centres each
                term, it is centred like a term of weight 1); ``released`` adds it, raw, to the advantage.
            batch_std: the std of ``advantage.kind: batch`` (over every rank's rewards), ``None``: local.
            k: completions per prompt (``model.rollout.num_generations``).

        Returns:
            ``(rewards, advantages)``; rewards include the penalty in ``reward`` mode; advantages are
            clipped to ±``advantage.clip`` last.
        """
        weights = torch.tensor(self.reward_weights, dtype=terms.dtype, device=terms.device)
        rewards = terms @ weights
        dapo_penalty = penalty is not None and self.reward.overlong_mode == "reward"
        if dapo_penalty:
            rewards = rewards + penalty
        if self.advantage.kind == "released":
            adv = objective.released_advantages(terms, weights, k)
            if dapo_penalty:
                adv = adv + objective.released_advantages(penalty[:, None], weights.new_ones(1), k)
        else:
            adv = objective.group_advantages(rewards, k, scale=self.advantage.kind, eps=self.advantage.eps, batch_std=batch_std)
        if penalty is not None and self.reward.overlong_mode == "released":
            adv = adv + penalty
        return rewards, objective.clip_advantages(adv, self.advantage.clip)

    def overlong_buffer_tokens(self, max_new_tokens: int) -> int | None:
        """The overlong buffer in tokens under a budget of ``max_new_tokens``: ``overlong_buffer``, or
        ``overlong_buffer_fraction`` of the budget (rounded down, at least 1), or ``None`` (no penalty)."""
        if self.reward.overlong_buffer_fraction is not None:
            return max(1, int(self.reward.overlong_buffer_fraction * max_new_tokens))
        return self.reward.overlong_buffer or None

    def overlong(self, lengths: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Soft overlong penalty ``(N,)`` (≤ 0) for completion lengths in tokens (DAPO Eq. 13) under a
        budget of ``max_new_tokens`` (``model.rollout.max_new_tokens``)."""
        return objective.overlong_penalty(lengths, max_new_tokens, self.overlong_buffer_tokens(max_new_tokens),
                                     self.reward.overlong_penalty)

    @torch.no_grad()
    def rollout(self, ctx: TaskContext, batch: Batch) -> Rollout:
        """Sample K completions per prompt, score them and compute advantages and reference log-probs."""
        t0 = time.perf_counter()
        policy = ctx.policy
        was_training = policy.training
        policy.eval()
        prompt, share, vision = self.prompt_inputs(ctx, batch)
        engine = engine_of(ctx)
        with reuse_vision(policy, vision):  # the sampling prefill encodes the clips into ``vision``
            completions = engine.sample(policy, ctx.tokenizer, prompt, ctx.rollout_cfg, share_prompt=share,
                                        policy_version=getattr(ctx, "policy_version", 0))
        policy.train(was_training)
        return self.score_rollout(ctx, batch, prompt, share, vision, completions, t0=t0,
                                  generation_seconds=time.perf_counter() - t0,
                                  weight_sync_seconds=engine.weight_sync_seconds)

    def prompt_inputs(self, ctx: TaskContext, batch: Batch) -> tuple[dict, bool, VisionFeatures | None]:
        """The batch's prompt inputs, whether its group work is shared, and the store of its vision features."""
        prompt = {name: v for name, v in batch.inputs.items() if name != "labels"}
        vision = VisionFeatures.for_model(ctx.policy) if self.compute.encode_vision_once else None
        return prompt, self._share(ctx.policy, prompt), vision

    @torch.no_grad()
    def score_rollout(self, ctx: TaskContext, batch: Batch, prompt: dict, share: bool, vision, completions, *,
                      t0: float, generation_seconds: float, weight_sync_seconds: float) -> Rollout:
        """Rewards, advantages, and the old-policy (trainer's own, now) and reference log-probs of sampled
        ``completions`` of ``batch``'s prompts; ``t0`` is when the rollout started (``perf_counter``)."""
        cfg = ctx.rollout_cfg
        k = cfg.num_generations
        policy = ctx.policy
        t1 = time.perf_counter()
        prompt_tokens = prompt_tokens_forwarded(prompt, k, share, generation=True)
        items = [item for item in batch.items for _ in range(k)]
        terms = compute_rewards(completions.texts, items, self.reward_terms,
                                opened_think=completions.prompt_opened_think or False).to(completions.ids.device)
        penalty = (self.overlong(completions.mask.sum(1), cfg.max_new_tokens).to(terms.device)
                   if self.overlong_buffer_tokens(cfg.max_new_tokens) else None)
        rewards, adv = self.advantages(terms, penalty, k=k)  # advantage: batch is redone by prepare() with all ranks
        zero_var = objective.zero_variance_groups(rewards, k)
        t2 = time.perf_counter()
        loss_mask = completions.mask.clone()
        if self.dynamic_sampling != "off":
            loss_mask &= ~zero_var.repeat_interleave(k)[:, None]
        old_logp = None
        if self.loss.num_iterations > 1 or (self.loss.importance_sampling_cap is not None and completions.sampled_logp is not None):
            old_logp, _ = score_completions(policy, prompt, completions.ids, completions.mask, k, cfg.temperature,
                                            share, self.compute.logprob_chunk_size, vision)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        ref_logp = None
        if self.loss.beta != 0.0:
            with ctx.reference() as ref:
                ref_logp, _ = score_completions(ref, prompt, completions.ids, completions.mask, k, cfg.temperature,
                                                share, self.compute.logprob_chunk_size, vision)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        return Rollout(prompt=prompt, shared=share, completions=completions, terms=terms, rewards=rewards,
                       advantages=adv, old_logp=old_logp, ref_logp=ref_logp, zero_variance=zero_var,
                       indices=list(batch.indices), rollout_seconds=time.perf_counter() - t0,
                       prompt_tokens=prompt_tokens, penalty=penalty, loss_mask=loss_mask, items=list(batch.items),
                       generation_seconds=generation_seconds, reward_seconds=t2 - t1,
                       logp_seconds=time.perf_counter() - t2, sampled_logp=completions.sampled_logp,
                       weight_sync_seconds=weight_sync_seconds, vision=vision)

    def _share(self, model, prompt: dict[str, torch.Tensor]) -> bool:
        """Whether this batch's group work is shared: asked for and exact for this model and these prompts."""
        if not self.compute.share_prompt:
            return False
        reason = sharing_unsupported_reason(model, prompt)
        if reason is not None and not self._warned_no_sharing:
            log.warning("GRPO share_prompt: falling back to repeated prompt rows: %s", reason)
            self._warned_no_sharing = True
        return reason is None

    @staticmethod
    def _window_of(batch: Batch) -> tuple[list[Batch], int, int, int]:
        """``(batches, position, iteration, index)`` of the micro-batch's window (a window of one without)."""
        w = batch.window
        return ([batch], 0, 0, -1) if w is None else (w.batches, w.position, w.iteration, w.index)

    def prepare(self, ctx: TaskContext, batch: Batch) -> dict | None:
        """At a window's first use: sample its rollout batch (:meth:`sample_window`), then one all-reduce
        of ``[loss tokens, n, Σ r, Σ r²]`` over ranks (``ctx.cross_rank``) for the ``dapo``
        normaliser and the ``batch`` advantage std. Runs on every rank at the same micro-batches
        (windows line up across ranks), also where the micro-batch or the whole window is empty.

        Returns:
            the rollout batch's figures (:meth:`sampling_metrics`) when it sampled one, else ``None``.
        """
        batches, position, iteration, index = self._window_of(batch)
        key = (index, tuple(tuple(b.indices) for b in batches))
        self._ready = (id(batch), id(batch.window))
        self._progress = (position, iteration, len(batches))
        if (iteration > 0 or position > 0) and key == self._window_key:
            if not self._restored or self._attach(ctx, batch.window, batches):
                return
        if iteration > 0 or position > 0:
            log.warning("GRPO: window %d (iteration %d) has no cached rollouts (resumed inside a window from a "
                        "checkpoint without them?); sampling them again", index, iteration)
        device = ctx.device
        self._window_rollouts = self.sample_window(ctx, [b.to(device) for b in batches], batch.window)
        self._window_key, self._restored = key, False
        self._window_normaliser(ctx, device)
        return self.sampling_metrics()

    def _window_normaliser(self, ctx: TaskContext, device) -> None:
        """One all-reduce of ``[loss tokens, n, Σ r, Σ r²]`` of the window over ranks: the ``dapo``
        normaliser and, for ``advantage: batch``, the advantages redone with every rank's reward std."""
        rollouts = [ro for ro in self._window_rollouts if ro is not None]
        tokens = sum((ro.loss_mask.sum().double() for ro in rollouts), torch.zeros((), dtype=torch.float64))
        rewards = torch.cat([ro.rewards.double().cpu() for ro in rollouts]) if rollouts else torch.zeros(0)
        local = torch.cat([tokens.reshape(1).cpu(), objective.reward_moments(rewards)]).to(device)
        total = ctx.cross_rank.sum(local).cpu()
        self._window_tokens = total[0]
        if self.advantage.kind == "batch":
            std = objective.std_from_moments(total[1:])
            for ro in rollouts:
                ro.rewards, ro.advantages = self.advantages(ro.terms, ro.penalty, batch_std=std,
                                                            k=ctx.rollout_cfg.num_generations)

    def sampling_metrics(self) -> dict:
        """The figures of the rollout batch just sampled (:meth:`sample_window`), as step metrics: this rank's
        seconds (:class:`RankMean`), generated and prompt tokens, generation calls (:class:`Sum`) and, with
        ``dynamic_sampling``, the groups tried and kept; with ``refill`` also the draws, the groups dropped
        and drawn-but-unused, and the reward over every group tried. Names that would repeat another series
        are left out: with ``drop`` every group tried is trained (its reward is ``reward/mean``, its dropped
        groups ``zero_variance_groups/count``), and ``off`` has nothing to report."""
        st = self._window_stats
        m: dict = {"time/rollout_s": RankMean(st["rollout_s"]), "time/generation_s": RankMean(st["generation_s"]),
                   "time/rewards_s": RankMean(st["rewards_s"]), "time/logp_s": RankMean(st["logp_s"]),
                   "time/weight_sync_s": RankMean(st.get("weight_sync_s", 0.0)),
                   "tokens/generated": Sum(st["generated_tokens"]), "tokens/prompt_forwarded": Sum(st["prompt_tokens"]),
                   "rollout/generation_calls": Sum(st["generation_calls"]),
                   "rollout/sequences_per_call": Mean(st["sequences"], st["generation_calls"])}
        if self.dynamic_sampling != "off":
            m["dynamic_sampling/groups_tried"] = Sum(st["groups_tried"])
            m["dynamic_sampling/groups_kept"] = Sum(st["groups_kept"])
        if self.dynamic_sampling == "refill":
            m["dynamic_sampling/groups_dropped"] = Sum(st["groups_dropped"])
            m["dynamic_sampling/groups_unused"] = Sum(st["groups_unused"])
            m["dynamic_sampling/resample_tries"] = Max(st["resample_tries"])
            m["dynamic_sampling/reward_mean_tried"] = Mean(st["reward_sum_tried"], st["completions_tried"])
        m.update(self.prefetch.metrics())
        return m

    def _chunks(self, batches: list[Batch]) -> list[list[Batch]]:
        """Micro-batches grouped into generation calls of at most ``rollout_batch_prompts`` prompts
        (whole micro-batches, at least one per call); all in one call when it is ``None``."""
        if self.batching.rollout_batch_prompts is None:
            return [batches] if batches else []
        chunks: list[list[Batch]] = []
        for b in batches:
            if chunks and sum(len(x) for x in chunks[-1]) + len(b) <= self.batching.rollout_batch_prompts:
                chunks[-1].append(b)
            else:
                chunks.append([b])
        return chunks

    def _sample(self, ctx: TaskContext, batches: list[Batch], window=None) -> list[Rollout]:
        """One rollout per generation call over the non-empty ``batches``; with ``model.rollout.overlap``
        the window's batch comes from the request submitted a step earlier, and the next window's is
        submitted before this one is scored (:class:`~grasp_lightning.grpo.overlap.RolloutPrefetch`)."""
        def chunked(micro: list[Batch]) -> list[Batch]:
            return [merge_batches(chunk, _pad_id(ctx)) for chunk in self._chunks([b for b in micro if len(b)])]

        if not getattr(ctx.rollout_cfg, "overlap", 0):
            return [self.rollout(ctx, chunk) for chunk in chunked(batches)]
        return self.prefetch.sample(self, ctx, chunked(batches), window, chunked)

    def sample_window(self, ctx: TaskContext, batches: list[Batch], window=None) -> list[Rollout | None]:
        """The rollout batch of a window: sampled in as few generation calls as ``rollout_batch_prompts``
        allows, refilled (``dynamic_sampling: refill``) from ``window.draw()``, then cut into one
        :class:`Rollout` per micro-batch position (``None`` for empty micro-batches).

        Off/drop: position ``i`` gets exactly the prompts of micro-batch ``i``. Refill: the window's prompt
        count of groups (:func:`~grasp_lightning.grpo.rollouts.refill_selection`: useful ones first, masked degenerate
        ones if the budget ran out) split evenly over the non-empty positions
        (:func:`~grasp_lightning.grpo.rollouts.even_split`); none for a window with no prompt on this rank. Collective
        under refill: one ``cross_rank.sum`` per try, on every rank, an empty one included.
        """
        pad = _pad_id(ctx)
        t0 = time.perf_counter()
        ros = self._sample(ctx, batches, window)
        target = sum(len(b) for b in batches)
        tries = 0
        if self.dynamic_sampling == "refill":
            device = ctx.device
            while tries < self.batching.max_resample:
                kept = sum(int((~ro.zero_variance).sum()) for ro in ros)
                short = ctx.cross_rank.sum(torch.tensor([float(kept < target)], device=device))
                if float(short[0]) == 0:
                    break
                extra = window.draw() if window is not None else None
                if extra is None:
                    break
                tries += 1
                ros += self._sample(ctx, [b.to(device) for b in extra])
        positions: list[Rollout | None] = [None] * len(batches)
        stats = {"groups_tried": 0.0, "groups_kept": 0.0, "groups_dropped": 0.0, "groups_unused": 0.0,
                 "resample_tries": float(tries), "reward_sum_tried": 0.0, "completions_tried": 0.0,
                 "generation_calls": 0.0, "sequences": 0.0, "generation_s": 0.0, "rewards_s": 0.0,
                 "logp_s": 0.0, "rollout_s": 0.0, "generated_tokens": 0.0, "prompt_tokens": 0.0, "weight_sync_s": 0.0}
        if ros:
            ro = cat_rollouts(ros, pad)
            live = [i for i, b in enumerate(batches) if len(b)]
            zero = ro.zero_variance.tolist()
            n_useful = ro.num_groups - sum(zero)
            unused = 0
            if self.dynamic_sampling == "refill":
                selected, unused = refill_selection(zero, target)
                sizes = even_split(len(selected), len(live))
            else:
                selected, sizes = list(range(ro.num_groups)), [len(batches[i]) for i in live]
            start = 0
            for i, size in zip(live, sizes):
                positions[i] = take_groups(ro, selected[start:start + size], ctx.rollout_cfg.num_generations)
                start += size
            stats.update(groups_tried=float(ro.num_groups), groups_kept=float(n_useful - unused),
                         groups_unused=float(unused), reward_sum_tried=float(ro.rewards.double().sum()),
                         completions_tried=float(ro.rewards.numel()),
                         groups_dropped=float(ro.num_groups - n_useful) if self.dynamic_sampling != "off" else 0.0,
                         generation_calls=float(ro.generation_calls), sequences=float(ro.completions.ids.shape[0]),
                         generation_s=ro.generation_seconds, rewards_s=ro.reward_seconds, logp_s=ro.logp_seconds,
                         rollout_s=time.perf_counter() - t0, generated_tokens=float(ro.completions.mask.sum()),
                         prompt_tokens=float(ro.prompt_tokens), weight_sync_s=ro.weight_sync_seconds)
        self._window_stats = stats
        return positions

    # ------------------------------------------------------------------ checkpointed cache
    def state_dict(self) -> dict:
        """The current window's rollouts (this rank), so a run resumed inside the window continues with
        the same samples: plain CPU tensors, lists and numbers (``torch.load(weights_only=True)``).
        Nothing derived from the data is stored: prompts and items are re-read from the window's
        micro-batches, or decoded again by dataset index (``Window.fetch``) for drawn prompts, and their
        vision features are encoded again (:meth:`_attach`). After the last micro-batch of the window's
        last use (:meth:`window_done`: a step boundary with ``loss.num_iterations`` 1, or the last
        iteration's) no rollout would be reused, so none is stored; the rollout request in flight
        (``model.rollout.overlap``) is recorded either way."""
        if self._window_key is None or self.window_done:
            return self.prefetch.state_dict()
        index, indices = self._window_key
        return {**self.prefetch.state_dict(), "window_index": int(index), "window_indices": [list(x) for x in indices],
                "window_tokens": float(self._window_tokens), "stats": dict(self._window_stats),
                "rollouts": [None if ro is None else rollout_state(ro) for ro in self._window_rollouts]}

    @property
    def window_done(self) -> bool:
        """True after the last micro-batch of the current window's last use (its last position at iteration
        ``loss.num_iterations - 1``): the next micro-batch opens a new window, so the cache is never reused."""
        if self._progress is None:
            return False
        position, iteration, size = self._progress
        return position == size - 1 and iteration >= self.loss.num_iterations - 1

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the prompts are attached at the window's next micro-batch."""
        if not state:
            return
        self.prefetch.load_state_dict(state)
        if "window_index" not in state:  # saved at the end of a window: nothing to reuse
            return
        self._window_key = (int(state["window_index"]), tuple(tuple(x) for x in state["window_indices"]))
        self._window_tokens = torch.tensor(float(state["window_tokens"]), dtype=torch.float64)
        self._window_stats = dict(state.get("stats", {}))
        self._window_rollouts = [None if r is None else rollout_from_state(r) for r in state["rollouts"]]
        self._restored = True

    def _attach(self, ctx: TaskContext, window, batches: list[Batch]) -> bool:
        """Give restored rollouts their prompts and items (from the micro-batch with the same indices, or
        decoded again by index) and one empty store of vision features for the window (the frozen tower
        encodes each clip again at its first forward and the later ones reuse it, as after sampling);
        ``False`` (resample) where that fails."""
        device = ctx.device
        vision = VisionFeatures.for_model(ctx.policy) if self.compute.encode_vision_once else None
        for i, ro in enumerate(self._window_rollouts):
            if ro is None:
                continue
            source = batches[i] if i < len(batches) and list(batches[i].indices) == ro.indices else None
            if source is None and window is not None:
                source = window.fetch(ro.indices)
            if source is None or list(source.indices) != ro.indices:
                log.warning("GRPO: cannot rebuild the prompts %s of a restored rollout; sampling again", ro.indices)
                return False
            source = source.to(device)
            ro.prompt = {k: v for k, v in source.inputs.items() if k != "labels"}
            ro.items = list(source.items)
            ro.vision = vision
            for name in (*ROW_TENSORS, *TOKEN_TENSORS, "zero_variance"):
                if getattr(ro, name) is not None:
                    setattr(ro, name, getattr(ro, name).to(device))
            c = ro.completions
            c.ids, c.mask, c.truncated = c.ids.to(device), c.mask.to(device), c.truncated.to(device)
        self._restored = False
        return True

    # ------------------------------------------------------------------ objective
    def training_step(self, ctx: TaskContext, batch: Batch) -> TaskOutput:
        """The micro-batch's rollouts (sampled by :meth:`prepare`), then the clipped GRPO loss with the k3 KL.

        Metrics (:meth:`metrics`) are this micro-batch's parts of the step's: means carry their counts
        (completions, groups, loss tokens), so the module's step values are means over the whole step on
        all ranks. Called directly (not through the module), the sampling figures of :meth:`prepare` are
        included."""
        prepared = {}
        if self._ready != (id(batch), id(batch.window)):
            prepared = self.prepare(ctx, batch) or {}  # called directly, not through the module
        self._ready = None
        batches, position, iteration, _ = self._window_of(batch)
        cfg = ctx.rollout_cfg
        k = cfg.num_generations
        count_groups = True
        if self.splits_groups:  # one completion of each prompt of one micro-batch of prompts (take_completion)
            source, completion = self.completion_of(position, iteration, len(batches), k)
            ro = take_completion(self._window_rollouts[source], completion, k)
            k, count_groups = 1, completion == 0
        else:
            ro = self._window_rollouts[position]
        t0 = time.perf_counter()
        mask = ro.loss_mask
        logp, entropy = score_completions(ctx.policy, ro.prompt, ro.completions.ids, ro.completions.mask,
                                          k, cfg.temperature, ro.shared, self.compute.logprob_chunk_size, ro.vision)
        num_items = None
        if self.loss.type == "dapo":
            # TRL's num_items_in_batch / W, divided by A once more: Lightning divides the loss by A (grpo.py).
            num_items = self._window_tokens.float().to(logp.device) / (ctx.cross_rank.world_size * len(batches))
        sampler = self._sampler_correction(logp, ro, mask)
        loss, lm = objective.grpo_loss(logp, ro.old_logp, ro.ref_logp, ro.advantages, mask, epsilon=self.loss.epsilon,
                                  epsilon_high=self.loss.epsilon_high, beta=self.loss.beta, loss_type=self.loss.type,
                                  max_completion_length=cfg.max_new_tokens, num_items_in_batch=num_items,
                                  token_weights=sampler.pop("weights", None), kl_clamp=self.loss.kl_clamp)
        if self.loss.divide_by_num_generations:
            loss = loss / cfg.num_generations
        metrics = self.metrics(batch, ro, lm, entropy, mask, count_groups=count_groups)
        metrics.update(sampler)
        if self.dynamic_sampling != "off" or self.loss.num_iterations > 1:  # else every generated token is a loss token
            metrics["tokens/loss"] = Sum(mask.sum())
        metrics["rollout/iteration"] = float(iteration)
        metrics["rollout/shared_prompt"] = float(ro.shared)
        metrics["tokens/prompt_forwarded"] = Sum(prompt_tokens_forwarded(ro.prompt, k, ro.shared))
        metrics["time/scoring_s"] = RankMean(time.perf_counter() - t0)
        if prepared:
            metrics = combine(prepared, metrics)
        kl_tokens = None
        if ro.ref_logp is not None:
            kl_tokens = objective.k3_kl(logp.detach(), ro.ref_logp, self.loss.kl_clamp)[mask.bool()]
        record = RolloutRecord(completions=ro.completions.texts, items=ro.items or batch.items, num_generations=k,
                               reward_names=list(self.reward_labels), terms=ro.terms, rewards=ro.rewards,
                               advantages=ro.advantages, kl_tokens=kl_tokens, entropy_tokens=entropy[mask.bool()])
        return TaskOutput(loss=loss, metrics=metrics, rollout=record)

    @staticmethod
    def completion_of(position: int, iteration: int, window: int, k: int) -> tuple[int, int]:
        """``batching.micro_batch: rollout``: which micro-batch of prompts of the window, and which of its
        completions, the micro-batch at ``position`` of ``iteration`` trains.

        The window's ``A = window`` micro-batches of prompts are yielded ``K = k`` times (``A x K`` micro-batches);
        the ``f``-th of them (``f = iteration * A + position``) trains completion ``f mod K`` of the prompts of
        micro-batch ``f div K``: prompt-major, as the released ``get_batch_samples`` lists them
        (``socialmllm/train/reasoning/trainer.py:78-90``, ``:138-164``).

        Returns:
            ``(micro-batch of prompts, completion)``, 0-based.
        """
        return divmod(iteration * window + position, k)

    def _sampler_correction(self, logp: torch.Tensor, ro: Rollout, mask: torch.Tensor) -> dict:
        """The sampler's log-probs against the trainer's (where the engine reports them): the gap's metrics
        (TRL's ``sampling/sampling_logp_difference`` and ``sampling/importance_sampling_ratio``) and, with
        ``importance_sampling_cap``, the truncated importance weights ``(N, Lc)`` under ``"weights"``."""
        if ro.sampled_logp is None:
            return {}
        old = (ro.old_logp if ro.old_logp is not None else logp.detach()).float()
        sampled = ro.sampled_logp.to(old.device).float()
        keep = mask.bool()
        if not bool(keep.any()):
            return {}
        diff = (old - sampled)[keep]
        ratio = torch.exp(diff.clamp(-20, 20))
        n = diff.numel()  # the loss tokens: means over the step's, extremes over the step
        out = {"sampling/logp_difference/mean": Mean(diff.abs().sum(), n), "sampling/logp_difference/max": Max.of(diff.abs()),
               "sampling/importance_ratio/min": Min.of(ratio), "sampling/importance_ratio/mean": Mean(ratio.sum(), n),
               "sampling/importance_ratio/max": Max.of(ratio)}
        if self.loss.importance_sampling_cap is not None:
            out["weights"] = torch.exp((old - sampled).clamp(-20, 20)).clamp(max=self.loss.importance_sampling_cap)
            capped = out["weights"][keep]
            out["sampling/importance_weight/mean"] = Mean(capped.sum(), n)
            out["sampling/importance_weight/max"] = Max.of(capped)
        return out

    def metrics(self, batch: Batch, ro: Rollout, lm: dict, entropy: torch.Tensor, mask: torch.Tensor,
                count_groups: bool = True) -> dict:
        """One micro-batch's parts of the step metrics (:mod:`grasp_lightning.step_metrics`).

        Over the completions of the micro-batch's groups (refill's masked filler groups included): reward
        terms, reward and advantage mean/std/extremes, completion lengths, the truncated and parsed
        fractions, grounding. Over its groups: the zero-variance fraction and count (``count_groups=False``: left
        out, for the micro-batches of ``batching.micro_batch: rollout`` after a group's first). Over its loss tokens
        (``mask``, ``(N, Lc)``: the groups left out by ``dynamic_sampling`` have none): k3 KL (only with a
        reference model), entropy, ratio and the clip fractions.
        """
        m: dict = {}
        for j, name in enumerate(self.reward_labels):
            m[f"rewards/{name}/mean"] = Mean.of(ro.terms[:, j])
            m[f"rewards/{name}/std"] = Std.of(ro.terms[:, j])
        m["reward/mean"] = Mean.of(ro.rewards)
        m["reward/std"] = Std.of(ro.rewards)
        m["advantage/mean"] = Mean.of(ro.advantages)
        m["advantage/std"] = Std.of(ro.advantages)
        m["advantage/max"] = Max.of(ro.advantages)
        m["advantage/min"] = Min.of(ro.advantages)
        n = mask.float().sum()
        if "kl_mean" in lm:
            m["kl"] = Mean(lm["kl_mean"] * n, n)
        m["clip_ratio"] = Mean(lm["clip_ratio"] * n, n)
        m["clip_ratio/low"] = Mean(lm["clip_ratio_low"] * n, n)
        m["clip_ratio/high"] = Mean(lm["clip_ratio_high"] * n, n)
        m["ratio/mean"] = Mean(lm["ratio_mean"] * n, n)
        m["entropy"] = Mean((entropy.detach().float() * mask).sum(), n)
        lengths = ro.completions.mask.sum(1).float()
        m["completion_length/mean"] = Mean.of(lengths)
        m["completion_length/max"] = Max.of(lengths)
        m["completion_length/truncated_fraction"] = Mean.of(ro.completions.truncated)
        n_zero = int(ro.zero_variance.sum()) if count_groups else 0
        self.zero_variance_groups_total += n_zero
        m["zero_variance_groups/fraction"] = Mean(n_zero, ro.zero_variance.numel() if count_groups else 0)
        m["zero_variance_groups/count"] = Sum(n_zero)
        k = ro.num_generations
        grounding, no_gt = _grounding_metrics(ro.completions.texts, ro.items or batch.items, k)
        m.update(grounding)
        rows_no_gt = no_gt // k if count_groups else 0
        self.rows_without_participants_total += rows_no_gt
        m["grounding/rows_without_participants"] = Sum(rows_no_gt)
        parsed = [extract_answer(t) is not None for t in ro.completions.texts]
        m["answer/parsed_fraction"] = Mean(sum(parsed), len(parsed))
        return m

    def step_warnings(self, ctx: TaskContext, metrics: dict[str, float]) -> list[str]:
        """A warning when every completion of the step hit the token budget, and one when every group of
        the step had equal rewards (no advantage, so no policy gradient), each naming what to change."""
        out = []
        budget = ctx.rollout_cfg.max_new_tokens
        if metrics.get("completion_length/truncated_fraction", 0.0) >= WARN_TRUNCATED_FRACTION:
            out.append(f"every completion of this step was cut off at model.rollout.max_new_tokens={budget} tokens "
                       "before it ended: none reached its answer, so the rewards cannot tell them apart. Raise "
                       "model.rollout.max_new_tokens (and model.evaluation.max_new_tokens for validation) to fit the "
                       "<think>...</think><answer>...</answer> format")
        if metrics.get("zero_variance_groups/fraction", 0.0) >= WARN_ZERO_VARIANCE_FRACTION:
            out.append(f"every group of this step has equal rewards for all its model.rollout.num_generations="
                       f"{ctx.rollout_cfg.num_generations} completions: every advantage is 0, so the policy "
                       "gradient is 0 (only the KL term acts). Make the completions differ (model.rollout.temperature, "
                       "model.rollout.num_generations, model.rollout.max_new_tokens if they are cut off) or the "
                       "rewards (model.task.init_args.reward.terms / .weights), or start from a policy that can "
                       "earn them (model.policy.name_or_path)")
        return out


def _grounding_metrics(texts: list[str], items: list[GraspItem], k: int) -> tuple[dict[str, Mean], int]:
    """Grounding of ``N = len(items) * k`` completions (``k`` per item, in item order) and how many have
    no ground-truth participants.

    ``grounding/precision`` and ``grounding/recall``: means over the completions with ground truth
    (naming nobody counts as 0); ``grounding/enumeration_rate``: among those naming at least one
    person, the share naming every person the item shows (at least two;
    :func:`grasp_lightning.grpo.rewards.enumerates`), as ``val/grounding/enumeration_rate``. Each is a
    :class:`~grasp_lightning.step_metrics.Mean` with its count, so the step's value is over every such
    completion of the step; a key is left out when nothing is averaged.
    """
    precisions, recalls, enumerating, no_gt = [], [], [], 0
    for text, item in zip(texts, [it for it in items for _ in range(k)]):
        gt = item.participants
        if not gt:
            no_gt += 1
            continue
        named = extract_participants(reasoning_text(text))
        p, r = grounding_precision_recall(named, gt)
        precisions.append(p)
        recalls.append(r)
        if named:
            enumerating.append(enumerates(named, persons_shown(item)))
    out = {}
    if precisions:
        out["grounding/precision"] = Mean(sum(precisions), len(precisions))
        out["grounding/recall"] = Mean(sum(recalls), len(recalls))
    if enumerating:
        out["grounding/enumeration_rate"] = Mean(sum(enumerating), len(enumerating))
    return out, no_gt


def _check_split(loss: LossConfig, dynamic_sampling: str, overlap: int) -> None:
    """``batching.micro_batch: rollout`` trains each rollout batch over K optimizer steps of its own, so rollout
    reuse, refill's draws, the rollout overlap and dapo's window-wide normaliser do not apply.

    Raises:
        GraspConfigError: naming the key that conflicts with it.
    """
    conflicts = {"loss.num_iterations": loss.num_iterations > 1, "loss.type: dapo": loss.type == "dapo",
                 "batching.dynamic_sampling: refill": dynamic_sampling == "refill", "model.rollout.overlap": bool(overlap)}
    for name, bad in conflicts.items():
        if bad:
            where = name if name.startswith("model.") else KEY + name
            raise GraspConfigError(f"{KEY}batching.micro_batch=rollout (the released run's loop) cannot be combined "
                                   f"with {where}; leave that at its default")


def _check_groups(**groups: tuple[object, type]) -> None:
    """Each of ``GRPOTask``'s settings groups is its dataclass (from Python: ``GRPOTask(advantage="group")``
    of the older flat layout is refused here, naming the group's keys).

    Raises:
        GraspConfigError: naming the group, its keys and the value given.
    """
    for name, (value, cls) in groups.items():
        if not isinstance(value, cls):
            keys = ", ".join(f.name for f in dataclasses.fields(cls))
            raise GraspConfigError(f"{KEY}{name} is a group of settings ({keys}), got {value!r}; set its keys, "
                                   f"e.g. {KEY}{name}.{dataclasses.fields(cls)[0].name}")


def _pad_id(ctx: TaskContext) -> int:
    """The tokenizer's pad id (0 where the context has no tokenizer, e.g. scripted rollouts)."""
    return ctx.tokenizer.pad_token_id if ctx.tokenizer is not None else 0
