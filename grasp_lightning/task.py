"""The task-plugin interface: a training objective, the narrow context it runs in, and what it returns.

The core knows no task by name. A task gets a :class:`TaskContext` (policy, tokenizer, device,
reference model, rollout sampling settings and engine, policy version, a cross-rank sum) and a batch, and returns a
:class:`TaskOutput`: a loss, the metrics to log and, for tasks that sample, a typed
:class:`RolloutRecord` the callbacks read. Configs select a task by ``class_path``
(``grasp_lightning.tasks.sft.SFTTask``, ``grasp_lightning.tasks.grpo.GRPOTask``). A task owns its objective, including how its loss
is normalised under gradient accumulation, and nothing else: it never sees the trainer, the
strategy, the DataModule or the processor. :class:`~grasp_lightning.module.GraspModule` is a
``TaskContext`` (structurally); tests pass small stand-ins.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from grasp_lightning.engines.decoding import RolloutConfig

if TYPE_CHECKING:
    from grasp_lightning.data.collate import Batch
    from grasp_lightning.data.records import GraspItem
    from grasp_lightning.engines.base import RolloutEngine
    from grasp_lightning.sequence_parallel import SequenceParallel


@dataclass
class RolloutRecord:
    """The scored rollouts of one micro-batch, as a sampling task (GRPO) shows them to the callbacks.

    ``B`` prompts (groups) of ``K`` completions each: ``N = B * K`` rows, group-major (row ``n`` is
    completion ``n % K`` of prompt ``n // K``); ``T`` reward terms; ``M`` completion tokens counted by
    the loss. Read by ``callbacks/kl_logging.py`` (``kl_tokens``), ``callbacks/rollout_samples.py``
    (everything but the token tensors) and ``callbacks/timing.py`` (``len(completions)``).

    Attributes:
        completions: ``N`` decoded completion texts.
        items: the ``B`` prompt records (:class:`~grasp_lightning.data.records.GraspItem`).
        num_generations: ``K``.
        reward_names: the ``T`` reward entries (registry names or import paths), the column order
            of ``terms``.
        terms: ``(N, T)`` float32 reward terms.
        rewards: ``(N,)`` weighted sum of the terms (plus the overlong penalty in ``reward`` mode).
        advantages: ``(N,)`` the advantages the loss used.
        kl_tokens: ``(M,)`` k3 KL to the reference model (nats) of the loss tokens, ``None`` without a
            reference model (GRPO ``loss.beta: 0``).
        entropy_tokens: ``(M,)`` policy entropy (nats) of the loss tokens, ``None`` if not computed.
    """

    completions: list[str]
    items: list[GraspItem]
    num_generations: int
    reward_names: list[str]
    terms: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    kl_tokens: torch.Tensor | None = None
    entropy_tokens: torch.Tensor | None = None


@dataclass
class TaskOutput:
    """What a task returns for one micro-batch (kept until the next step as ``module.last_task_output``).

    Attributes:
        loss: scalar tensor to back-propagate (already normalised as the task defines), or
            ``None`` to skip the micro-batch (e.g. every row was skipped).
        metrics: this micro-batch's parts of the step's metrics, logged under ``train/`` once per
            optimizer step: :mod:`grasp_lightning.step_metrics` values (``Mean(total, count)``, ``Sum``, ...)
            say how they combine over the step's micro-batches and ranks; a plain number or 0-d tensor is a
            mean over the step's micro-batches.
        rollout: the micro-batch's scored rollouts for the callbacks (tasks that sample), else ``None``.
    """

    loss: torch.Tensor | None
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)
    rollout: RolloutRecord | None = None


class CrossRank:
    """The one cross-rank operation tasks may use: a sum over the data-parallel ranks.

    Every rank must call :meth:`sum` the same number of times in the same order; the module calls
    :meth:`Task.prepare` on every micro-batch of every rank (empty ones included) for that reason.
    On one process it returns its input. Under DDP and DeepSpeed, Lightning initialises
    ``torch.distributed`` (gloo on CPU, NCCL on GPU: pass tensors on the module's device).

    Args:
        group: the process group to reduce over: ``None``, every rank (the default group); with sequence
            parallelism the data group of this rank's position (one rank per sample,
            :attr:`grasp_lightning.sequence_parallel.SequenceParallel.data_group`), so a sample the ``N``
            ranks of its group share counts once.
    """

    def __init__(self, group=None) -> None:
        self.group = group

    @property
    def world_size(self) -> int:
        """Number of ranks reduced over (``W``, or ``W / N`` with sequence parallelism; 1 without ``torch.distributed``)."""
        dist = torch.distributed
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``values`` over the ranks (a new tensor; shape and dtype kept)."""
        out = values.detach().clone()
        if self.world_size > 1:
            torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM, group=self.group)
        return out

    def gather(self, obj: object) -> list:
        """``obj`` of every rank reduced over, index = rank in the group (``all_gather_object``; ``[obj]`` on one
        process). Collective: every rank must call it."""
        if self.world_size > 1:
            out: list = [None] * self.world_size
            torch.distributed.all_gather_object(out, obj, group=self.group)
            return out
        return [obj]


@runtime_checkable
class TaskContext(Protocol):
    """What a task may use: the one narrow view of the run it gets (the module satisfies it).

    Attributes:
        policy: the trainable policy (a Hugging Face image-text-to-text model).
        tokenizer: the policy's tokenizer (``None`` before the policy is loaded).
        device: where the policy's inputs go.
        rollout_cfg: the rollout sampling settings (``model.rollout``), the one copy; read, never copy.
        rollout_engine: the engine that samples rollouts (:mod:`grasp_lightning.engines`, ``model.rollout.engine``);
            a context without one cannot sample (``AttributeError``), there is no fallback.
        policy_version: optimizer steps taken so far (an engine holding its own copy of the weights
            updates it when its copy is older).
        cross_rank: the cross-rank sum (:class:`CrossRank`).
        sequence_parallel: the sequence-parallel group splitting the task's training forwards
            (:class:`~grasp_lightning.sequence_parallel.SequenceParallel`; ``size`` 1: none).
    """

    policy: torch.nn.Module
    tokenizer: Any
    rollout_cfg: RolloutConfig
    rollout_engine: RolloutEngine
    policy_version: int
    cross_rank: CrossRank
    sequence_parallel: SequenceParallel

    @property
    def device(self) -> torch.device:
        """The device of the policy's inputs."""

    def reference(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """Context yielding the frozen reference model (or the policy with its adapters disabled).

        Raises:
            GraspConfigError: the task asked for no reference model (``Task.needs_reference``).
        """


class Task:
    """Base class of a task plugin.

    Attributes:
        needs_reference: the module builds a frozen reference model only when this is true.
        data_mode: the batch kind the task consumes: ``"sft"`` (prompt + target, labels) or
            ``"rl"`` (prompts with answers and ground-truth events). The task is its one owner: the
            module passes it to the DataModule (``GraspDataModule.connect(data_mode=...)``), so
            ``data.loader.data_mode`` need not be set.
        num_iterations: optimizer steps each batch serves (GRPO's rollout reuse); the DataModule
            repeats every accumulation window this many times.
        window_batches: the task works on whole accumulation windows: each micro-batch arrives with
            ``batch.window`` holding all micro-batches of its window (GRPO samples them together).
        draws_prompts: the task may take further windows from the data stream (``batch.window.draw()``,
            GRPO ``dynamic_sampling: refill``); the DataModule then records draws for resume.
        splits_groups: each of a window's ``num_iterations`` repeats trains other completions of its prompts,
            and the epoch ends after as many micro-batches as the loader has micro-batches of prompts (GRPO
            ``batching.micro_batch: rollout``, the released GRASP run's loop); the module tells the DataModule.
        samples_rollouts: the task samples completions from the policy during training
            (``model.rollout``: K per prompt); the memory planner then counts the rollout KV cache.
        shares_prompt: a group's clip is encoded and its prompt prefilled once for its K completions
            (``grasp_lightning/grpo/scoring.py``); the planner counts one prompt per group.
        logprob_chunk_size: the task's log-probs run the LM head over this many tokens at a time
            (:mod:`grasp_lightning.grpo.logprobs`); the planner then counts one chunk's logits.
            ``None``: the full ``(N, L, V)`` logits.
    """

    needs_reference: bool = False
    data_mode: str = "sft"
    num_iterations: int = 1
    window_batches: bool = False
    draws_prompts: bool = False
    splits_groups: bool = False
    samples_rollouts: bool = False
    shares_prompt: bool = False
    logprob_chunk_size: int | None = None

    def state_dict(self) -> dict:
        """This rank's task state for checkpoints (plain tensors and containers, so ``weights_only``
        loading works); the module saves every rank's (:meth:`CrossRank.gather`). Default: none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` of this rank (called from ``GraspModule.on_load_checkpoint``)."""

    def check_settings(self, rollout_cfg: RolloutConfig) -> None:
        """Refuse settings this task cannot run with, when the module is built (before any weight is
        loaded, so ``check-data`` and ``plan-memory`` refuse them as ``fit`` does). Default: none.

        Raises:
            GraspConfigError: a setting the task cannot run with, naming its key.
        """

    def check_sequence_parallel(self, size: int, rollout_cfg: RolloutConfig) -> None:
        """Refuse ``model.sequence_parallel: size`` with settings of this task that need a sample's whole sequence,
        or a sample's own process, on one rank (checked when the module is built). Default: none refused;
        a task whose training forwards do not split (:mod:`grasp_lightning.sequence_parallel`) still runs,
        every rank of a group computing the whole sample.

        Raises:
            GraspConfigError: a setting that cannot run split, naming its key and ``model.sequence_parallel``.
        """

    def setup(self, ctx: TaskContext) -> None:
        """Called once the policy is loaded (e.g. to read token ids from the tokenizer)."""

    def callbacks(self) -> list:
        """Lightning callbacks the task's settings ask for (the module returns them from
        ``configure_callbacks``, so they join the trainer's), e.g. GRPO's reference sync. Default: none."""
        return []

    def prepare(self, ctx: TaskContext, batch: Batch) -> dict | None:
        """Called on every micro-batch of every rank before :meth:`training_step`, also for an empty
        batch that will be skipped: the place for cross-rank collectives (``ctx.cross_rank``),
        which no rank may miss.

        Returns:
            metrics of work done here that belong to the optimizer step rather than to one micro-batch's
            loss (GRPO: the window it sampled), as :attr:`TaskOutput.metrics`; or ``None``.
        """
        return None

    def step_warnings(self, ctx: TaskContext, metrics: dict[str, float]) -> list[str]:
        """Problems visible in one optimizer step's metrics that a user should act on, each naming the
        setting to change; the module logs them at WARNING on rank 0. Default: none.

        Args:
            ctx: the task's context (its settings, e.g. ``ctx.rollout_cfg``).
            metrics: the step's metrics over all ranks, named as in :attr:`TaskOutput.metrics` (no ``train/``).
        """
        return []

    def training_step(self, ctx: TaskContext, batch: Batch) -> TaskOutput:
        """Compute the loss of one micro-batch. Must be overridden."""
        raise NotImplementedError
