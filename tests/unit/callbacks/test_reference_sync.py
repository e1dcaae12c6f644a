"""GRPO's reference sync (``loss.reference_sync_steps``, TR-DPO; TRL's ``sync_ref_model``) on the tiny model:
the reference after a sync is exactly ``alpha * policy + (1 - alpha) * reference``, only at the named steps, it
survives a checkpoint, and the settings it cannot run with are refused by name."""

from __future__ import annotations

import types

import lightning as L
import pytest
import torch

from grasp_lightning.callbacks.reference_sync import ReferenceSync, mix_into
from grasp_lightning.data.datamodule_config import LoaderConfig, SourceConfig, VideoConfig
from grasp_lightning.datamodule import GraspDataModule
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.module import GraspModule, OptimConfig, RolloutConfig
from grasp_lightning.policy import LoraConfig, PolicyConfig, ReferenceConfig, load_policy, load_reference
from grasp_lightning.tasks.grpo import GRPOTask, LossConfig, RewardConfig
from tests.helpers import SAMPLE, TINY

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_grpo_mix_into_gives_the_weighted_mean_of_every_parameter() -> None:
    cfg = PolicyConfig(name_or_path=str(TINY), dtype="float32")
    policy, reference = load_policy(cfg), load_reference(cfg, ReferenceConfig())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    before, pol = _params(reference), _params(policy)
    assert mix_into(reference, policy, 0.25) == len(before)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(p.detach(), 0.25 * pol[name] + 0.75 * before[name], rtol=0, atol=1e-6)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(GraspConfigError, match="reference_sync_steps: the reference model's parameters do not pair"):
        mix_into(other, policy, 0.5)


def letters(completion: str, item, opened_think: bool = False) -> float:  # noqa: ARG001 (reward signature)
    """Share of ASCII letters in the completion: random samples differ on it, so every group has an advantage."""
    return sum(c.isascii() and c.isalpha() for c in completion) / max(len(completion), 1)


class Probe(L.Callback):
    """The reference model's weights after each optimizer step (the sync runs after this callback)."""

    def __init__(self) -> None:
        self.reference: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.reference.append(_params(pl_module.reference_model))


def _fit(module: GraspModule, steps: int, callbacks: list) -> L.Trainer:
    data = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                           video=VideoConfig(max_frames=4, max_pixels=4096),
                           loader=LoaderConfig(data_mode="rl", batch_size=1, num_workers=0, seed=0))
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, max_epochs=-1, logger=False, callbacks=callbacks,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, data)
    return trainer


def test_grpo_reference_moves_towards_the_policy_every_n_steps_in_a_fit() -> None:
    L.seed_everything(0)
    task = GRPOTask(reward=RewardConfig(terms=[letters], weights=[1.0]),
                    loss=LossConfig(beta=0.05, reference_sync_steps=2, reference_mixup_alpha=0.5))
    sync = task.callbacks()
    assert [type(c) for c in sync] == [ReferenceSync] and (sync[0].every_n_steps, sync[0].alpha) == (2, 0.5)
    module = GraspModule(task, policy=PolicyConfig(name_or_path=str(TINY), dtype="float32"),
                         optim=OptimConfig(lr=1e-2, warmup_steps=0),
                         rollout=RolloutConfig(num_generations=4, max_new_tokens=8, stop_at_answer=False))
    probe = Probe()
    trainer = _fit(module, 2, [probe])
    syncs = [c for c in trainer.callbacks if isinstance(c, ReferenceSync)]
    assert len(syncs) == 1 and syncs[0].syncs == 1 and syncs[0].last_step == 2  # added by the task, once
    initial = _params(load_reference(module.policy_cfg, module.reference_cfg))
    policy = _params(module.policy)
    assert any(not torch.equal(policy[n], initial[n]) for n in policy)  # the policy did move
    for name, value in probe.reference[0].items():  # step 1: no sync
        assert torch.equal(value, initial[name]), name
    for name, p in module.reference_model.named_parameters():  # step 2: the mix
        torch.testing.assert_close(p.detach(), 0.5 * policy[name] + 0.5 * initial[name], rtol=0, atol=1e-6)
    # the moved reference goes into the checkpoint and comes back on resume
    state = syncs[0].state_dict()
    assert state["last_step"] == 2 and set(state["reference"]) == set(policy)
    fresh = ReferenceSync(2, 0.5)
    fresh.load_state_dict(state)
    reloaded = load_reference(module.policy_cfg, module.reference_cfg)
    fresh.on_train_start(None, types.SimpleNamespace(reference_model=reloaded))
    for name, p in reloaded.named_parameters():
        assert torch.equal(p.detach(), state["reference"][name]), name


def test_grpo_reference_sync_refusals_name_the_key() -> None:
    with pytest.raises(GraspConfigError, match=r"loss.reference_sync_steps acts on the KL .*loss.beta=0"):
        LossConfig(beta=0.0, reference_sync_steps=4)
    with pytest.raises(GraspConfigError, match=r"loss.reference_mixup_alpha must be in \(0, 1\], got 1.5"):
        LossConfig(reference_sync_steps=4, reference_mixup_alpha=1.5)
    with pytest.raises(GraspConfigError, match=r"loss.reference_sync_steps must be >= 1 or null, got 0"):
        LossConfig(reference_sync_steps=0)
    assert GRPOTask().callbacks() == []
    lora = types.SimpleNamespace(lora_cfg=LoraConfig(enabled=True), task=GRPOTask())
    with pytest.raises(GraspConfigError, match=r"reference_sync_steps with model.lora.enabled"):
        ReferenceSync(4, 0.5).setup(types.SimpleNamespace(strategy=None), lora, "fit")
    zero3 = types.SimpleNamespace(strategy=types.SimpleNamespace(config={"zero_optimization": {"stage": 3}}))
    with pytest.raises(GraspConfigError, match=r"reference_sync_steps under DeepSpeed ZeRO-3"):
        ReferenceSync(4, 0.5).setup(zero3, types.SimpleNamespace(lora_cfg=LoraConfig(), task=GRPOTask()), "fit")
