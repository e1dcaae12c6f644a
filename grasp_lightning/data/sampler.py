"""A deterministic, resumable sampler split across distributed ranks.

Order: a permutation seeded by ``seed + epoch`` (or the identity), the same on every rank; with
``groups`` (a curriculum: 0 easy, 1 medium, 2 hard), the items of group 0 first, then group 1, ...,
each group permuted by that seed. Rank ``r`` of ``W`` takes positions ``r, r + W, ...``. Resuming sets the number of this rank's samples
already consumed in the epoch, and iteration continues with the next unseen one — the property
tested by the resume tests. Mirrors ``torch.utils.data.DistributedSampler``'s split and padding.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler[int]):
    """Yield dataset indices for one rank, starting after ``start`` consumed samples.

    Args:
        num_items: dataset length ``N``.
        shuffle: permute by ``seed + epoch``; otherwise keep file order.
        seed: base seed of the permutation.
        rank: this process's rank.
        world_size: number of ranks ``W``.
        pad: how to even out ranks when ``N % W != 0``: ``"wrap"`` repeats the first indices of the
            order (training, as ``DistributedSampler``); ``"mark"`` yields ``N + k`` for padding
            positions, which the dataset turns into rows with ``valid=False`` that are never
            scored (evaluation).
        groups: one integer per item (length ``N``), or ``None``: the epoch's order visits the groups in
            increasing order, shuffled within each group (with ``shuffle``), so every rank sees the lower
            groups first. The SFT curriculum passes 0/1/2 for easy/medium/hard (released GRASP
            ``LengthGroupedSampler``, ``socialmllm/utils/data_processing.py:36-50``, without its length
            grouping).

    Every rank yields ``ceil(N / W)`` indices per epoch, minus ``start``.
    """

    def __init__(self, num_items: int, *, shuffle: bool = True, seed: int = 0, rank: int = 0,
                 world_size: int = 1, pad: str = "wrap", groups: list[int] | None = None) -> None:
        if pad not in ("wrap", "mark"):
            raise ValueError(f"pad must be 'wrap' or 'mark', got {pad!r}")
        if groups is not None and len(groups) != num_items:
            raise ValueError(f"groups has {len(groups)} entries for {num_items} items")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world size {world_size}")
        self.num_items = num_items
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        self.groups = list(groups) if groups is not None else None
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation (Lightning calls this at every epoch start)."""
        if epoch != self.epoch:
            self.start = 0
        self.epoch = epoch

    def set_start(self, epoch: int, start: int) -> None:
        """Resume: this rank already consumed ``start`` samples of epoch ``epoch``."""
        self.epoch = epoch
        self.start = start

    @property
    def per_rank(self) -> int:
        """Samples per rank and epoch, padding included."""
        return math.ceil(self.num_items / self.world_size) if self.num_items else 0

    def order(self) -> list[int]:
        """The full order of this epoch over all ranks, padding included (length ``per_rank * W``)."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=g).tolist()
        else:
            order = list(range(self.num_items))
        if self.groups is not None:  # stable: the permutation's order inside each group
            order.sort(key=self.groups.__getitem__)
        missing = self.per_rank * self.world_size - self.num_items
        if self.pad == "wrap":
            order += (order * (missing // max(1, len(order)) + 1))[:missing]
        else:
            order += [self.num_items + k for k in range(missing)]
        return order

    def __iter__(self):
        return iter(self.order()[self.rank:: self.world_size][self.start:])

    def __len__(self) -> int:
        return max(0, self.per_rank - self.start)


class ResumableBatchSampler:
    """Batches of a :class:`ResumableSampler`, optionally grouped into accumulation windows, resumable.

    Args:
        sampler: the per-rank index sampler.
        batch_size: indices per micro-batch (the last micro-batch of an epoch may be shorter).
        window: micro-batches per yielded item. ``1``: one micro-batch per item. ``A > 1``: the
            indices of ``A`` consecutive micro-batches (one accumulation window) as one flat list,
            which :class:`WindowCollate` splits again into ``A`` micro-batches of ``batch_size``; an
            epoch's trailing micro-batches that do not fill a window are dropped (GRPO's
            ``num_iterations``: a rollout is reused only after an optimizer step, so a window is
            the unit of reuse; see :class:`grasp_lightning.data.windows.WindowLoader`).

    Resume state is the number of items (micro-batches, or windows) of this epoch already consumed,
    and, for a window resumed in its middle that had drawn further windows (GRPO refill,
    :class:`grasp_lightning.data.windows.Window.draw`), how many items after it to leave out.
    """

    def __init__(self, sampler: ResumableSampler, batch_size: int, window: int = 1) -> None:
        if batch_size < 1 or window < 1:
            raise ValueError(f"batch_size and window must be >= 1, got {batch_size}, {window}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.window = window
        self._start: tuple[int, int] = (0, 0)
        self._exclude = 0

    @property
    def start_batches(self) -> int:
        """Items skipped at the start of the current epoch (non-zero only in the resumed epoch)."""
        epoch, batches = self._start
        return batches if epoch == self.sampler.epoch else 0

    def set_epoch(self, epoch: int) -> None:
        """Forwarded to the index sampler. Lightning calls ``set_epoch`` on ``batch_sampler.sampler``
        directly, so the resume offset is keyed by epoch rather than reset here."""
        self.sampler.set_epoch(epoch)

    def set_start(self, epoch: int, batches: int, exclude: int = 0) -> None:
        """Resume after ``batches`` consumed items of epoch ``epoch``; ``exclude`` items right after the
        first yielded one are left out (they were drawn, and consumed, before the checkpoint).

        Raises:
            ValueError: ``batches`` or ``exclude`` < 0.
        """
        if batches < 0 or exclude < 0:
            raise ValueError(f"set_start: batches and exclude must be >= 0, got {batches}, {exclude}")
        self.sampler.set_start(epoch, 0)
        self._start = (epoch, batches)
        self._exclude = exclude

    def _all_batches(self) -> list[list[int]]:
        indices = list(self.sampler)
        chunks = [indices[i: i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.window == 1:
            return chunks
        full = len(chunks) // self.window * self.window
        return [sum(chunks[i: i + self.window], []) for i in range(0, full, self.window)]

    def __iter__(self):
        items = self._all_batches()[self.start_batches:]
        if self._exclude and self._start[0] == self.sampler.epoch:  # only in the resumed epoch
            items = items[:1] + items[1 + self._exclude:]
        return iter(items)

    def __len__(self) -> int:
        """Items of the whole epoch, *including* the ones skipped on resume: Lightning restores its
        own batch counter to the consumed count and stops the epoch when that counter reaches this
        length (a shorter length cut the resumed epoch short by the skipped batches whenever fewer
        than half were consumed, and changed ``estimated_stepping_batches``, hence the LR schedule)."""
        return math.ceil(len(self.sampler) / self.batch_size) // self.window
