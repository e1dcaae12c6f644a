"""The vLLM rollout engine (grasp_lightning/engines/vllm.py) without a server: the prompt folding, the weights
sent, the sampler-gap metrics and the truncated importance-sampling weights, the settings' errors. The
weight-sync folder is tested in test_weight_sync.py, the server itself in tests/vllm/test_vllm_engine.py."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
import torch

from grasp_lightning.grpo.config import LossConfig
from grasp_lightning.sequence_parallel import SequenceParallel
from tests.helpers import TINY

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
    from grasp_lightning.grpo.objective import grpo_loss, k3_kl

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
    from grasp_lightning.tasks.grpo import GRPOTask, LossConfig

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
    capped = GRPOTask(loss=LossConfig(importance_sampling_cap=1.2))._sampler_correction(logp, ro, mask)["weights"]
    assert capped[0].tolist() == pytest.approx([1.2, np.exp(-1.0), 1.0])  # exp(0.5) = 1.65 capped at 1.2
    assert GRPOTask()._sampler_correction(logp, types.SimpleNamespace(sampled_logp=None, old_logp=None), mask) == {}


def test_engine_settings_are_checked_with_the_key_named(monkeypatch):
    from grasp_lightning.data.collate import Batch
    from grasp_lightning.engines import make_engine
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.engines.hf import HFEngine
    from grasp_lightning.engines.vllm_config import VLLMConfig
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.grpo.config import ComputeConfig
    from grasp_lightning.tasks.grpo import GRPOTask

    monkeypatch.delenv("GRASP_VLLM_PYTHON", raising=False)
    assert isinstance(make_engine(RolloutConfig()), HFEngine)
    # a context without an engine cannot sample: no silent fallback to an HF engine
    bare = types.SimpleNamespace(sequence_parallel=SequenceParallel(), policy=torch.nn.Linear(1, 1), tokenizer=None, rollout_cfg=RolloutConfig())
    prompt = Batch(inputs={"input_ids": torch.ones(1, 2, dtype=torch.long)}, items=[], indices=[0],
                   valid=torch.ones(1, dtype=torch.bool), prompt_lengths=torch.tensor([2]), padding_side="left")
    with pytest.raises(AttributeError, match="rollout_engine"):
        GRPOTask(compute=ComputeConfig(share_prompt=False, encode_vision_once=False)).rollout(bare, prompt)
    with pytest.raises(GraspConfigError, match=r"model.rollout.engine=vllm needs model.rollout.vllm.python \(or "
                                               r"GRASP_VLLM_PYTHON\)"):
        make_engine(RolloutConfig(engine="vllm"), model_path="m")
    for bad, match in [(dict(gpu_memory_utilization=1.5), "gpu_memory_utilization must be a number in"),
                       (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1"),
                       (dict(request_timeout_s=0), "request_timeout_s must be a number of seconds > 0")]:
        with pytest.raises(GraspConfigError, match=f"model.rollout.vllm.{match}"):
            VLLMConfig(**bad)
    with pytest.raises(GraspConfigError, match="importance_sampling_cap must be >= 1 or null, got 0.5"):
        GRPOTask(loss=LossConfig(importance_sampling_cap=0.5))
    cfg = RolloutConfig(engine="vllm", vllm={"python": "/x", "dtype": "float32"})  # a checkpoint's plain dict
    assert isinstance(cfg.vllm, VLLMConfig) and cfg.vllm.dtype == "float32"


def test_vllm_engine_refuses_a_model_it_was_not_tested_with(monkeypatch, tmp_path):
    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.engines.vllm_config import VLLMConfig
    from grasp_lightning.errors import GraspConfigError

    python = tmp_path / "python"
    python.write_text("")
    engine = VLLMEngine(VLLMConfig(python=str(python)), model_path="m")
    llava = types.SimpleNamespace(config=types.SimpleNamespace(model_type="llava"))
    with pytest.raises(GraspConfigError, match=r"supports \['qwen3_vl', 'qwen3_5'\].*the policy is 'llava'"):
        engine.start(llava)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine = VLLMEngine(VLLMConfig(python=str(python), dtype="float32"), model_path="m")
    qwen35 = types.SimpleNamespace(config=types.SimpleNamespace(model_type="qwen3_5"))
    with pytest.raises(GraspConfigError, match=r"model.rollout.vllm.dtype=float32 with Qwen3.5 on the CPU: .*"
                                               r"'CPU GDN attention requires BF16'.*dtype=bfloat16"):
        engine.start(qwen35)
    for model_type, version in (("qwen3_5", -1), ("qwen3_vl", 0)):  # Qwen3.5: synced before its first rollout
        engine = VLLMEngine(VLLMConfig(python=str(python), dtype="bfloat16"), model_path="m")
        config = types.SimpleNamespace(model_type=model_type, get_text_config=lambda: types.SimpleNamespace())
        engine._check_model(types.SimpleNamespace(config=config))
        assert engine.version == version


# ------------------------------------------------------------------ a too small weight-sync folder
def _tiny_policy():
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(str(TINY), dtype=torch.float32)


def test_a_too_small_weight_sync_dir_fails_before_the_server_starts_naming_the_setting(tmp_path, monkeypatch):
    import shutil

    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.engines.vllm_config import VLLMConfig
    from grasp_lightning.errors import GraspConfigError

    python = tmp_path / "python"
    python.write_text("")
    policy = _tiny_policy()
    data = sum(p.numel() for n, p in policy.state_dict().items() if "visual" not in n and not n.startswith("lm_head"))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=100_000))  # the tiny model needs 0.5 MB
    big = tmp_path / "shm"
    engine = VLLMEngine(VLLMConfig(python=str(python), weight_sync_dir=str(big), dtype="float32"), model_path="m")
    with pytest.raises(GraspConfigError) as err:
        engine.start(policy)
    msg = str(err.value)
    need = int(msg.split("need ")[1].split(" bytes")[0])
    assert data * 4 < need < data * 4 + 65536  # float32 language-model weights plus the safetensors header
    assert f"{big} has 100000 bytes (0.10 MiB) free" in msg and "Set model.rollout.vllm.weight_sync_dir" in msg
    assert engine.proc is None  # refused before the server was started
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=need))
    from grasp_lightning.engines.vllm import language_model_entries

    assert engine.folder().check_space(language_model_entries(policy), torch.float32) == need  # exactly enough
    engine.close()
    assert not any(big.iterdir())  # the run's folder is gone with the engine


def _mapped_file(address: int) -> str | None:
    """The file mapped at ``address`` in this process (``/proc/self/maps``), ``None`` for anonymous memory."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else None
    return None


def test_embeddings_reach_the_server_mapped_from_one_file_without_copies(tmp_path):
    import tracemalloc

    from grasp_lightning.engines.server.vllm_server import _tensor
    from grasp_lightning.engines.weight_sync import SyncFolder

    folder = SyncFolder(tmp_path, rank=3, key="emb")
    g = torch.Generator().manual_seed(0)
    clips = [torch.randn(1000, 2048, generator=g).to(torch.bfloat16), torch.randn(7, 33, generator=g),
             torch.randn(2000, 2048, generator=g).to(torch.bfloat16)]
    payload = sum(t.numel() * t.element_size() for t in clips)
    tracemalloc.start()
    path, metas = folder.write_embeddings(clips)
    got = [_tensor(m) for m in metas]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert path.name == "embeds-rank3-1.raw" and path.stat().st_size >= payload
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, clips))
    assert all(_mapped_file(t.data_ptr()) == str(path) for t in got)  # views of the file's mapping, not copies
    assert peak < payload / 100  # no Python-side copy (pickling made 6 of the payload)
    path.unlink()  # the trainer removes the file after the answer; the server's mapping stays valid
    assert torch.equal(got[2], clips[2])
    folder.close()


def test_evaluation_engine_follows_the_rollout_engine_unless_set_and_keys_predictions(monkeypatch, tmp_path):
    """``model.evaluation.engine``: ``None`` takes ``model.rollout.engine``'s; the vLLM one is synced to the
    evaluated weights outside ``fit`` (version -2, never 0, the model directory's); ``predict``'s setup key
    is unchanged for ``generate`` and differs for vLLM."""
    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.engines.hf import HFEngine
    from grasp_lightning.engines.vllm import VLLMEngine
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.module import EVALUATED_WEIGHTS, EvalConfig, GraspModule
    from grasp_lightning.policy import PolicyConfig
    from grasp_lightning.tasks.sft import SFTTask

    python = tmp_path / "python"
    python.write_text("")
    vllm = {"python": str(python)}
    with pytest.raises(GraspConfigError, match=r"model.evaluation.engine must be one of \['hf', 'vllm'\] or null"):
        EvalConfig(engine="sglang")

    def module(rollout="hf", evaluation=None):
        return GraspModule(SFTTask(), policy=PolicyConfig(name_or_path=str(TINY)),
                           rollout=RolloutConfig(engine=rollout, vllm=vllm), evaluation=EvalConfig(engine=evaluation))

    plain, both, split = module(), module("vllm"), module("hf", "vllm")
    assert isinstance(plain.eval_engine, HFEngine) and plain.eval_engine is plain.rollout_engine
    assert both.eval_engine_name == "vllm" and both.eval_engine is both.rollout_engine
    assert isinstance(split.eval_engine, VLLMEngine) and isinstance(split.rollout_engine, HFEngine)
    assert split.eval_engine.model_path == str(TINY) and split.eval_engine.cfg.python == str(python)
    assert module("vllm", "hf").eval_engine_name == "hf"
    assert split.eval_weights_version == EVALUATED_WEIGHTS == -2  # no trainer: evaluation, not fit
    hf_setup, vllm_setup = plain.prediction_setup({}), split.prediction_setup({})
    assert "engine" not in hf_setup.decoding and vllm_setup.decoding["engine"] == "vllm"
    assert hf_setup.key != vllm_setup.key
    hf_decoding = {**dataclasses.asdict(EvalConfig()), "max_new_tokens": plain.eval_max_new_tokens}
    del hf_decoding["engine"]  # generate's decoding does not name its engine
    assert hf_setup.decoding == hf_decoding
    split.teardown("predict")
    assert split._eval_engine is None
