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


class Task:
    """Base class of a task plugin.

    Attributes:
        needs_reference: the module builds a frozen reference model only when this is true.
        data_mode: the batch kind the task consumes: ``"sft"`` (prompt + target, labels) or
            ``"rl"`` (prompts with answers and ground-truth events).
    """

    needs_reference: bool = False
    data_mode: str = "sft"

    def setup(self, module: "GraspModule") -> None:
        """Called once the policy is loaded (e.g. to read token ids from the processor)."""

    def training_step(self, module: "GraspModule", batch: "Batch") -> TaskOutput:
        """Compute the loss of one micro-batch. Must be overridden."""
        raise NotImplementedError
