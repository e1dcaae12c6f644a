"""KL logging: once per optimizer step, the KL to the reference model, the ratio clip fraction and the
policy entropy over the step's completion tokens.

Everything goes under one section, ``kl/``, of every logger: the scalars ``kl/mean``, ``kl/max``,
``kl/clip_ratio`` and ``kl/entropy``, and the distribution ``kl/per_token`` of the k3 estimates of the
step's completion tokens (:func:`grasp_lightning.loggers.log_histogram`: a histogram in TensorBoard and
W&B, summary metrics ``kl/per_token/p50, ...`` in MLflow and CSV). A step is the whole accumulation
window on every rank: the loss tokens of all its micro-batches (:class:`callbacks.step_window.StepWindow`),
gathered from every rank, written once when the optimizer has stepped, at the step's 0-based index (where
Lightning writes the module's ``train/`` values of the same window). ``kl/mean`` and ``kl/entropy`` are
token means, ``kl/clip_ratio`` the micro-batches' clip fractions weighted by their loss tokens (the
fraction of the step's loss tokens whose ratio was clipped). A warning is logged when the mean KL
exceeds ``warn_above``. The callback only reads ``module.last_task_output``
(:class:`~grasp_lightning.task.TaskOutput`: ``metrics["clip_ratio"]`` and ``rollout.kl_tokens`` /
``rollout.entropy_tokens``, written by the GRPO task); it never changes training.
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from typing_extensions import override

from callbacks.step_window import StepWindow
from grasp_lightning.loggers import log_histogram

log = logging.getLogger(__name__)

# the logged names (one place, so a rename touches one line)
TAG_MEAN, TAG_MAX, TAG_CLIP, TAG_ENTROPY, TAG_HISTOGRAM = "kl/mean", "kl/max", "kl/clip_ratio", "kl/entropy", "kl/per_token"


def _cat(parts: list[torch.Tensor], device) -> torch.Tensor:
    return torch.cat(parts).to(device) if parts else torch.zeros(0, device=device)


def gather_tokens(trainer, values: torch.Tensor) -> torch.Tensor:
    """Every rank's ``values`` (``(M_r,)`` float32, lengths may differ), concatenated in rank order:
    ``(sum_r M_r,)``. A collective: every rank must call it. One process: ``values`` itself."""
    if trainer.world_size == 1:
        return values
    n = torch.tensor([values.numel()], device=values.device)
    sizes = trainer.strategy.all_gather(n).reshape(-1)
    padded = torch.zeros(int(sizes.max()), dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = trainer.strategy.all_gather(padded).reshape(len(sizes), -1)
    return torch.cat([gathered[r, : int(sizes[r])] for r in range(len(sizes))])


class KLLogging(L.Callback):
    """Log KL statistics of every ``every_n_steps``-th optimizer step (0, n, 2n, ...), over its whole
    accumulation window and every rank.

    Args:
        every_n_steps: logging interval in optimizer steps.
        warn_above: log a warning when the step's mean k3 KL is above this (nats per token).
        histogram: also log the per-token KL distribution (``kl/per_token``).

    Attributes:
        warnings: steps whose mean KL was above ``warn_above``.
        last: the values written for the last logged step (tag to value), for tests and benchmarks.
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
        self._entropy: list[torch.Tensor] = []
        self._clip_sum = 0.0      # sum over micro-batches of clip_ratio x loss tokens
        self._clip_tokens = 0.0   # loss tokens of the micro-batches that reported clip_ratio
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
        """Keep this micro-batch's loss-token KL and entropy and its token-weighted clip fraction."""
        if out is None or out.rollout is None:
            return
        self._seen = True
        record = out.rollout
        if record.kl_tokens is not None:
            self._kl.append(record.kl_tokens.detach().float().reshape(-1))
        if record.entropy_tokens is not None:
            self._entropy.append(record.entropy_tokens.detach().float().reshape(-1))
        if "clip_ratio" in out.metrics:
            tokens = float(record.entropy_tokens.numel()) if record.entropy_tokens is not None else 1.0
            self._clip_sum += float(out.metrics["clip_ratio"]) * tokens
            self._clip_tokens += tokens

    def _write(self, trainer, device, step: int) -> None:
        """Reduce the window over the ranks (every rank takes part) and write on rank zero."""
        seen = torch.tensor([float(self._seen), float(bool(self._kl)), float(bool(self._entropy)),
                             self._clip_sum, self._clip_tokens], device=device)
        if trainer.world_size > 1:
            seen = trainer.strategy.reduce(seen, reduce_op="sum")
        if not seen[0]:
            return  # no rollout on any rank in this window (an SFT task)
        kl = gather_tokens(trainer, _cat(self._kl, device)) if seen[1] else None
        entropy = gather_tokens(trainer, _cat(self._entropy, device)) if seen[2] else None
        self._reset()
        values = {}
        if kl is not None and kl.numel():
            values[TAG_MEAN], values[TAG_MAX] = float(kl.mean()), float(kl.max())
        if seen[4] > 0:
            values[TAG_CLIP] = float(seen[3] / seen[4])
        if entropy is not None and entropy.numel():
            values[TAG_ENTROPY] = float(entropy.mean())
        self.last = values
        if not values or not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)
        if self.histogram and TAG_MEAN in values:
            log_histogram(trainer, TAG_HISTOGRAM, kl, step)
        if TAG_MEAN in values and values[TAG_MEAN] > self.warn_above:
            self.warnings += 1
            log.warning("step %d: KL to the reference model %.4f is above %.4f (max %.4f)", step,
                        values[TAG_MEAN], self.warn_above, values[TAG_MAX])
