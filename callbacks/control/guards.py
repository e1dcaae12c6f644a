"""Numerical guards: a non-finite gradient skips the optimizer update; too many in a row stop the run.

Two places catch NaN/Inf:

- the loss, in ``GraspModule.training_step``: a non-finite micro-batch loss is counted
  (``module.nonfinite_losses``), logged with the items' ids, and skipped (``None`` on one
  process; a zero-gradient loss under DDP/DeepSpeed, where every rank must run the backward);
- the gradients, here, in ``on_before_optimizer_step`` (after the backward of the last micro-batch of
  the accumulation window, before clipping and the step): when the total gradient norm is not
  finite, every gradient is set to ``None``, so ``torch.optim`` optimizers leave the weights and
  their state untouched for that step. The window's dataset indices are logged.

A step counts as *bad* when its gradients were non-finite or a micro-batch of its window had a
non-finite loss. After ``max_consecutive`` bad steps in a row the run stops with
``FloatingPointError`` naming the steps and the items. Metrics: ``guards/skipped_steps`` (sum)
and ``guards/bad_streak``.

Under DeepSpeed ZeRO the gradients live in DeepSpeed's partitions (``p.grad`` is ``None``), so only
the loss check applies there. The gradients after all-reduce are the same on every rank (DDP), so
every rank takes the same decision without a collective.
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from typing_extensions import override

log = logging.getLogger(__name__)


def grad_norm(parameters) -> torch.Tensor | None:
    """Total L2 norm (float32 scalar) of the gradients of ``parameters``; ``None`` when none has one.

    Inf or NaN in any gradient gives a non-finite norm (a NaN propagates through the sum of squares).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads, 2.0)
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2.0)


class NonFiniteGuard(L.Callback):
    """Skip optimizer steps with NaN/Inf gradients; stop after ``max_consecutive`` bad steps in a row.

    Args:
        max_consecutive: bad steps in a row that stop the run (``FloatingPointError``); 0 never stops.
        check_grads: check the gradient norm before each optimizer step (one pass over the gradients).

    Attributes:
        skipped_steps: optimizer steps whose update was skipped (non-finite gradients).
        bad_streak: bad steps in a row so far.
        bad_steps: ``(global_step, dataset indices)`` of every bad step.

    Raises:
        FloatingPointError: ``max_consecutive`` bad steps in a row.
    """

    def __init__(self, max_consecutive: int = 5, check_grads: bool = True) -> None:
        if max_consecutive < 0:
            raise ValueError(f"NonFiniteGuard: max_consecutive must be >= 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.check_grads = check_grads
        self.skipped_steps = 0
        self.bad_streak = 0
        self.bad_steps: list[tuple[int, list[int]]] = []
        self._window: list[int] = []
        self._window_batches = 0
        self._losses_at_window_start = 0
        self._step_at_batch_start = -1
        self._grad_bad = False

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._window_batches == 0:
            self._losses_at_window_start = getattr(pl_module, "nonfinite_losses", 0)
        self._window.extend(getattr(batch, "indices", []))
        self._window_batches += 1
        self._step_at_batch_start = trainer.global_step

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """Drop the gradients when their norm is not finite (the optimizer then changes nothing)."""
        if not self.check_grads:
            return
        norm = grad_norm(p for group in optimizer.param_groups for p in group["params"])
        if norm is None or bool(torch.isfinite(norm)):
            return
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = None
        self.skipped_steps += 1
        self._grad_bad = True
        log.warning("step %d: non-finite gradient norm (%s) for dataset indices %s; optimizer update skipped",
                    trainer.global_step, float(norm), self._window)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """At the end of an accumulation window: update the streak, log, stop when it is too long."""
        if trainer.global_step == self._step_at_batch_start:
            return  # still accumulating
        bad_losses = getattr(pl_module, "nonfinite_losses", 0) - self._losses_at_window_start
        bad = self._grad_bad or bad_losses > 0
        step = trainer.global_step - 1
        if bad:
            self.bad_streak += 1
            self.bad_steps.append((step, list(self._window)))
        else:
            self.bad_streak = 0
        pl_module.log("guards/bad_streak", float(self.bad_streak), on_step=True, batch_size=1)
        pl_module.log("guards/skipped_steps", float(self.skipped_steps), on_step=True, batch_size=1)
        self._grad_bad = False
        self._window, self._window_batches = [], 0
        if self.max_consecutive and self.bad_streak >= self.max_consecutive:
            recent = self.bad_steps[-self.bad_streak:]
            raise FloatingPointError(
                f"{self.bad_streak} optimizer steps in a row had a non-finite loss or gradient "
                f"(grasp_lightning.callbacks.control.guards.NonFiniteGuard max_consecutive={self.max_consecutive}); steps and dataset "
                f"indices: {recent}. Lower the learning rate, check these items, or resume from an earlier "
                f"checkpoint.")
