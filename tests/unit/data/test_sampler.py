"""The resumable sampler: deterministic order, rank split, padding, resume by batch count."""

import pytest

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig
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


def _curriculum_dm(root):
    from grasp_lightning.datamodule import GraspDataModule
    from tests.helpers import TINY

    dm = GraspDataModule(source=SourceConfig(root=str(root), train_file="train/data_sft.jsonl", bench=None),
                         prompt=PromptConfig(processor=str(TINY)),
                         loader=LoaderConfig(curriculum=True, num_workers=0, batch_size=2))
    dm.setup("fit")
    return dm


def test_datamodule_curriculum_orders_the_sample_rows_and_resumes_exactly():
    from grasp_lightning.data.records import DIFFICULTIES
    from tests.helpers import SAMPLE

    dm = _curriculum_dm(SAMPLE)
    batches = list(dm.train_dataloader().batch_sampler)
    rank = [DIFFICULTIES.index(dm.train_items[i].difficulty) for i in sum(batches, [])]
    assert rank == sorted(rank) and len(set(rank)) == 3 and len(rank) == 24  # easy -> medium -> hard, every row
    dm._consumed = 5  # five micro-batches consumed in epoch 0: the checkpoint records them with the setting
    state = dm.state_dict()
    assert state["curriculum"] is True
    resumed = _curriculum_dm(SAMPLE)
    resumed.load_state_dict(state)
    assert list(resumed.train_dataloader().batch_sampler) == batches[5:]
    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.errors import GraspConfigError

    with pytest.raises(GraspConfigError, match="resume with data.loader.curriculum=true"):  # the other order: refused
        GraspDataModule(source=SourceConfig(bench=None), loader=LoaderConfig(curriculum=False)).load_state_dict(state)


def test_datamodule_curriculum_names_the_file_when_rows_carry_no_difficulty(tmp_path):
    from grasp_lightning.errors import GraspDataError
    from tests.helpers import SAMPLE, sft_row, write_jsonl

    write_jsonl(tmp_path / "train" / "data_sft.jsonl", [sft_row(), sft_row()])  # no meta spec
    (tmp_path / "train" / "videos").symlink_to(SAMPLE / "train" / "videos")
    dm = _curriculum_dm(tmp_path)
    with pytest.raises(GraspDataError) as err:
        dm.train_dataloader()
    assert err.value.where == f"{tmp_path / 'train' / 'data_sft.jsonl'}:1"
    assert "2 of 2 rows of train/data_sft.jsonl carry no difficulty" in err.value.reason
    assert "data.loader.curriculum=false" in str(err.value)
