"""SFT task: token cross-entropy on the assistant response only (GRASP stage 1, Sec. 4.1).

Labels are ``-100`` on prompt tokens (system, user, video), so the loss covers the
``<think>…<gaze>…</gaze>…</think><answer>…</answer>`` target and its end-of-turn token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.prompts import IGNORE_INDEX
from grasp_lightning.step_metrics import Sum
from grasp_lightning.task import Task, TaskContext, TaskOutput


def response_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross-entropy over response tokens.

    Args:
        logits: ``(B, L, V)`` policy logits (any float dtype; computed in float32).
        labels: ``(B, L)`` target ids with ``-100`` on ignored (prompt, padding) positions.

    Returns:
        ``(loss, n_tokens)``: the scalar mean over the ``n_tokens`` response tokens predicted.
        ``loss`` is 0 (with a gradient path) when there are no response tokens.
    """
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    n = (shift_labels != IGNORE_INDEX).sum()
    loss = F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")
    return loss / n.clamp(min=1), n


class SFTTask(Task):
    """Supervised fine-tuning on ``data_sft.jsonl`` rows.

    The loss of a micro-batch is the mean over its response tokens; with gradient accumulation
    Lightning averages micro-batch losses, as is usual for SFT, and the logged ``train/loss`` is that
    mean over the step's micro-batches and ranks. ``train/tokens/loss`` counts the step's response tokens
    on all ranks.
    """

    needs_reference = False
    data_mode = "sft"

    def training_step(self, ctx: TaskContext, batch: Batch) -> TaskOutput:
        """Cross-entropy on the response. Logits are computed only from the first response
        position on (``logits_to_keep``), never over the thousands of video tokens of the prompt."""
        inputs = dict(batch.inputs)
        labels = inputs.pop("labels")
        keep = labels.shape[1] - int(batch.prompt_lengths.min()) + 1
        logits = ctx.policy(**inputs, use_cache=False, logits_to_keep=keep).logits
        loss, n_tokens = response_cross_entropy(logits, labels[:, -keep:])
        return TaskOutput(loss=loss, metrics={"tokens/loss": Sum(n_tokens)})
