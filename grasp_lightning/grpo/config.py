"""``GRPOTask``'s settings in setting groups by purpose: ``model.task.init_args.{reward,advantage,loss,batching,compute}``.

Each setting group is a small dataclass whose ``Attributes:`` jsonargparse reads as the help of its keys
(``--model.task.init_args.loss.epsilon``), checked when it is built: a bad value stops the run at
start-up with a :class:`~grasp_lightning.errors.GraspConfigError` naming its key. Names follow TRL 1.16
``GRPOConfig`` and the DAPO paper where they have one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from grasp_lightning.errors import GraspConfigError, is_count, is_number, require
from grasp_lightning.grpo import objective

log = logging.getLogger(__name__)

#: The prefix of every key below, as a config or the command line spells it.
KEY = "model.task.init_args."

ADVANTAGES = ("group", "batch", "released", "none", "normalize_then_sum")
OVERLONG_MODES = ("reward", "released")
DYNAMIC_SAMPLING = ("off", "drop", "refill")
MICRO_BATCHES = ("group", "rollout")


@dataclass
class RewardConfig:
    """The reward of a completion: a weighted sum of reward terms (GRASP Sec. 3.3), plus DAPO's soft
    overlong penalty (Eq. 13: 0 up to the buffer's start, then linear down to -overlong_penalty at the
    budget's end, ``model.rollout.max_new_tokens``), off unless a buffer is set.

    Attributes:
        terms: reward terms: names in grasp_lightning.grpo.rewards.REWARDS, import paths of a reward function of one's own
            (``my_pkg.rewards:length_bonus``, ``my_pkg.rewards.length_bonus`` or ``path/to/file.py:length_bonus``;
            signatures in grasp_lightning.grpo.rewards) or, from Python, the functions themselves. Metrics name a term by
            its label: the registry name, or the function's name (``train/rewards/length_bonus/mean``).
        weights: one weight per term (SGR recipe: 1.0, 0.1, 0.05, 0.2); null: 1.0 each.
        overlong_buffer: the overlong penalty's ramp over the last this-many tokens of the budget (released recipe:
            256); null: no penalty.
        overlong_buffer_fraction: the same ramp as a fraction in (0, 1] of model.rollout.max_new_tokens (rounded
            down, at least 1 token): 0.25 is the released 256 of 1,024 and follows a budget an overlay shrinks.
            Exclusive with overlong_buffer.
        overlong_penalty: the penalty at the budget's end.
        overlong_mode: reward (DAPO: added to the reward before the group normalisation) or released (released GRASP
            code: the raw penalty added to the advantage, before the advantage clip).
    """

    terms: list[str] = field(default_factory=lambda: ["accuracy", "format"])
    weights: list[float] | None = None
    overlong_buffer: int | None = None
    overlong_buffer_fraction: float | None = None
    overlong_penalty: float = 1.0
    overlong_mode: str = "reward"

    def __post_init__(self) -> None:
        k = KEY + "reward."
        if self.weights is not None and len(self.terms) != len(self.weights):
            ones = ", ".join(["1.0"] * len(self.terms))
            raise GraspConfigError(
                f"{k}terms and {k}weights: {len(self.terms)} terms {list(self.terms)} but {len(self.weights)} weights "
                f"{list(self.weights)}. A recipe's weights stay when only the terms change: give one weight per term "
                f"with them (--{k}weights '[{ones}]'), or --{k}weights null for 1.0 each")
        require(self.overlong_mode in OVERLONG_MODES, k + "overlong_mode", f"one of {OVERLONG_MODES}",
                self.overlong_mode)
        if self.overlong_buffer is not None and self.overlong_buffer_fraction is not None:
            raise GraspConfigError(f"{k}overlong_buffer and {k}overlong_buffer_fraction: set the buffer in tokens or "
                                   "as a fraction of model.rollout.max_new_tokens, not both")
        fraction = self.overlong_buffer_fraction
        require(fraction is None or (is_number(fraction) and 0 < fraction <= 1), k + "overlong_buffer_fraction",
                "in (0, 1]", fraction)

    @property
    def term_weights(self) -> list[float]:
        """``weights``, or 1.0 for every term when it is ``None``."""
        return [1.0] * len(self.terms) if self.weights is None else [float(w) for w in self.weights]


@dataclass
class AdvantageConfig:
    """How rewards become advantages (GRPO: per group of K completions of one prompt).

    Attributes:
        kind: group: (r - mean) / (std + eps) per group (paper); batch: the std over every rank's rewards; released:
            each term mean-centred per group, then weighted (released code); none: centred, not scaled;
            normalize_then_sum (GDPO; TRL's multi_objective_aggregation): each term (r - mean) / (std + eps) per group,
            weighted and summed, then centred and scaled over the rollout batch of every rank.
        eps: the eps of the std division (TRL: 1e-4).
        clip: clip advantages to +-this (released recipe: 5); null: no clip.
    """

    kind: str = "group"
    eps: float = 1e-4
    clip: float | None = None

    def __post_init__(self) -> None:
        k = KEY + "advantage."
        require(self.kind in ADVANTAGES, k + "kind", f"one of {ADVANTAGES}", self.kind)


@dataclass
class LossConfig:
    """The policy objective (DeepSeekMath GRPO and the family TRL 1.16 offers beside it) with a k3 KL to the
    reference model and an optional entropy bonus (grasp_lightning.grpo.objective.grpo_loss).

    Attributes:
        type: the objective, TRL's loss_type: grpo, bnpo, dapo, dr_grpo (the clipped ratio, aggregated per sequence,
            per micro-batch token, per window token over all ranks, per budget token); cispo (MiniMax-M1: the
            clipped weight, detached, times log-prob; epsilon_high is the weight's cap); sapo (a soft
            temperature gate for the clip); luspo (summed per sequence, for ratio_level: sequence); vespo (a
            gamma weight of the sequence's ratio). dapo, cispo and vespo divide by the loss tokens of the whole
            accumulation window over all ranks.
        epsilon: lower clip range of the ratio.
        epsilon_high: upper clip range; null: the same as epsilon. With type cispo: the cap of the importance weight
            (required; ScaleRL: 5.0).
        delta: two-sided clip (INTELLECT-2): the ratio of a token with a negative advantage is capped at this
            (> 1 + epsilon_high recommended); null: off. Clipping types only (grpo, bnpo, dapo, dr_grpo, luspo).
        ratio_level: token: one importance ratio per token; sequence (GSPO): one per completion,
            exp(mean of the token log-ratios over its loss tokens). TRL's importance_sampling_level.
        sapo_temperature_pos: type sapo: the gate's temperature for tokens with a positive advantage (TRL: 1.0).
        sapo_temperature_neg: type sapo: the temperature for the others (TRL: 1.05).
        vespo_k_pos: type vespo: the weight's power for a non-negative advantage (TRL: 2.0).
        vespo_lambda_pos: type vespo: the weight's decay for a non-negative advantage (TRL: 3.0).
        vespo_k_neg: type vespo: the power for a negative advantage (TRL: 3.0).
        vespo_lambda_neg: type vespo: the decay for a negative advantage (TRL: 2.0).
        mask_truncated: leave completions that hit model.rollout.max_new_tokens without ending out of the loss (DAPO;
            TRL's mask_truncated_completions); their tokens leave the loss normalisers too.
        top_entropy_quantile: the policy term keeps only this top share of each micro-batch's loss tokens by
            entropy (Beyond the 80/20 Rule: 0.2); 1.0: every token.
        entropy_coef: coefficient of the entropy bonus (minus coef x the mean entropy of the loss tokens); with
            adaptive_entropy its starting value. 0: no bonus.
        adaptive_entropy: adapt entropy_coef after every optimizer step (Skywork-OR1; TRL's use_adaptive_entropy): up
            by entropy_coef_delta while the step's mean entropy is at or below entropy_target, else down, within
            [entropy_coef_min, entropy_coef_max]; the bonus acts only while the last step's entropy was at or
            below the target. The coefficient is saved in checkpoints.
        entropy_coef_min: adaptive_entropy: the coefficient's lower bound (TRL: 0.0).
        entropy_coef_max: adaptive_entropy: its upper bound (TRL: 1.0).
        entropy_coef_delta: adaptive_entropy: its change per optimizer step (TRL: 0.005).
        entropy_target: adaptive_entropy: the target mean entropy per token in nats (TRL: 0.2).
        beta: coefficient of the k3 KL to the reference model (recipe: 0.05); 0 skips the reference model entirely.
        num_iterations: optimizer steps per rollout batch (TRL's num_iterations); the DataModule repeats each
            accumulation window this many times, with the sampling policy's log-probs as the ratio's old ones.
        importance_sampling_cap: with a rollout engine that reports its own log-probs (model.rollout.engine: vllm),
            correct each token's policy loss for the sampler by w = exp(logp_old - logp_sampler) (per token, or per
            sequence with exp of the sum), limited above by this cap (TRL's vllm_importance_sampling_clip_max); with
            importance_sampling_floor null: both null turn the correction off.
        importance_sampling_mode: token_truncate (w clamped to [floor, cap]; TRL's TIS), token_mask (w set to 0 outside
            [floor, cap]; MIS), sequence_truncate or sequence_mask (one w per sequence); TRL's
            vllm_importance_sampling_mode.
        importance_sampling_floor: the lower bound of w (TRL's vllm_importance_sampling_clip_min); null: none.
        off_policy_mask_threshold: drop from the policy loss each sequence with a negative advantage whose mean
            per-token KL from the sampling policy (the sampler's log-probs with vllm, else the old policy's) is above
            this (DeepSeek-V3.2 off-policy sequence masking; TRL's off_policy_mask_threshold, e.g. 0.5); null: off.
        kl_bias_correction: multiply each token's k3 KL by the policy's ratio to the sampling policy (DeepSeek-V3.2's
            unbiased KL gradient; TRL's use_bias_correction_kl, true in TRL); needs beta != 0.
        reference_sync_steps: every this-many optimizer steps move the reference model towards the policy,
            ref = alpha * policy + (1 - alpha) * ref (TR-DPO; TRL's sync_ref_model with ref_model_sync_steps, 512 in
            TRL); null: the reference stays fixed. Needs beta != 0 and a reference of its own (not model.lora).
        reference_mixup_alpha: the alpha of reference_sync_steps, in (0, 1] (TRL's ref_model_mixup_alpha).
        kl_clamp: clamp each token's k3 KL estimate to +-this before it is averaged (released GRASP code: 10,
            socialmllm/train/reasoning/trainer.py:196); null: no clamp.
        divide_by_num_generations: divide each micro-batch's loss by model.rollout.num_generations (K) once more, on top
            of Lightning's division by trainer.accumulate_grad_batches: the released run's scale, whose Hugging Face
            Trainer divides each one-rollout micro-batch's loss by the K x A micro-batches of its rollout batch while
            it steps every A (docs/released-recipe.md, "What the released run did"); false: no extra division.
    """

    type: str = "grpo"
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    ratio_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    mask_truncated: bool = False
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2
    beta: float = 0.05
    num_iterations: int = 1
    importance_sampling_cap: float | None = None
    importance_sampling_mode: str = "token_truncate"
    importance_sampling_floor: float | None = None
    off_policy_mask_threshold: float | None = None
    kl_bias_correction: bool = False
    reference_sync_steps: int | None = None
    reference_mixup_alpha: float = 0.6
    kl_clamp: float | None = None
    divide_by_num_generations: bool = False

    def __post_init__(self) -> None:
        k = KEY + "loss."
        require(self.kl_clamp is None or (is_number(self.kl_clamp) and self.kl_clamp > 0), k + "kl_clamp",
                "a number > 0 or null", self.kl_clamp)
        require(self.type in objective.LOSS_TYPES, k + "type", f"one of {objective.LOSS_TYPES}", self.type)
        require(is_count(self.num_iterations), k + "num_iterations", ">= 1", self.num_iterations)
        require(self.importance_sampling_cap is None or (is_number(self.importance_sampling_cap)
                                                         and self.importance_sampling_cap >= 1.0),
                k + "importance_sampling_cap", ">= 1 or null", self.importance_sampling_cap)
        require(self.ratio_level in objective.RATIO_LEVELS, k + "ratio_level", f"one of {objective.RATIO_LEVELS}",
                self.ratio_level)
        require(is_number(self.epsilon) and 0 <= self.epsilon < 1, k + "epsilon", "in [0, 1)", self.epsilon)
        require(self.epsilon_high is None or (is_number(self.epsilon_high) and self.epsilon_high >= 0),
                k + "epsilon_high", ">= 0 or null", self.epsilon_high)
        require(self.delta is None or (is_number(self.delta) and self.delta > 1), k + "delta", "> 1 or null",
                self.delta)
        for name in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
            require(is_number(getattr(self, name)) and getattr(self, name) > 0, k + name, "> 0", getattr(self, name))
        for name in ("vespo_k_pos", "vespo_k_neg", "entropy_coef", "entropy_coef_delta", "entropy_target"):
            require(is_number(getattr(self, name)) and getattr(self, name) >= 0, k + name, ">= 0", getattr(self, name))
        require(is_number(self.top_entropy_quantile) and 0 <= self.top_entropy_quantile <= 1,
                k + "top_entropy_quantile", "in [0, 1]", self.top_entropy_quantile)
        require(is_number(self.entropy_coef_min) and is_number(self.entropy_coef_max)
                and 0 <= self.entropy_coef_min <= self.entropy_coef_max, k + "entropy_coef_min",
                f"in [0, {k}entropy_coef_max={self.entropy_coef_max}]", self.entropy_coef_min)
        if self.type == "cispo" and self.epsilon_high is None:
            raise GraspConfigError(f"{k}type=cispo caps the importance weight at {k}epsilon_high, which is null "
                                   f"(it would be epsilon={self.epsilon}, below 1); set it, e.g. 5.0 (ScaleRL)")
        if self.delta is not None and self.type in ("cispo", "sapo", "vespo"):
            raise GraspConfigError(f"{k}delta={self.delta} clips the ratio of the clipping objectives (grpo, bnpo, "
                                   f"dapo, dr_grpo, luspo); {k}type={self.type} has no such clip: set delta null")
        if self.ratio_level == "sequence" and self.type == "vespo":
            raise GraspConfigError(f"{k}ratio_level=sequence with {k}type=vespo: vespo takes its own sequence "
                                   f"weight from the token ratios, so the setting would do nothing; leave "
                                   f"ratio_level: token")
        if self.type == "luspo" and self.ratio_level == "token":  # TRL 1.16 warns the same
            log.warning("%stype=luspo with %sratio_level=token: LUSPO's paper uses the sequence-level ratio "
                        "(ratio_level: sequence)", k, k)
        if self.ratio_level == "sequence" and self.type in ("bnpo", "dr_grpo", "dapo", "cispo"):
            log.warning("%sratio_level=sequence with %stype=%s sums per-token terms, weighting each completion by "
                        "its length; GSPO's setup is type: grpo", k, k, self.type)
        modes = objective.SAMPLER_CORRECTION_MODES
        require(self.importance_sampling_mode in modes, k + "importance_sampling_mode", f"one of {modes}",
                self.importance_sampling_mode)
        floor = self.importance_sampling_floor
        require(floor is None or (is_number(floor) and 0 < floor <= 1), k + "importance_sampling_floor",
                "in (0, 1] or null", floor)
        if self.importance_sampling_mode != "token_truncate" and not self.sampler_correction:
            raise GraspConfigError(f"{k}importance_sampling_mode={self.importance_sampling_mode!r} has no bound: set "
                                   f"{k}importance_sampling_cap and/or {k}importance_sampling_floor (both null: no "
                                   "correction)")
        if self.type == "vespo" and self.sampler_correction and self.importance_sampling_mode.startswith("sequence"):
            raise GraspConfigError(f"{k}type=vespo folds the sampler's per-token weights into its own sequence weight: "
                                   f"{k}importance_sampling_mode={self.importance_sampling_mode!r} gives one per "
                                   "sequence; use token_truncate or token_mask (TRL 1.16 refuses the same)")
        threshold = self.off_policy_mask_threshold
        require(threshold is None or (is_number(threshold) and threshold > 0), k + "off_policy_mask_threshold",
                "a number > 0 or null", threshold)
        require(is_count(self.reference_sync_steps, optional=True), k + "reference_sync_steps", ">= 1 or null",
                self.reference_sync_steps)
        alpha = self.reference_mixup_alpha
        require(is_number(alpha) and 0 < alpha <= 1, k + "reference_mixup_alpha", "in (0, 1]", alpha)
        for name, on in (("kl_bias_correction", self.kl_bias_correction),
                         ("reference_sync_steps", self.reference_sync_steps is not None)):
            if on and self.beta == 0.0:
                raise GraspConfigError(f"{k}{name} acts on the KL to the reference model, which {k}beta=0 leaves out; "
                                       f"set {k}beta != 0 or leave {k}{name} at its default")

    def objective_kwargs(self) -> dict:
        """The objective's settings as :func:`grasp_lightning.grpo.objective.grpo_loss` takes them (beyond
        epsilon, beta and the loss type)."""
        return {"ratio_level": self.ratio_level, "delta": self.delta, "sapo_temperature_pos": self.sapo_temperature_pos,
                "sapo_temperature_neg": self.sapo_temperature_neg, "vespo": self.vespo}

    @property
    def vespo(self) -> dict[str, float]:
        """VESPO's four settings as :func:`grasp_lightning.grpo.objective.vespo_weights` takes them."""
        return {"k_pos": self.vespo_k_pos, "lambda_pos": self.vespo_lambda_pos, "k_neg": self.vespo_k_neg,
                "lambda_neg": self.vespo_lambda_neg}

    @property
    def sampler_correction(self) -> bool:
        """True when the sampler's log-probs correct the loss: ``importance_sampling_cap`` or ``_floor`` is set."""
        return self.importance_sampling_cap is not None or self.importance_sampling_floor is not None


@dataclass
class BatchingConfig:
    """Which groups train and how a rollout batch (the prompts of one accumulation window) is sampled.

    Attributes:
        dynamic_sampling: off; drop: the tokens of groups whose rewards are all equal are masked out of the loss's
            numerator (their rows stay in a per-sequence normaliser, as TRL defines it); refill (DAPO dynamic
            sampling): drop them and draw further prompts until the rollout batch has as many groups with distinct
            rewards as the window has prompts, then trim it to that size.
        max_resample: refill draws at most this many further windows of prompts per rollout batch; each one
            shortens the epoch by one window (logged at the epoch's end).
        rollout_batch_prompts: prompts per generation call, in whole micro-batches (at least one); null: the whole
            accumulation window in one call (TRL's generation_batch_size).
        micro_batch: group: a micro-batch trains every completion of its prompts (K rows each). rollout: the released
            GRASP run as it ran (docs/released-recipe.md, "What the released run did"): a micro-batch trains one
            completion of each of its prompts, so a window's A micro-batches of prompts become A x K micro-batches of
            completions in prompt order (the first prompt's completions 1..K, then the next prompt's), A per optimizer
            step, hence K optimizer steps per rollout batch; the advantages are the whole group's, computed when it is
            sampled; the epoch ends after as many micro-batches as this rank has micro-batches of prompts (the Hugging
            Face Trainer's max_steps from len(dataloader)), about 1/K of the data.
    """

    dynamic_sampling: str = "off"
    max_resample: int = 4
    rollout_batch_prompts: int | None = None
    micro_batch: str = "group"

    def __post_init__(self) -> None:
        k = KEY + "batching."
        require(self.micro_batch in MICRO_BATCHES, k + "micro_batch", f"one of {MICRO_BATCHES}", self.micro_batch)
        require(self.dynamic_sampling in DYNAMIC_SAMPLING, k + "dynamic_sampling", f"one of {DYNAMIC_SAMPLING}",
                self.dynamic_sampling)
        require(is_number(self.max_resample) and float(self.max_resample).is_integer() and self.max_resample >= 0,
                k + "max_resample", ">= 0", self.max_resample)
        require(is_count(self.rollout_batch_prompts, optional=True), k + "rollout_batch_prompts",
                ">= 1 or null", self.rollout_batch_prompts)


@dataclass
class ComputeConfig:
    """Exact savings of time and memory: the results are the same up to float rounding.

    Attributes:
        share_prompt: encode each group's clip and prefill its prompt once for sampling and for the policy, old-policy
            and reference scoring (grasp_lightning.grpo.scoring); false: every prompt K times as separate rows, like
            TRL. Models or prompts where sharing is not exact fall back to the rows with a warning.
        encode_vision_once: with a frozen vision tower (model.policy.freeze_vision), encode each rollout batch's clips
            once, at sampling, and reuse the outputs in every later forward of that batch
            (grasp_lightning.grpo.vision); false: every forward runs the tower.
        logprob_chunk_size: completion tokens per chunk of the LM head and log-softmax in every scoring forward, so
            no (B*K, Lc, V) logits exist (grasp_lightning.grpo.logprobs); null: the full logits.
    """

    share_prompt: bool = True
    encode_vision_once: bool = True
    logprob_chunk_size: int | None = 256

    def __post_init__(self) -> None:
        require(is_count(self.logprob_chunk_size, optional=True), KEY + "compute.logprob_chunk_size",
                ">= 1 or null", self.logprob_chunk_size)
