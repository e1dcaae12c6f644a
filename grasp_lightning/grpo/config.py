"""``GRPOTask``'s settings in setting groups by purpose: ``model.task.init_args.{reward,advantage,loss,batching,compute}``.

Each setting group is a small dataclass whose ``Attributes:`` jsonargparse reads as the help of its keys
(``--model.task.init_args.loss.epsilon``), checked when it is built: a bad value stops the run at
start-up with a :class:`~grasp_lightning.errors.GraspConfigError` naming its key. Names follow TRL 1.16
``GRPOConfig`` and the DAPO paper where they have one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grasp_lightning.errors import GraspConfigError, is_count, is_number, require
from grasp_lightning.grpo import objective

#: The prefix of every key below, as a config or the command line spells it.
KEY = "model.task.init_args."

ADVANTAGES = ("group", "batch", "released", "none")
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
            each term mean-centred per group, then weighted (released code); none: centred, not scaled.
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
    """The clipped-ratio objective with a k3 KL to the reference model (DeepSeekMath GRPO; TRL ``grpo_loss``).

    Attributes:
        type: grpo, bnpo, dapo or dr_grpo (TRL's loss_type; grasp_lightning.objective.grpo_loss); dapo divides by the loss
            tokens of the whole accumulation window over all ranks.
        epsilon: lower clip range of the ratio.
        epsilon_high: upper clip range; null: the same as epsilon.
        beta: coefficient of the k3 KL to the reference model (recipe: 0.05); 0 skips the reference model entirely.
        num_iterations: optimizer steps per rollout batch (TRL's num_iterations); the DataModule repeats each
            accumulation window this many times, with the sampling policy's log-probs as the ratio's old ones.
        importance_sampling_cap: with a rollout engine that reports its own log-probs (model.rollout.engine: vllm),
            weight each token's loss by min(exp(logp_old - logp_sampler), cap): TRL's
            vllm_importance_sampling_correction (token_truncate; TRL's cap 2.0); null: off.
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
    beta: float = 0.05
    num_iterations: int = 1
    importance_sampling_cap: float | None = None
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
