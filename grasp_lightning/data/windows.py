"""Accumulation windows for rollout reuse: a window of ``A`` micro-batches, repeated ``n`` times.

GRPO's ``num_iterations = n`` reuses each rollout for ``n`` optimizer steps with the log-probs of the
policy that sampled it (TRL 1.16 ``GRPOTrainer``: ``num_iterations``, ``steps_per_generation``). An
optimizer step takes ``A = trainer.accumulate_grad_batches`` micro-batches, so reuse is per window:
the loader yields micro-batches ``w0 w1 … w(A-1)``, then the same ``A`` again, ``n`` times, then the
next window. Repeating each micro-batch instead (``w0 w0 w1 w1``) puts both uses inside one optimizer
step, where the ratio is exactly 1 and nothing is reused.

Every micro-batch carries its :class:`Window` (``batch.window``): all ``A`` micro-batches of the
window (decoded once, reused by every iteration), its position and the iteration, so a task can
sample the whole window's rollouts at its first micro-batch (window-wide token counts and reward
statistics, as TRL computes them over a generation batch).

Resume counts micro-batches (repeats included); a resumed epoch skips whole windows in the batch
sampler and the consumed micro-batches (iterations included) of the first window here.

**Draws** (GRPO ``dynamic_sampling: refill``): a task may take further windows of prompts from the
stream with :meth:`Window.draw` — the next item of the same loader, so a drawn window is consumed
exactly like a yielded one and is never yielded afterwards (no sample lost or seen twice within the
epoch). Stream positions count both: a window's :attr:`Window.index` is its position among the
loader's items, the next yielded window sits at ``index + 1 + draws``. Resuming inside a window that
drew ``d`` windows re-yields it and leaves out the ``d`` items after it (:func:`resume_position`;
the task restores those rollouts from its checkpointed cache).

**Peeking** (``model.rollout.overlap: 1``): a task may read the next window's micro-batches ahead with
:meth:`Window.peek`, to have them sampled while it trains on this one. A peeked window is not consumed:
the loader yields it next as usual, the same :class:`Batch` objects, and resume positions count yielded
micro-batches only (Lightning's), never peeked ones.

**Drawing shortens the epoch** by ``A·n`` micro-batches per drawn window: Lightning ends the epoch
when the loader stops, but ``len()`` — hence ``trainer.estimated_stepping_batches`` and the LR
schedule built from it — stays the undrawn count, which cannot be known before the rollouts are
scored. :class:`WindowLoader` logs the count at the end of every epoch that drew (a warning:
windows drawn, micro-batches and optimizer steps run against those ``len()`` announced). For a
schedule that matches the steps run, give it in steps (``trainer.max_epochs: -1`` with
``trainer.max_steps``: Lightning then schedules over exactly ``max_steps``). Lightning's loop also
counts an epoch as finished only at ``len()`` batches, so resume from checkpoints saved inside an
epoch (every ``n`` steps, preemption), not from one saved at the very end of a shortened epoch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

from grasp_lightning.data.collate import Batch, Sample

log = logging.getLogger(__name__)


@dataclass
class Window:
    """One accumulation window as a task sees it.

    Attributes:
        batches: the ``A`` micro-batches of the window, in order (the same objects every iteration).
        position: index of the current micro-batch in ``batches`` (0 … A-1).
        iteration: 0 … n-1, how many optimizer steps this window already served.
        index: the window's position in the epoch (0-based, counting every window of the epoch).
    """

    batches: list[Batch]
    position: int
    iteration: int
    index: int = 0
    source: "WindowSource | None" = None

    @property
    def draws(self) -> int:
        """Windows this window drew from the stream so far (0 without a source)."""
        return self.source.draws if self.source is not None else 0

    def draw(self) -> list[Batch] | None:
        """The next window of micro-batches from the data stream, consumed by this window (``None`` when
        the epoch's stream is exhausted or the loader cannot draw)."""
        return self.source.draw() if self.source is not None else None

    def fetch(self, indices: list[int]) -> Batch | None:
        """Decode and collate the dataset rows ``indices`` again as one micro-batch (a resumed task rebuilds
        the prompts of drawn windows this way); ``None`` when the loader cannot."""
        return self.source.fetch(indices) if self.source is not None else None

    def peek(self) -> list[Batch] | None:
        """The micro-batches of the window the loader yields after this one (and its draws), not consumed;
        ``None`` at the end of the epoch or without a source."""
        return self.source.peek() if self.source is not None else None


@dataclass
class WindowSource:
    """What the micro-batches of one window share: the stream they came from and the draws made.

    Attributes:
        iterator: the loader's iterator (the next item is the next window of the stream).
        dataset: the loader's dataset and ``collate`` its micro-batch collate (for :meth:`fetch`).
        draws: windows drawn by this window.
        on_draw: called with each drawn window (the DataModule counts its samples and skips).
    """

    iterator: Iterator | None = None
    dataset: object = None
    collate: Callable | None = None
    draws: int = 0
    on_draw: Callable[[list[Batch]], None] | None = None
    next_batches: list[Batch] | None = None  # the next window, once the loader has taken it from the stream

    def peek(self) -> list[Batch] | None:
        """The next window of the stream without consuming it: the one the loader already took (Lightning
        fetches a micro-batch ahead), else the stream's next item held back for the loader; ``None`` at the
        end of the epoch."""
        if self.next_batches is not None:
            return self.next_batches
        peek = getattr(self.iterator, "peek", None)
        return peek() if peek is not None else None

    def draw(self) -> list[Batch] | None:
        """The next window of the stream (its ``A`` micro-batches), consumed so the loader never yields
        it; ``None`` at the end of the epoch. Counted in :attr:`draws` and reported to ``on_draw``."""
        if self.iterator is None:
            return None
        try:
            batches = next(self.iterator)
        except StopIteration:
            self.iterator = None
            return None
        self.draws += 1
        if self.on_draw is not None:
            self.on_draw(batches)
        return batches

    def fetch(self, indices: list[int]) -> Batch | None:
        """The micro-batch of these dataset indices, collated again (a rollout cache restored from a
        checkpoint re-attaches its prompts this way); ``None`` without a dataset."""
        if self.dataset is None or self.collate is None:
            return None
        return self.collate([self.dataset[i] for i in indices])


class Lookahead:
    """An iterator that can hold its next item back: :meth:`peek` reads it, the next ``next()`` returns it.

    Args:
        iterator: the loader's iterator of windows.
    """

    def __init__(self, iterator: Iterator) -> None:
        self.iterator = iterator
        self._held: list = []

    def __iter__(self) -> Lookahead:
        return self

    def __next__(self):
        return self._held.pop() if self._held else next(self.iterator)

    def peek(self):
        """The next item, kept for the next ``next()``; ``None`` when the iterator is exhausted."""
        if not self._held:
            try:
                self._held.append(next(self.iterator))
            except StopIteration:
                return None
        return self._held[0]


def resume_position(consumed: int, per_window: int, stream_index: int | None, draws: int) -> tuple[int, int, int]:
    """Where a resumed epoch starts in the stream of windows.

    Args:
        consumed: micro-batches of the epoch Lightning already ran (iterations included).
        per_window: micro-batches per window and its repeats (``A * n``).
        stream_index: stream position of the window of the last consumed micro-batch, ``None`` when
            unknown (a checkpoint from before draws existed: no draws are assumed).
        draws: windows that window drew.

    Returns:
        ``(first, skip, exclude)``: the stream position to start at, micro-batches of that window to
        skip, and stream items right after it to leave out (its draws).
    """
    windows, skip = divmod(consumed, per_window)
    if stream_index is None or consumed == 0:
        return windows, skip, 0
    if skip == 0:  # at a window boundary: continue after the last window and its draws
        return stream_index + 1 + draws, 0, 0
    return stream_index, skip, draws


@dataclass
class WindowCollate:
    """Collate a flat list of ``A × batch_size`` samples into ``A`` micro-batches.

    Args:
        collate: the micro-batch collate function (``samples -> Batch``).
        batch_size: samples per micro-batch; only the window's last micro-batch may be shorter.
    """

    collate: Callable[[list[Sample]], Batch]
    batch_size: int

    def __call__(self, samples: list[Sample]) -> list[Batch]:
        """``ceil(len(samples) / batch_size)`` micro-batches, in order."""
        return [self.collate(samples[i: i + self.batch_size]) for i in range(0, len(samples), self.batch_size)]


@dataclass
class WindowLoader:
    """Iterate a loader of windows (lists of ``A`` micro-batches) as micro-batches, each window ``repeat`` times.

    Args:
        loader: a ``DataLoader`` whose items are lists of ``window`` :class:`Batch` (see
            :class:`WindowCollate` and ``ResumableBatchSampler(window=A)``).
        window: ``A``, micro-batches per window (``trainer.accumulate_grad_batches``).
        repeat: ``n``, iterations per window (the task's ``num_iterations``).
        skip: micro-batches of the first yielded window's repetitions already consumed (resume;
            ``< window * repeat``).
        first_window: stream position of the loader's first window (resume).
        exclude: draws of the first window before the checkpoint (resume; the batch sampler already
            leaves those items out, see ``ResumableBatchSampler.set_start``).
        on_draw: passed to every :class:`WindowSource`.
        limit: ``None``, or the epoch ends after this many micro-batches (resumed ones included): GRPO
            ``batching.micro_batch: rollout`` passes the rank's number of micro-batches of prompts, as the released
            run's Hugging Face Trainer stopped at ``max_steps`` computed from ``len(dataloader)``.

    ``len()`` is the epoch's micro-batch count, resumed ones included (as Lightning expects, see
    ``ResumableBatchSampler.__len__``), *without* draws: an epoch that drew ``d`` windows yields
    ``d·A·n`` micro-batches fewer, logged as a warning at its end and kept in :attr:`drawn_windows`
    (the last finished epoch's draws, those before a resume included). ``batch_sampler`` is the
    loader's, so Lightning's ``set_epoch`` reaches the index sampler.
    """

    loader: object
    window: int
    repeat: int
    skip: int = 0
    first_window: int = 0
    exclude: int = 0
    on_draw: Callable[[list[Batch]], None] | None = None
    limit: int | None = None
    batch_sampler: object = field(init=False)
    drawn_windows: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.batch_sampler = getattr(self.loader, "batch_sampler", None)

    # Lightning shuts a DataLoader's workers down when a loop ends (``CombinedLoader.reset`` calls
    # ``_shutdown_workers_and_reset_iterator``, which looks for ``_iterator``). Passing the wrapped loader's
    # iterator through lets it do the same here. Without it the persistent workers outlived ``fit``: they
    # ignore SIGTERM (``datamodule.ignore_stop_signals``), so the interpreter's exit, which terminates and
    # joins them, waited forever.
    @property
    def _iterator(self):
        return getattr(self.loader, "_iterator", None)

    @_iterator.setter
    def _iterator(self, value) -> None:
        if hasattr(self.loader, "_iterator"):
            self.loader._iterator = value

    def __iter__(self):
        skip, index, draws = self.skip, self.first_window, self.exclude
        self.skip, self.first_window, self.exclude = 0, 0, 0  # only the resumed epoch starts late
        left = None if self.limit is None else self.limit - index * self.window * self.repeat - skip
        drawn = 0
        iterator = Lookahead(iter(self.loader))
        dataset = getattr(self.loader, "dataset", None)
        collate = getattr(getattr(self.loader, "collate_fn", None), "collate", None)
        previous = None
        for batches in iterator:
            if previous is not None:
                previous.next_batches = batches  # what its peek() returns from now on
            source = previous = WindowSource(iterator, dataset, collate, draws=draws, on_draw=self.on_draw)
            for iteration in range(self.repeat):
                for position, batch in enumerate(batches):
                    if skip:
                        skip -= 1
                        continue
                    if left is not None:
                        if left <= 0:
                            return
                        left -= 1
                    batch.window = Window(batches, position, iteration, index, source)
                    yield batch
            source.iterator = None  # the window is done: no more draws from it
            index += 1 + source.draws
            drawn += source.draws
            draws = 0
        self.drawn_windows = drawn
        if drawn:
            per_window, total = self.window * self.repeat, len(self.loader)
            log.warning("refill drew %d windows of prompts from the stream this epoch: it ran %d of the %d micro-batches "
                        "len() announced (%d of %d optimizer steps); the LR schedule counts the announced ones (give it "
                        "in steps: trainer.max_epochs=-1 with trainer.max_steps)", drawn, (total - drawn) * per_window,
                        total * per_window, (total - drawn) * per_window // self.window, total * per_window // self.window)

    def __len__(self) -> int:
        full = len(self.loader) * self.window * self.repeat
        return full if self.limit is None else min(full, self.limit)
