"""KL logging: once per optimizer step, the largest per-token KL to the reference model and the
distribution of them, over the step's completion tokens on every rank.

Everything goes under one section, ``kl/``, of every logger: the scalar ``kl/max`` and the distribution
``kl/per_token`` of the k3 estimates of the step's completion tokens
(:func:`grasp_lightning.monitoring.loggers.log_histogram`: a histogram in TensorBoard and W&B, summary metrics
``kl/per_token/p50, ...`` in MLflow and CSV). A step is the whole accumulation window on every rank: the
loss tokens of all its micro-batches (:class:`grasp_lightning.callbacks.step_window.StepWindow`), gathered from every
rank, written once when the optimizer has stepped, at the step's 0-based index (where the module writes
its ``train/`` values of the same window). The step's mean KL, clip ratio and entropy are the task's
``train/kl``, ``train/clip_ratio`` and ``train/entropy`` (``docs/metrics.md``); a warning is logged when
the mean KL exceeds ``warn_above``. The callback only reads ``module.last_task_output``
(:class:`~grasp_lightning.task.TaskOutput`: ``rollout.kl_tokens``, written by the GRPO task); it never
changes training.
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from typing_extensions import override

from grasp_lightning.callbacks.step_window import StepWindow
from grasp_lightning.monitoring.loggers import log_histogram

log = logging.getLogger(__name__)

# the logged names (one place, so a rename touches one line)
TAG_MAX, TAG_HISTOGRAM = "kl/max", "kl/per_token"


def _cat(parts: list[torch.Tensor], device) -> torch.Tensor:
    return torch.cat(parts).to(device) if parts else torch.zeros(0, device=device)


def gather_tokens(trainer, values: torch.Tensor, share: int = 1) -> torch.Tensor:
    """Every rank's ``values`` (``(M_r,)`` float32, lengths may differ), concatenated in rank order:
    ``(sum_r M_r,)``. A collective: every rank must call it. One process: ``values`` itself.
    ``share``: ranks holding each sample (``model.sequence_parallel``; their values are the same): only the
    first rank of each group ``0, N, 2N, ..`` is kept, so a token counts once."""
    if trainer.world_size == 1:
        return values
    n = torch.tensor([values.numel()], device=values.device)
    sizes = trainer.strategy.all_gather(n).reshape(-1)
    padded = torch.zeros(int(sizes.max()), dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = trainer.strategy.all_gather(padded).reshape(len(sizes), -1)
    return torch.cat([gathered[r, : int(sizes[r])] for r in range(0, len(sizes), share)])


class KLLogging(L.Callback):
    """Log KL statistics of every ``every_n_steps``-th optimizer step (0, n, 2n, ...), over its whole
    accumulation window and every rank.

    Args:
        every_n_steps: logging interval in optimizer steps.
        warn_above: log a warning when the step's mean k3 KL is above this (nats per token).
        histogram: also log the per-token KL distribution (``kl/per_token``).

    Attributes:
        warnings: steps whose mean KL was above ``warn_above``.
        last: the last logged step's ``kl/max`` and its token mean ``mean`` (the value ``train/kl``
            logs), for tests and benchmarks.
    """

    def __init__(self, every_n_steps: int = 1, warn_above: float = 0.5, histogram: bool = True) -> None:
        if every_n_steps < 1:
            raise ValueError(f"KLLogging: every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.warn_above = warn_above
        self.histogram = histogram
        self.warnings = 0
        self.last: dict[str, float] = {}
        self._window = StepWindow()
        self._reset()

    def _reset(self) -> None:
        self._kl: list[torch.Tensor] = []
        self._seen = False

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._window.start(trainer):
            self._reset()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._window.step % self.every_n_steps == 0:
            self._collect(getattr(pl_module, "last_task_output", None))
        if self._window.stepped(trainer) and self._window.step % self.every_n_steps == 0:
            self._write(trainer, pl_module.device, self._window.step)

    def _collect(self, out) -> None:
        """Keep this micro-batch's loss-token KL estimates."""
        if out is None or out.rollout is None:
            return
        self._seen = True
        if out.rollout.kl_tokens is not None:
            self._kl.append(out.rollout.kl_tokens.detach().float().reshape(-1))

    def _write(self, trainer, device, step: int) -> None:
        """Reduce the window over the ranks (every rank takes part) and write on rank zero."""
        seen = torch.tensor([float(self._seen), float(bool(self._kl))], device=device)
        if trainer.world_size > 1:
            seen = trainer.strategy.reduce(seen, reduce_op="sum")
        if not seen[0]:
            return  # no rollout on any rank in this window (an SFT task)
        sp = getattr(trainer.lightning_module, "sequence_parallel", None)
        kl = gather_tokens(trainer, _cat(self._kl, device), sp.size if sp is not None else 1) if seen[1] else None
        self._reset()
        if kl is None or not kl.numel():
            return
        mean, peak = float(kl.mean()), float(kl.max())
        self.last = {TAG_MAX: peak, "mean": mean}
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.log_metrics({TAG_MAX: peak}, step=step)
        if self.histogram:
            log_histogram(trainer, TAG_HISTOGRAM, kl, step)
        if mean > self.warn_above:
            self.warnings += 1
            log.warning("step %d: KL to the reference model %.4f is above %.4f (max %.4f)", step, mean,
                        self.warn_above, peak)
