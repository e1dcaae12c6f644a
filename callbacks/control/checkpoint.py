"""``AtomicModelCheckpoint``: Lightning's ``ModelCheckpoint`` whose saves are atomic.

Every save (periodic, top-k and ``last``) is written under a hidden temporary name beside its
destination (``.partial-<id>-<name>``) and renamed into place only once whole
(:func:`grasp_lightning.checkpointing.publish`):

* a Lightning ``.ckpt`` file is flushed and ``os.replace``-d;
* a DeepSpeed checkpoint directory (every rank writes its ZeRO shard into it) is completed, after
  a barrier, by :data:`~grasp_lightning.checkpointing.COMPLETE_MARKER` written last by rank 0,
  then renamed. :class:`grasp_lightning.strategies.GraspDeepSpeedStrategy` refuses to resume from
  a directory without a valid marker, and ``python -m grasp_lightning export`` refuses to export it.

A crash during a save therefore leaves the previous checkpoint (or nothing) under the final name,
never a checkpoint that looks complete but is not. Temporaries left by a crash are removed when
the next run sets up. Takes exactly the arguments of ``ModelCheckpoint``. Other code that saves
checkpoints (e.g. on preemption) gets the same guarantee from
:func:`grasp_lightning.checkpointing.save_checkpoint_atomic`.
"""

from __future__ import annotations

from weakref import proxy

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from grasp_lightning.checkpointing import remove_partials, save_checkpoint_atomic


class AtomicModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` with atomic, marker-completed saves (see the module docstring)."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath:
            remove_partials(self.dirpath)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        save_checkpoint_atomic(trainer, filepath, self.save_weights_only)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))
