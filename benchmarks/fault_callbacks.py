"""Fault-injection callbacks of ``benchmarks/faults.py`` and the reliability tests, passed to the CLI with
``--trainer.callbacks+=benchmarks.fault_callbacks.<Name>`` (run from the repository root, which is on the path).

- :class:`BatchIndexRecorder` appends JSON lines per training micro-batch (at its start: step, epoch,
  batch index, dataset indices; after its backward: the loss) to a file, so a test can compare the
  samples an interrupted-and-resumed run saw with those of an uninterrupted run. It can pause at a
  given micro-batch until the test has signalled the process, which makes the signal tests
  deterministic.
- :class:`FaultInjector` makes the loss or the gradients non-finite at chosen micro-batches.
"""

from __future__ import annotations

import json
import os
import time

import lightning as L


class BatchIndexRecorder(L.Callback):
    """Record the dataset indices of every training micro-batch.

    Args:
        path: JSONL file, appended to (one line per micro-batch, flushed at once).
        pause_at: pause at the start of this micro-batch (0-based count of this process) until
            a signal arrives or ``pause_seconds`` pass; the line for that micro-batch is written
            first, so a test can wait for it and then signal.
        pause_seconds: upper bound of the pause.
    """

    def __init__(self, path: str, pause_at: int | None = None, pause_seconds: float = 60.0) -> None:
        self.path = path
        self.pause_at = pause_at
        self.pause_seconds = pause_seconds
        self.count = 0
        self._pending: dict | None = None

    def _write(self, row: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        row = {"event": "start", "pid": os.getpid(), "step": trainer.global_step, "epoch": trainer.current_epoch,
               "batch_idx": batch_idx, "indices": list(batch.indices), "skipped": [s.uid for s in batch.skipped]}
        self._write(row)
        if self.pause_at is not None and self.count == self.pause_at:
            preempt = [cb for cb in trainer.callbacks if hasattr(cb, "received")]
            end = time.monotonic() + self.pause_seconds
            while time.monotonic() < end and not any(cb.received is not None for cb in preempt):
                time.sleep(0.02)
        self.count += 1

    def on_after_backward(self, trainer, pl_module) -> None:
        # Written here, not in on_train_batch_end: a preemption stops the run inside that hook, after
        # this micro-batch was trained, possibly before this callback's on_train_batch_end runs.
        out = getattr(pl_module, "last_task_output", None)
        loss = float(out.loss.detach()) if out is not None and out.loss is not None else None
        self._write({"event": "done", "pid": os.getpid(), "step": trainer.global_step, "loss": loss})


class FaultInjector(L.Callback):
    """Make chosen micro-batches non-finite (counted from 0 in this process).

    Args:
        nan_loss_at: micro-batches whose logits (hence loss) become NaN (a forward hook on the
            policy's output embedding layer).
        nan_grad_at: micro-batches after whose backward one trainable gradient becomes Inf while
            the loss stays finite.
    """

    def __init__(self, nan_loss_at: list[int] = [], nan_grad_at: list[int] = []) -> None:  # noqa: B006
        self.nan_loss_at = set(nan_loss_at)
        self.nan_grad_at = set(nan_grad_at)
        self.count = -1
        self._hook = None
        self.changed: list[bool] = []  # per micro-batch: did the trainable weights change?
        self._before = 0.0

    @staticmethod
    def _checksum(pl_module) -> float:
        return sum(float(p.detach().double().abs().sum()) for p in pl_module.parameters() if p.requires_grad)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.count += 1
        self._before = self._checksum(pl_module)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.count in self.nan_loss_at:
            head = pl_module.policy.get_output_embeddings()
            self._hook = head.register_forward_hook(lambda mod, inp, out: out * float("nan"))

    def on_after_backward(self, trainer, pl_module) -> None:
        if self.count in self.nan_grad_at:
            for p in pl_module.parameters():
                if p.requires_grad and p.grad is not None:
                    p.grad.view(-1)[0] = float("inf")
                    break

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.changed.append(self._checksum(pl_module) != self._before)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
