"""Test-only plugins for the strategy tier (``tests/cli/test_strategies.py``), selected from a config by class path.

- :class:`GradientProbe` records what a one-process run and a multi-rank run must agree on: the loss
  each micro-batch back-propagates, the full gradient of every trainable weight at each optimizer
  step (before clipping), and the trainable weights at the end.
- :class:`PromptSeededGRPOTask` samples each prompt's K completions from a generator seeded by the
  prompt's dataset index, so a prompt gets the same rollouts whichever rank or micro-batch draws it.
- :func:`completion_length` is a reward term that differs between completions of one group, so the
  advantages (and the gradients compared) are not all zero on an untrained tiny policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from grasp_lightning.tasks.grpo import GRPOTask

#: Seed of the prompt with dataset index ``i``: ``PROMPT_SEED + i``.
PROMPT_SEED = 10_000


class PromptSeededGRPOTask(GRPOTask):
    """:class:`grasp_lightning.tasks.grpo.GRPOTask` whose rollouts of a prompt come from torch's RNG seeded with
    ``PROMPT_SEED + dataset index`` (forked: the run's own RNG stream is untouched). Needs one
    prompt per generation call (``batching.rollout_batch_prompts: 1``), since one call draws from one stream.

    Raises:
        ValueError: a generation call holds more than one prompt.
    """

    def rollout(self, ctx, batch):
        """:meth:`GRPOTask.rollout` under a generator seeded by the prompt's dataset index."""
        if len(batch.indices) != 1:
            raise ValueError(f"PromptSeededGRPOTask seeds one prompt per call, got indices {list(batch.indices)}: "
                             f"set batching.rollout_batch_prompts: 1")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(PROMPT_SEED + int(batch.indices[0]))
            return super().rollout(ctx, batch)


def completion_length(completion: str, item) -> float:
    """Characters of the completion / 100: distinct within almost every group of sampled completions."""
    return len(completion) / 100.0


def _full_grads(trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, torch.Tensor]:
    """Every trainable weight's full gradient (float32, CPU), as the optimizer is about to apply it.
    Collective under DeepSpeed (``safe_get_full_grad`` all-reduces the ZeRO-2 partitions): every rank calls
    it at the same step."""
    strategy = trainer.strategy
    named = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
    if isinstance(strategy, DeepSpeedStrategy):
        from deepspeed.utils import safe_get_full_grad

        return {n: safe_get_full_grad(p).detach().float().cpu().clone() for n, p in named}
    return {n: p.grad.detach().float().cpu().clone() for n, p in named if p.grad is not None}


def _is_boundary(trainer: L.Trainer) -> bool:
    """Whether this ``on_before_optimizer_step`` applies the optimizer (DeepSpeed's engine is stepped
    after every micro-batch and decides itself; other strategies call the hook at boundaries only)."""
    engine = trainer.model
    if hasattr(engine, "is_gradient_accumulation_boundary"):
        return bool(engine.is_gradient_accumulation_boundary())
    return True


class GradientProbe(L.Callback):
    """Write, under ``out_dir``: ``losses_rank{r}.jsonl`` (per micro-batch: global step, dataset
    indices, the loss Lightning back-propagates, i.e. the task's loss / ``accumulate_grad_batches``),
    ``grads_step{s}.pt`` (rank 0: ``{name: full gradient}`` before optimizer step ``s``, 0-based) and
    ``weights_end.pt`` (rank 0: ``{name: weight}`` of the trainable weights after the last step;
    ZeRO-2 keeps whole weights on every rank).

    Args:
        out_dir: the folder (created).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_start(self, trainer, pl_module) -> None:
        """Create ``out_dir``."""
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Note the optimizer step this micro-batch belongs to (``global_step`` moves at its end)."""
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Append the micro-batch's back-propagated loss."""
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        row = {"rank": trainer.global_rank, "global_step": self._step, "indices": list(batch.indices),
               "loss": None if loss is None else float(loss.detach())}
        with open(self.out_dir / f"losses_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        """Save the step's full gradients (rank 0) at an accumulation boundary."""
        if not _is_boundary(trainer):
            return
        grads = _full_grads(trainer, pl_module)
        if trainer.global_rank == 0:
            torch.save(grads, self.out_dir / f"grads_step{trainer.global_step}.pt")

    def on_train_end(self, trainer, pl_module) -> None:
        """Save the trainable weights (rank 0)."""
        if trainer.global_rank != 0:
            return
        weights = {n: p.detach().float().cpu().clone() for n, p in pl_module.named_parameters()
                   if p.requires_grad}
        torch.save(weights, self.out_dir / "weights_end.pt")


def read_losses(out_dir: str | Path, rank: int = 0) -> list[dict]:
    """The rows :class:`GradientProbe` wrote for ``rank``, in order."""
    path = Path(out_dir) / f"losses_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

