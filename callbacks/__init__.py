"""Lightning callbacks, in two kinds.

- Observers (this package's own modules): they read what the module and tasks expose and log or
  evaluate, and never change training — :mod:`callbacks.kl_logging` (KL statistics),
  :mod:`callbacks.rollout_samples` (sampled completions and their rewards), :mod:`callbacks.timing`
  (step-time shares and throughput), :mod:`callbacks.bench` (GRASP-Bench reports),
  :mod:`callbacks.predictions` (``predict``'s JSON lines). Those that watch training act once per
  optimizer step, on the whole accumulation window (:mod:`callbacks.step_window`).
- Control (:mod:`callbacks.control`): callbacks that change training — stop, skip, save:
  ``guards.NonFiniteGuard``, ``preemption.Preemption``, ``checkpoint.AtomicModelCheckpoint``.

Configs name both kinds by ``class_path`` (e.g. ``callbacks.timing.StepTiming``,
``callbacks.control.checkpoint.AtomicModelCheckpoint``).
"""
