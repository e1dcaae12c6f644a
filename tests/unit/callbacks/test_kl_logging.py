"""KL logging's gather over ranks (callbacks/kl_logging.py): every rank's tokens once, in rank order; with
sequence parallelism only the first rank of each group (its ranks hold the same tokens)."""

from __future__ import annotations

import types

import torch

from grasp_lightning.callbacks.kl_logging import gather_tokens


def _trainer(per_rank: list[torch.Tensor]):
    """A trainer of ``len(per_rank)`` ranks whose strategy's ``all_gather`` stacks every rank's tensor."""
    calls = []

    def all_gather(t):
        calls.append(t.numel())
        if t.numel() == 1 and len(calls) == 1:  # the lengths
            return torch.tensor([[v.numel()] for v in per_rank])
        width = t.numel()
        return torch.stack([torch.nn.functional.pad(v, (0, width - v.numel())) for v in per_rank])

    return types.SimpleNamespace(world_size=len(per_rank), strategy=types.SimpleNamespace(all_gather=all_gather))


def test_gather_keeps_every_rank_once_and_one_rank_per_sequence_parallel_group():
    ranks = [torch.tensor([0.25, 0.5]), torch.tensor([0.25, 0.5]), torch.tensor([2.0]), torch.tensor([2.0])]  # exact in float32
    assert gather_tokens(_trainer(ranks), ranks[0]).tolist() == [0.25, 0.5, 0.25, 0.5, 2.0, 2.0]
    assert gather_tokens(_trainer(ranks), ranks[0], share=2).tolist() == [0.25, 0.5, 2.0]
    one = torch.tensor([0.3])
    assert gather_tokens(types.SimpleNamespace(world_size=1), one) is one
