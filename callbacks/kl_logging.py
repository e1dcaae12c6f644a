"""KL logging: per step, the largest per-token KL to the reference model and the distribution of them.

Everything goes under one section, ``kl/``, of every logger: the scalar ``kl/max`` and the distribution
``kl/per_token`` of the k3 estimates of the
step's completion tokens (:func:`grasp_lightning.loggers.log_histogram`: a histogram in TensorBoard and
W&B, summary metrics ``kl/per_token/p50, ...`` in MLflow and CSV). A warning is logged when the mean
KL exceeds ``warn_above``. The callback only reads ``module.last_task_output``
(:class:`~grasp_lightning.task.TaskOutput`: its ``rollout.kl_tokens``, written by the GRPO task); it never
changes training. The step's mean KL, clip ratio and entropy are the task's ``train/kl``,
``train/clip_ratio`` and ``train/entropy`` (``docs/metrics.md``).
"""

from __future__ import annotations

import logging

import lightning as L
from typing_extensions import override

from grasp_lightning.loggers import log_histogram

log = logging.getLogger(__name__)


class KLLogging(L.Callback):
    """Log KL statistics every ``every_n_steps`` optimizer steps.

    Args:
        every_n_steps: logging interval in optimizer steps.
        warn_above: log a warning when the step's mean k3 KL is above this (nats per token).
        histogram: also log the per-token KL distribution (``kl/per_token``).
    """

    def __init__(self, every_n_steps: int = 1, warn_above: float = 0.5, histogram: bool = True) -> None:
        self.every_n_steps = every_n_steps
        self.warn_above = warn_above
        self.histogram = histogram
        self.warnings = 0

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = getattr(pl_module, "last_task_output", None)
        if out is None or trainer.global_step % self.every_n_steps or not trainer.is_global_zero:
            return
        kl = out.rollout.kl_tokens if out.rollout is not None else None
        if kl is None or not kl.numel():
            return
        # the mean KL, clip ratio and entropy of the step are the task's train/kl, train/clip_ratio, train/entropy
        mean, peak = float(kl.mean()), float(kl.max())
        for logger in trainer.loggers:
            logger.log_metrics({"kl/max": peak}, step=trainer.global_step)
        if self.histogram:
            log_histogram(trainer, "kl/per_token", kl, trainer.global_step)
        if mean > self.warn_above:
            self.warnings += 1
            log.warning("step %d: KL to the reference model %.4f is above %.4f (max %.4f)", trainer.global_step,
                        mean, self.warn_above, peak)
