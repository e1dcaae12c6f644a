"""The resumable sampler: deterministic order, rank split, padding, resume by batch count."""

import pytest

from grasp_lightning.data.sampler import ResumableBatchSampler, ResumableSampler


def test_order_is_a_seeded_permutation_split_across_ranks():
    ranks = [list(ResumableSampler(10, seed=3, rank=r, world_size=3)) for r in range(3)]
    # ceil(10 / 3) = 4 per rank; 2 padding positions wrap around to the first indices of the order.
    assert [len(r) for r in ranks] == [4, 4, 4]
    order = ResumableSampler(10, seed=3).order()
    assert sorted(order) == list(range(10))
    flat = [ranks[i % 3][i // 3] for i in range(12)]
    assert flat[:10] == order
    assert flat[10:] == order[:2]
    # A different epoch gives a different order; the same epoch the same order.
    s = ResumableSampler(10, seed=3)
    s.set_epoch(1)
    assert list(s) != order and sorted(s) == list(range(10))
    assert list(ResumableSampler(10, seed=3)) == order


def test_mark_padding_yields_out_of_range_indices_for_evaluation():
    ranks = [list(ResumableSampler(5, shuffle=False, rank=r, world_size=2, pad="mark")) for r in range(2)]
    assert ranks == [[0, 2, 4], [1, 3, 5]]  # 5 is padding (>= N): scored as valid=False


def test_batches_resume_after_consumed_batches_and_repeat():
    sampler = ResumableSampler(7, seed=0)
    full = list(ResumableBatchSampler(sampler, batch_size=3, repeat=2))
    assert len(full) == 6 and full[0] == full[1] and full[2] == full[3] and len(full[4]) == 1
    resumed = ResumableBatchSampler(ResumableSampler(7, seed=0), batch_size=3, repeat=2)
    resumed.set_start(0, 3)
    assert list(resumed) == full[3:]
    assert len(resumed) == 6  # the epoch's length: Lightning counts the resumed epoch from the 3 consumed
    resumed.set_epoch(1)  # a new epoch starts from its first batch
    assert len(list(resumed)) == 6


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="pad"):
        ResumableSampler(3, pad="drop")
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(3, rank=2, world_size=2)
