"""A run one can watch: one console line per logged step, and the run's curves as a picture.

On every logged optimizer step of ``fit`` (the steps the module writes its ``train/`` values at: every
``trainer.log_every_n_steps``-th and the last), rank zero:

* logs one line through the project's logger (``logging``; no carriage return, so a log file reads
  line by line), for GRPO::

      step 3/12 | reward 0.4120 (accuracy 0.2500) | kl 0.00123 | len 143.0 | zero-var 0.50 | loss 0.0123 | lr 1.00e-03 | 2.31 s/step | ETA 0:00:21

  and for SFT ``step 3/12 | loss 2.345 | 812 tok/s | lr ... | 1.20 s/step | ETA ...`` (tok/s: the step's
  response tokens, ``train/tokens/loss``, per second of the step). The values are the logged ones: the
  module's ``last_step_metrics`` (``train/...``, ``docs/metrics.md``), the step time of
  :class:`~grasp_lightning.callbacks.timing.StepTiming` when the trainer has one (``time/optimizer_step_s``,
  else this callback's own clock over the step), the learning rate of the step's first parameter group
  (what ``LearningRateMonitor`` logs). The ETA is the mean step time so far times the steps left
  (``trainer.estimated_stepping_batches``: ``max_steps`` or the epochs' steps);
* appends the step's record (those values, ``lr``, and after each validation the ``val/`` values of
  ``trainer.callback_metrics``) to ``<run folder>/curves.jsonl`` (:data:`grasp_lightning.monitoring.curves.HISTORY_FILE`);
* draws ``<run folder>/curves.png`` (:func:`grasp_lightning.monitoring.curves.plot_runs`) at each checkpoint save
  (when the history grew since the last picture) and at the end of ``fit``.

The CLI adds it to every ``fit`` (``--watch.console``, ``--watch.curves``: the group ``watch`` of
:class:`grasp_lightning.commands.train.GraspCLI`). It only reads; it never changes training. When the
console is not a terminal, ``quiet_progress_bar`` turns Lightning's progress bar off (its redraws are
carriage returns that bury a log file's lines); the console line takes its place.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time

import lightning as L
from typing_extensions import override

from grasp_lightning.callbacks.step_window import StepWindow
from grasp_lightning.callbacks.timing import StepTiming
from grasp_lightning.monitoring.curves import HISTORY_FILE, PICTURE_FILE, plot_runs
from grasp_lightning.monitoring.loggers import run_dir

log = logging.getLogger(__name__)

#: The step-time tag (:class:`~grasp_lightning.callbacks.timing.StepTiming`'s), also in the history.
STEP_TIME = "time/optimizer_step_s"


def console_line(step: int, total: int | None, values: dict[str, float], eta_s: float | None) -> str:
    """The console line of one logged step (``step`` 0-based; shown 1-based out of ``total``).

    ``values`` holds the step's logged tags (``train/...``), ``lr`` and :data:`STEP_TIME` (seconds);
    a tag the step lacks is left out of the line. GRPO's reward fields are shown when
    ``train/reward/mean`` is present, SFT's tokens per second otherwise.
    """
    parts = [f"step {step + 1}/{total}" if total else f"step {step + 1}"]
    get = values.get
    seconds = get(STEP_TIME)
    if "train/reward/mean" in values:
        reward = f"reward {values['train/reward/mean']:.4f}"
        if "train/rewards/accuracy/mean" in values:
            reward += f" (accuracy {values['train/rewards/accuracy/mean']:.4f})"
        parts.append(reward)
        if "train/kl" in values:
            parts.append(f"kl {values['train/kl']:.4g}")
        if "train/completion_length/mean" in values:
            parts.append(f"len {values['train/completion_length/mean']:.1f}")
        if "train/zero_variance_groups/fraction" in values:
            parts.append(f"zero-var {values['train/zero_variance_groups/fraction']:.2f}")
    if "train/loss" in values:
        parts.append(f"loss {values['train/loss']:.4g}")
    if "train/reward/mean" not in values and get("train/tokens/loss") and seconds:
        parts.append(f"{values['train/tokens/loss'] / seconds:.0f} tok/s")
    if get("lr") is not None:
        parts.append(f"lr {values['lr']:.2e}")
    if seconds is not None:
        parts.append(f"{seconds:.2f} s/step")
    if eta_s is not None:
        parts.append(f"ETA {datetime.timedelta(seconds=round(eta_s))}")
    return " | ".join(parts)


class RunWatch(L.Callback):
    """The console line per logged step and the curves picture of a ``fit`` (module docstring).

    Args:
        console: log the line of every logged step.
        curves: keep ``curves.jsonl`` and draw ``curves.png`` in the run folder.
        quiet_progress_bar: turn Lightning's progress bar off when stderr is not a terminal.

    Attributes:
        records: this run's records (as written to ``curves.jsonl``), for tests.
        lines: the console lines logged, for tests.
    """

    def __init__(self, console: bool = True, curves: bool = True, quiet_progress_bar: bool = True) -> None:
        self.console = console
        self.curves = curves
        self.quiet_progress_bar = quiet_progress_bar
        self.records: list[dict[str, float]] = []
        self.lines: list[str] = []
        self._window = StepWindow()
        self._lr: float | None = None
        self._last_end: float | None = None
        self._window_start = 0.0
        self._times: list[float] = []
        self._drawn = 0
        self._folder: str | None = None

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit" and self.quiet_progress_bar and not sys.stderr.isatty():
            bar = trainer.progress_bar_callback
            if bar is not None and hasattr(bar, "disable"):
                bar.disable()

    @override
    def on_train_start(self, trainer, pl_module) -> None:
        self._last_end = time.perf_counter()
        if not (self.curves and trainer.is_global_zero):
            return
        self._folder = run_dir(trainer)
        path = os.path.join(self._folder, HISTORY_FILE)
        if os.path.exists(path):  # a resumed run: keep the steps before the resume point
            with open(path, encoding="utf-8") as f:
                kept = [json.loads(line) for line in f if line.strip()]
            self.records = [r for r in kept if int(r["step"]) < trainer.global_step]
        self._rewrite()

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._window.start(trainer):
            self._window_start = self._last_end if self._last_end is not None else time.perf_counter()
            groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
            self._lr = float(groups[0]["lr"]) if groups else None

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._last_end = time.perf_counter()
        if not self._window.stepped(trainer):
            return
        step = self._window.step
        own_seconds = self._last_end - self._window_start
        every = max(1, int(trainer.log_every_n_steps))
        if not ((step + 1) % every == 0 or trainer.should_stop):  # the steps the module logs (module._log_step)
            self._times.append(own_seconds)
            return
        values = {k: float(v) for k, v in (getattr(pl_module, "last_step_metrics", None) or {}).items()}
        if self._lr is not None:
            values["lr"] = self._lr
        timing = next((cb for cb in trainer.callbacks if isinstance(cb, StepTiming) and cb.step_history), None)
        values[STEP_TIME] = timing.step_history[-1][STEP_TIME] if timing is not None else own_seconds
        self._times.append(values[STEP_TIME])
        if not trainer.is_global_zero:
            return
        total = self._total(trainer, None)
        eta = (total - step - 1) * sum(self._times) / len(self._times) if total else None
        if self.console:
            line = console_line(step, total, values, eta)
            self.lines.append(line)
            log.info("%s", line)
        if self.curves:
            self._append({"step": step, **values})

    @override
    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self._folder is None:  # fit's validations only, on rank zero
            return
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
        if values:  # at the step Lightning logs them at (the optimizer steps taken before the validation)
            step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step)
            self._append({"step": int(step), **values})

    @override
    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if len(self.records) > self._drawn:
            self._draw(trainer)

    @override
    def on_fit_end(self, trainer, pl_module) -> None:
        self._draw(trainer)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _total(trainer, default):
        total = trainer.estimated_stepping_batches
        return int(total) if total not in (None, float("inf")) and total > 0 else default

    def _append(self, record: dict) -> None:
        self.records.append(record)
        if self._folder is not None:
            os.makedirs(self._folder, exist_ok=True)
            with open(os.path.join(self._folder, HISTORY_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def _rewrite(self) -> None:
        os.makedirs(self._folder, exist_ok=True)
        with open(os.path.join(self._folder, HISTORY_FILE), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.records)

    def _draw(self, trainer) -> None:
        """``curves.png`` of the records so far (rank zero; nothing without records)."""
        if not (self.curves and trainer.is_global_zero and self.records and self._folder):
            return
        name = os.path.basename(os.path.normpath(self._folder))
        try:
            plot_runs({name: self.records}, os.path.join(self._folder, PICTURE_FILE), title=self._folder)
        except Exception as e:  # a picture never stops a run
            log.warning("could not draw %s: %s", PICTURE_FILE, e)
            return
        self._drawn = len(self.records)
