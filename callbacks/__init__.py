"""Lightning callbacks, in two kinds.

- Observers (this package's own modules): they read what the module and tasks expose and log or
  evaluate, and never change training — :mod:`grasp_lightning.callbacks.kl_logging` (KL statistics),
  :mod:`grasp_lightning.callbacks.rollout_samples` (sampled completions and their rewards), :mod:`grasp_lightning.callbacks.timing`
  (step-time shares and throughput), :mod:`grasp_lightning.callbacks.watch` (a console line per logged step and
  the curves picture; the CLI adds it to every run), :mod:`grasp_lightning.callbacks.eval_reports` (every evaluation suite's reports),
  :mod:`grasp_lightning.callbacks.prediction_writer` (``predict``'s JSON lines). Those that watch training act once per
  optimizer step, on the whole accumulation window (:mod:`grasp_lightning.callbacks.step_window`).
- Control (:mod:`grasp_lightning.callbacks.control`): callbacks that change training — stop, skip, save:
  ``guards.NonFiniteGuard``, ``preemption.Preemption``, ``checkpoint.AtomicModelCheckpoint``.

Configs name both kinds by ``class_path`` (e.g. ``grasp_lightning.callbacks.timing.StepTiming``,
``grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint``).
"""
