"""The frozen vision tower once per rollout batch (grasp_lightning/grpo/vision.py).

Scoring with the kept vision features must give the log-probs, entropies and gradients of scoring
that runs the tower (group-shared and naive rows, with and without gradient checkpointing, both
tiny families) while the tower encodes nothing; a GRPO step must give the same completions, loss
and gradients with the tower run once per prompt instead of 3 (4 with ``num_iterations > 1``); the
features are not checkpointed (``rollout_state``) and a resumed rollout encodes its clips once again;
a trained tower or a reference with another tower keeps today's path.
"""

from __future__ import annotations

import logging

import pytest
import torch

from grasp_lightning.grpo import vision as vision_features
from grasp_lightning.grpo.rollouts import rollout_from_state, rollout_state, take_groups
from grasp_lightning.grpo.scoring import score_completions, select_prompts
from grasp_lightning.grpo.vision import VisionFeatures, VisionForwardCounter, fingerprint, reuse_vision
from tests.helpers import (
    LOGP_TOLS,
    TINY_MODELS,
    K,
    assert_grad_close,
    load_model,
    random_completions,
    sample_rl_datamodule,
)

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")


@pytest.mark.parametrize("share, checkpointing", [(True, False), (True, True), (False, True)])
def test_kept_features_score_like_the_tower(prompts, family, share, checkpointing):  # noqa: F811
    inputs, tok = prompts
    model = load_model(family, train=True, noise=0.1)
    model.model.visual.requires_grad_(False)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, mask = random_completions(tok, 2 * K)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))
    features = VisionFeatures.for_model(model)
    with torch.no_grad(), VisionForwardCounter(model) as first:  # the rollout's first forward fills the store
        score_completions(model, inputs, ids, mask, K, 0.7, share, vision=features)
    assert first.grids == inputs["video_grid_thw"].shape[0] and len(features.entries) == 2  # naive rows: once too

    def run(vision):
        model.zero_grad(set_to_none=True)
        with VisionForwardCounter(model) as counter:
            logp, entropy = score_completions(model, inputs, ids, mask, K, 0.7, share, vision=vision)
            (logp * weights * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach(), entropy, grads, counter.grids

    tower, kept = run(None), run(features)
    assert tower[3] >= (1 if share else K) * 2 and kept[3] == 0  # the tower ran only without the kept features
    torch.testing.assert_close(kept[0][mask], tower[0][mask], **LOGP_TOLS[family])
    torch.testing.assert_close(kept[1][mask], tower[1][mask], **LOGP_TOLS[family])
    assert set(kept[2]) == set(tower[2]) and not any("visual" in n for n in tower[2])
    for name, grad in tower[2].items():
        assert_grad_close(kept[2][name], grad, name, family)
    assert features.reused > 0 and "get_video_features" not in vars(model.model)  # method restored
    # a subset of the prompts (what take_groups keeps) is found by content, in either order
    with torch.no_grad(), VisionForwardCounter(model) as counter, reuse_vision(model, features):
        sub = select_prompts(inputs, [1])
        out = model(**sub, logits_to_keep=1).logits
    assert counter.grids == 0
    with torch.no_grad():
        torch.testing.assert_close(out, model(**sub, logits_to_keep=1).logits, rtol=1e-5, atol=1e-5)


def test_fingerprint_tells_clips_apart_and_survives_layout() -> None:
    gen = torch.Generator().manual_seed(0)
    patches, grid = torch.randn(12, 6, generator=gen), torch.tensor([1, 3, 4])
    key = fingerprint("video", patches, grid)
    assert key == fingerprint("video", patches.t().contiguous().t(), grid)  # another memory layout
    assert key == fingerprint("video", patches.clone(), grid)
    swapped = patches.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # same values, two rows exchanged
    assert key != fingerprint("video", swapped, grid)
    assert key != fingerprint("image", patches, grid) and key != fingerprint("video", patches, torch.tensor([1, 4, 3]))
    nudged = patches.clone()
    nudged[5, 2] = torch.nextafter(nudged[5, 2], torch.tensor(1e9))  # one ulp
    assert key != fingerprint("video", nudged, grid)


def test_trained_tower_and_other_reference_tower_keep_todays_path(prompts, family, caplog):  # noqa: F811
    inputs, tok = prompts
    model = load_model(family, noise=0.1)
    vision_features._WARNED.clear()  # a tower id of an earlier test may be reused
    with caplog.at_level(logging.WARNING, logger="grasp_lightning.grpo.vision"):
        assert VisionFeatures.for_model(model) is None  # every parameter trains
    assert "the vision tower trains" in caplog.text and "visual." in caplog.text
    model.model.visual.requires_grad_(False)
    features = VisionFeatures.for_model(model)
    same = load_model(family, noise=0.1).requires_grad_(False)
    other = load_model(family, noise=0.2).requires_grad_(False)
    assert features.serves(model) and features.serves(same) and not features.serves(other)
    ids, mask = random_completions(tok, 2 * K)
    with torch.no_grad():
        score_completions(model, inputs, ids, mask, K, 1.0, True, vision=features)
        with VisionForwardCounter(other) as counter:
            got, _ = score_completions(other, inputs, ids, mask, K, 1.0, True, vision=features)
            want, _ = score_completions(other, inputs, ids, mask, K, 1.0, True)
    assert counter.grids == 4  # the other tower encoded its clips both times
    torch.testing.assert_close(got, want)


def _task_step(family: str, batch, once: bool, num_iterations: int = 1, checkpointing: bool = False,  # noqa: F811
               share: bool = True):
    """One GRPO step (sampling, reference and policy scoring); completions, loss, grads, grids encoded, task."""
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.grpo import ComputeConfig, GRPOTask, LossConfig

    module = GraspModule(GRPOTask(loss=LossConfig(beta=0.05, num_iterations=num_iterations),
                                  compute=ComputeConfig(encode_vision_once=once, share_prompt=share)),
                         policy=PolicyConfig(name_or_path=str(TINY_MODELS[family]), dtype="float32",
                                             freeze_vision=True, gradient_checkpointing=checkpointing),
                         rollout=RolloutConfig(num_generations=K, max_new_tokens=12, stop_at_answer=False))
    module.configure_model()
    torch.manual_seed(0)
    with VisionForwardCounter(module.policy) as policy_grids, VisionForwardCounter(module.reference_model) as ref_grids:
        module.task.prepare(module, batch)
        out = module.task.training_step(module, batch)
        out.loss.backward()
    grads = {n: p.grad for n, p in module.policy.named_parameters() if p.grad is not None}
    return out, grads, policy_grids.grids + ref_grids.grids, module.task


@pytest.mark.parametrize("num_iterations, checkpointing, share", [(1, False, True), (2, True, True), (1, False, False)])
def test_grpo_step_encodes_each_clip_once_with_the_same_loss(family, num_iterations, checkpointing, share):  # noqa: F811
    batch = next(iter(sample_rl_datamodule(TINY_MODELS[family]).train_dataloader()))
    prompts_in_batch = batch.inputs["video_grid_thw"].shape[0]
    before = _task_step(family, batch, False, num_iterations, checkpointing, share)
    after = _task_step(family, batch, True, num_iterations, checkpointing, share)
    passes = 3 + (num_iterations > 1)  # sampling prefill, reference, training forward (+ old policy)
    # naive scoring rows encode each clip K times; naive sampling is generate(num_return_sequences=K), once
    assert before[2] == (1 + (passes - 1) * (1 if share else K)) * prompts_in_batch
    assert after[2] == prompts_in_batch
    assert after[0].rollout.completions == before[0].rollout.completions
    torch.testing.assert_close(after[0].loss, before[0].loss, rtol=1e-5, atol=1e-6)
    assert set(after[1]) == set(before[1])
    for name, grad in before[1].items():
        assert_grad_close(after[1][name], grad, name, family)
    task = after[3]
    ro = task.cache.rollouts[0]
    assert ro.vision is not None and len(ro.vision.entries) == prompts_in_batch
    one = take_groups(ro, [1], K)
    assert one.vision is ro.vision  # the window's positions share one store
    # the checkpointed rollout keeps no vision features (data-derived): on resume the task gives the window an
    # empty store (GRPOTask._attach), its first forward encodes each clip once, and it scores like the tower
    state = torch.load(_roundtrip(rollout_state(ro)), weights_only=True)
    assert "vision" not in state and rollout_from_state(state).vision is None
    from grasp_lightning.grpo.scoring import score_completions as score

    model = load_model(family, noise=0.0)  # the tiny checkpoint's own weights, as the module loaded them
    model.model.visual.requires_grad_(False)
    fresh = VisionFeatures.for_model(model)
    with torch.no_grad(), VisionForwardCounter(model) as counter:
        got, _ = score(model, ro.prompt, ro.completions.ids, ro.completions.mask, K, 1.0, share, vision=fresh)
        assert counter.grids == prompts_in_batch  # encoded again, once per clip
        again, _ = score(model, ro.prompt, ro.completions.ids, ro.completions.mask, K, 1.0, share, vision=fresh)
        assert counter.grids == prompts_in_batch  # then reused
        want, _ = score(model, ro.prompt, ro.completions.ids, ro.completions.mask, K, 1.0, share)
    assert counter.grids == (1 + (1 if share else K)) * prompts_in_batch  # the last call ran the tower
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, again)


def _roundtrip(state: dict):
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf
