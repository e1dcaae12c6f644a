"""Callbacks that change training: stop, skip, save.

- :mod:`grasp_lightning.callbacks.control.guards` — ``NonFiniteGuard``: a non-finite gradient skips the optimizer
  update; too many bad steps in a row stop the run.
- :mod:`grasp_lightning.callbacks.control.preemption` — ``Preemption``: on SIGTERM or SLURM's warning signal, save
  ``last.ckpt`` at the next optimizer-step boundary and stop.
- :mod:`grasp_lightning.callbacks.control.checkpoint` — ``AtomicModelCheckpoint``: Lightning's ``ModelCheckpoint``
  with atomic, marker-completed saves.

They are named in the recipes by ``class_path`` (``grasp_lightning.callbacks.control.guards.NonFiniteGuard``, ...).
The observers, which never change training, are the modules of :mod:`callbacks` itself.
"""
