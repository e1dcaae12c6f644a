"""Callbacks and reward terms the CLI runs name by class path (``--trainer.callbacks+=tests.helpers.<Name>``,
``reward.terms=[..., tests.helpers.checksum_reward]``): what a run did, per micro-batch and per rank."""

from __future__ import annotations

import json
import os
import signal
import zlib
from pathlib import Path

import lightning as L
import torch


# ---------------------------------------------------- What ZeRO-2 runs on the CPU record, per rank
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


# -------------------- Callbacks and rewards the CLI runs name by class path (tests.helpers.<Name>)
class WeightRecorder(L.Callback):
    """Records every policy weight when the fit starts (``--trainer.callbacks+=``)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        self.before = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}


class GradRecorder(L.Callback):
    """Records the policy's gradients before the first optimizer step (``--trainer.callbacks+=``)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not hasattr(self, "grads"):
            self.grads = {n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters()
                          if p.grad is not None}


class MicroBatchLosses(L.Callback):
    """Records each micro-batch's optimizer step, task loss and loss tokens (``--trainer.callbacks+=``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        self.rows.append((self._step, float(out.loss.detach()), float(out.metrics["tokens/loss"])))


class UpdateRecorder(L.Callback):
    """Record each trainable weight and its gradient just before the first optimizer step, and the
    weight after it."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        named = [(n, p) for n, p in pl_module.policy.named_parameters() if p.requires_grad and p.grad is not None]
        self.before = {n: p.detach().clone() for n, p in named}
        self.grads = {n: p.grad.detach().clone() for n, p in named}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        params = dict(pl_module.policy.named_parameters())
        self.after = {n: params[n].detach().clone() for n in self.before}


class WindowRecorder(L.Callback):
    """Per training micro-batch: ``trainer.global_step`` at its start and its task output's KL and
    entropy tokens, clip fraction and prompt ids (test-only; ``--trainer.callbacks+=`` this class).

    Args:
        path: if given, each rank saves its rows to ``<path>.rank<r>`` (``torch.save``) at the end of fit.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.rows: list[dict] = []
        self._step = -1

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.path:
            torch.save(self.rows, f"{self.path}.rank{trainer.global_rank}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        record = out.rollout
        self.rows.append({"step": self._step, "kl": record.kl_tokens.detach().clone(),
                          "entropy": record.entropy_tokens.detach().clone(),
                          "clip": float(out.metrics["clip_ratio"]), "uids": [item.uid for item in record.items]})


class StepMetricsRecorder(L.Callback):
    """Writes, per micro-batch of this rank, what the step metrics are computed from: the rollouts the
    micro-batch trained (rewards, lengths, truncation, groups), its k3 KL and entropy of the loss tokens
    and its loss (``steps_rank{r}.jsonl`` under ``out_dir``)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        ro = pl_module.task.cache.rollouts[batch.window.position]
        k = ro.num_generations
        row = {"step": self._step, "position": batch.window.position,
               "rewards": ro.rewards.tolist(), "k": k, "lengths": ro.completions.mask.sum(1).tolist(),
               "truncated": ro.completions.truncated.tolist(), "zero_variance": ro.zero_variance.tolist(),
               "kl": out.rollout.kl_tokens.tolist(), "entropy": out.rollout.entropy_tokens.tolist(),
               "loss": float(out.loss.detach())}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"steps_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")


class SigtermAt(L.Callback):
    """Sends this process SIGTERM after optimizer step ``step``, as a cluster would on preemption;
    ``grasp_lightning.callbacks.control.preemption.Preemption`` (in configs/sgr.yaml) then saves ``last.ckpt`` at the next
    step boundary and stops the run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class PromptRecorder(L.Callback):
    """Keep the prompt ids (padding removed) and the completions' inputs of every validation batch."""

    def __init__(self) -> None:
        self.prompts: list[torch.Tensor] = []
        self.uids: list[str] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        ids, mask = batch.inputs["input_ids"], batch.inputs["attention_mask"].bool()
        self.prompts += [row[keep] for row, keep in zip(ids, mask)]
        self.uids += [item.uid for item in batch.items]


def checksum_reward(completion: str, item) -> float:
    """A reward term in [0, 1) that differs between any two distinct completions (CRC-32 of the text).

    The tiny models never earn the recipe's terms (every group's rewards are all 0, so every advantage
    is 0 and the first step's gradient is exactly 0); this term gives each group distinct rewards.
    """
    return zlib.crc32(completion.encode()) / 2**32


def half_degenerate_reward(completion: str, item) -> float:
    """A reward term: 0.5 for every completion of the prompts whose file line is even (degenerate groups),
    else a value that differs between any two distinct completions (CRC-32 of the text)."""
    if int(item.uid.rsplit(":", 1)[1]) % 2 == 0:
        return 0.5
    return zlib.crc32(completion.encode()) / 2**32
