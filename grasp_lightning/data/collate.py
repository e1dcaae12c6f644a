"""Batching of encoded examples: padding, vision inputs, and the records and skips that travel along."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from grasp_lightning.data.formats import SkipRecord
from grasp_lightning.data.prompts import IGNORE_INDEX, EncodedExample
from grasp_lightning.data.records import GraspItem


@dataclass
class Sample:
    """What a dataset returns for one index: an encoded example, or the reason it was skipped.

    Attributes:
        index: position in the dataset (for exact resume accounting).
        item: the record.
        example: the encoding, ``None`` when skipped.
        skip: the skip record, ``None`` when encoded.
        valid: ``False`` for padding added to even out distributed ranks (never scored).
    """

    index: int
    item: GraspItem
    example: EncodedExample | None = None
    skip: SkipRecord | None = None
    valid: bool = True


@dataclass
class Batch:
    """A collated batch.

    Attributes:
        inputs: model inputs: ``input_ids`` ``(B, L)``, ``attention_mask`` ``(B, L)``,
            ``mm_token_type_ids`` ``(B, L)`` (0 text, 1 image, 2 video); ``pixel_values_videos``
            ``(sum N_i, D)`` and ``video_grid_thw`` ``(V, 3)`` of the ``V`` rows with a clip, in row
            order; ``pixel_values`` and ``image_grid_thw`` ``(I, 3)`` of the ``I`` rows with an image
            (keys absent when no row has that medium); plus ``labels`` ``(B, L)`` for SFT batches.
        items: the records of the B encoded rows, in row order.
        indices: dataset indices of the B rows.
        valid: ``(B,)`` bool; ``False`` for rank padding.
        prompt_lengths: ``(B,)`` prompt tokens of each row.
        skipped: records of items skipped in this batch (not among the B rows).
        padding_side: ``"left"`` (prompts for generation) or ``"right"`` (training sequences).
        window: the accumulation window this micro-batch belongs to, set by
            :class:`~grasp_lightning.data.windows.WindowLoader` (``None`` outside window mode).
    """

    inputs: dict[str, torch.Tensor]
    items: list[GraspItem]
    indices: list[int]
    valid: torch.Tensor
    prompt_lengths: torch.Tensor
    skipped: list[SkipRecord] = field(default_factory=list)
    padding_side: str = "right"
    window: object | None = None  # grasp_lightning.data.windows.Window (kept untyped: no import cycle)

    def __len__(self) -> int:
        return len(self.items)

    def to(self, device: torch.device | str) -> "Batch":
        """Move the tensors to ``device`` (Lightning's ``transfer_batch_to_device`` calls this)."""
        self.inputs = {k: v.to(device) for k, v in self.inputs.items()}
        self.valid = self.valid.to(device)
        self.prompt_lengths = self.prompt_lengths.to(device)
        return self


def _pad(seqs: list[torch.Tensor], value: int, side: str) -> torch.Tensor:
    length = max(s.numel() for s in seqs)
    out = torch.full((len(seqs), length), value, dtype=seqs[0].dtype)
    for i, s in enumerate(seqs):
        if side == "left":
            out[i, length - s.numel():] = s
        else:
            out[i, : s.numel()] = s
    return out


def collate_samples(samples: list[Sample], pad_token_id: int, padding_side: str = "right") -> Batch:
    """Collate dataset samples into a :class:`Batch`; skipped samples travel in ``Batch.skipped``.

    Args:
        samples: what the dataset returned for the sampler's indices.
        pad_token_id: id written into padding positions of ``input_ids``.
        padding_side: ``"right"`` for training sequences, ``"left"`` for batched generation.

    A batch whose every sample was skipped has ``B = 0`` and empty inputs; the task skips it.
    """
    kept = [s for s in samples if s.example is not None]
    skipped = [s.skip for s in samples if s.skip is not None]
    examples = [s.example for s in kept]
    inputs: dict[str, torch.Tensor] = {}
    if examples:
        ids = [e.input_ids for e in examples]
        inputs["input_ids"] = _pad(ids, pad_token_id, padding_side)
        inputs["attention_mask"] = _pad([torch.ones_like(i) for i in ids], 0, padding_side)
        inputs["mm_token_type_ids"] = _pad([e.mm_token_type_ids for e in examples], 0, padding_side)
        for pixels, grid in (("pixel_values_videos", "video_grid_thw"), ("pixel_values", "image_grid_thw")):
            carrying = [e for e in examples if getattr(e, grid) is not None]
            if carrying:  # row order: the model pairs the k-th grid of a medium with its k-th placeholder run
                inputs[pixels] = torch.cat([getattr(e, pixels) for e in carrying])
                inputs[grid] = torch.cat([getattr(e, grid) for e in carrying])
        if all(e.labels is not None for e in examples):
            inputs["labels"] = _pad([e.labels for e in examples], IGNORE_INDEX, padding_side)
    return Batch(
        inputs=inputs,
        items=[s.item for s in kept],
        indices=[s.index for s in kept],
        valid=torch.tensor([s.valid for s in kept], dtype=torch.bool),
        prompt_lengths=torch.tensor([e.prompt_length for e in examples], dtype=torch.long),
        skipped=skipped,
        padding_side=padding_side,
    )
