"""Time accounting of every optimizer step: data wait, rollout, scoring, update, model calls, throughput.

One record per optimizer step, written when the optimizer has stepped, at the step's 0-based index
(where Lightning writes the module's ``train/`` values of the same window); each time is the sum over
the micro-batches of the step's accumulation window (:class:`grasp_lightning.callbacks.step_window.StepWindow`), in
seconds (wall clock, ``time.perf_counter``; CUDA is synchronised at each boundary so asynchronous
kernels are charged to the phase that launched them), on rank zero:

* ``time/data_wait_s``: from the end of the previous batch (or the epoch start) to each micro-batch's
  ``on_train_batch_start`` — the DataLoader fetch and the host-to-device transfer.
* ``time/step_s``: ``on_train_batch_start`` to ``on_train_batch_end`` of each micro-batch — everything else.
* ``time/optimizer_step_s``: ``time/step_s`` + ``time/data_wait_s``, the step's wall seconds.
* ``time/update_s``: the backward passes (``on_before_backward`` → ``on_after_backward``, also as
  ``time/backward_s``) plus the optimizer step (``on_before_optimizer_step`` → ``on_train_batch_end``,
  clipping included, ``time/optimizer_s``).
* ``time/other_s``: ``step_s`` minus rollout, scoring and update (rewards, logging, Lightning); the
  rollout and scoring times are the task's ``time/rollout_s`` and ``time/scoring_s`` (GRPO logs them).
* ``time/model_s``: time inside the forward calls of the policy and the reference model (measured
  with forward hooks on the top-level modules; each ``generate`` step is one call);
  ``time/overhead_fraction`` = 1 − (model + update) / step: the share of the step spent outside the
  model (sampling logic in ``generate``, rewards, advantages, Lightning).
* ``time/rollout_share``, ``time/update_share``, ``time/data_wait_share``, ``time/other_share``:
  shares of ``time/optimizer_step_s`` (rollout = generation + rewards + old/reference log-probs;
  update = backward + optimizer; other = the policy's scoring forward and everything else), summing
  to 1; ``time/generation_share`` the generation part of the rollout.
* ``throughput/samples_per_s``: completions (or rows) of the step per second of ``time/optimizer_step_s``;
  ``throughput/generated_tokens_per_s`` likewise for the generated tokens (the task's
  ``tokens/generated``); ``throughput/generation_tokens_per_s``: per second of generation
  (``time/generation_s``). The step's prompt tokens and completions per ``generate`` call are the
  task's ``train/tokens/prompt_forwarded`` and ``train/rollout/sequences_per_call`` (``docs/metrics.md``).

The callback only reads the task output (``module.last_task_output``) and the clock; it never
changes training. ``history`` keeps every micro-batch's record (benchmarks read it; not logged),
``step_history`` every logged step record.
"""

from __future__ import annotations

import time

import lightning as L
import torch
from typing_extensions import override

from grasp_lightning.callbacks.step_window import StepWindow


class StepTiming(L.Callback):
    """Log where each training step's time goes (see the module docstring for the keys).

    Args:
        model_calls: time the forward calls of the policy and reference model with hooks.
        sync_cuda: ``torch.cuda.synchronize()`` at each boundary when running on CUDA (accurate
            phases at a small cost); ignored on CPU.
        keep_history: keep every step's record in ``self.history``.
    """

    def __init__(self, model_calls: bool = True, sync_cuda: bool = True, keep_history: bool = True) -> None:
        self.model_calls = model_calls
        self.sync_cuda = sync_cuda
        self.keep_history = keep_history
        self.history: list[dict[str, float]] = []
        self._hooked: set[int] = set()
        self._handles: list = []
        self._last_end: float | None = None
        self._start = 0.0
        self._wait = 0.0
        self._mark = 0.0
        self._backward = 0.0
        self._optimizer_start: float | None = None
        self._model = 0.0
        self._depth = 0
        self._call_start = 0.0
        self._window = StepWindow()
        self._acc: dict[str, float] = {}
        self.step_history: list[dict[str, float]] = []

    # ------------------------------------------------------------------ clock
    def _now(self) -> float:
        if self.sync_cuda and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre_forward(self, module, args) -> None:
        if self._depth == 0:
            self._call_start = self._now()
        self._depth += 1

    def _post_forward(self, module, args, output) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._model += self._now() - self._call_start

    def _hook(self, pl_module) -> None:
        for model in (getattr(pl_module, "policy", None), getattr(pl_module, "reference_model", None)):
            if model is not None and id(model) not in self._hooked:
                self._hooked.add(id(model))
                self._handles.append(model.register_forward_pre_hook(self._pre_forward))
                self._handles.append(model.register_forward_hook(self._post_forward))

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._last_end = self._now()

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = self._now()
        if self._window.start(trainer):
            self._acc = {}
        self._wait = self._start - self._last_end if self._last_end is not None else 0.0
        self._backward, self._model, self._depth, self._optimizer_start = 0.0, 0.0, 0, None
        if self.model_calls:
            self._hook(pl_module)

    @override
    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._mark = self._now()

    @override
    def on_after_backward(self, trainer, pl_module) -> None:
        self._backward += self._now() - self._mark

    @override
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._optimizer_start = self._now()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        end = self._now()
        self._last_end = end
        step = end - self._start
        optimizer = end - self._optimizer_start if self._optimizer_start is not None else 0.0
        update = self._backward + optimizer
        out = getattr(pl_module, "last_task_output", None)
        metrics = out.metrics if out is not None else {}
        rollout = float(metrics.get("time/rollout_s", 0.0))
        scoring = float(metrics.get("time/scoring_s", 0.0))
        record = out.rollout if out is not None else None
        rows = len(record.completions or batch) if record is not None else len(batch)
        wall = step + self._wait
        if self.keep_history:  # this micro-batch alone
            self.history.append({
                "time/data_wait_s": self._wait, "time/step_s": step, "time/update_s": update,
                "time/rollout_s": rollout, "time/scoring_s": scoring, "time/model_s": self._model,
                "time/overhead_fraction": 1.0 - (self._model + update) / step if step > 0 else 0.0,
                "throughput/samples_per_s": rows / wall if wall > 0 else 0.0,
                "throughput/prompt_tokens_per_step": float(metrics.get("tokens/prompt_forwarded", 0.0))})
        acc = self._acc
        for key, value in (("wall", wall), ("wait", self._wait), ("step", step), ("rollout", rollout),
                           ("scoring", scoring), ("update", update), ("backward", self._backward),
                           ("optimizer", optimizer), ("model", self._model), ("rows", float(rows)),
                           ("generation", float(metrics.get("time/generation_s", 0.0))),
                           ("tokens", float(metrics.get("tokens/generated", 0.0))),
                           ("prompt_tokens", float(metrics.get("tokens/prompt_forwarded", 0.0))),
                           ("calls", float(metrics.get("rollout/generation_calls", 0.0))),
                           ("sequences", float(metrics.get("rollout/generation_calls", 0.0))
                            * float(metrics.get("rollout/sequences_per_call", 0.0)))):
            acc[key] = acc.get(key, 0.0) + value
        acc["has_tokens"] = acc.get("has_tokens", 0.0) + float("tokens/generated" in metrics)
        acc["has_prompt"] = acc.get("has_prompt", 0.0) + float("tokens/prompt_forwarded" in metrics)
        if not self._window.stepped(trainer):
            return  # still accumulating
        step_record = self._step_record(acc, self.model_calls)
        self._acc = {}
        if self.keep_history:
            self.step_history.append(step_record)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(step_record, step=self._window.step)

    @staticmethod
    def _step_record(acc: dict[str, float], model_calls: bool = True) -> dict[str, float]:
        """Times, shares and rates of one optimizer step from the sums over its micro-batches."""
        get = acc.get
        wall, step, update = get("wall", 0.0), get("step", 0.0), get("update", 0.0)
        share = (lambda x: x / wall) if wall > 0 else (lambda x: 0.0)
        rollout, wait, gen = get("rollout", 0.0), get("wait", 0.0), get("generation", 0.0)
        record = {
            "time/data_wait_s": wait, "time/step_s": step, "time/optimizer_step_s": wall, "time/update_s": update,
            "time/backward_s": get("backward", 0.0), "time/optimizer_s": get("optimizer", 0.0),
            "time/other_s": step - rollout - get("scoring", 0.0) - update,
            "time/rollout_share": share(rollout), "time/update_share": share(update),
            "time/data_wait_share": share(wait), "time/other_share": share(wall - rollout - update - wait),
            "time/generation_share": share(gen), "throughput/samples_per_s": share(get("rows", 0.0)),
            "throughput/generation_tokens_per_s": get("tokens", 0.0) / gen if gen > 0 else 0.0}
        if model_calls:
            record["time/model_s"] = get("model", 0.0)
            record["time/overhead_fraction"] = 1.0 - (get("model", 0.0) + update) / step if step > 0 else 0.0
        if get("has_tokens"):
            record["throughput/generated_tokens_per_s"] = share(get("tokens", 0.0))
        return record

    @override
    def on_fit_end(self, trainer, pl_module) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._hooked = [], set()
