"""The task-plugin interface: a training objective the :class:`~grasp_lightning.module.GraspModule` runs.

The core knows no task by name. A task gets the module (policy, reference model, processor) and a
batch, and returns a loss and the metrics to log; configs select it by ``class_path``
(``tasks.sft.SFTTask``, ``tasks.grpo.GRPOTask``). A task owns its objective, including how its
loss is normalised under gradient accumulation, and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from grasp_lightning.data.collate import Batch
    from grasp_lightning.module import GraspModule


@dataclass
class TaskOutput:
    """What a task returns for one micro-batch.

    Attributes:
        loss: scalar tensor to back-propagate (already normalised as the task defines), or
            ``None`` to skip the micro-batch (e.g. every row was skipped).
        metrics: scalars to log under ``train/`` (tensors or floats).
        extras: anything the callbacks may read (e.g. per-token KL, completions), kept until the
            next step as ``module.last_task_output``.
    """

    loss: torch.Tensor | None
    metrics: dict[str, torch.Tensor | float] = field(default_factory=dict)
    extras: dict = field(default_factory=dict)


class CrossRank:
    """The one cross-rank operation tasks may use: a sum over all ranks (the default process group).

    Every rank must call :meth:`sum` the same number of times in the same order; the module calls
    :meth:`Task.prepare` on every micro-batch of every rank (empty ones included) for that reason.
    On one process it returns its input. Under DDP and DeepSpeed, Lightning initialises
    ``torch.distributed`` (gloo on CPU, NCCL on GPU: pass tensors on the module's device).
    """

    @property
    def world_size(self) -> int:
        """Number of ranks ``W`` (1 without ``torch.distributed``)."""
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of ``values`` over all ranks (a new tensor; shape and dtype kept)."""
        out = values.detach().clone()
        if self.world_size > 1:
            torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
        return out

    def gather(self, obj: object) -> list:
        """``obj`` of every rank, index = global rank (``all_gather_object``; ``[obj]`` on one process).
        Collective: every rank must call it."""
        if self.world_size > 1:
            out: list = [None] * self.world_size
            torch.distributed.all_gather_object(out, obj)
            return out
        return [obj]


class Task:
    """Base class of a task plugin.

    Attributes:
        needs_reference: the module builds a frozen reference model only when this is true.
        data_mode: the batch kind the task consumes: ``"sft"`` (prompt + target, labels) or
            ``"rl"`` (prompts with answers and ground-truth events).
        num_iterations: optimizer steps each batch serves (GRPO's rollout reuse); the DataModule
            repeats every accumulation window this many times.
        window_batches: the task works on whole accumulation windows: each micro-batch arrives with
            ``batch.window`` holding all micro-batches of its window (GRPO samples them together).
        draws_prompts: the task may take further windows from the data stream (``batch.window.draw()``,
            GRPO ``dynamic_sampling: refill``); the DataModule then records draws for resume.
        samples_rollouts: the task samples completions from the policy during training
            (``model.rollout``: K per prompt); the memory planner then counts the rollout KV cache.
        shares_prompt: a group's clip is encoded and its prompt prefilled once for its K completions
            (``grasp_lightning/shared_prompt.py``); the planner counts one prompt per group.
    """

    needs_reference: bool = False
    data_mode: str = "sft"
    num_iterations: int = 1
    window_batches: bool = False
    draws_prompts: bool = False
    samples_rollouts: bool = False
    shares_prompt: bool = False

    def state_dict(self) -> dict:
        """This rank's task state for checkpoints (plain tensors and containers, so ``weights_only``
        loading works); the module saves every rank's (:meth:`CrossRank.gather`). Default: none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` of this rank (called from ``GraspModule.on_load_checkpoint``)."""

    def setup(self, module: "GraspModule") -> None:
        """Called once the policy is loaded (e.g. to read token ids from the processor)."""

    def prepare(self, module: "GraspModule", batch: "Batch") -> None:
        """Called on every micro-batch of every rank before :meth:`training_step`, also for an empty
        batch that will be skipped: the place for cross-rank collectives (``module.cross_rank``),
        which no rank may miss."""

    def training_step(self, module: "GraspModule", batch: "Batch") -> TaskOutput:
        """Compute the loss of one micro-batch. Must be overridden."""
        raise NotImplementedError
