"""``GraspDeepSpeedStrategy``: Lightning's DeepSpeed strategy with the loss scaled once under accumulation.

Lightning divides the loss of every micro-batch by ``trainer.accumulate_grad_batches`` before the
backward pass (``ClosureResult.from_training_step_output``), and DeepSpeed's
``engine.backward(loss)`` divides it again by ``gradient_accumulation_steps``, which Lightning
sets to the same number. With ``accumulate_grad_batches = 4`` the gradient DeepSpeed reduces and
clips would be 1/16 of the mean micro-batch gradient instead of 1/4 (Lightning issue #6170;
transformers PR #35808 fixed the same double scaling in its Trainer). This subclass calls
``engine.backward(loss, scale_wrt_gas=False)`` in automatic optimisation, so a DeepSpeed run and a
plain run with the same global batch take the same optimizer steps (``tests/cli/test_scale.py``
measures both gradient norms and losses).

Stepping is unchanged: Lightning calls ``engine.step()`` after every micro-batch (the strategy
``handles_gradient_accumulation``), and the engine applies the optimizer only at an accumulation
boundary; Lightning's step counter, learning-rate scheduler and checkpoint intervals count
optimizer steps, not micro-batches. Because the engine counts windows over the whole run while
Lightning counts them per epoch, a multi-epoch run whose batches per epoch the accumulation does
not divide is refused at setup (:func:`check_accumulation`, which names the
``trainer.limit_train_batches`` to set).

Inputs: Lightning's ``DeepSpeedPrecision.convert_input`` walks the whole batch with
``apply_to_collection`` and raises on the frozen record dataclasses a
:class:`~grasp_lightning.data.collate.Batch` carries ("A frozen dataclass was passed to
`apply_to_collection`"), so every DeepSpeed run failed at its first batch. The strategy installs
:class:`BatchDeepSpeedPrecision`, which converts the floating tensors of ``batch.inputs`` only.

LoRA (a module whose ``trainable_only_checkpoints`` is true): DeepSpeed writes the module's weights itself
(``DeepSpeedEngine.save_checkpoint``; Lightning drops the checkpoint's ``state_dict``), so
:meth:`GraspDeepSpeedStrategy.save_checkpoint` keeps the frozen base out of it: see there.

Resume: a sharded checkpoint directory is loaded only if it carries the completion marker that
``grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint`` writes last
(:func:`grasp_lightning.checkpointing.require_complete`). DeepSpeed restores a checkpoint after
the strategy's setup, by which time Lightning has built the train loader (to count the stepping
batches for the LR schedule) and started it at the epoch's first batch; the loader is rebuilt after
the restore so a resumed run continues with the next unseen sample.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.plugins.precision import DeepSpeedPrecision, Precision
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from grasp_lightning.checkpointing import require_complete, trainable_keys
from grasp_lightning.errors import GraspConfigError


class BatchDeepSpeedPrecision(DeepSpeedPrecision):
    """``DeepSpeedPrecision`` that casts the floating tensors of a ``Batch``'s ``inputs`` dict
    (e.g. ``pixel_values_videos`` to bfloat16 under ``bf16-mixed``) and leaves its records alone.
    Any other input goes to ``DeepSpeedPrecision.convert_input``."""

    @override
    def convert_input(self, data: Any) -> Any:
        inputs = getattr(data, "inputs", None)
        if isinstance(inputs, dict) and hasattr(data, "items"):
            data.inputs = super().convert_input(inputs)
            return data
        return super().convert_input(data)


def check_accumulation(batches_per_epoch: int | float, accumulate: int, max_epochs: int | None) -> None:
    """Refuse DeepSpeed accumulation windows that would straddle epochs.

    DeepSpeed counts accumulation windows over the whole run, Lightning per epoch, and under
    DeepSpeed Lightning does not step on an epoch's last, partial window. With a remainder the
    engine's optimizer steps and Lightning's ``zero_grad``/scheduler steps drift apart from the
    second epoch on. A single epoch is allowed (its last partial window is not applied).

    Args:
        batches_per_epoch: training micro-batches per epoch and rank (``inf`` when unknown: not checked).
        accumulate: ``trainer.accumulate_grad_batches``.
        max_epochs: ``trainer.max_epochs`` (``None``/-1: unbounded).

    Raises:
        GraspConfigError: ``accumulate`` does not divide ``batches_per_epoch`` and more than one epoch may run.
    """
    if accumulate <= 1 or not isinstance(batches_per_epoch, int) or max_epochs == 1:
        return
    rest = batches_per_epoch % accumulate
    if rest:
        raise GraspConfigError(
            f"DeepSpeed: {batches_per_epoch} training batches per epoch and rank are not a multiple of "
            f"trainer.accumulate_grad_batches={accumulate}; DeepSpeed's accumulation windows would run across epochs, "
            f"out of step with Lightning's. Set trainer.limit_train_batches={batches_per_epoch - rest} (drops the "
            f"last {rest} batches of each epoch) or an accumulation that divides {batches_per_epoch}")


class GraspDeepSpeedStrategy(DeepSpeedStrategy):
    """:class:`lightning.pytorch.strategies.DeepSpeedStrategy` whose backward does not divide by the
    accumulation steps a second time. Takes exactly the arguments of ``DeepSpeedStrategy``
    (``stage``, ``overlap_comm``, ``contiguous_gradients``, ``allgather_bucket_size``,
    ``reduce_bucket_size``, ...); select it in a config with
    ``class_path: grasp_lightning.strategies.GraspDeepSpeedStrategy``.
    """

    @property
    def precision_plugin(self) -> Precision:
        """The precision plugin; a plain ``DeepSpeedPrecision`` is replaced by :class:`BatchDeepSpeedPrecision`."""
        return self._precision_plugin if self._precision_plugin is not None else Precision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        if type(plugin) is DeepSpeedPrecision:
            plugin = BatchDeepSpeedPrecision(plugin.precision)
        self._precision_plugin = plugin

    def setup(self, trainer) -> None:
        """Set up DeepSpeed, then :func:`check_accumulation` on the training batches per epoch."""
        super().setup(trainer)
        if trainer.training:
            check_accumulation(trainer.num_training_batches, trainer.accumulate_grad_batches, trainer.max_epochs)

    def backward(self, closure_loss, optimizer, *args: Any, **kwargs: Any):
        """Back-propagate ``closure_loss`` (already divided by ``accumulate_grad_batches`` by Lightning
        in automatic optimisation) through the DeepSpeed engine without a second division."""
        module = self.lightning_module
        if module is not None and module.automatic_optimization:
            kwargs.setdefault("scale_wrt_gas", False)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        """DeepSpeed's checkpoint directory; for a LoRA module (``trainable_only_checkpoints``) without the
        frozen base, which reloads from ``model.policy.name_or_path``.

        ``DeepSpeedEngine.save_checkpoint`` writes ``module.state_dict()`` to ``mp_rank_00_model_states.pt``,
        under ZeRO-2 plus a CPU copy of every frozen weight (``frozen_param_fragments``; a second copy in the
        file when the weights are on a GPU); its optimizer shards hold the trainable parameters' float32
        partitions and AdamW state only. Lightning's ``exclude_frozen_parameters`` (turned on here for the
        save) leaves the frozen weights out of both, except a frozen weight tied under a second name
        (Qwen3-VL-2B's ``lm_head.weight``, the 151,936 x 2,048 embedding: DeepSpeed finds frozen names through
        ``named_parameters``, which lists a tied weight once), so a state-dict hook also keeps the module's
        state to its trainable parameters for the save, as
        :meth:`~grasp_lightning.module.GraspModule.on_save_checkpoint` does without DeepSpeed.
        """
        module = self.lightning_module
        if not getattr(module, "trainable_only_checkpoints", False):
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        keep = trainable_keys(module)

        def trainable_only(_module, state: dict, prefix: str, _metadata) -> None:
            for name in [n for n in state if n.startswith(prefix) and n[len(prefix):] not in keep]:
                del state[name]

        hook = module.register_state_dict_post_hook(trainable_only)
        exclude, self.exclude_frozen_parameters = self.exclude_frozen_parameters, True
        try:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        finally:
            hook.remove()
            self.exclude_frozen_parameters = exclude

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a DeepSpeed checkpoint directory after checking it is complete.

        Raises:
            GraspConfigError: the directory has no (valid) completion marker.
        """
        require_complete(checkpoint_path)
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            # DeepSpeed restores *after* setup, where ``configure_optimizers`` (its
            # ``estimated_stepping_batches``) already built the train loader and started its iterator from
            # the epoch's first batch. Drop both so the fit loop rebuilds them from the DataModule once its
            # state (the next unseen sample) is restored, as it does without DeepSpeed.
            fit_loop = trainer.fit_loop
            if fit_loop._data_fetcher is not None:
                fit_loop._data_fetcher.teardown()  # also stops persistent DataLoader workers
                fit_loop._data_fetcher = None
            fit_loop._combined_loader = None
        return checkpoint


class CPUDeepSpeedStrategy(GraspDeepSpeedStrategy):
    """DeepSpeed ZeRO on CPU processes over gloo: the CPU smoke mode of ``benchmarks/gpu_check.py`` and the
    ZeRO-2 tests. Real runs use :class:`GraspDeepSpeedStrategy` on CUDA.

    It is :class:`GraspDeepSpeedStrategy` minus the two GPU-only checks of Lightning's
    ``DeepSpeedStrategy`` (``setup_environment`` refuses a non-CUDA accelerator; ``setup_distributed``
    requires device indices equal to local ranks), with a root device that has an index (DeepSpeed
    reads ``root_device.index``). Everything else (the ZeRO-2 optimizer, gradient partitioning and
    reduction, sharded checkpoints) is DeepSpeed's own code. The first run compiles DeepSpeed's CPU
    communication op (cached under ``~/.cache/torch_extensions`` afterwards). Select it by class path:
    ``--trainer.strategy grasp_lightning.strategies.CPUDeepSpeedStrategy`` with ``--trainer.accelerator cpu``.
    """

    def setup_environment(self) -> None:
        """Set up the process group as DDP does, skipping DeepSpeed's CUDA-only accelerator check."""
        DDPStrategy.setup_environment(self)  # skips DeepSpeedStrategy's "only supported on CUDA GPUs"

    def setup_distributed(self) -> None:
        """Seed, set the ranks and start DeepSpeed's process group, without the device-index check."""
        reset_seed()  # as DeepSpeedStrategy.setup_distributed, without _validate_device_index_selection
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        """``cpu:0``: a CPU device with an index, which DeepSpeed reads."""
        return torch.device("cpu", 0)
