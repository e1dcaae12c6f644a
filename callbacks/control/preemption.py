"""Preemption: on SIGTERM or SLURM's warning signal, save a checkpoint at the next optimizer-step
boundary and exit cleanly.

Lightning 2.6 on its own reacts to SIGTERM by raising ``SIGTERMException`` after the *current
micro-batch* and saves nothing, and its SLURM handler (``SLURMEnvironment(auto_requeue=True)``)
saves ``hpc_ckpt_N.ckpt`` *inside the signal handler*, wherever the training loop happens to be.
Both can land in the middle of a gradient-accumulation window: the accumulated gradients are not
part of a checkpoint, while the DataModule already counted those micro-batches as consumed, so
their dataset items would be lost on resume. This callback replaces those handlers while training runs:

1. the handler only records the signal (nothing else is safe inside a signal handler);
2. at the end of the micro-batch that completed an optimizer step, all ranks agree
   (``strategy.reduce_boolean_decision``: one rank's signal stops every rank at the same step);
3. the full training state (weights, optimizer, scheduler, loops, DataModule sample counters) is
   saved to ``<checkpoint dir>/last.ckpt`` with
   :func:`grasp_lightning.checkpointing.save_checkpoint_atomic` (written beside it under a temporary
   name and renamed into place, so a kill during the write leaves the previous file intact);
4. under SLURM with auto-requeue, Lightning's own requeue routine then saves ``hpc_ckpt_N.ckpt``
   at this consistent point and calls ``scontrol requeue``; the requeued job resumes from it by
   itself (Lightning picks the newest ``hpc_ckpt_*`` when ``ckpt_path`` is unset under SLURM);
5. Lightning's ``SIGTERMException`` (a ``SystemExit`` with status 0) ends the run.

Resume with ``--ckpt_path <that last.ckpt>``; the resumed run sees exactly the dataset items the
uninterrupted run would have seen (``tests/cli/test_reliability.py``). With SLURM use
``#SBATCH --signal=USR1@90`` (or ``B:USR1@90`` when the batch script forwards it) and leave the
seconds for one optimizer step (all its micro-batches) plus the checkpoint write.

A signal that arrives during validation is acted on at the end of the next optimizer step (a
checkpoint taken inside validation would resume mid-evaluation): keep a validation pass, or lower
``trainer.limit_val_batches``, within the grace period too. A signal before training starts (model
loading) ends the process as usual: nothing has been trained yet.

DataLoader workers ignore these signals (``GraspDataModule`` installs ``SIG_IGN`` in each
worker), so a signal sent to the whole process group does not kill them before the checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from grasp_lightning.checkpointing import save_checkpoint_atomic

log = logging.getLogger(__name__)


def _signal_number(name: str | int) -> signal.Signals:
    """``"SIGTERM"``, ``"TERM"``, ``"USR1"`` or ``15`` -> the signal; ``ValueError`` if unknown."""
    if isinstance(name, int):
        return signal.Signals(name)
    key = name.strip().upper()
    key = key if key.startswith("SIG") else f"SIG{key}"
    try:
        return signal.Signals[key]
    except KeyError:
        raise ValueError(f"Preemption: unknown signal {name!r}") from None


class Preemption(L.Callback):
    """Save ``last.ckpt`` at the next optimizer-step boundary after a signal, then stop the run.

    Args:
        signals: signals that mean "stop soon" (names such as ``"SIGTERM"``, ``"SIGUSR1"``).
        dirpath: where to write the checkpoint; default: the ``ModelCheckpoint`` folder, else
            ``<default_root_dir>/checkpoints``.
        filename: checkpoint file name without ``.ckpt`` (``last`` makes ``--ckpt_path last``
            find it when the run reuses the same log version).
        requeue: under SLURM with auto-requeue, also save Lightning's ``hpc_ckpt_N.ckpt`` and requeue
            the job (``scontrol requeue``) when the signal is SLURM's requeue signal (USR1).

    Attributes:
        received: the signal received, ``None`` before one arrives.
        saved_path: the checkpoint written on preemption, ``None`` if none was.
        stopped_at_step: ``trainer.global_step`` when the run stopped.
    """

    def __init__(self, signals: list[str] = ["SIGTERM", "SIGUSR1"], dirpath: str | None = None,  # noqa: B006
                 filename: str = "last", requeue: bool = True) -> None:
        self.signals = [_signal_number(s) for s in signals]
        self.dirpath = dirpath
        self.filename = filename
        self.requeue = requeue
        self.received: signal.Signals | None = None
        self.saved_path: str | None = None
        self.stopped_at_step: int | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._step_at_batch_start = -1

    # ------------------------------------------------------------------ handlers
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.received, self.saved_path, self.stopped_at_step = None, None, None

    def _handler(self, signum: int, frame) -> None:  # noqa: ARG002 (signal API)
        # Only record: logging, I/O and collectives are not safe inside a signal handler.
        if self.received is None:
            self.received = signal.Signals(signum)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Install the handlers; runs after Lightning registered its own, so ours replace them."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("Preemption: not in the main thread, signal handlers not installed")
            return
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)
        log.info("Preemption: on %s, save a checkpoint at the next step boundary and stop",
                 "/".join(s.name for s in self.signals))

    def _restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handler and previous is not None:
                signal.signal(sig, previous)
        self._previous = {}

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    # ------------------------------------------------------------------ step boundary
    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """At the micro-batch that completed an optimizer step: agree across ranks, save, stop."""
        if trainer.global_step == self._step_at_batch_start:
            return  # inside an accumulation window: the accumulated gradients are in no checkpoint
        stop = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if not stop:
            return
        requeue_signal = self._requeue_signal(trainer)  # the same on every rank
        requeue = requeue_signal is not None and trainer.strategy.reduce_boolean_decision(
            self.received == requeue_signal, all=False)  # collective: every rank saves the hpc checkpoint
        name = self.received.name if self.received is not None else "a signal on another rank"
        path = self.checkpoint_path(trainer)
        log.warning("Preemption: received %s; saving %s at step %d and stopping", name, path, trainer.global_step)
        save_checkpoint_atomic(trainer, path)
        self.saved_path = path
        self.stopped_at_step = trainer.global_step
        if requeue:
            # Lightning's SLURM routine (hpc_ckpt_N.ckpt on every rank, ``scontrol requeue`` on rank 0),
            # now at a consistent point of training instead of inside its signal handler.
            trainer._signal_connector._slurm_sigusr_handler_fn(requeue_signal, None)
        log.warning("Preemption: checkpoint saved; resume with --ckpt_path %s", path)
        raise SIGTERMException

    def checkpoint_path(self, trainer: L.Trainer) -> str:
        """``<dirpath>/<filename>.ckpt`` (see the class arguments for the default folder)."""
        folder = self.dirpath
        if folder is None and trainer.checkpoint_callback is not None:
            folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        if folder is None:
            folder = os.path.join(trainer.default_root_dir, "checkpoints")
        return str(Path(folder) / f"{self.filename}.ckpt")

    def _requeue_signal(self, trainer: L.Trainer) -> signal.Signals | None:
        """SLURM's requeue signal when running under SLURM with auto-requeue and ``requeue`` is on."""
        from lightning.fabric.plugins.environments import SLURMEnvironment

        env = trainer._accelerator_connector.cluster_environment
        if not (self.requeue and isinstance(env, SLURMEnvironment) and env.auto_requeue):
            return None
        if not hasattr(getattr(trainer, "_signal_connector", None), "_slurm_sigusr_handler_fn"):  # pragma: no cover
            log.warning("Preemption: this Lightning version has no SLURM requeue routine; requeue the job yourself")
            return None
        return signal.Signals(env.requeue_signal)
