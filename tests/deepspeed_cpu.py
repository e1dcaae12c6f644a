"""Test-only: a real DeepSpeed ZeRO engine on CPU processes over gloo, and a step recorder.

``CPUDeepSpeedStrategy`` is :class:`grasp_lightning.strategies.GraspDeepSpeedStrategy` minus the
two GPU-only checks of Lightning's ``DeepSpeedStrategy`` (``setup_environment`` refuses a
non-CUDA accelerator; ``setup_distributed`` requires device indices equal to local ranks), with a
root device that has an index (DeepSpeed reads ``root_device.index``). Everything else — the
ZeRO-2 optimizer, gradient partitioning and reduction, sharded checkpoints — is DeepSpeed's own
code. The first run compiles DeepSpeed's CPU communication op
(about 30 s; cached under ``~/.cache/torch_extensions`` afterwards).

``StepRecorder`` writes, per rank and micro-batch, what the resume and accumulation tests compare.
Select both from a config by class path (``grasp_lightning.strategies.CPUDeepSpeedStrategy``); the
``tests`` package is importable when commands run from the repository root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies.ddp import DDPStrategy

from grasp_lightning.strategies import GraspDeepSpeedStrategy


class CPUDeepSpeedStrategy(GraspDeepSpeedStrategy):
    """ZeRO on CPU processes (gloo). Test use only: production configs use the CUDA path."""

    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # skips DeepSpeedStrategy's "only supported on CUDA GPUs"

    def setup_distributed(self) -> None:
        reset_seed()  # as DeepSpeedStrategy.setup_distributed, without _validate_device_index_selection
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu", 0)


def _global_grad_norm(trainer: L.Trainer, pl_module: L.LightningModule) -> float | None:
    engine = trainer.model if hasattr(trainer.model, "get_global_grad_norm") else None
    if engine is not None:
        norm = engine.get_global_grad_norm()
        return None if norm is None else float(norm)
    return getattr(pl_module, "_recorded_grad_norm", None)


class StepRecorder(L.Callback):
    """Record per micro-batch: rank, global step, batch index, dataset indices, the task's loss,
    the learning rate, one draw from torch's global RNG (after the step, as sampling would) and,
    at accumulation boundaries, the pre-clipping global gradient norm. On train end rank 0 saves
    the policy's logits on a fixed token sequence (``final_logits.pt``).

    Args:
        out_dir: where ``steps_rank{r}.jsonl`` and ``final_logits.pt`` are written (appended to,
            so a stopped and a resumed run land in one file).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # Plain (non-DeepSpeed) runs: the accumulated, unclipped gradient is on the parameters here.
        grads = [p.grad.detach().float().norm() for p in pl_module.parameters() if p.grad is not None]
        pl_module._recorded_grad_norm = float(torch.stack(grads).norm()) if grads else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        boundary = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        metrics = out.metrics if out is not None else {}
        row = {"rank": trainer.global_rank, "global_step": trainer.global_step, "batch_idx": batch_idx,
               "epoch": trainer.current_epoch, "indices": list(batch.indices),
               "loss": float(out.loss.detach()) if out is not None and out.loss is not None else None,
               "kl": float(metrics["kl"]) if "kl" in metrics else None,
               "lr": float(trainer.optimizers[0].param_groups[0]["lr"]),
               "rng": float(torch.rand(1).item()),
               "grad_norm": _global_grad_norm(trainer, pl_module) if boundary else None}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"steps_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        # What the optimizer holds (DeepSpeed's ZeRO optimizer keeps the model's own tensors in
        # ``bit16_groups``) against the policy's trainable parameters and the reference model's.
        opt = trainer.optimizers[0]
        groups = getattr(opt, "bit16_groups", None) or [g["params"] for g in opt.param_groups]
        held = {id(p) for group in groups for p in group}
        ref = getattr(pl_module, "reference_model", None)
        meta = {"optimizer": type(opt).__name__, "world_size": trainer.world_size,
                "optimizer_numel": sum(p.numel() for group in groups for p in group),
                "policy_trainable_numel": sum(p.numel() for p in pl_module.policy.parameters() if p.requires_grad),
                "reference_loaded": ref is not None,
                "reference_params_in_optimizer": sum(id(p) in held for p in ref.parameters()) if ref is not None else 0,
                "reference_in_state_dict": any(k.startswith("reference") for k in pl_module.state_dict())}
        self._write_meta(trainer, "start", meta)

    def _write_meta(self, trainer, name: str, meta: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"meta_{name}_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(meta), encoding="utf-8")

    def on_train_end(self, trainer, pl_module) -> None:
        engine = trainer.model if hasattr(trainer.model, "global_steps") else None
        self._write_meta(trainer, "end", {"global_step": trainer.global_step,
                                          "engine_global_steps": getattr(engine, "global_steps", None),
                                          "engine_micro_steps": getattr(engine, "micro_steps", None)})
        if trainer.global_rank != 0:
            return
        policy = pl_module.policy
        ids = torch.arange(3, 35, device=pl_module.device).reshape(2, 16)
        with torch.no_grad():
            logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().cpu()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": ids.cpu(), "logits": logits}, self.out_dir / "final_logits.pt")


def read_steps(out_dir: str | os.PathLike, rank: int = 0) -> list[dict]:
    """The rows :class:`StepRecorder` wrote for ``rank``, in order."""
    path = Path(out_dir) / f"steps_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_meta(out_dir: str | os.PathLike, name: str, rank: int = 0) -> dict:
    """The ``meta_{name}_rank{rank}.json`` :class:`StepRecorder` wrote (``start`` or ``end``)."""
    return json.loads((Path(out_dir) / f"meta_{name}_rank{rank}.json").read_text(encoding="utf-8"))
