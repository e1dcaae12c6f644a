"""SFT task: token cross-entropy on the assistant response only (GRASP stage 1, Sec. 4.1).

Labels are ``-100`` on prompt tokens (system, user, video), so the loss covers the
``<think>…<gaze>…</gaze>…</think><answer>…</answer>`` target and its end-of-turn token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.prompts import IGNORE_INDEX
from grasp_lightning.grpo.logprobs import hidden_states_as_logits
from grasp_lightning.sequence_parallel import SequenceParallel
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


def split_response_cross_entropy(policy, inputs: dict[str, torch.Tensor], labels: torch.Tensor, keep: int,
                                 sp: SequenceParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`response_cross_entropy` of a forward split over the sequence-parallel group ``sp``.

    Each rank applies the LM head to the positions of its chunk among the last ``keep`` (those that predict
    response tokens), takes their per-token cross-entropy, and the group's sum places every position
    (:meth:`~grasp_lightning.sequence_parallel.SequenceParallel.sum_disjoint`): every rank returns the same loss.

    Args:
        policy: a Qwen3-VL / Qwen3.5 policy with the split forwards installed
            (:func:`~grasp_lightning.sequence_parallel.install`).
        inputs: the batch's model inputs ``(B, L)`` without labels.
        labels: ``(B, L)`` target ids, ``-100`` where ignored.
        keep: positions from the end that may predict a response token (``L`` minus the shortest prompt, plus 1).
        sp: the group (``size > 1``).

    Returns:
        ``(loss, n_tokens)`` as :func:`response_cross_entropy` on the whole sequence.
    """
    with sp.splitting(), hidden_states_as_logits(policy) as head:
        hidden = policy(**inputs, use_cache=False, logits_to_keep=0).logits  # (B, S/N, D): this rank's chunk
    layout = sp.layout()
    length = labels.shape[1]
    start = length - keep  # positions start .. length-2 predict labels start+1 .. length-1
    first, last = layout.local_span(start, length - 1)
    logits = head(hidden[:, first - layout.lo:last - layout.lo]).float()
    targets = labels[:, first + 1:last + 1]
    per_token = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none")
    per_token = F.pad(per_token, (first - start, keep - 1 - (last - start)))  # (B, keep - 1), zero off the chunk
    per_token = sp.sum_disjoint(per_token + 0.0 * hidden.sum())  # a rank without response positions takes part too
    n = (labels[:, start + 1:] != IGNORE_INDEX).sum()
    return per_token.sum() / n.clamp(min=1), n


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
        if ctx.sequence_parallel.size > 1:
            loss, n_tokens = split_response_cross_entropy(ctx.policy, inputs, labels, keep, ctx.sequence_parallel)
        else:
            logits = ctx.policy(**inputs, use_cache=False, logits_to_keep=keep).logits
            loss, n_tokens = response_cross_entropy(logits, labels[:, -keep:])
        return TaskOutput(loss=loss, metrics={"tokens/loss": Sum(n_tokens)})
