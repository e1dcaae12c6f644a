"""``predict``'s setup key (grasp_lightning/predictions.py, ``GraspModule.prediction_setup``): every setting of every
group of the module and the DataModule is keyed or named as changing no answer, and the settings the audit found
left out (``data.video.frame_max_tokens``, ``model.rollout.vllm.dtype`` under vLLM) change the key."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest

from grasp_lightning.data.datamodule_config import VideoConfig
from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.module import EvalConfig, GraspModule
from grasp_lightning.policy import LoraConfig, PolicyConfig
from grasp_lightning.predictions import NOT_IN_SETUP_KEY, not_in_key, setup_settings
from grasp_lightning.tasks.sft import SFTTask
from tests.helpers import REPO

TINY = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"


def dataclass_groups(cls) -> dict[str, type]:
    """``{argument name: dataclass}`` of ``cls.__init__``'s settings groups."""
    hints = typing.get_type_hints(cls.__init__)
    return {name: hints[name] for name in inspect.signature(cls.__init__).parameters
            if name in hints and dataclasses.is_dataclass(hints[name])}


def fields_of(prefix: str, cls) -> list[str]:
    """Dotted names of every field of dataclass ``cls``, nested dataclass groups (``model.rollout.vllm``) opened."""
    names = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        names += fields_of(f"{prefix}.{f.name}", kind) if dataclasses.is_dataclass(kind) else [f"{prefix}.{f.name}"]
    return names


def module(*, engine: str | None = None, lora: bool = False, **rollout) -> GraspModule:
    return GraspModule(SFTTask(), policy=PolicyConfig(name_or_path=str(TINY)), lora=LoraConfig(enabled=lora),
                       rollout=RolloutConfig(**rollout), evaluation=EvalConfig(engine=engine))


def data_groups(**video) -> dict:
    return dict(GraspDataModule(video=VideoConfig(**video)).hparams)


def test_every_field_of_every_group_is_keyed_or_named_as_changing_no_answer() -> None:
    """A setting added to a group enters the key unless NOT_IN_SETUP_KEY names it with a reason; the list names
    only settings that exist. Before: a hand list of six data settings (PROMPT_SETTINGS) and four model ones."""
    model_groups, data_group_types = dataclass_groups(GraspModule), dataclass_groups(GraspDataModule)
    full = module(engine="vllm", lora=True)  # every group applies: vLLM answers, LoRA on
    assert set(full.setting_groups) == set(model_groups)  # no group of GraspModule is left out of the key
    data = data_groups()
    assert set(data) == set(data_group_types)
    keyed = full.prediction_setup(data).identity["settings"]
    every = [name for group, cls in model_groups.items() for name in fields_of(f"model.{group}", cls)]
    every += [name for group, cls in data_group_types.items() for name in fields_of(f"data.{group}", cls)]
    assert len(every) > 70
    unaccounted = [name for name in every if not not_in_key(name)
                   and not any(key == name or key.startswith(name + ".") for key in keyed)]
    assert unaccounted == []
    assert all(not_in_key(key) is False for key in keyed)
    groups = {f"model.{g}" for g in model_groups} | {f"data.{g}" for g in data_group_types}
    stale = [name for name in NOT_IN_SETUP_KEY if name not in every and name not in groups and name != "model.task"]
    assert stale == [] and all(reason for reason in NOT_IN_SETUP_KEY.values())
    # the settings the audit found missing are keyed
    for name in ("data.video.frame_max_tokens", "model.rollout.vllm.dtype", "data.prompt.system_prompt",
                 "model.policy.dtype", "model.lora.r", "model.evaluation.temperature"):
        assert name in keyed, name


def test_frame_max_tokens_and_vllm_dtype_change_the_key() -> None:
    """Before: both keys were equal (the key left frame_max_tokens and every model.rollout.vllm setting out)."""
    plain = module()
    base = plain.prediction_setup(data_groups()).key
    assert plain.prediction_setup(data_groups(frame_max_tokens=4)).key != base
    assert plain.prediction_setup(data_groups(max_pixels=8192)).key != base
    assert module().prediction_setup(data_groups()).key == base  # the same setup: the same key
    # settings that change no answer: the same key
    quiet = dict(data_groups())
    quiet["loader"] = {**quiet["loader"], "num_workers": 7, "val_batch_size": 2}
    quiet["source"] = {**quiet["source"], "root": "/elsewhere"}
    assert plain.prediction_setup(quiet).key == base
    assert module(num_generations=2, max_new_tokens=64).prediction_setup(data_groups()).key == base
    # model.rollout.vllm: keyed when vLLM answers, not with generate
    vllm = module(engine="vllm").prediction_setup(data_groups())
    fp32 = module(engine="vllm", vllm={"dtype": "float32"}).prediction_setup(data_groups())
    assert vllm.key not in (base, fp32.key)
    assert vllm.identity["settings"]["model.rollout.vllm.dtype"] == "auto"
    assert module(vllm={"dtype": "float32"}).prediction_setup(data_groups()).key == base
    assert module(engine="vllm", vllm={"gpu_memory_utilization": 0.5}).prediction_setup(data_groups()).key == vllm.key
    # LoRA's settings only with LoRA on
    assert module(lora=True).prediction_setup(data_groups()).key != base
    off = GraspModule(SFTTask(), policy=PolicyConfig(name_or_path=str(TINY)), lora=LoraConfig(enabled=False, r=4))
    assert off.prediction_setup(data_groups()).key == base


def test_setup_settings_flattens_groups_and_drops_the_named_ones() -> None:
    groups = {"model.rollout": {"engine": "vllm", "temperature": 0.5,
                                "vllm": {"dtype": "float32", "env": {}, "engine_kwargs": {"enforce_eager": True},
                                         "log_file": "x.log"}},
              "data.loader": {"batch_size": 3}, "data.video": {"frame_max_tokens": None}}
    assert setup_settings(groups) == {"data.video.frame_max_tokens": None, "model.rollout.vllm.dtype": "float32",
                                      "model.rollout.vllm.engine_kwargs.enforce_eager": True,
                                      "model.rollout.vllm.env": {}}
    assert not_in_key("data.source.root") and not_in_key("model.rollout.vllm.log_file")
    assert not not_in_key("model.rollout.vllm.dtype") and not not_in_key("data.video.frame_max_tokens")


@pytest.mark.parametrize("processor, same", [(None, True), (str(TINY), True), (str(REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5"), False)])
def test_a_processor_other_than_the_models_is_keyed_by_its_files(processor, same) -> None:
    data = data_groups()
    base = module().prediction_setup(data).key
    data["prompt"] = {**data["prompt"], "processor": processor}
    assert (module().prediction_setup(data).key == base) is same
