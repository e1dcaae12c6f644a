"""The reference model moved towards the policy every N optimizer steps (TR-DPO, arXiv 2404.09656).

``ref ← alpha * policy + (1 - alpha) * ref``, parameter by parameter, after every ``every_n_steps``-th
optimizer step (TRL 1.16 ``SyncRefModelCallback``: ``trl/trainer/callbacks.py:116-151``, at
``on_step_end`` when ``global_step % ref_model_sync_steps == 0``). ``GRPOTask`` adds it
(:meth:`grasp_lightning.tasks.grpo.GRPOTask.callbacks`) when ``loss.reference_sync_steps`` is set; it
changes training, so it is a control callback in effect, kept here beside its one user.

Strategies: under DDP and DeepSpeed ZeRO-1/2 every rank holds the whole policy (ZeRO-2 shards only the
gradients and the optimizer state) and its own whole reference model (the module keeps the reference out of
its children, so no strategy wraps or shards it); every rank mixes the same weights and the references
stay equal without a collective. ZeRO-3 shards the policy's parameters and is refused. The policy's
weights are cast to the reference's dtype and device (float32 masters into a bf16 reference under
``bf16-mixed``).

With LoRA the reference is the policy with its adapters disabled, or a second model whose parameters do
not pair with the adapted policy's: refused, as TRL refuses ``sync_ref_model`` with PEFT.

Checkpoints: the reference model is not part of the module's state, so once it has moved its weights go
into the checkpoint as this callback's state and are restored on resume (a run resumed without them would
measure its KL to the unmoved reference).
"""

from __future__ import annotations

import logging

import lightning as L
import torch
from typing_extensions import override

from grasp_lightning.errors import GraspConfigError, is_count, is_number, require

log = logging.getLogger(__name__)

KEY = "model.task.init_args.loss."


@torch.no_grad()
def mix_into(reference: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> int:
    """``reference ← alpha * policy + (1 - alpha) * reference`` for every parameter, in place.

    Parameters pair by name (``named_parameters``, tied weights once); the policy's are cast to the
    reference's dtype and device.

    Returns:
        the number of parameters mixed.

    Raises:
        GraspConfigError: the two models' parameter names differ (naming the first few).
    """
    ref_params = dict(reference.named_parameters())
    pol_params = dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        missing = sorted(set(pol_params) ^ set(ref_params))[:3]
        raise GraspConfigError(f"{KEY}reference_sync_steps: the reference model's parameters do not pair with the "
                               f"policy's (e.g. {missing}); model.reference.name_or_path must be the policy's "
                               "architecture")
    for name, target in ref_params.items():
        target.mul_(1.0 - alpha).add_(pol_params[name].detach().to(target.device, target.dtype), alpha=alpha)
    return len(ref_params)


class ReferenceSync(L.Callback):
    """Mix the policy into the reference model after every ``every_n_steps``-th optimizer step.

    Args:
        every_n_steps: optimizer steps between syncs (``loss.reference_sync_steps``).
        alpha: the policy's share in the mix (``loss.reference_mixup_alpha``).

    Attributes:
        syncs: how many syncs this run made.
        last_step: the optimizer step of the last sync (0: none).

    Raises:
        GraspConfigError: a bad ``every_n_steps`` / ``alpha``; at setup, LoRA (``model.lora.enabled``),
            no reference model (``loss.beta: 0``) or DeepSpeed ZeRO-3.
    """

    def __init__(self, every_n_steps: int, alpha: float) -> None:
        require(is_count(every_n_steps), KEY + "reference_sync_steps", ">= 1", every_n_steps)
        require(is_number(alpha) and 0 < alpha <= 1, KEY + "reference_mixup_alpha", "in (0, 1]", alpha)
        self.every_n_steps = int(every_n_steps)
        self.alpha = float(alpha)
        self.syncs = 0
        self.last_step = 0
        self._restored: dict[str, torch.Tensor] | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._module = pl_module  # state_dict reads its reference model
        if getattr(pl_module, "lora_cfg", None) is not None and pl_module.lora_cfg.enabled:
            raise GraspConfigError(f"{KEY}reference_sync_steps with model.lora.enabled: the reference is the policy "
                                   "with its adapters disabled (or a model whose parameters do not pair with the "
                                   "adapted policy's), so there is no reference of its own to move; set it to null")
        if not getattr(getattr(pl_module, "task", None), "needs_reference", True):
            raise GraspConfigError(f"{KEY}reference_sync_steps needs a reference model ({KEY}beta != 0)")
        stage_n = getattr(trainer.strategy, "zero_stage_3", False) or (
            getattr(trainer.strategy, "config", None) or {}).get("zero_optimization", {}).get("stage") == 3
        if stage_n:
            raise GraspConfigError(f"{KEY}reference_sync_steps under DeepSpeed ZeRO-3: the policy's parameters are "
                                   "sharded; use stage 2 (the recipes' ZeRO-2) or DDP")

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps taken, this micro-batch's included
        if step == self.last_step or step % self.every_n_steps:
            return
        reference = pl_module.reference_model
        if self._restored is not None:
            self._load(reference)
        n = mix_into(reference, pl_module.policy, self.alpha)
        self.syncs += 1
        self.last_step = step
        log.info("step %d: reference model moved towards the policy (alpha %g, %d parameters)", step, self.alpha, n)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._restored is not None and pl_module.reference_model is not None:
            self._load(pl_module.reference_model)

    def _load(self, reference: torch.nn.Module) -> None:
        """Copy the checkpoint's reference weights into ``reference``."""
        with torch.no_grad():
            for name, p in reference.named_parameters():
                p.copy_(self._restored[name].to(p.device, p.dtype))
        self._restored = None

    @override
    def state_dict(self) -> dict:
        """``last_step`` and, once the reference has moved, its weights (CPU tensors; the module's checkpoint
        leaves the reference model out)."""
        state: dict = {"last_step": self.last_step}
        reference = getattr(self._module, "reference_model", None)
        if self.last_step and reference is not None:
            state["reference"] = {n: p.detach().cpu() for n, p in reference.named_parameters()}
        return state

    _module: L.LightningModule | None = None

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        self.last_step = int(state_dict.get("last_step", 0))
        self._restored = state_dict.get("reference")
