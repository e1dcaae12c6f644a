"""A GRPO window's rollouts: sampled together, kept for its micro-batches, checkpointed for resume.

A *window* is the ``A = trainer.accumulate_grad_batches`` micro-batches of one optimizer step
(``batch.window``, :mod:`grasp_lightning.data.windows`) and the rollouts sampled for them. Its ``B·A``
prompts are sampled at its first micro-batch in as few generation calls as
``batching.rollout_batch_prompts`` allows (:func:`generation_calls`), K completions each, scored once
(old/reference log-probs) and kept in the :class:`WindowCache`; the optimizer then runs over the ``A``
micro-batches of those rollouts (TRL 1.16 ``generation_batch_size``/``steps_per_generation``; verl's
rollout batch vs PPO micro-batch). The ``dapo`` normaliser (loss tokens of the window over all ranks,
TRL's ``num_items_in_batch``) and the ``batch`` advantage std (all ranks' rewards) are known before the
first loss. ``loss.num_iterations`` > 1 reuses a window's rollouts for that many optimizer steps with the
old log-probs of the sampling policy: the DataModule yields each window that many times (``w0 … w(A-1)``
then again), so every reuse comes after an optimizer step.

**Dynamic sampling** (DAPO Sec. 3.2, ``batching.dynamic_sampling``): ``off``; ``drop`` masks groups whose
rewards are all equal out of the loss's numerator; ``refill`` also draws further windows of prompts from
the data stream (``Window.draw``: the next windows the loader would have yielded, consumed) and samples
them until the window holds as many groups with distinct rewards as it has prompts, at most
``batching.max_resample`` draws. :func:`split_window` then trims the groups to the window's prompt count
(DAPO, verl): the first useful groups in sampling order, then, if the budget ran out, masked degenerate
groups (:func:`~grasp_lightning.grpo.rollouts.refill_selection`), split evenly over the window's non-empty
micro-batches (never more than ``B`` prompts in one). Useful groups drawn beyond that are *drawn and
unused*: sampled and scored (their rewards count in ``dynamic_sampling/reward_mean_tried``), not trained,
not returned to the stream, and counted in ``dynamic_sampling/groups_unused``. So no prompt is lost or
seen twice within the epoch: each is yielded or drawn exactly once, and each drawn one is trained or
counted. Every rank draws when any rank is short, so the streams of all ranks stay aligned; a rank whose
whole window was skipped draws too (its draws are all unused) and joins every collective. Drawn windows
are not yielded again, so the epoch runs ``A·num_iterations`` micro-batches fewer per drawn window than
``len()`` of the loader (and the LR schedule) expects; the loader logs the count at the epoch's end.

**Overlap** (``model.rollout.overlap: 1``): the next window is sampled by the vLLM server while this one
trains, one step stale (:mod:`grasp_lightning.grpo.overlap`).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import asdict

import torch

from grasp_lightning.data.collate import Batch
from grasp_lightning.errors import GraspError
from grasp_lightning.grpo.rollouts import (
    Rollout,
    SamplingStats,
    even_split,
    merge_batches,
    refill_selection,
    rollout_from_state,
    rollout_state,
    take_groups,
)
from grasp_lightning.grpo.vision import VisionFeatures

log = logging.getLogger(__name__)


def generation_calls(batches: list[Batch], max_prompts: int | None, pad_token_id: int) -> list[Batch]:
    """The non-empty micro-batches merged into generation calls of at most ``max_prompts`` prompts
    (``batching.rollout_batch_prompts``; whole micro-batches, at least one per call; all in one call when
    ``None``), each one left-padded batch (:func:`~grasp_lightning.grpo.rollouts.merge_batches`)."""
    live = [b for b in batches if len(b)]
    if max_prompts is None:
        chunks = [live] if live else []
    else:
        chunks: list[list[Batch]] = []
        for b in live:
            if chunks and sum(len(x) for x in chunks[-1]) + len(b) <= max_prompts:
                chunks[-1].append(b)
            else:
                chunks.append([b])
    return [merge_batches(chunk, pad_token_id) for chunk in chunks]


def split_window(ro: Rollout, batches: list[Batch], dynamic_sampling: str, k: int,
                 stats: SamplingStats) -> list[Rollout | None]:
    """Cut a window's sampled rollout ``ro`` (every group tried, in sampling order) into one
    :class:`~grasp_lightning.grpo.rollouts.Rollout` per micro-batch position (``None`` for an empty one),
    and add its group counts to ``stats`` (in place).

    ``off``/``drop``: position ``i`` gets exactly the prompts of micro-batch ``i``. ``refill``: the window's
    prompt count of groups (:func:`~grasp_lightning.grpo.rollouts.refill_selection`) split evenly over the
    non-empty positions (:func:`~grasp_lightning.grpo.rollouts.even_split`).
    """
    live = [i for i, b in enumerate(batches) if len(b)]
    zero = ro.zero_variance.tolist()
    n_useful = ro.num_groups - sum(zero)
    unused = 0
    if dynamic_sampling == "refill":
        selected, unused = refill_selection(zero, sum(len(b) for b in batches))
        sizes = even_split(len(selected), len(live))
    else:
        selected, sizes = list(range(ro.num_groups)), [len(batches[i]) for i in live]
    positions: list[Rollout | None] = [None] * len(batches)
    start = 0
    for i, size in zip(live, sizes):
        positions[i] = take_groups(ro, selected[start:start + size], k)
        start += size
    stats.groups_tried = float(ro.num_groups)
    stats.groups_kept = float(n_useful - unused)
    stats.groups_unused = float(unused)
    stats.groups_dropped = float(ro.num_groups - n_useful) if dynamic_sampling != "off" else 0.0
    stats.reward_sum_tried = float(ro.rewards.double().sum())
    stats.completions_tried = float(ro.rewards.numel())
    return positions


class CacheState(enum.Enum):
    """What the :class:`WindowCache` holds."""

    EMPTY = "empty"  # no window: before the first, or restored from a checkpoint written at a window's end
    SAMPLED = "sampled"  # the window's rollouts, just sampled; no micro-batch has trained on them yet
    IN_USE = "in use"  # the window's rollouts, trained on by at least one micro-batch
    RESTORED = "restored"  # the window's rollouts from a checkpoint, their prompts and items not attached yet


class WindowCache:
    """The current window's rollouts, one per micro-batch position, between its first micro-batch and its
    last use; and the handshake of :meth:`Task.prepare <grasp_lightning.task.Task.prepare>` (which the
    module calls on every micro-batch) with the task's ``training_step``.

    States (:class:`CacheState`): ``EMPTY`` → ``SAMPLED`` (:meth:`fill`, at a window's first micro-batch)
    → ``IN_USE`` (:meth:`take`, by every micro-batch that trains) → ``SAMPLED`` at the next window.
    :meth:`load_state_dict` gives ``RESTORED``, and :meth:`attach` (at the window's next micro-batch)
    ``IN_USE``.

    **Resume.** :meth:`state_dict` holds the window's rollouts, so a run resumed inside a window continues
    with the same samples: plain CPU tensors, lists and numbers (``torch.load(weights_only=True)``).
    Nothing derived from the data is stored: prompts and items are re-read from the window's micro-batches,
    or decoded again by dataset index (``Window.fetch``) for drawn prompts, and their vision features are
    encoded again (:meth:`attach`). After the last micro-batch of the window's last use
    (:meth:`done_at`) no rollout would be reused, so none is stored.

    Attributes:
        state: the :class:`CacheState`.
        key: ``(window index, dataset indices of its micro-batches)`` of the window held, or ``None``.
        rollouts: the window's rollouts by micro-batch position (``None`` for an empty micro-batch).
        tokens: loss tokens of the window over all ranks (0-d tensor; the ``dapo`` normaliser).
        stats: the window's :class:`~grasp_lightning.grpo.rollouts.SamplingStats` (logged once).
        progress: ``(position, iteration, A)`` of the last micro-batch prepared, or ``None``.
    """

    def __init__(self) -> None:
        self.state = CacheState.EMPTY
        self.key: tuple | None = None
        self.rollouts: list[Rollout | None] = []
        self.tokens = torch.tensor(0.0)
        self.stats = SamplingStats()
        self.progress: tuple[int, int, int] | None = None
        self._prepared: Batch | None = None

    def prepare(self, batch: Batch, position: int, iteration: int, size: int) -> None:
        """Record that ``batch`` (at ``position`` of ``iteration`` of a window of ``size`` micro-batches)
        was prepared: :meth:`take` accepts it next."""
        self._prepared = batch
        self.progress = (position, iteration, size)

    def holds(self, key: tuple) -> bool:
        """Whether the cache holds the rollouts of the window ``key`` (restored ones included)."""
        return self.state is not CacheState.EMPTY and key == self.key

    def fill(self, key: tuple, rollouts: list[Rollout | None], stats: SamplingStats) -> None:
        """Hold the freshly sampled rollouts of window ``key`` (state ``SAMPLED``)."""
        self.key, self.rollouts, self.stats, self.state = key, rollouts, stats, CacheState.SAMPLED

    def take(self, batch: Batch) -> list[Rollout | None]:
        """The window's rollouts for ``batch``, the micro-batch prepared last (state ``IN_USE``).

        Raises:
            GraspError: ``batch`` was not prepared (``GraspModule.training_step`` calls ``Task.prepare``
                first; a caller running a task on its own must too), or its rollouts are still to attach.
        """
        if batch is not self._prepared or self.state in (CacheState.EMPTY, CacheState.RESTORED):
            raise GraspError(f"GRPO: micro-batch of dataset indices {list(batch.indices)} was not prepared: call "
                             "task.prepare(ctx, batch) before task.training_step(ctx, batch) (GraspModule.training_step "
                             "does both)")
        self._prepared = None
        self.state = CacheState.IN_USE
        return self.rollouts

    def done_at(self, num_iterations: int) -> bool:
        """Whether the micro-batch prepared last ends the window's last use (its last position at iteration
        ``num_iterations - 1``): the next micro-batch opens a new window, so the cache is never reused."""
        if self.progress is None:
            return False
        position, iteration, size = self.progress
        return position == size - 1 and iteration >= num_iterations - 1

    def state_dict(self, num_iterations: int) -> dict:
        """The window's rollouts and figures (see the class docstring); ``{}`` when there is no window or
        nothing would reuse it (:meth:`done_at`)."""
        if self.key is None or self.done_at(num_iterations):
            return {}
        index, indices = self.key
        return {"window_index": int(index), "window_indices": [list(x) for x in indices],
                "window_tokens": float(self.tokens), "stats": asdict(self.stats),
                "rollouts": [None if ro is None else rollout_state(ro) for ro in self.rollouts]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (state ``RESTORED``); the prompts are attached at the window's next
        micro-batch (:meth:`attach`). A state without a window (saved at a window's end) changes nothing."""
        if "window_index" not in state:
            return
        self.key = (int(state["window_index"]), tuple(tuple(x) for x in state["window_indices"]))
        self.tokens = torch.tensor(float(state["window_tokens"]), dtype=torch.float64)
        self.stats = SamplingStats(**state.get("stats", {}))
        self.rollouts = [None if r is None else rollout_from_state(r) for r in state["rollouts"]]
        self.state = CacheState.RESTORED

    def attach(self, window, batches: list[Batch], device: torch.device, vision: VisionFeatures | None) -> bool:
        """Give restored rollouts their prompts and items (from the micro-batch with the same indices, or
        decoded again by index with ``window.fetch``) and ``vision``, one empty store of vision features for
        the window (the frozen tower encodes each clip again at its first forward and the later ones reuse
        it, as after sampling), and move them to ``device`` (state ``IN_USE``).

        Returns:
            ``False`` (the caller samples the window again) where a prompt cannot be rebuilt.
        """
        for i, ro in enumerate(self.rollouts):
            if ro is None:
                continue
            source = batches[i] if i < len(batches) and list(batches[i].indices) == ro.indices else None
            if source is None and window is not None:
                source = window.fetch(ro.indices)
            if source is None or list(source.indices) != ro.indices:
                log.warning("GRPO: cannot rebuild the prompts %s of a restored rollout; sampling again", ro.indices)
                return False
            source = source.to(device)
            ro.prompt = {k: v for k, v in source.inputs.items() if k != "labels"}
            ro.items = list(source.items)
            ro.vision = vision
            ro.tensors_to(device)
        self.state = CacheState.IN_USE
        return True
