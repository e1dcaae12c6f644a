"""The rollout-engine layer without a vLLM server: the prompt folding, the weights sent, the sampler-gap
metrics and the truncated importance-sampling weights, the settings' errors. The server itself is
tested in tests/test_vllm_engine.py."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from .conftest import TINY

VIDEO = {"start": "<|vision_start|>", "pad": "<|video_pad|>", "end": "<|vision_end|>"}


@pytest.fixture(scope="module")
def processor():
    from grasp_lightning.policy import load_processor

    return load_processor(str(TINY))


def _encode(processor, frames: int, question: str = "Who looks at whom?"):
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}],
        add_generation_prompt=True, tokenize=False)
    video = np.random.default_rng(0).integers(0, 255, (frames, 64, 64, 3), dtype=np.uint8)
    meta = dict(total_num_frames=frames, fps=2.0, frames_indices=list(range(frames)), duration=frames / 2, width=64,
                height=64, video_backend="decord")
    enc = processor(text=[text], videos=[video], video_metadata=[meta], do_sample_frames=False,
                    cap_pixels_per_frame=True, return_tensors="pt")
    return text, enc


def test_fold_video_prompt_gives_back_the_template_text_and_the_timestamps(processor):
    from grasp_lightning.engines.vllm import EngineError, fold_video_prompt

    text, enc = _encode(processor, frames=8)
    decoded = processor.tokenizer.decode(enc["input_ids"][0], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
    assert decoded.count("<|video_pad|>") > 1 and "seconds>" in decoded
    assert decoded.count("<|vision_start|>") == 4  # one per group: no start/end pair around the whole clip
    folded, stamps = fold_video_prompt(decoded, VIDEO)
    # the chat template's text with its video wrapper as one bare placeholder, which vLLM expands to the same groups
    assert folded == text.replace("<|vision_start|><|video_pad|><|vision_end|>", "<|video_pad|>")
    assert folded.count("<|video_pad|>") == 1 and "<|vision_start|>" not in folded
    assert stamps == [0.2, 1.2, 2.2, 3.2]  # frames (0, 1), (2, 3), ... at 2 fps: mean index / fps, "%.1f"
    with pytest.raises(EngineError, match="exactly one video, found 0"):
        fold_video_prompt(text.replace("<|video_pad|>", ""), VIDEO)
    run = decoded[decoded.index("<0.2 seconds>"):decoded.rindex("<|vision_end|>") + len("<|vision_end|>")]
    with pytest.raises(EngineError, match="exactly one video, found 2"):
        fold_video_prompt(decoded.replace("Who looks", "Who " + run + " looks"), VIDEO)


def test_language_model_state_merges_lora_into_a_copy_and_leaves_out_the_vision_tower():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3VLForConditionalGeneration

    from grasp_lightning.engines.vllm import language_model_state

    base = Qwen3VLForConditionalGeneration.from_pretrained(str(TINY), dtype=torch.float32)
    plain = language_model_state(base, None)
    assert not any("visual" in n for n in plain) and "model.language_model.embed_tokens.weight" in plain
    assert "lm_head.weight" not in plain  # tied to the embedding: written once, as save_pretrained does
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    layer = model.base_model.model.model.language_model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    before = layer.base_layer.weight.detach().clone()
    state = language_model_state(model, torch.bfloat16)
    want = before + 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight  # scaling alpha / r
    got = state["model.language_model.layers.0.self_attn.q_proj.weight"]
    assert got.dtype == torch.bfloat16 and torch.allclose(got.float(), want, atol=1e-2)
    assert not torch.allclose(want, before)
    assert torch.equal(layer.base_layer.weight, before)  # the policy is not merged in place
    assert not any("lora_" in n or "base_layer" in n for n in state) and set(state) == set(plain)


def test_truncated_importance_weights_scale_the_clipped_term_before_the_kl():
    from grasp_lightning.grpo import grpo_loss, k3_kl

    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g) - 2
    old, ref = logp + 0.1 * torch.randn(4, 5, generator=g), logp + 0.2 * torch.randn(4, 5, generator=g)
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(4, 5)
    w = torch.rand(4, 5, generator=g) * 2
    loss, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.1, loss_type="bnpo", token_weights=w)
    ratio = torch.exp(logp - old)
    per = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None]) * w + 0.1 * k3_kl(logp, ref)
    assert float(loss) == pytest.approx(float(per.mean()), rel=1e-6)
    plain, _ = grpo_loss(logp, old, ref, adv, mask, beta=0.1, loss_type="bnpo")
    assert float(plain) != pytest.approx(float(loss))


def test_sampler_gap_metrics_and_the_capped_weights():
    from tasks.grpo import GRPOTask

    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    sampled = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0]])  # gaps +0.5, -1.0, 0.0 on the kept tokens
    ro = types.SimpleNamespace(sampled_logp=sampled, old_logp=None)
    out = GRPOTask()._sampler_correction(logp, ro, mask)
    assert float(out["sampling/logp_difference/mean"]) == pytest.approx(0.5)
    assert float(out["sampling/logp_difference/max"]) == pytest.approx(1.0)
    assert float(out["sampling/importance_ratio/min"]) == pytest.approx(np.exp(-1.0))
    assert float(out["sampling/importance_ratio/max"]) == pytest.approx(np.exp(0.5))
    assert "weights" not in out
    capped = GRPOTask(importance_sampling_cap=1.2)._sampler_correction(logp, ro, mask)["weights"]
    assert capped[0].tolist() == pytest.approx([1.2, np.exp(-1.0), 1.0])  # exp(0.5) = 1.65 capped at 1.2
    assert GRPOTask()._sampler_correction(logp, types.SimpleNamespace(sampled_logp=None, old_logp=None), mask) == {}


def test_engine_settings_are_checked_with_the_key_named(monkeypatch):
    from grasp_lightning.engines import engine_of, make_engine
    from grasp_lightning.engines.base import HFEngine
    from grasp_lightning.engines.config import VLLMConfig
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.generation import RolloutConfig
    from tasks.grpo import GRPOTask

    monkeypatch.delenv("GRASP_VLLM_PYTHON", raising=False)
    assert isinstance(make_engine(RolloutConfig()), HFEngine)
    assert isinstance(engine_of(types.SimpleNamespace()), HFEngine)
    with pytest.raises(GraspConfigError, match=r"model.rollout.engine=vllm needs model.rollout.vllm.python \(or "
                                               r"GRASP_VLLM_PYTHON\)"):
        make_engine(RolloutConfig(engine="vllm"), model_path="m")
    for bad, match in [(dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be a number in"),
                       (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1"),
                       (dict(request_timeout_s=0), "request_timeout_s must be a number of seconds > 0")]:
        with pytest.raises(GraspConfigError, match=f"model.rollout.vllm.{match}"):
            VLLMConfig(**bad)
    with pytest.raises(GraspConfigError, match="importance_sampling_cap must be >= 1 or null, got 0.5"):
        GRPOTask(importance_sampling_cap=0.5)
    cfg = RolloutConfig(engine="vllm", vllm={"python": "/x", "dtype": "float32"})  # a checkpoint's plain dict
    assert isinstance(cfg.vllm, VLLMConfig) and cfg.vllm.dtype == "float32"


def test_vllm_engine_refuses_a_model_it_was_not_tested_with(monkeypatch, tmp_path):
    from grasp_lightning.engines.config import VLLMConfig
    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.errors import GraspConfigError

    python = tmp_path / "python"
    python.write_text("")
    engine = VLLMEngine(VLLMConfig(python=str(python)), model_path="m")
    qwen35 = types.SimpleNamespace(config=types.SimpleNamespace(model_type="qwen3_5"))
    with pytest.raises(GraspConfigError, match=r"supports \['qwen3_vl'\].*the policy is 'qwen3_5'"):
        engine.start(qwen35)
