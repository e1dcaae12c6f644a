"""GRPO task with configurable rewards: plain GRPO (accuracy + format) or GRPO-SGR (GRASP stage 2).

One optimizer step trains on a *window*: the ``A`` micro-batches of ``B`` prompts of one step
(``batch.window``), sampled together at its first micro-batch (GRASP Sec. 3.3, Eq. for ``r_gnd``;
DeepSeekMath GRPO; TRL 1.16 ``GRPOTrainer`` for the option names). In the order this file runs them:

1. sample: K completions per prompt (a group), the whole window in as few generation calls as
   ``batching.rollout_batch_prompts`` allows (:meth:`GRPOTask.prepare` → :meth:`GRPOTask.sample_window`
   → :meth:`GRPOTask.rollout`);
2. reward: the weighted reward terms of every completion (:mod:`grasp_lightning.grpo.rewards`);
3. advantage: rewards normalised within each group (:meth:`GRPOTask.advantages`), with the old-policy and
   reference log-probs of the completions (:meth:`GRPOTask.score_rollout`);
4. score: each micro-batch's policy log-probs of its completions (:meth:`GRPOTask.training_step`);
5. loss: the clipped ratio with the k3 KL to the frozen reference model (:mod:`grasp_lightning.grpo.objective`);
6. metrics: the micro-batch's parts of the step's, reduced by the module once per step (``docs/metrics.md``).

The window's rollouts are kept in a :class:`~grasp_lightning.grpo.sampling.WindowCache` (dynamic sampling's
refill and resuming inside a window: :mod:`grasp_lightning.grpo.sampling`); with ``model.rollout.overlap: 1``
the next window is sampled while this one trains (:mod:`grasp_lightning.grpo.overlap`). A group's shared work
(vision encoder, prompt prefill, old-policy and reference forwards) runs once per prompt
(``compute.share_prompt``, default; exact, see :mod:`grasp_lightning.grpo.scoring`); ``false`` repeats each
prompt K times like TRL.
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
from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo import objective
from grasp_lightning.grpo.config import KEY, AdvantageConfig, BatchingConfig, ComputeConfig, LossConfig, RewardConfig
from grasp_lightning.grpo.overlap import DEFAULT_OVERLAP_CAP, RolloutPrefetch, check_overlap
from grasp_lightning.grpo.rewards import compute_rewards, enumerates, grounding_precision_recall, resolve_reward
from grasp_lightning.grpo.rollouts import Rollout, SamplingStats, cat_rollouts, take_completion
from grasp_lightning.grpo.sampling import CacheState, WindowCache, generation_calls, split_window
from grasp_lightning.grpo.scoring import prompt_tokens_forwarded, score_completions, sharing_unsupported_reason
from grasp_lightning.grpo.vision import VisionFeatures, reuse_vision
from grasp_lightning.parsing import extract_answer, extract_participants, reasoning_text
from grasp_lightning.step_metrics import Max, Mean, Min, RankMean, Std, Sum
from grasp_lightning.task import RolloutRecord, Task, TaskContext, TaskOutput

log = logging.getLogger(__name__)

#: :meth:`GRPOTask.step_warnings` warns at or above these step values: every completion cut off at the budget
#: (``completion_length/truncated_fraction``), every group with equal rewards (``zero_variance_groups/fraction``).
#: docs/metrics.md's "What healthy looks like" states them (``tests/test_healthy_ranges.py`` checks they agree).
WARN_TRUNCATED_FRACTION = 1.0
WARN_ZERO_VARIANCE_FRACTION = 1.0
#: grpo_loss's metrics (means over loss tokens) by their step names; each loss type has its own (docs/metrics.md).
LOSS_METRICS = {"clip_ratio": "clip_ratio", "clip_ratio_low": "clip_ratio/low", "clip_ratio_high": "clip_ratio/high",
                "clip_ratio_delta": "clip_ratio/delta", "ratio_mean": "ratio/mean",
                "vespo_weight_mean": "vespo/weight_mean"}


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
        self.zero_variance_groups_total = 0
        self.rows_without_participants_total = 0
        self.cache = WindowCache()  # the current window's rollouts, by micro-batch position
        self.prefetch = RolloutPrefetch()  # model.rollout.overlap: the next window's request in flight
        self._num_generations = 0  # model.rollout.num_generations, known from check_settings (micro_batch: rollout)
        self.entropy_control = objective.EntropyControl(self.loss)  # loss.entropy_coef, adapted with loss.adaptive_entropy

    window_batches = True  # rollouts are sampled per accumulation window (batch.window)
    samples_rollouts = True

    @property
    def shares_prompt(self) -> bool:
        """``compute.share_prompt``: each group's prompt is prefilled once (the memory planner reads this)."""
        return self.compute.share_prompt

    @property
    def num_iterations(self) -> int:
        """Optimizer steps per window of rollouts (the module passes it to the DataModule, which yields each window that
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

        With ``model.rollout.overlap: 1`` and neither ``importance_sampling_cap`` nor ``_floor``, the cap becomes
        :data:`~grasp_lightning.grpo.overlap.DEFAULT_OVERLAP_CAP` (TRL's default, 2.0): the correction is
        on whenever rollouts are a step stale.

        Raises:
            GraspConfigError: ``model.rollout.num_generations`` < 2; an overlong buffer longer than
                ``model.rollout.max_new_tokens``; ``model.rollout.overlap: 1`` with ``num_iterations > 1`` or
                ``dynamic_sampling: refill`` (:func:`~grasp_lightning.grpo.overlap.check_overlap`); the sampler
                correction or the off-policy mask with nothing off-policy to act on (:func:`_check_off_policy`).
        """
        self._num_generations = rollout_cfg.num_generations
        if self.splits_groups:
            _check_split(self.loss, self.dynamic_sampling, rollout_cfg.overlap)
        if rollout_cfg.overlap:
            check_overlap(self.num_iterations, self.dynamic_sampling)
            if not self.loss.sampler_correction:
                log.info("model.rollout.overlap=1: model.task.init_args.loss.importance_sampling_cap set to %g (unset)",
                         DEFAULT_OVERLAP_CAP)
                self.loss.importance_sampling_cap = DEFAULT_OVERLAP_CAP
        _check_off_policy(self.loss, rollout_cfg)
        if rollout_cfg.num_generations < 2:
            raise GraspConfigError("model.rollout.num_generations must be >= 2: a group of one has no advantage")
        buffer = self.overlong_buffer_tokens(rollout_cfg.max_new_tokens)
        if buffer is not None and not 0 < buffer <= rollout_cfg.max_new_tokens:
            raise GraspConfigError(f"{KEY}reward.overlong_buffer={buffer} must be in 1 … "
                                   f"model.rollout.max_new_tokens={rollout_cfg.max_new_tokens} (a budget shrunk by "
                                   f"an overlay, e.g. configs/demo.yaml, shrinks reward.overlong_buffer_fraction's "
                                   f"buffer with it)")

    @override
    def check_sequence_parallel(self, size: int, rollout_cfg: RolloutConfig) -> None:
        """GRPO splits its scoring and update forwards; the group's rank 0 samples the rollouts the group trains on.

        Raises:
            GraspConfigError: ``model.sequence_parallel > 1`` with ``model.rollout.overlap: 1`` (the next window is
                sampled in a background thread, whose broadcast to the group would race the training step's
                exchanges) or ``dynamic_sampling: refill`` (refills draw prompts rank by rank).
        """
        if size == 1:
            return
        if rollout_cfg.overlap:
            raise GraspConfigError(f"model.sequence_parallel: {size} with model.rollout.overlap: 1 is refused: the "
                                   "rollouts of a sequence-parallel group are broadcast from its first rank, which a "
                                   "background sampling thread would do while the step's exchanges run; set model.rollout.overlap: 0")
        if self.dynamic_sampling == "refill":
            raise GraspConfigError(f"model.sequence_parallel: {size} with {KEY}batching.dynamic_sampling: refill is refused: "
                                   "refills draw further prompts rank by rank; use dynamic_sampling: filter or off")

    @override
    def callbacks(self) -> list:
        """:class:`~grasp_lightning.callbacks.reference_sync.ReferenceSync` when ``loss.reference_sync_steps`` is set."""
        if self.loss.reference_sync_steps is None:
            return []
        from grasp_lightning.callbacks.reference_sync import ReferenceSync

        return [ReferenceSync(self.loss.reference_sync_steps, self.loss.reference_mixup_alpha)]

    @override
    def setup(self, ctx: TaskContext) -> None:
        """Check the context's rollout settings again (a context may differ from the module's)."""
        self.check_settings(ctx.rollout_cfg)

    # ------------------------------------------------------------------ the step
    def prepare(self, ctx: TaskContext, batch: Batch) -> dict | None:
        """Stages 1-3 for the whole window, at its first use: sample it (:meth:`sample_window`), then one
        all-reduce of ``[loss tokens, n, Σ r, Σ r²]`` over ranks (``ctx.cross_rank``) for the ``dapo``
        normaliser and the ``batch`` advantage std. The module calls it on every micro-batch of every rank,
        before :meth:`training_step`, also where the micro-batch or the whole window is empty (windows line
        up across ranks). A later micro-batch of the window reuses the :attr:`cache` (restored rollouts get
        their prompts first, :meth:`WindowCache.attach <grasp_lightning.grpo.sampling.WindowCache.attach>`).

        Returns:
            the window's sampling figures (:meth:`sampling_metrics`) when it sampled one, else ``None``.
        """
        batches, position, iteration, index = self._window_of(batch)
        if position == 0:  # a new optimizer step: the adaptive entropy coefficient from the last one's entropy
            self.entropy_control.step(ctx)
        key = (index, tuple(tuple(b.indices) for b in batches))
        self.cache.prepare(batch, position, iteration, len(batches))
        first_use = iteration == 0 and position == 0
        if not first_use and self.cache.holds(key):
            if self.cache.state is not CacheState.RESTORED or self.cache.attach(
                    batch.window, batches, ctx.device, self._vision_store(ctx)):
                return None
        if not first_use:
            log.warning("GRPO: window %d (iteration %d) has no cached rollouts (resumed inside a window from a "
                        "checkpoint without them?); sampling them again", index, iteration)
        device = ctx.device
        self.cache.fill(key, *self.sample_window(ctx, [b.to(device) for b in batches], batch.window))
        self._window_normaliser(ctx, device)
        return self.sampling_metrics()

    def training_step(self, ctx: TaskContext, batch: Batch) -> TaskOutput:
        """One micro-batch's clipped GRPO loss with the k3 KL, on its rows of the window's rollouts.

        Shapes: ``N = B * K`` rows (``K = 1`` with ``batching.micro_batch: rollout``), ``Lc`` completion
        tokens. Metrics (:meth:`metrics`) are this micro-batch's parts of the step's: means carry their counts
        (completions, groups, loss tokens), so the module's step values are means over the whole step on all
        ranks.

        Raises:
            GraspError: ``batch`` was not prepared (:meth:`prepare`, which ``GraspModule.training_step`` calls).
        """
        cfg = ctx.rollout_cfg
        # 1-3. sample, reward, advantage: done for the window by prepare(); this micro-batch's rows
        #      -> completions.ids (N, Lc), advantages (N,), old_logp / ref_logp (N, Lc) or None
        ro, k, iteration, count_groups = self._micro_batch_rollout(batch, self.cache.take(batch), cfg.num_generations)
        # 4. score: the policy's log-probs and entropy of the completion tokens -> logp, entropy (N, Lc)
        t0 = time.perf_counter()
        bonus = {"entropy_grad": True} if self.entropy_control.enabled else {}  # the entropy bonus's gradient
        logp, entropy = score_completions(ctx.policy, ro.prompt, ro.completions.ids, ro.completions.mask,
                                          k, cfg.temperature, ro.shared, self.compute.logprob_chunk_size, ro.vision,
                                          sp=ctx.sequence_parallel, **bonus)
        # 5. loss: clipped ratio, k3 KL, the loss type's normaliser -> scalar; lm: its parts; sampler: metrics
        loss, lm, sampler = self._loss(ctx, batch, ro, logp, entropy)
        entropy = entropy.detach()
        # 6. metrics: this micro-batch's parts of the step's (step_metrics values); its rollouts for the callbacks
        metrics = self._step_metrics(batch, ro, k, lm, entropy, sampler, iteration, count_groups, t0)
        return TaskOutput(loss=loss, metrics=metrics, rollout=self._record(batch, ro, logp, entropy, k))

    @staticmethod
    def _window_of(batch: Batch) -> tuple[list[Batch], int, int, int]:
        """``(batches, position, iteration, index)`` of the micro-batch's window (a window of one without)."""
        w = batch.window
        return ([batch], 0, 0, -1) if w is None else (w.batches, w.position, w.iteration, w.index)

    def _micro_batch_rollout(self, batch: Batch, rollouts: list[Rollout | None], k: int) -> tuple[Rollout, int, int, bool]:
        """``(rollout, K, iteration, counts groups)`` of ``batch``: the rollout at its window position; with
        ``batching.micro_batch: rollout``, one completion of each prompt of one micro-batch of prompts
        (:meth:`completion_of`), ``K = 1``, and its groups counted at their first completion only."""
        batches, position, iteration, _ = self._window_of(batch)
        if not self.splits_groups:
            return rollouts[position], k, iteration, True
        source, completion = self.completion_of(position, iteration, len(batches), k)
        return take_completion(rollouts[source], completion, k), 1, iteration, completion == 0

    # ------------------------------------------------------------------ 1. sample
    def sample_window(self, ctx: TaskContext, batches: list[Batch], window=None) -> tuple[list[Rollout | None], SamplingStats]:
        """The rollouts of a window, one per micro-batch position (``None`` for empty micro-batches), and their
        :class:`~grasp_lightning.grpo.rollouts.SamplingStats`: sampled in as few generation calls as
        ``batching.rollout_batch_prompts`` allows, refilled (``dynamic_sampling: refill``) from
        ``window.draw()``, then cut by position (:func:`~grasp_lightning.grpo.sampling.split_window`).
        Collective under refill: one ``cross_rank.sum`` per try, on every rank, an empty one included.
        """
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
        if not ros:
            return [None] * len(batches), SamplingStats(resample_tries=float(tries))
        ro = cat_rollouts(ros, _pad_id(ctx))
        stats = dataclasses.replace(ro.stats, resample_tries=float(tries), generation_calls=float(len(ros)),
                                    sequences=float(ro.completions.ids.shape[0]))
        positions = split_window(ro, batches, self.dynamic_sampling, ctx.rollout_cfg.num_generations, stats)
        stats.rollout_s = time.perf_counter() - t0
        stats.generated_tokens = float(ro.completions.mask.sum())
        return positions, stats

    def _sample(self, ctx: TaskContext, batches: list[Batch], window=None) -> list[Rollout]:
        """One rollout per generation call over the non-empty ``batches``; with ``model.rollout.overlap``
        the window's calls come from the request submitted a step earlier, and the next window's is
        submitted before this one is scored (:class:`~grasp_lightning.grpo.overlap.RolloutPrefetch`)."""
        def calls(micro: list[Batch]) -> list[Batch]:
            return generation_calls(micro, self.batching.rollout_batch_prompts, _pad_id(ctx))

        if not ctx.rollout_cfg.overlap:
            return [self.rollout(ctx, call) for call in calls(batches)]
        return self.prefetch.sample(self, ctx, calls(batches), window, calls)

    @torch.no_grad()
    def rollout(self, ctx: TaskContext, batch: Batch) -> Rollout:
        """One generation call: K completions per prompt of ``batch`` from ``ctx.rollout_engine``, scored
        (:meth:`score_rollout`).

        Returns:
            the :class:`~grasp_lightning.grpo.rollouts.Rollout`: ``completions.ids`` ``(B*K, Lc)`` and the
            tensors of stages 2-3.
        """
        t0 = time.perf_counter()
        policy = ctx.policy
        was_training = policy.training
        policy.eval()
        prompt, share, vision = self.prompt_inputs(ctx, batch)
        engine = ctx.rollout_engine
        with reuse_vision(policy, vision):  # the sampling prefill encodes the clips into ``vision``
            completions = engine.sample(policy, ctx.tokenizer, prompt, ctx.rollout_cfg, share_prompt=share,
                                        policy_version=ctx.policy_version)
        completions = ctx.sequence_parallel.broadcast(completions)  # a split group trains on its rank 0's samples
        policy.train(was_training)
        return self.score_rollout(ctx, batch, prompt, share, vision, completions, t0=t0,
                                  generation_seconds=time.perf_counter() - t0,
                                  weight_sync_seconds=engine.weight_sync_seconds)

    def prompt_inputs(self, ctx: TaskContext, batch: Batch) -> tuple[dict, bool, VisionFeatures | None]:
        """The batch's prompt inputs, whether its group work is shared, and the store of its vision features."""
        prompt = {name: v for name, v in batch.inputs.items() if name != "labels"}
        return prompt, self._share(ctx.policy, prompt), self._vision_store(ctx)

    def _vision_store(self, ctx: TaskContext) -> VisionFeatures | None:
        """An empty store of the frozen tower's features for the policy (``compute.encode_vision_once``), else ``None``."""
        return VisionFeatures.for_model(ctx.policy) if self.compute.encode_vision_once else None

    def _share(self, model, prompt: dict[str, torch.Tensor]) -> bool:
        """Whether this batch's group work is shared: asked for and exact for this model and these prompts."""
        if not self.compute.share_prompt:
            return False
        reason = sharing_unsupported_reason(model, prompt)
        if reason is not None and not self._warned_no_sharing:
            log.warning("GRPO share_prompt: falling back to repeated prompt rows: %s", reason)
            self._warned_no_sharing = True
        return reason is None

    # ------------------------------------------------------------------ 2. reward, 3. advantage
    @torch.no_grad()
    def score_rollout(self, ctx: TaskContext, batch: Batch, prompt: dict, share: bool, vision, completions, *,
                      t0: float, generation_seconds: float, weight_sync_seconds: float) -> Rollout:
        """Rewards, advantages, and the old-policy (trainer's own, now) and reference log-probs of sampled
        ``completions`` of ``batch``'s prompts; ``t0`` is when the rollout started (``perf_counter``).
        ``N = B * K`` rows, ``T`` reward terms, ``Lc`` completion tokens."""
        cfg = ctx.rollout_cfg
        k = cfg.num_generations
        policy = ctx.policy
        t1 = time.perf_counter()
        prompt_tokens = prompt_tokens_forwarded(prompt, k, share, generation=True)
        # 2. reward: every completion's reward terms -> terms (N, T); the overlong penalty -> (N,) or None
        items = [item for item in batch.items for _ in range(k)]
        terms = compute_rewards(completions.texts, items, self.reward_terms,
                                opened_think=completions.prompt_opened_think or False).to(completions.ids.device)
        penalty = (self.overlong(completions.mask.sum(1), cfg.max_new_tokens).to(terms.device)
                   if self.overlong_buffer_tokens(cfg.max_new_tokens) else None)
        # 3. advantage: weighted rewards, group-normalised -> rewards, advantages (N,); zero_var (B,)
        rewards, adv = self.advantages(terms, penalty, k=k)  # advantage: batch is redone by prepare() with all ranks
        zero_var = objective.zero_variance_groups(rewards, k)
        t2 = time.perf_counter()
        loss_mask = completions.mask.clone()
        if self.dynamic_sampling != "off":
            loss_mask &= ~zero_var.repeat_interleave(k)[:, None]
        if self.loss.mask_truncated:  # TRL's mask_truncated_completions: out of the loss and its normalisers
            loss_mask &= ~completions.truncated.to(loss_mask.device)[:, None]
        # the old-policy and reference log-probs the loss compares with -> (N, Lc) or None
        old_logp = None
        if self.loss.num_iterations > 1 or (self.loss.sampler_correction and completions.sampled_logp is not None):
            old_logp, _ = score_completions(policy, prompt, completions.ids, completions.mask, k, cfg.temperature,
                                            share, self.compute.logprob_chunk_size, vision, sp=ctx.sequence_parallel)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        ref_logp = None
        if self.loss.beta != 0.0:
            with ctx.reference() as ref:
                ref_logp, _ = score_completions(ref, prompt, completions.ids, completions.mask, k, cfg.temperature,
                                                share, self.compute.logprob_chunk_size, vision,
                                                sp=ctx.sequence_parallel)
            prompt_tokens += prompt_tokens_forwarded(prompt, k, share)
        stats = SamplingStats(rollout_s=time.perf_counter() - t0, generation_s=generation_seconds, rewards_s=t2 - t1,
                              logp_s=time.perf_counter() - t2, weight_sync_s=weight_sync_seconds, generation_calls=1.0,
                              prompt_tokens=float(prompt_tokens))
        return Rollout(prompt=prompt, shared=share, completions=completions, terms=terms, rewards=rewards,
                       advantages=adv, old_logp=old_logp, ref_logp=ref_logp, zero_variance=zero_var,
                       indices=list(batch.indices), penalty=penalty, loss_mask=loss_mask, items=list(batch.items),
                       sampled_logp=completions.sampled_logp, vision=vision, stats=stats)

    def advantages(self, terms: torch.Tensor, penalty: torch.Tensor | None = None,
                   batch_std: torch.Tensor | None = None, *, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted rewards ``(N,)`` and advantages ``(N,)`` from reward terms ``(N, T)``.

        Args:
            terms: ``(N, T)`` reward terms, ``N = B * k`` rows, group-major.
            penalty: ``(N,)`` overlong penalty (≤ 0) or ``None``. ``reward.overlong_mode: reward`` adds it to
                the reward before the normalisation (with ``advantage.kind: released``, which centres each
                term, it is centred like a term of weight 1); ``released`` adds it, raw, to the advantage.
            batch_std: the std of ``advantage.kind: batch`` (over every rank's rewards); for
                ``normalize_then_sum`` the moments ``[n, Σ s, Σ s²]`` of the term-normalised sums over every rank
                (:meth:`gdpo_moments`); ``None``: local.
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
        elif self.advantage.kind == "normalize_then_sum":  # the penalty is one more term of weight 1
            adv = objective.normalize_then_sum(*self._gdpo_terms(terms, weights, penalty if dapo_penalty else None), k,
                                               eps=self.advantage.eps, batch_moments=batch_std)
        else:
            adv = objective.group_advantages(rewards, k, scale=self.advantage.kind, eps=self.advantage.eps, batch_std=batch_std)
        if penalty is not None and self.reward.overlong_mode == "released":
            adv = adv + penalty
        return rewards, objective.clip_advantages(adv, self.advantage.clip)

    @staticmethod
    def _gdpo_terms(terms: torch.Tensor, weights: torch.Tensor,
                    penalty: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The terms and weights ``normalize_then_sum`` normalises: the DAPO penalty joins as a term of weight 1."""
        if penalty is None:
            return terms, weights
        return torch.cat([terms, penalty[:, None]], 1), torch.cat([weights, weights.new_ones(1)])

    def gdpo_moments(self, ro: Rollout, k: int) -> torch.Tensor:
        """``[n, Σ s, Σ s²]`` (float64) of ``advantage.kind: normalize_then_sum``'s term-normalised sums ``s`` of a
        rollout (:func:`~grasp_lightning.grpo.objective.term_normalised_sum`), to be summed over ranks."""
        weights = torch.tensor(self.reward_weights, dtype=ro.terms.dtype, device=ro.terms.device)
        penalty = ro.penalty if self.reward.overlong_mode == "reward" else None
        terms, weights = self._gdpo_terms(ro.terms, weights, penalty)
        return objective.reward_moments(objective.term_normalised_sum(terms, weights, k, self.advantage.eps))

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

    def _window_normaliser(self, ctx: TaskContext, device) -> None:
        """One all-reduce of ``[loss tokens, n, Σ r, Σ r²]`` of the window over ranks: the ``dapo``
        normaliser and, for ``advantage: batch``, the advantages redone with every rank's reward std (for
        ``normalize_then_sum``, with the moments of its sums appended: every rank's batch mean and std)."""
        rollouts = [ro for ro in self.cache.rollouts if ro is not None]
        tokens = sum((ro.loss_mask.sum().double() for ro in rollouts), torch.zeros((), dtype=torch.float64))
        rewards = torch.cat([ro.rewards.double().cpu() for ro in rollouts]) if rollouts else torch.zeros(0)
        k = ctx.rollout_cfg.num_generations
        parts = [tokens.reshape(1).cpu(), objective.reward_moments(rewards)]
        if self.advantage.kind == "normalize_then_sum":  # the batch mean and std of GDPO's sums, every rank's
            parts.append(sum((self.gdpo_moments(ro, k).cpu() for ro in rollouts), torch.zeros(3, dtype=torch.float64)))
        total = ctx.cross_rank.sum(torch.cat(parts).to(device)).cpu()
        self.cache.tokens = total[0]
        if self.advantage.kind in ("batch", "normalize_then_sum"):
            std = objective.std_from_moments(total[1:4]) if self.advantage.kind == "batch" else total[4:7]
            for ro in rollouts:
                ro.rewards, ro.advantages = self.advantages(ro.terms, ro.penalty, batch_std=std, k=k)

    # ------------------------------------------------------------------ 5. loss
    def _loss(self, ctx: TaskContext, batch: Batch, ro: Rollout, logp: torch.Tensor,
              entropy: torch.Tensor) -> tuple[torch.Tensor, dict, dict]:
        """The policy loss of ``loss.type`` on ``logp`` and ``entropy`` ``(N, Lc)`` against the rollout's old/reference log-probs and
        advantages (:func:`~grasp_lightning.grpo.objective.grpo_loss`), with the sampler's correction
        (:meth:`_sampler_correction`).

        Returns:
            ``(loss, parts, sampler metrics)``: the scalar loss, ``grpo_loss``'s parts (means over the loss
            tokens), and the sampler's metrics.
        """
        cfg = ctx.rollout_cfg
        num_items = None
        if self.loss.type in objective.WINDOW_TOKEN_TYPES:
            # TRL's num_items_in_batch / W, divided by A once more: Lightning divides the loss by A (grpo.py).
            window = len(self._window_of(batch)[0])
            num_items = self.cache.tokens.float().to(logp.device) / (ctx.cross_rank.world_size * window)
        sampler = self._sampler_correction(logp, ro, ro.loss_mask)
        keep = self._off_policy_mask(logp, ro, ro.loss_mask, sampler)
        loss, lm = objective.grpo_loss(logp, ro.old_logp, ro.ref_logp, ro.advantages, ro.loss_mask,
                                       epsilon=self.loss.epsilon, epsilon_high=self.loss.epsilon_high,
                                       beta=self.loss.beta, loss_type=self.loss.type,
                                       max_completion_length=cfg.max_new_tokens, num_items_in_batch=num_items,
                                       token_weights=sampler.pop("weights", None), kl_clamp=self.loss.kl_clamp,
                                       bias_correction_kl=self.loss.kl_bias_correction, sequence_mask=keep,
                                       **self.entropy_control.loss_kwargs(entropy), **self.loss.objective_kwargs())
        if self.loss.divide_by_num_generations:
            loss = loss / cfg.num_generations
        return loss, lm, sampler

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
        (TRL's ``sampling/sampling_logp_difference`` and ``sampling/importance_sampling_ratio``) and, with the
        correction on (``loss.importance_sampling_cap`` / ``_floor``), its weights under ``"weights"``
        (:func:`~grasp_lightning.grpo.objective.sampler_importance_weights`: ``(N, Lc)`` per token or ``(N, 1)``
        per sequence) with their mean/min/max over the loss tokens (token modes) or sequences (sequence modes)
        and, in the mask modes, how many are set to 0."""
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
        if self.loss.sampler_correction:
            mode = self.loss.importance_sampling_mode
            out["weights"] = objective.sampler_importance_weights(old, sampled, mask, mode,
                                                                  self.loss.importance_sampling_floor,
                                                                  self.loss.importance_sampling_cap)
            w = out["weights"][keep] if mode.startswith("token") else out["weights"][keep.any(1)].reshape(-1)
            out["sampling/importance_weight/mean"] = Mean(w.sum(), w.numel())
            out["sampling/importance_weight/min"] = Min.of(w)
            out["sampling/importance_weight/max"] = Max.of(w)
            if mode.endswith("mask"):
                unit = "tokens" if mode.startswith("token") else "sequences"
                out[f"sampling/importance_masked_{unit}"] = Sum(int((w == 0).sum()))
        return out

    def _off_policy_mask(self, logp: torch.Tensor, ro: Rollout, mask: torch.Tensor, metrics: dict) -> torch.Tensor | None:
        """The off-policy sequence mask ``(N, 1)`` (``loss.off_policy_mask_threshold``;
        :func:`~grasp_lightning.grpo.objective.off_policy_mask`, against the sampler's log-probs where the engine
        reports them, else the old policy's); adds ``off_policy/masked_fraction`` and ``off_policy/masked_sequences``
        (over the sequences with loss tokens) to ``metrics``. ``None`` when the threshold is null."""
        threshold = self.loss.off_policy_mask_threshold
        if threshold is None:
            return None
        behaviour = ro.sampled_logp if ro.sampled_logp is not None else ro.old_logp
        behaviour = logp.detach() if behaviour is None else behaviour.to(logp.device)
        keep = objective.off_policy_mask(logp, behaviour, ro.advantages, mask, threshold)
        live = mask.bool().any(1)
        dropped = int((keep[live] == 0).sum())
        metrics["off_policy/masked_fraction"] = Mean(dropped, int(live.sum()))
        metrics["off_policy/masked_sequences"] = Sum(dropped)
        return keep

    # ------------------------------------------------------------------ 6. metrics
    def _step_metrics(self, batch: Batch, ro: Rollout, k: int, lm: dict, entropy: torch.Tensor, sampler: dict,
                      iteration: int, count_groups: bool, t0: float) -> dict:
        """:meth:`metrics` with the sampler's, the loss tokens, the iteration, the prompt tokens forwarded (``k``
        completions per prompt) and the seconds since ``t0`` (the scoring's start, ``perf_counter``)."""
        mask = ro.loss_mask
        metrics = self.metrics(batch, ro, lm, entropy, mask, count_groups=count_groups)
        metrics.update(sampler)
        metrics.update(self.entropy_control.record(lm, mask))
        if "low_entropy_tokens" in lm:
            metrics["masked/low_entropy_tokens"] = Sum(lm["low_entropy_tokens"])
        if self.loss.mask_truncated:
            metrics["masked/truncated_completions"] = Sum(ro.completions.truncated.sum())
        if self.dynamic_sampling != "off" or self.loss.num_iterations > 1:  # else every generated token is a loss token
            metrics["tokens/loss"] = Sum(mask.sum())
        metrics["rollout/iteration"] = float(iteration)
        metrics["rollout/shared_prompt"] = float(ro.shared)
        metrics["tokens/prompt_forwarded"] = Sum(prompt_tokens_forwarded(ro.prompt, k, ro.shared))
        metrics["time/scoring_s"] = RankMean(time.perf_counter() - t0)
        return metrics

    def _record(self, batch: Batch, ro: Rollout, logp: torch.Tensor, entropy: torch.Tensor, k: int) -> RolloutRecord:
        """The micro-batch's scored rollouts for the callbacks: its k3 KL ``(M,)`` (with a reference model)
        and entropy ``(M,)`` over its ``M`` loss tokens."""
        mask = ro.loss_mask.bool()
        kl_tokens = None
        if ro.ref_logp is not None:
            kl_tokens = objective.k3_kl(logp.detach(), ro.ref_logp, self.loss.kl_clamp)[mask]
        return RolloutRecord(completions=ro.completions.texts, items=ro.items or batch.items, num_generations=k,
                             reward_names=list(self.reward_labels), terms=ro.terms, rewards=ro.rewards,
                             advantages=ro.advantages, kl_tokens=kl_tokens, entropy_tokens=entropy[mask])

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
        for key, name in LOSS_METRICS.items():  # each loss type's own (sapo and vespo have no clip fractions)
            if key in lm:
                m[name] = Mean(lm[key] * n, n)
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

    def sampling_metrics(self) -> dict:
        """The figures of the window just sampled (:meth:`sample_window`), as step metrics: this rank's
        seconds (:class:`RankMean`), generated and prompt tokens, generation calls (:class:`Sum`) and, with
        ``dynamic_sampling``, the groups tried and kept; with ``refill`` also the draws, the groups dropped
        and drawn-but-unused, and the reward over every group tried. Names that would repeat another series
        are left out: with ``drop`` every group tried is trained (its reward is ``reward/mean``, its dropped
        groups ``zero_variance_groups/count``), and ``off`` has nothing to report."""
        st = self.cache.stats
        m: dict = {"time/rollout_s": RankMean(st.rollout_s), "time/generation_s": RankMean(st.generation_s),
                   "time/rewards_s": RankMean(st.rewards_s), "time/logp_s": RankMean(st.logp_s),
                   "time/weight_sync_s": RankMean(st.weight_sync_s),
                   "tokens/generated": Sum(st.generated_tokens), "tokens/prompt_forwarded": Sum(st.prompt_tokens),
                   "rollout/generation_calls": Sum(st.generation_calls),
                   "rollout/sequences_per_call": Mean(st.sequences, st.generation_calls)}
        if self.dynamic_sampling != "off":
            m["dynamic_sampling/groups_tried"] = Sum(st.groups_tried)
            m["dynamic_sampling/groups_kept"] = Sum(st.groups_kept)
        if self.dynamic_sampling == "refill":
            m["dynamic_sampling/groups_dropped"] = Sum(st.groups_dropped)
            m["dynamic_sampling/groups_unused"] = Sum(st.groups_unused)
            m["dynamic_sampling/resample_tries"] = Max(st.resample_tries)
            m["dynamic_sampling/reward_mean_tried"] = Mean(st.reward_sum_tried, st.completions_tried)
        m.update(self.prefetch.metrics())
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

    # ------------------------------------------------------------------ checkpointed window
    def state_dict(self) -> dict:
        """This rank's window of rollouts (:meth:`WindowCache.state_dict
        <grasp_lightning.grpo.sampling.WindowCache.state_dict>`: none after the window's last use) and the
        rollout request in flight (``model.rollout.overlap``)."""
        return {**self.prefetch.state_dict(), **self.entropy_control.state_dict(),
                **self.cache.state_dict(self.loss.num_iterations)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the prompts are attached at the window's next micro-batch."""
        if not state:
            return
        self.prefetch.load_state_dict(state)
        self.entropy_control.load_state_dict(state)
        self.cache.load_state_dict(state)


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
    """``batching.micro_batch: rollout`` trains each window's rollouts over K optimizer steps of their own, so rollout
    reuse, refill's draws, the rollout overlap and dapo's window-wide normaliser do not apply.

    Raises:
        GraspConfigError: naming the key that conflicts with it.
    """
    conflicts = {"loss.num_iterations": loss.num_iterations > 1, f"loss.type: {loss.type}": loss.type in objective.WINDOW_TOKEN_TYPES,
                 "batching.dynamic_sampling: refill": dynamic_sampling == "refill", "model.rollout.overlap": bool(overlap)}
    for name, bad in conflicts.items():
        if bad:
            where = name if name.startswith("model.") else KEY + name
            raise GraspConfigError(f"{KEY}batching.micro_batch=rollout (the released run's loop) cannot be combined "
                                   f"with {where}; leave that at its default")


def _check_off_policy(loss: LossConfig, rollout_cfg: RolloutConfig) -> None:
    """The sampler correction needs an engine that reports its log-probs (``model.rollout.engine: vllm``); the
    off-policy mask needs rollouts that can be off-policy (that engine, or ``loss.num_iterations > 1``).

    Raises:
        GraspConfigError: naming the setting and what it needs.
    """
    engine = rollout_cfg.engine
    if loss.sampler_correction and engine != "vllm":
        raise GraspConfigError(f"{KEY}loss.importance_sampling_cap / importance_sampling_floor correct for the "
                               f"sampler's own log-probs, which only model.rollout.engine=vllm reports (got "
                               f"{engine!r}); set both to null or use the vllm engine")
    if loss.off_policy_mask_threshold is not None and engine != "vllm" and loss.num_iterations == 1:
        raise GraspConfigError(f"{KEY}loss.off_policy_mask_threshold masks sequences sampled off-policy, but with "
                               f"model.rollout.engine={engine!r} and {KEY}loss.num_iterations=1 every rollout is "
                               "on-policy (its KL is 0); use the vllm engine or num_iterations > 1, or set it to null")


def _check_groups(**groups: tuple[object, type]) -> None:
    """Each of ``GRPOTask``'s setting groups is its dataclass (from Python, ``GRPOTask(advantage="group")``
    is refused here, naming the group's keys).

    Raises:
        GraspConfigError: naming the group, its keys and the value given.
    """
    for name, (value, cls) in groups.items():
        if not isinstance(value, cls):
            keys = ", ".join(f.name for f in dataclasses.fields(cls))
            raise GraspConfigError(f"{KEY}{name} is a setting group ({keys}), got {value!r}; set its keys, "
                                   f"e.g. {KEY}{name}.{dataclasses.fields(cls)[0].name}")


def _pad_id(ctx: TaskContext) -> int:
    """The tokenizer's pad id (0 where the context has no tokenizer, e.g. scripted rollouts)."""
    return ctx.tokenizer.pad_token_id if ctx.tokenizer is not None else 0
