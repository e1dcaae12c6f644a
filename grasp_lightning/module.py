"""``GraspModule``: the LightningModule that holds the policy, the frozen reference model and a task.

Training delegates the objective to the task plugin (``grasp_lightning.tasks.sft.SFTTask``,
``grasp_lightning.tasks.grpo.GRPOTask``); validation and test decode answers for every evaluation suite
(GRASP-Bench, MMSI, ...) and hand them to ``module.suites``
(:class:`~grasp_lightning.evaluation.suite.SuiteRunner`), which scores each with its own suite and
metric (exact across ranks). Reports are written by the ``grasp_lightning.callbacks.eval_reports.EvalReports``
callback from ``module.suites``.

The module's settings, one setting group per ``model.<name>`` key, all importable from here
(``from grasp_lightning.module import RolloutConfig``):

=============================  ======================  ========================================
key                            class                   defined in
=============================  ======================  ========================================
``model.policy``               ``PolicyConfig``        :mod:`grasp_lightning.policy`
``model.reference``            ``ReferenceConfig``     :mod:`grasp_lightning.policy`
``model.lora``                 ``LoraConfig``          :mod:`grasp_lightning.policy`
``model.optim``                ``OptimConfig``         this module
``model.rollout``              ``RolloutConfig``       :mod:`grasp_lightning.engines.decoding`
``model.rollout.vllm``         ``VLLMConfig``          :mod:`grasp_lightning.engines.vllm_config`
``model.evaluation``           ``EvalConfig``          this module
``model.evaluation.released``  ``ReleasedEvalConfig``  this module
``model.task``                 a ``Task`` plugin       ``tasks/`` (GRPO: :mod:`grasp_lightning.grpo.config`)
=============================  ======================  ========================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from grasp_lightning.checkpointing import (
    RNG_KEY,
    check_trainable_state,
    restore_rng_states,
    rng_states_all_ranks,
    trainable_state,
)
from grasp_lightning.data.collate import Batch
from grasp_lightning.engines import make_engine
from grasp_lightning.engines.base import RolloutEngine
from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.engines.vllm_config import ENGINES, VLLMConfig
from grasp_lightning.errors import GraspConfigError, is_count, is_number, require
from grasp_lightning.evaluation.protocol import GraspProtocol, make_protocol
from grasp_lightning.evaluation.suite import SuiteRunner
from grasp_lightning.policy import (
    LoraConfig,
    PolicyConfig,
    ReferenceConfig,
    load_policy,
    load_processor,
    load_reference,
)
from grasp_lightning.predictions import (
    PredictionSetup,
    files_signature,
    model_identity,
    prediction_records,
    setup_settings,
)
from grasp_lightning.quantization import check_strategy
from grasp_lightning.sequence_parallel import SequenceParallel, install, new_groups, unsupported_reason
from grasp_lightning.step_metrics import Mean, StepMetrics, Sum, combine
from grasp_lightning.task import CrossRank, Task, TaskOutput

__all__ = ["EvalConfig", "GraspModule", "LoraConfig", "OptimConfig", "PolicyConfig", "ReferenceConfig",
           "ReleasedEvalConfig", "RolloutConfig", "VLLMConfig"]

log = logging.getLogger(__name__)

#: The policy version a vLLM engine is synced to in ``validate``/``test``/``predict`` (never an optimizer step
#: count): the weights as loaded for evaluation (:attr:`GraspModule.eval_weights_version`).
EVALUATED_WEIGHTS = -2

#: Checkpoint key of every rank's task state (``Task.state_dict``; GRPO: the rollout cache of the window).
TASK_STATE_KEY = "task_state_all_ranks"

#: The prefix of the ``released`` protocol's keys, as a config or the command line spells it.
RELEASED_KEY = "model.evaluation.released."


@dataclass
class OptimConfig:
    """AdamW with a warm-up then decay schedule from ``transformers.get_scheduler``.

    Attributes:
        lr: peak learning rate (paper: SFT 2e-6, GRPO+SGR 3e-6).
        weight_decay: decoupled weight decay.
        betas: Adam betas.
        eps: Adam epsilon.
        warmup_steps: optimizer steps of linear warm-up (paper: SFT 200, GRPO 256).
        scheduler: a ``transformers.SchedulerType`` name (``cosine``, ``linear``, ``constant_with_warmup``).
    """

    lr: float = 2e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    scheduler: str = "cosine"

    def __post_init__(self) -> None:
        k = "model.optim."
        require(is_number(self.lr) and self.lr > 0, k + "lr", "a number > 0", self.lr)
        require(is_number(self.weight_decay) and self.weight_decay >= 0, k + "weight_decay", "a number >= 0",
                 self.weight_decay)
        require(is_number(self.eps) and self.eps > 0, k + "eps", "a number > 0", self.eps)
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else ()
        require(len(betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in betas), k + "betas",
                 "two numbers in [0, 1)", self.betas)
        require(is_number(self.warmup_steps) and float(self.warmup_steps).is_integer() and self.warmup_steps >= 0,
                 k + "warmup_steps", "an integer >= 0", self.warmup_steps)


@dataclass
class ReleasedEvalConfig:
    """The ``released`` evaluation protocol's prompt and frame settings (``model.evaluation.released.*``;
    unused by ``grasp``). The defaults are the released GRASP evaluation's
    (:class:`~grasp_lightning.evaluation.protocol.ReleasedProtocol`).

    Attributes:
        reasoning: reasoning mode (its system prompt, think instruction, ``<think>\n``).
        model_type: ``qwen3_vl`` (``<think>\n`` appended after the generation prompt) or ``qwen3_5`` (the chat
            template's ``enable_thinking``).
        max_frames: at most this many frames, spread uniformly over the whole clip (replaces
            ``data.video.fps``/``data.video.max_frames``/``data.video.max_pixels`` for GRASP-Bench).
        frame_max_tokens: visual tokens per 2-frame temporal patch; frames are shrunk to the largest patch grid
            within it, aspect ratio kept.
        frame_spatial_patch: pixels per token side; ``None``: the processor's patch size x merge size (32 for
            Qwen3-VL and Qwen3.5, the released constant).
        timestamps: ``released`` (frame ``i`` labelled ``i / 2`` s, as the released code's fake metadata does)
            or ``real`` (the frames' true seconds).
    """

    reasoning: bool = True
    model_type: str = "qwen3_vl"
    max_frames: int = 240
    frame_max_tokens: int = 256
    frame_spatial_patch: int | None = None
    timestamps: str = "released"

    def __post_init__(self) -> None:
        k = RELEASED_KEY
        require(is_count(self.max_frames), k + "max_frames", "an integer >= 1", self.max_frames)
        require(is_count(self.frame_max_tokens), k + "frame_max_tokens", "an integer >= 1", self.frame_max_tokens)
        require(is_count(self.frame_spatial_patch, optional=True), k + "frame_spatial_patch",
                "an integer >= 1 or null", self.frame_spatial_patch)


@dataclass
class EvalConfig:
    """Validation and test: the decoding of every evaluation suite and GRASP-Bench's evaluation protocol.

    Attributes:
        protocol: ``grasp`` (ours: the data module's prompts, ``data.video.fps`` frames with real
            timestamps, our answer parser) or ``released`` (the released GRASP evaluation, so scores
            compare with the paper: its prompts, frames, resizing, answer extraction and report;
            :mod:`grasp_lightning.evaluation.protocol`, ``configs/eval_released.yaml``).
        max_new_tokens: completion budget in tokens; ``None``: the protocol's (ours 1024; released 2048
            with reasoning, 64 without).
        do_sample: sample instead of greedy decoding (released: greedy).
        temperature: sampling temperature (only when sampling).
        top_p: nucleus mass (only when sampling).
        stop_at_answer: stop a completion at ``</answer>`` (released: in reasoning mode only).
        engine: who decodes the answers: ``hf`` (transformers' ``generate`` on the policy) or ``vllm`` (a
            vLLM server with ``model.rollout.vllm``'s settings, the one rollouts use when
            ``model.rollout.engine`` is ``vllm`` too; docs/rollout-engines.md); ``None``:
            ``model.rollout.engine``'s. Greedy answers are the same tokens either way (float32).
        released: the ``released`` protocol's prompt and frame settings (:class:`ReleasedEvalConfig`).
    """

    protocol: str = "grasp"
    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    stop_at_answer: bool = True
    engine: str | None = None
    released: ReleasedEvalConfig = field(default_factory=ReleasedEvalConfig)

    def __post_init__(self) -> None:
        k = "model.evaluation."
        if isinstance(self.released, Mapping):  # from a checkpoint's hyperparameters
            self.released = ReleasedEvalConfig(**self.released)
        require(self.engine is None or self.engine in ENGINES, k + "engine", f"one of {list(ENGINES)} or null",
                self.engine)
        require(is_count(self.max_new_tokens, optional=True), k + "max_new_tokens", "an integer >= 1 or null",
                 self.max_new_tokens)
        require(is_number(self.temperature) and self.temperature > 0, k + "temperature", "a number > 0", self.temperature)
        require(is_number(self.top_p) and 0 < self.top_p <= 1, k + "top_p", "a number in (0, 1]", self.top_p)

    def make_protocol(self) -> GraspProtocol:
        """The protocol object (:func:`grasp_lightning.evaluation.protocol.make_protocol`).

        Raises:
            GraspConfigError: an unknown protocol or setting.
        """
        if self.protocol != "released":
            return make_protocol(self.protocol)
        return make_protocol("released", **dataclasses.asdict(self.released))


class GraspModule(L.LightningModule):
    """Policy + frozen reference model + task plugin.

    Args:
        task: the training objective (``class_path`` in the config).
        policy: how to load the policy.
        reference: where the reference model comes from; built only when ``task.needs_reference``.
        lora: the LoRA flag and its settings (peft).
        optim: optimizer and learning-rate schedule.
        rollout: sampling of training rollouts (used by tasks that sample, e.g. GRPO).
        evaluation: decoding for the evaluation suites and GRASP-Bench's protocol.
        sequence_parallel: ranks ``N`` that split each sample's sequence in the training forwards (Ulysses,
            :mod:`grasp_lightning.sequence_parallel`; docs/scaling.md); 1: none. Ranks ``g*N .. g*N+N-1`` share
            one sample.
    """

    def __init__(self, task: Task, policy: PolicyConfig = PolicyConfig(),  # noqa: B008 (copied below)
                 reference: ReferenceConfig = ReferenceConfig(), lora: LoraConfig = LoraConfig(),  # noqa: B008
                 optim: OptimConfig = OptimConfig(), rollout: RolloutConfig = RolloutConfig(),  # noqa: B008
                 evaluation: EvalConfig = EvalConfig(), sequence_parallel: int = 1) -> None:  # noqa: B008
        super().__init__()
        self.task = task
        task.check_settings(rollout)  # refused at build time: fit, check-data and plan-memory alike
        require(is_count(sequence_parallel), "model.sequence_parallel", "an integer >= 1", sequence_parallel)
        task.check_sequence_parallel(sequence_parallel, rollout)
        self.policy_cfg = dataclasses.replace(policy)
        self.reference_cfg = dataclasses.replace(reference)
        self.lora_cfg = dataclasses.replace(lora)
        self.optim_cfg = dataclasses.replace(optim)
        self.rollout_cfg = dataclasses.replace(rollout)
        self.eval_cfg = dataclasses.replace(evaluation)
        # Plain dicts only, so checkpoints load with ``torch.load(weights_only=True)`` (no unpickling of objects).
        self.save_hyperparameters({
            "task": f"{type(task).__module__}.{type(task).__qualname__}",
            **{name: dataclasses.asdict(cfg) for name, cfg in (
                ("policy", self.policy_cfg), ("reference", self.reference_cfg), ("lora", self.lora_cfg),
                ("optim", self.optim_cfg), ("rollout", self.rollout_cfg), ("evaluation", self.eval_cfg))},
            "sequence_parallel": sequence_parallel,
        })
        self.sequence_parallel_size = sequence_parallel
        self.policy: torch.nn.Module | None = None
        self.reference_model: torch.nn.Module | None = None
        self.processor = None
        self.suites = SuiteRunner()  # the evaluation suites: GRASP-Bench (data.source.bench) and data.eval_suites
        self.last_task_output: TaskOutput | None = None
        self.nonfinite_losses = 0  # micro-batches skipped for a NaN/Inf loss (this process)
        self.step_metrics = StepMetrics()  # this rank's parts of the current optimizer step's metrics
        self.last_step_metrics: dict[str, float] = {}  # the last step's metrics over all ranks, as logged
        self.cross_rank = CrossRank()  # the tasks' only cross-rank operation (sum over ranks; per sample under SP)
        self.sequence_parallel = SequenceParallel()  # the SP group, made at configure_model (a collective)
        self._rollout_engine: RolloutEngine | None = None
        self._eval_engine: RolloutEngine | None = None  # only when model.evaluation.engine differs from rollouts'

    # ------------------------------------------------------------------ models
    def configure_model(self) -> None:
        """Load the policy (and the reference model where :attr:`builds_reference`). Idempotent.

        For ``fit`` outside DeepSpeed the trainable weights are kept in float32 (master weights, see
        :func:`~grasp_lightning.policy.keep_float32_masters`): ``trainer.precision: bf16-mixed`` still
        computes in bf16, but AdamW no longer loses updates to bf16 rounding. DeepSpeed keeps its own
        float32 master copy of bf16 weights, so its policy loads as configured.

        Raises:
            GraspConfigError: ``fit`` with ``trainer.precision`` ``bf16-true``/``16-true`` outside DeepSpeed
                (Lightning would cast the master weights back to half precision).
        """
        if self.policy is not None:
            self._load_reference()  # a module evaluated first, then fitted: its reference comes now
            return
        self.processor = load_processor(self.policy_cfg.name_or_path,
                                        trust_remote_code=self.policy_cfg.trust_remote_code,
                                        revision=self.policy_cfg.revision)
        self.eval_protocol  # noqa: B018 - validates model.evaluation before the (long) model load
        check_strategy(self.lora_cfg, self._trainer.strategy if self._trainer is not None else None)
        self.policy = load_policy(self.policy_cfg, self.lora_cfg, float32_masters=self._needs_float32_masters())
        if self.trainable_only_checkpoints:  # they lack the frozen base; load_state_dict checks what they hold
            self.strict_loading = False
        self._split_sequences()
        self._load_reference()
        self.task.setup(self)

    def _split_sequences(self) -> None:
        """With ``model.sequence_parallel: N > 1`` and a trainer that fits: make the SP groups (collective), sum the
        tasks' cross-rank values per sample (:class:`CrossRank` over the data group) and install the split
        forwards on the policy (:func:`~grasp_lightning.sequence_parallel.install`).

        Raises:
            GraspConfigError: no distributed run, ``N`` not dividing the ranks, or a model whose heads do not split.
        """
        if self.sequence_parallel_size == 1 or self._trainer is None or self.trainer.state.fn != "fit":
            return  # evaluation, predict and chat generate with the whole sequence on every rank
        reason = unsupported_reason(self.policy, self.sequence_parallel_size)  # before the ranks: says what to change
        if reason:
            raise GraspConfigError(f"model.sequence_parallel: {self.sequence_parallel_size}: {reason}")
        self.sequence_parallel = new_groups(self.sequence_parallel_size)
        self.cross_rank = CrossRank(self.sequence_parallel.data_group)
        install(self.policy, self.sequence_parallel)

    #: Set by a caller that drives the module without a trainer only to answer (``chat``): no reference model.
    answers_only: bool = False

    @property
    def builds_reference(self) -> bool:
        """True when the module loads a frozen reference model: the task needs one (``task.needs_reference``;
        GRPO with ``beta != 0``), it is not the adapter-disabled policy (:attr:`uses_adapter_reference`), and
        the trainer fits (or there is no trainer: a caller driving the task by hand). ``validate``, ``test``
        and ``predict`` only generate with the policy, so they never load it; nor does a module driven without a
        trainer that only answers (:attr:`answers_only`, ``chat``)."""
        if not self.task.needs_reference or self.uses_adapter_reference or self.answers_only:
            return False
        trainer = self._trainer
        return trainer is None or trainer.state.fn == "fit"

    def _load_reference(self) -> None:
        """Load the reference model if :attr:`builds_reference` and not yet loaded."""
        if self.builds_reference and self.reference_model is None:
            # Kept out of the module's children so it is never handed to the optimizer nor saved.
            object.__setattr__(self, "reference_model", load_reference(self.policy_cfg, self.reference_cfg))
            install(self.reference_model, self.sequence_parallel)

    def _needs_float32_masters(self) -> bool:
        """True for ``fit`` outside DeepSpeed: the optimizer must update float32 copies of the weights.

        Raises:
            GraspConfigError: the trainer's precision is ``bf16-true`` or ``16-true`` (pure half-precision
                weights) outside DeepSpeed.
        """
        from lightning.pytorch.strategies import DeepSpeedStrategy

        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit" or isinstance(trainer.strategy, DeepSpeedStrategy):
            return False
        precision = str(trainer.precision)
        if precision in ("bf16-true", "16-true"):
            raise GraspConfigError(
                f"trainer.precision={precision} trains pure half-precision weights outside DeepSpeed: AdamW updates "
                f"below half a bf16/fp16 ulp are lost (at lr 2e-6 about 4 % of the weights change in a step). Use "
                f"trainer.precision=bf16-mixed (the policy's trainable weights are then kept in float32 and computed "
                f"in bf16), or a DeepSpeed strategy (float32 master weights in its optimizer)")
        return True

    @property
    def quantized(self) -> bool:
        """True for QLoRA (``model.lora.quantize``): the policy's base is 4 bit and frozen."""
        return self.lora_cfg.enabled and self.lora_cfg.quantize is not None

    @property
    def trainable_only_checkpoints(self) -> bool:
        """True for LoRA and QLoRA (``model.lora.enabled``): checkpoints hold the trainable parameters (the
        adapters, and any module left trainable) and their optimizer state, not the frozen base, which
        reloads from ``model.policy.name_or_path`` (:meth:`on_save_checkpoint`, :meth:`load_state_dict`; under
        DeepSpeed :meth:`grasp_lightning.strategies.GraspDeepSpeedStrategy.save_checkpoint`)."""
        return self.lora_cfg.enabled

    @property
    def uses_adapter_reference(self) -> bool:
        """True when the reference is the policy with its LoRA adapters disabled (no second copy)."""
        return self.lora_cfg.enabled and self.reference_cfg.name_or_path is None

    @contextlib.contextmanager
    def reference(self):
        """Context yielding the reference model: the frozen copy, or the policy with adapters disabled.

        Raises:
            GraspConfigError: the task did not ask for a reference model.
        """
        if self.uses_adapter_reference:
            with self.policy.disable_adapter():
                yield self.policy
        elif self.reference_model is not None:
            if self.reference_model.device != self.device:
                self.reference_model.to(self.device)
            yield self.reference_model
        else:
            raise GraspConfigError("no reference model is loaded: the task does not need one (task.needs_reference is "
                                   "false), or the trainer does not fit (validate, test and predict load none)")

    @property
    def rollout_engine(self) -> RolloutEngine:
        """The rollout engine ``model.rollout.engine`` names (:mod:`grasp_lightning.engines`), built once; a
        vLLM server starts at the first rollout and stops at :meth:`teardown`.

        Raises:
            GraspConfigError: ``vllm`` without its Python or address.
        """
        if self._rollout_engine is None:
            rank = self.global_rank if self._trainer is not None else 0
            self._rollout_engine = make_engine(self.rollout_cfg, model_path=self.policy_cfg.name_or_path, rank=rank)
        return self._rollout_engine

    @property
    def policy_version(self) -> int:
        """Optimizer steps taken so far (``trainer.global_step``): an engine holding its own copy of the weights
        updates it when its copy is older."""
        return int(self.trainer.global_step) if self._trainer is not None else 0

    @property
    def eval_engine_name(self) -> str:
        """``model.evaluation.engine``, else ``model.rollout.engine``."""
        return self.eval_cfg.engine or self.rollout_cfg.engine

    @property
    def eval_engine(self) -> RolloutEngine:
        """The engine that decodes ``validate``/``test``/``predict`` answers (:attr:`eval_engine_name`): the
        rollout engine when both name the same, else one of its own built with ``model.rollout``'s settings.

        Raises:
            GraspConfigError: ``vllm`` without its Python or address.
        """
        if self.eval_engine_name == self.rollout_cfg.engine:
            return self.rollout_engine
        if self._eval_engine is None:
            rank = self.global_rank if self._trainer is not None else 0
            cfg = dataclasses.replace(self.rollout_cfg, engine=self.eval_engine_name)
            self._eval_engine = make_engine(cfg, model_path=self.policy_cfg.name_or_path, rank=rank)
        return self._eval_engine

    @property
    def eval_weights_version(self) -> int:
        """The version of the weights evaluation decodes with, for an engine holding its own copy: inside
        ``fit``, :attr:`policy_version` (validation after step ``t`` reuses the copy the rollouts synced);
        in ``validate``/``test``/``predict``, :data:`EVALUATED_WEIGHTS`, so a vLLM server is synced once
        to the policy as loaded (a checkpoint, LoRA merged, QLoRA dequantized) before its first answer,
        never left on the model directory's weights."""
        trainer = self._trainer
        if trainer is not None and trainer.state.fn == "fit":
            return self.policy_version
        return EVALUATED_WEIGHTS

    def teardown(self, stage: str) -> None:
        """Stop the engines' servers, if any were started (Lightning calls this at the end of every stage)."""
        for attr in ("_rollout_engine", "_eval_engine"):
            engine = getattr(self, attr)
            if engine is not None:
                engine.close()
                setattr(self, attr, None)

    @property
    def tokenizer(self):
        """The processor's tokenizer (``None`` before :meth:`configure_model` loads it)."""
        return self.processor.tokenizer if self.processor is not None else None

    # ------------------------------------------------------------------ training
    def setup(self, stage: str) -> None:
        """Before ``fit`` builds the train loader: tell the DataModule how the task consumes batches.

        ``connect(window, repeat, data_mode)``: the accumulation window (``trainer.accumulate_grad_batches``)
        for tasks that work on whole windows, the task's ``num_iterations`` (each window is yielded
        that many times, so a rollout is reused only after an optimizer step) and the task's
        ``data_mode`` (the batch kind; the task is its one owner); ``lookahead`` with ``model.rollout.overlap: 1``
        (the task reads the next window ahead, ``Window.peek``).

        Raises:
            GraspConfigError: ``num_iterations > 1`` with a DataModule that has no ``connect``; a task that
                draws prompts (``dynamic_sampling: refill``) with validation placed as a share of the epoch
                (:meth:`_check_validation_in_steps`); from ``connect``: an explicit ``data.loader.data_mode`` that
                contradicts the task.
        """
        if stage != "fit" or self._trainer is None:
            return
        if self.task.samples_rollouts:
            self.rollout_engine  # noqa: B018 - refuses a bad model.rollout.engine setting before the run
        dm = getattr(self.trainer, "datamodule", None)
        repeat = self.task.num_iterations
        window = self.trainer.accumulate_grad_batches if self.task.window_batches else 1
        connect = getattr(dm, "connect", None)
        if connect is None:
            if repeat > 1 or window > 1:
                raise GraspConfigError(f"model.task.init_args.loss.num_iterations={repeat} with "
                                       f"trainer.accumulate_grad_batches={self.trainer.accumulate_grad_batches} "
                                       "needs a DataModule with connect(window, repeat) (GraspDataModule)")
            return
        connection = {"window": window, "repeat": repeat, "data_mode": self.task.data_mode}
        if self.task.draws_prompts:
            self._check_validation_in_steps()
            connection["draws"] = True
        if self.task.samples_rollouts and self.rollout_cfg.overlap:
            connection["lookahead"] = True  # the next window is sampled while this one trains (Window.peek)
        if self.task.splits_groups:
            connection["split_groups"] = True  # the released run's loop: the epoch ends after len(prompt loader) batches
        if self.sequence_parallel_size > 1:
            connection["sequence_parallel"] = self.sequence_parallel_size  # the group's ranks read the same batches
        connect(**connection)

    def _check_validation_in_steps(self) -> None:
        """A task that draws prompts from the stream (``dynamic_sampling: refill``) ends its epochs early, so
        validation placed by the epoch's announced length (``trainer.val_check_interval`` null or a fraction:
        Lightning validates when the batch index reaches that share of ``len(loader)``) would never run.

        Raises:
            GraspConfigError: validation is on and placed as a share of the epoch.
        """
        trainer = self.trainer
        interval = getattr(trainer, "val_check_interval", None)  # unset for a time-based interval, which is fine
        validates = trainer.limit_val_batches != 0 and self._datamodule_validates(trainer.datamodule)
        if validates and isinstance(interval, float) and getattr(trainer, "_val_check_time_interval", None) is None:
            raise GraspConfigError(
                f"model.task.init_args.batching.dynamic_sampling=refill ends each epoch early by the windows it draws, so "
                f"validation at trainer.val_check_interval={interval} (a share of the epoch's announced length) would "
                "never run: give trainer.val_check_interval in micro-batches (an integer, as configs/sgr.yaml's 200), "
                "or turn validation off (data.source.bench=null and no data.eval_suites)")

    @staticmethod
    def _datamodule_validates(datamodule) -> bool:
        """Whether ``datamodule`` has anything to validate: GRASP-Bench (``data.source.bench``) or an evaluation
        suite (``data.eval_suites``); ``True`` for a DataModule of another kind (its validation is unknown)."""
        source = getattr(datamodule, "source", None)
        if source is None or not hasattr(source, "bench"):
            return True
        return bool(source.bench) or bool(getattr(datamodule, "eval_suites", None))

    def training_step(self, batch: Batch, batch_idx: int):
        """Run the task on one micro-batch and add its metrics to the optimizer step's (:attr:`step_metrics`).

        Every micro-batch of every rank adds ``data/skipped`` and the metrics of :meth:`Task.prepare`
        (GRPO: the window it sampled), then, unless empty, the task's ``train/`` metrics,
        ``train/nonfinite_loss`` and ``train/loss`` (:class:`~grasp_lightning.step_metrics.Mean` over the
        step's micro-batches with a finite loss, on all ranks). At the step's last micro-batch
        (:meth:`_ends_step`) they are reduced over ranks and logged once (:meth:`_log_step`).
        """
        parts = self.step_metrics
        parts.add({"data/skipped": Sum(len(batch.skipped))})
        prepared = self.task.prepare(self, batch) or {}  # every rank, every micro-batch: the task's collectives
        parts.add(prepared, prefix="train/")
        result = self._train_micro_batch(batch, prepared)
        if self._ends_step(batch):
            self._log_step()
        return result

    def _train_micro_batch(self, batch: Batch, prepared: dict):
        """The task's loss of a non-empty micro-batch (``None``/zero loss for an empty or non-finite one); its
        metrics go to :attr:`step_metrics`. ``last_task_output`` (read by callbacks) also shows ``prepared``."""
        if len(batch) == 0:
            self.last_task_output = None
            return self._no_update()
        out = self.task.training_step(self, batch)
        self.step_metrics.add(out.metrics, prefix="train/")
        if prepared:
            out.metrics = combine(prepared, out.metrics)
        self.last_task_output = out
        finite = out.loss is None or bool(torch.isfinite(out.loss.detach()).all())
        self.step_metrics.add({"train/nonfinite_loss": Sum(float(not finite))})
        if not finite:
            return self._skip_nonfinite_loss(out.loss, batch)
        if out.loss is not None:
            self.step_metrics.add({"train/loss": Mean(out.loss.detach(), 1)})
            if self.sequence_parallel.size > 1:  # DDP/DeepSpeed average over all W ranks, N of which share a sample
                return out.loss * self.sequence_parallel.loss_scale
        return out.loss

    def _ends_step(self, batch: Batch) -> bool:
        """Whether this micro-batch is the last of its optimizer step: Lightning's own decision
        (``fit_loop._should_accumulate``, which also steps at an epoch's last batch); without a trainer,
        the last micro-batch of ``batch.window`` (or every micro-batch without one)."""
        if self._trainer is not None:
            return not self.trainer.fit_loop._should_accumulate()
        window = getattr(batch, "window", None)
        return window is None or window.position == len(window.batches) - 1

    def _log_step(self) -> None:
        """Reduce the step's metrics over ranks (one collective, on every rank), keep them as
        :attr:`last_step_metrics`, log the task's warnings (:meth:`Task.step_warnings`) on rank 0, and write
        them to every logger at ``trainer.global_step`` (every ``trainer.log_every_n_steps`` steps).

        Written to the loggers directly rather than through ``self.log``: a name missing from a step (a
        mean over nothing) is then missing from the log, where Lightning would repeat its last value.
        ``train/loss`` also goes to the progress bar and ``trainer.callback_metrics``."""
        values = self.step_metrics.reduce(self.cross_rank)
        self.last_step_metrics = values
        step = self.trainer.global_step if self._trainer is not None else -1
        if self.global_rank == 0:
            own = {k[len("train/"):]: v for k, v in values.items() if k.startswith("train/")}
            for message in self.task.step_warnings(self, own):
                log.warning("step %d: %s", step, message)
        if self._trainer is None:
            return
        if "train/loss" in values:
            self.log("train/loss", values["train/loss"], prog_bar=True, logger=False, on_step=True, batch_size=1)
        every = max(1, int(self.trainer.log_every_n_steps))
        if values and ((step + 1) % every == 0 or self.trainer.should_stop):
            for logger in self.loggers:
                logger.log_metrics(values, step=step)

    @override
    def on_train_epoch_start(self) -> None:
        self.step_metrics.clear()  # a window cut at an epoch's end (DeepSpeed does not step there) is not carried

    def _skip_nonfinite_loss(self, loss: torch.Tensor, batch: Batch):
        """Count and log a NaN/Inf loss, then skip the micro-batch.

        On one process Lightning skips backward and step for ``None``; with several processes (DDP,
        DeepSpeed) every rank must still run the backward collective, so the micro-batch returns a
        zero loss over the trainable weights instead (zero gradient). ``grasp_lightning.callbacks.control.guards.NonFiniteGuard``
        stops the run after too many in a row.
        """
        self.nonfinite_losses += 1
        log.warning("step %d: non-finite loss %s on items %s (dataset indices %s); micro-batch skipped",
                    self.trainer.global_step if self._trainer is not None else -1, float(loss.detach().float().sum()),
                    [item.uid for item in batch.items], list(batch.indices))
        return self._no_update()

    def _no_update(self):
        """What a micro-batch that must not train returns: ``None`` on one process (Lightning skips
        its backward and step); under DDP or DeepSpeed, where every rank must run the backward
        collectives (and DeepSpeed refuses ``None``), a zero loss over the trainable weights."""
        from lightning.pytorch.strategies import DeepSpeedStrategy

        if self._trainer is None or (self.trainer.world_size == 1
                                     and not isinstance(self.trainer.strategy, DeepSpeedStrategy)):
            return None
        return sum((p * 0.0).sum() for p in self.policy.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ evaluation
    @property
    def eval_protocol(self) -> GraspProtocol:
        """The GRASP-Bench protocol of ``model.evaluation.protocol`` (built once).

        Raises:
            GraspConfigError: an unknown protocol or setting.
        """
        if getattr(self, "_eval_protocol", None) is None:
            self._eval_protocol = self.eval_cfg.make_protocol()
        return self._eval_protocol

    @property
    def eval_max_new_tokens(self) -> int:
        """``model.evaluation.max_new_tokens``, or the protocol's budget when it is ``None``."""
        budget = self.eval_cfg.max_new_tokens
        return self.eval_protocol.max_new_tokens if budget is None else budget

    def on_validation_epoch_start(self) -> None:
        """Reset :attr:`suites` over the DataModule's ``val_suites`` and warn about decoding that differs
        from the chosen protocol's reference."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer else None
        self.suites.start(getattr(datamodule, "val_suites", None) or [], self.device)
        cfg = self.eval_cfg
        deviations = self.eval_protocol.decoding_deviations(self.eval_max_new_tokens, cfg.do_sample, cfg.stop_at_answer)
        if deviations and self.global_rank == 0:
            log.warning("model.evaluation.protocol=%s with decoding that differs from the released evaluation: %s",
                        cfg.protocol, ", ".join(deviations))

    def validation_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Decode answers for a batch of the evaluation suite of ``dataloader_idx`` and hand them to
        :attr:`suites`, which scores them with that suite (padding rows are not counted).

        Raises:
            GraspConfigError: the dataloader belongs to no evaluation suite of the DataModule.
        """
        if len(batch) == 0:
            return
        suite = self.suites.route(dataloader_idx)
        if suite is None:
            raise GraspConfigError(f"validation dataloader {dataloader_idx} belongs to no evaluation suite (the "
                                   f"DataModule's val_suites: {[s.name for s in self.suites.suites]})")
        self.suites.update(suite, self._answer(batch).texts, batch)

    def _answer(self, batch: Batch, streamer=None):
        """One completion per prompt of ``batch`` with the ``model.evaluation`` decoding (eval mode), by
        :attr:`eval_engine` (``generate``, or a vLLM server synced to :attr:`eval_weights_version`).

        Args:
            batch: left-padded prompts.
            streamer: a transformers ``TextStreamer`` fed each token as it is generated (``chat``); only the
                ``hf`` engine takes one.

        Raises:
            EngineError: the vLLM engine failed or refused a prompt (:mod:`grasp_lightning.engines.vllm`).
            GraspConfigError: a ``streamer`` with an engine other than ``hf``.
        """
        cfg = self.eval_cfg
        stream = {}
        if streamer is not None:
            if self.eval_engine_name != "hf":
                raise GraspConfigError(f"streaming tokens needs model.evaluation.engine hf, not {self.eval_engine_name}")
            stream["streamer"] = streamer
        was_training = self.policy.training
        self.policy.eval()
        try:
            completions = self.eval_engine.answer(
                self.policy, self.tokenizer, batch.inputs, max_new_tokens=self.eval_max_new_tokens,
                do_sample=cfg.do_sample, temperature=cfg.temperature, top_p=cfg.top_p,
                stop_strings=("</answer>",) if cfg.stop_at_answer else (), policy_version=self.eval_weights_version,
                **stream)
        finally:
            self.policy.train(was_training)
        return completions

    def on_validation_epoch_end(self) -> None:
        """Compute every suite's metrics (collective), log the values each suite names
        (:meth:`~grasp_lightning.evaluation.base.EvalSuite.log_values`) and its summary, if any."""
        for name, metrics in self.suites.compute().items():
            suite = self.suites.by_name(name)
            for key, value in suite.log_values(metrics).items():
                self.log(key, value, rank_zero_only=True)
            summary = suite.summary(metrics)  # the released metric_report layout for GRASP-Bench, or None
            if summary and self.global_rank == 0:
                log.info("%s (%s protocol):%s", suite.title, self.eval_cfg.protocol, summary)

    def test_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Same as :meth:`validation_step`."""
        self.validation_step(batch, batch_idx, dataloader_idx)

    @override
    def on_test_epoch_start(self) -> None:
        self.on_validation_epoch_start()

    @override
    def on_test_epoch_end(self) -> None:
        self.on_validation_epoch_end()

    def on_predict_start(self) -> None:
        """Refuse a ``predict`` whose answers would reach no file.

        Raises:
            GraspConfigError: no callback of ``trainer.callbacks`` is a ``BasePredictionWriter``
                (``grasp_lightning.callbacks.prediction_writer.PredictionWriter`` in the recipes).
        """
        if not any(isinstance(cb, BasePredictionWriter) for cb in self.trainer.callbacks):
            raise GraspConfigError("predict writes its answers through a prediction writer, and trainer.callbacks has "
                                   "none: add `- class_path: grasp_lightning.callbacks.prediction_writer.PredictionWriter` (as the recipes "
                                   "in configs/ do)")

    @property
    def setting_groups(self) -> dict[str, object]:
        """The module's setting groups by config name (``model.<name>``): one per dataclass argument of
        :class:`GraspModule` (``tests/unit/test_predictions.py`` checks none is missing)."""
        return {"policy": self.policy_cfg, "reference": self.reference_cfg, "lora": self.lora_cfg,
                "optim": self.optim_cfg, "rollout": self.rollout_cfg, "evaluation": self.eval_cfg}

    def prediction_setup(self, data_groups: Mapping[str, Any]) -> PredictionSetup:
        """What, besides the item, decides this module's ``predict`` answers, for ``PredictionWriter``'s resume.

        The key covers every setting of the module's groups (:attr:`setting_groups`) and of ``data_groups`` (the
        DataModule's ``hparams``: ``source``, ``video``, ``prompt``, ...) but those
        :data:`~grasp_lightning.predictions.NOT_IN_SETUP_KEY` names (:func:`~grasp_lightning.predictions.setup_settings`),
        with what they resolve to: the policy's weights by :func:`~grasp_lightning.predictions.model_identity`,
        a processor other than the policy's by its files, the engine that answers (:attr:`eval_engine_name`;
        ``model.rollout.vllm`` only when it is ``vllm``), ``model.lora`` only when LoRA is on, the checkpoint
        ``predict`` restored (``trainer.ckpt_path``, known once it is loaded) by its file signature, the
        trainer's precision, and the ``model.evaluation`` decoding with ``max_new_tokens`` resolved.

        Args:
            data_groups: the DataModule's setting groups by name (plain dicts; ``{}``: none).
        """
        cfg = self.policy_cfg
        trainer = self._trainer
        checkpoint = str(trainer.ckpt_path) if trainer is not None and trainer.ckpt_path else None
        decoding = {**dataclasses.asdict(self.eval_cfg), "max_new_tokens": self.eval_max_new_tokens}
        decoding.pop("engine")  # a record without an engine was decoded by generate (hf); vLLM's records
        if self.eval_engine_name != "hf":  # name it (bf16 kernels may break a greedy tie the other way)
            decoding["engine"] = self.eval_engine_name
        groups: dict[str, Any] = {f"model.{name}": dataclasses.asdict(group)
                                  for name, group in self.setting_groups.items()}
        if self.eval_engine_name != "vllm":
            groups["model.rollout"].pop("vllm")
        if not self.lora_cfg.enabled:
            groups["model.lora"] = {"enabled": False}
        groups.update({f"data.{name}": group for name, group in data_groups.items() if isinstance(group, Mapping)})
        processor = (data_groups.get("prompt") or {}).get("processor")
        identity = {
            "model": model_identity(cfg.name_or_path, cfg.revision),
            "processor": model_identity(processor) if processor not in (None, cfg.name_or_path) else None,
            "checkpoint": files_signature(checkpoint) if checkpoint else None,
            "precision": str(trainer.precision) if trainer is not None else None,
            "engine": self.eval_engine_name, "settings": setup_settings(groups),
        }
        return PredictionSetup(model=cfg.name_or_path, checkpoint=checkpoint, decoding=decoding, identity=identity)

    def predict_step(self, batch: Batch, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        """Answer a batch: one completion per prompt (``model.evaluation`` decoding), returned as
        :func:`~grasp_lightning.predictions.prediction_records` (id, completion, parsed answer,
        participants named, token counts, seconds), skipped items included with their reason."""
        if len(batch) == 0:
            return prediction_records(batch, [], [], [], 0.0)
        start = time.perf_counter()
        completions = self._answer(batch)
        seconds = time.perf_counter() - start
        return prediction_records(batch, completions.texts, completions.mask.sum(1).tolist(),
                                  completions.prompt_opened_think or [False] * len(batch), seconds)

    # ------------------------------------------------------------------ optimisation
    def configure_callbacks(self) -> list:
        """The callbacks the task's settings ask for (:meth:`grasp_lightning.task.Task.callbacks`)."""
        return self.task.callbacks()

    def configure_optimizers(self):
        """AdamW over the trainable policy parameters, stepped schedule with warm-up."""
        from transformers import get_scheduler

        cfg = self.optim_cfg
        params = [p for p in self.policy.parameters() if p.requires_grad]
        if not params:
            raise GraspConfigError("the policy has no trainable parameters (everything frozen?)")
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                      weight_decay=cfg.weight_decay)
        total = int(self.trainer.estimated_stepping_batches) if self.trainer is not None else 1
        scheduler = get_scheduler(cfg.scheduler, optimizer, num_warmup_steps=cfg.warmup_steps,
                                  num_training_steps=max(total, cfg.warmup_steps + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Add every rank's torch/numpy/Python/CUDA random states, so a resumed run continues the same
        random streams (rollout sampling, dropout), and every rank's task state under
        :data:`TASK_STATE_KEY` (GRPO: the cached rollouts of the current window, so a run stopped inside
        a window resumes with the same samples). Both are gathered to every rank because DeepSpeed
        saves client state from rank 0 only. Collective: every rank saves (``trainer.save_checkpoint``).

        LoRA and QLoRA (:attr:`trainable_only_checkpoints`): ``state_dict`` keeps the trainable parameters only
        (:func:`~grasp_lightning.checkpointing.trainable_state`); the optimizer holds nothing else
        (:meth:`configure_optimizers`), so its state is the adapters' too. DeepSpeed writes the weights itself
        and ignores this ``state_dict``: :meth:`grasp_lightning.strategies.GraspDeepSpeedStrategy.save_checkpoint`."""
        checkpoint[RNG_KEY] = rng_states_all_ranks()
        checkpoint[TASK_STATE_KEY] = CrossRank().gather(self.task.state_dict())  # every rank's, by global rank
        if self.trainable_only_checkpoints and "state_dict" in checkpoint:
            checkpoint["state_dict"] = trainable_state(checkpoint["state_dict"], self)

    #: The optimizer step of the checkpoint the weights were restored from (``validate --ckpt_path``:
    #: evaluation reports are filed under it; Lightning restores no step counter outside ``fit``).
    restored_step: int | None = None

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Keep the saved random states; they are set at the first training batch after the resume,
        once the data loader has drawn its seeds, which is where the uninterrupted run stood. Restore this
        rank's task state (``Task.load_state_dict``); note the checkpoint's step (:attr:`restored_step`)."""
        self._pending_rng_states = checkpoint.get(RNG_KEY)
        self.restored_step = checkpoint.get("global_step")
        states = checkpoint.get(TASK_STATE_KEY) or []
        rank = self.global_rank if self._trainer is not None else 0
        if len(states) > rank:
            self.task.load_state_dict(states[rank])
        elif states:
            log.warning("checkpoint holds the task state of %d ranks, this is rank %d: not restored", len(states), rank)

    @override
    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; for LoRA and QLoRA (:attr:`trainable_only_checkpoints`), whose
        checkpoints lack the frozen base, first :func:`~grasp_lightning.checkpointing.check_trainable_state`,
        then a non-strict load. Lightning calls it on resume, and so does DeepSpeed's engine with the module
        state of its checkpoint directory.

        Raises:
            GraspConfigError: a trainable parameter is missing from ``state_dict``, or it names a weight this
                model does not have.
        """
        if self.trainable_only_checkpoints and self.policy is not None:
            check_trainable_state(state_dict, self, "the resumed checkpoint")
            strict = False
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @override
    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        states = getattr(self, "_pending_rng_states", None)
        if states:
            restore_rng_states(states, self.global_rank)
            self._pending_rng_states = None
