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


def test_window_loader_repeats_whole_windows_and_resumes_inside_them():
    from grasp_lightning.data.windows import WindowLoader

    class B:  # a stand-in micro-batch
        def __init__(self, name):
            self.name, self.window = name, None

    loader = [[B("a0"), B("a1")], [B("b0"), B("b1")]]
    seen = [(b.name, b.window.position, b.window.iteration, b.window.index) for b in WindowLoader(loader, 2, 2)]
    # w0 w1 w0 w1: the second use of a window comes after the optimizer step of its first use
    assert seen == [("a0", 0, 0, 0), ("a1", 1, 0, 0), ("a0", 0, 1, 0), ("a1", 1, 1, 0),
                    ("b0", 0, 0, 1), ("b1", 1, 0, 1), ("b0", 0, 1, 1), ("b1", 1, 1, 1)]
    assert len(WindowLoader(loader, 2, 2)) == 8
    # resumed after 6 micro-batches: the batch sampler skipped window 0 (loader starts at b), and the
    # loader skips b's first iteration; the next epoch starts from its first window again
    resumed = WindowLoader(loader[1:], 2, 2, skip=2, first_window=1)
    assert [(b.name, b.window.iteration, b.window.index) for b in resumed] == [("b0", 1, 1), ("b1", 1, 1)]
    assert len(list(resumed)) == 4


class _Micro:
    """A stand-in micro-batch (``WindowLoader`` sets ``window`` on it)."""

    def __init__(self, name):
        self.name, self.window = name, None


def _as_window(items: list[int]) -> list[_Micro]:
    return [_Micro(i) for i in items]


def test_lightning_shuts_down_the_workers_of_a_window_loader_stopped_inside_a_window():
    """``fit`` that stops at ``max_steps`` leaves the window generator suspended; Lightning's loop teardown
    (``CombinedLoader.reset``) must still shut the persistent workers down. They ignore SIGTERM, so before
    this the interpreter's exit (terminate, then join) waited on them forever (a refill run never exited)."""
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from torch.utils.data import DataLoader

    from grasp_lightning.data.windows import WindowLoader
    from grasp_lightning.datamodule import ignore_stop_signals

    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True, collate_fn=_as_window,
                        worker_init_fn=ignore_stop_signals)
    combined = CombinedLoader(WindowLoader(loader, 2, 1), "max_size_cycle")
    it = iter(combined)
    first, _, _ = next(it)
    assert first.name == 0 and first.window.position == 0  # stopped inside the first window
    workers = list(loader._iterator._workers)
    assert len(workers) == 1 and workers[0].is_alive()
    combined.reset()
    workers[0].join(timeout=20)
    assert not workers[0].is_alive() and loader._iterator is None


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
