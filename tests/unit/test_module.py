"""The Lightning module (``grasp_lightning/module.py``): a task context built from its settings, the reference
model only where the task asks for one, and the task state it checkpoints and restores."""

from __future__ import annotations

import types

import pytest

from grasp_lightning.engines.decoding import RolloutConfig
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.config import LossConfig
from grasp_lightning.module import TASK_STATE_KEY, GraspModule
from grasp_lightning.tasks.grpo import GRPOTask
from grasp_lightning.tasks.sft import SFTTask


def test_the_module_is_a_task_context_and_the_task_reads_k_from_it():
    from grasp_lightning.module import GraspModule
    from grasp_lightning.task import TaskContext

    module = GraspModule(GRPOTask(), rollout=RolloutConfig(num_generations=3))
    assert isinstance(module, TaskContext) and module.tokenizer is None  # before configure_model
    module.task.setup(module)  # checks, copies nothing
    assert not hasattr(module.task, "num_generations") and module.rollout_cfg.num_generations == 3
    with pytest.raises(GraspConfigError, match="num_generations must be >= 2"):  # when the module is built
        GraspModule(GRPOTask(), rollout=RolloutConfig(num_generations=1))
    with pytest.raises(GraspConfigError, match="num_generations must be >= 2"):  # and from any context
        GRPOTask().setup(types.SimpleNamespace(rollout_cfg=RolloutConfig(num_generations=1)))


def test_a_reference_model_is_built_only_when_the_task_asks_for_one():
    """GRPO with beta 0.04 needs one (no trainer: a caller driving the task by hand), beta 0 and SFT do not;
    asking a module without one for it is refused with the reason."""
    assert GraspModule(GRPOTask(loss=LossConfig(beta=0.04))).builds_reference
    assert not GraspModule(GRPOTask(loss=LossConfig(beta=0.0))).builds_reference
    sft = GraspModule(SFTTask())
    assert not sft.builds_reference
    with pytest.raises(GraspConfigError, match="no reference model is loaded: the task does not need one"):
        with sft.reference():
            pass


def test_the_task_state_goes_into_the_checkpoint_and_back_to_this_rank(monkeypatch):
    """on_save_checkpoint gathers every rank's task state (one rank here) under TASK_STATE_KEY; on_load_checkpoint
    gives rank 0's back to the task and notes the checkpoint's step."""
    module = GraspModule(GRPOTask())
    saved = {"window_index": 4}
    monkeypatch.setattr(module.task, "state_dict", lambda: dict(saved))
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint[TASK_STATE_KEY] == [saved]
    restored = []
    monkeypatch.setattr(module.task, "load_state_dict", restored.append)
    module.on_load_checkpoint({**checkpoint, "global_step": 12})
    assert restored == [saved] and module.restored_step == 12
