"""The offline tiny Qwen3-VL: rebuilt from code it equals the shipped copy, and loads like a checkpoint."""

import json

import torch
from safetensors.torch import load_file

from grasp_lightning.policy import PolicyConfig, load_policy, load_processor
from grasp_lightning.tiny import SPECIAL_TOKENS, build_tiny_qwen3vl

from .conftest import TINY


def test_rebuild_equals_the_shipped_model(tmp_path):
    out = build_tiny_qwen3vl(tmp_path / "tiny", seed=0)
    assert (out / "tokenizer.json").read_text() == (TINY / "tokenizer.json").read_text()
    assert json.loads((out / "config.json").read_text()) == json.loads((TINY / "config.json").read_text())
    fresh, shipped = load_file(out / "model.safetensors"), load_file(TINY / "model.safetensors")
    assert fresh.keys() == shipped.keys()
    assert all(torch.equal(fresh[k], shipped[k]) for k in fresh)


def test_loads_through_from_pretrained_with_frozen_vision_and_special_tokens():
    model = load_policy(PolicyConfig(name_or_path=str(TINY), dtype="float32", freeze_vision=True))
    assert model.training  # from_pretrained returns eval mode; the loader switches to train
    visual = model.model.visual
    assert not any(p.requires_grad for p in visual.parameters())
    assert all(p.requires_grad for p in model.model.language_model.parameters())
    tok = load_processor(str(TINY)).tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS) and tok.unk_token_id not in ids
    assert model.config.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
