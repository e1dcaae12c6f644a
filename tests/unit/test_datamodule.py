"""The GRASP DataModule (``grasp_lightning/datamodule.py``): what the task connects (mode, windows), the curriculum
order and its resume, and the resume state it checkpoints."""

from __future__ import annotations

import pytest

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig
from grasp_lightning.data.windows import WindowLoader
from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.errors import GraspConfigError
from tests.helpers import SAMPLE, TINY


def test_data_mode_comes_from_the_task_and_a_contradicting_one_is_an_error():
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(bench=None))
    assert dm.data_mode == "sft"  # stand-alone: no task connected
    dm.connect(data_mode="rl")
    assert dm.data_mode == "rl"
    agreeing = GraspDataModule(source=SourceConfig(bench=None), loader=LoaderConfig(data_mode="rl"))
    agreeing.connect(data_mode="rl")  # an explicit, agreeing value is fine
    with pytest.raises(GraspConfigError, match=r"data.loader.data_mode='sft' contradicts the task, which consumes 'rl'"):
        GraspDataModule(source=SourceConfig(bench=None), loader=LoaderConfig(data_mode="sft")).connect(data_mode="rl")


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


def _sft_dm(**loader) -> GraspDataModule:
    """The sample data's SFT rows (24) with the tiny model's processor, set up for fit."""
    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_sft.jsonl", bench=None),
                         prompt=PromptConfig(processor=str(TINY)),
                         loader=LoaderConfig(num_workers=0, batch_size=2, **loader))
    dm.setup("fit")
    return dm


def test_connect_refuses_empty_windows_and_an_unknown_mode():
    dm = GraspDataModule(source=SourceConfig(bench=None))
    with pytest.raises(GraspConfigError, match="window and repeat must be >= 1, got 0, 1"):
        dm.connect(window=0)
    with pytest.raises(GraspConfigError, match="data_mode must be 'sft' or 'rl', got 'ppo'"):
        dm.connect(data_mode="ppo")


def test_connected_windows_yield_each_window_repeat_times_with_the_window_set():
    """24 rows, micro-batches of 2: 12 micro-batches, 6 windows of 2, each yielded twice -> len 24."""
    dm = _sft_dm()
    assert len(dm.train_dataloader()) == 12  # plain loader: micro-batches of 2
    dm.connect(window=2, repeat=2)
    loader = dm.train_dataloader()
    assert isinstance(loader, WindowLoader) and len(loader) == 24
    first = next(iter(loader))
    assert (first.window.position, first.window.iteration, first.window.index) == (0, 0, 0)
    assert len(first.window.batches) == 2 and first.window.batches[0] is first and len(first.indices) == 2


def test_a_window_larger_than_the_epoch_is_refused_naming_the_setting():
    dm = _sft_dm()
    dm.connect(window=13)  # 12 micro-batches per epoch
    with pytest.raises(GraspConfigError, match=r"12 micro-batches per epoch and rank .* fill no window of 13"):
        dm.train_dataloader()


def test_state_dict_round_trip_resumes_after_the_consumed_micro_batches():
    dm = _sft_dm()
    order = list(dm.train_dataloader().batch_sampler)
    assert dm.state_dict() == {"epoch": 0, "consumed": 0, "samples_seen": 0, "curriculum": False,
                               "samples_skipped": 0, "stream_index": -1, "stream_draws": 0}
    resumed = _sft_dm()
    resumed.load_state_dict({"epoch": 0, "consumed": 3, "samples_seen": 6, "curriculum": False})
    assert list(resumed.train_dataloader().batch_sampler) == order[3:]
    assert resumed.samples_seen == 6
