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


def test_batches_resume_after_consumed_batches():
    sampler = ResumableSampler(7, seed=0)
    full = list(ResumableBatchSampler(sampler, batch_size=3))
    assert [len(b) for b in full] == [3, 3, 1] and sorted(sum(full, [])) == list(range(7))
    resumed = ResumableBatchSampler(ResumableSampler(7, seed=0), batch_size=3)
    resumed.set_start(0, 2)
    assert list(resumed) == full[2:]
    assert len(resumed) == 3  # the epoch's length: Lightning counts the resumed epoch from the 2 consumed
    resumed.set_epoch(1)  # a new epoch starts from its first batch
    assert len(list(resumed)) == 3


def test_windows_group_accumulation_windows_and_drop_the_partial_one():
    order = ResumableSampler(11, seed=0).order()
    windows = list(ResumableBatchSampler(ResumableSampler(11, seed=0), batch_size=2, window=2))
    # 6 micro-batches of 2 (the last has 1) -> 3 windows of 4, 4 and 3 indices, in order
    assert windows == [order[0:4], order[4:8], order[8:11]]
    odd = ResumableBatchSampler(ResumableSampler(10, seed=0), batch_size=2, window=2)  # 5 micro-batches
    assert len(odd) == 2 and list(odd) == [order_ for order_ in [ResumableSampler(10, seed=0).order()[i:i + 4]
                                                                 for i in (0, 4)]]


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="pad"):
        ResumableSampler(3, pad="drop")
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(3, rank=2, world_size=2)


def test_batch_sampler_resume_leaves_out_drawn_windows():
    """set_start(epoch, 2, exclude=2): windows 2, then 5, 6, ... (windows 3 and 4 were drawn before the stop)."""
    from grasp_lightning.data.sampler import ResumableBatchSampler, ResumableSampler

    full = list(ResumableBatchSampler(ResumableSampler(16, shuffle=False), 2, window=1))
    batches = ResumableBatchSampler(ResumableSampler(16, shuffle=False), 2, window=1)
    batches.set_start(0, 2, exclude=2)
    assert list(batches) == [full[2], *full[5:]] == [[4, 5], [10, 11], [12, 13], [14, 15]]
    batches.set_epoch(1)  # the next epoch is whole again
    assert list(batches) == full


# ------------------------------------------------------------------------------- curriculum (data.loader.curriculum)
def test_curriculum_visits_groups_in_order_shuffled_inside_each():
    groups = [2, 0, 1, 0, 2, 1, 0, 2, 1, 0]
    plain = ResumableSampler(10, seed=5).order()
    order = ResumableSampler(10, seed=5, groups=groups).order()
    assert [groups[i] for i in order] == sorted(groups)  # easy, then medium, then hard
    # inside a group, the order of the plain seeded permutation (the shuffle is the same, grouped stably)
    for g in (0, 1, 2):
        assert [i for i in order if groups[i] == g] == [i for i in plain if groups[i] == g]
    later = ResumableSampler(10, seed=5, groups=groups)
    later.set_epoch(1)
    assert later.order() != order and [groups[i] for i in later.order()] == sorted(groups)
    # two ranks over 9 items: each sees the lower groups first; rank 1's last position is the padding, which
    # wraps to the first item of the order (an easy one)
    nine = ResumableSampler(9, seed=5, groups=groups[:9]).order()
    rank0, rank1 = (list(ResumableSampler(9, seed=5, groups=groups[:9], rank=r, world_size=2)) for r in range(2))
    assert rank0 == nine[0::2] and rank1 == nine[1::2] + [nine[0]]
    assert [groups[i] for i in rank0] == sorted(groups[i] for i in rank0)
    assert [groups[i] for i in rank1[:-1]] == sorted(groups[i] for i in rank1[:-1])
    with pytest.raises(ValueError, match="groups has 3 entries for 10 items"):
        ResumableSampler(10, groups=[0, 1, 2])


def test_curriculum_resumes_exactly_after_consumed_batches():
    groups = [2, 0, 1, 0, 2, 1, 0]
    full = list(ResumableBatchSampler(ResumableSampler(7, seed=1, groups=groups), batch_size=2))
    resumed = ResumableBatchSampler(ResumableSampler(7, seed=1, groups=groups), batch_size=2)
    resumed.set_start(0, 2)
    assert list(resumed) == full[2:]


