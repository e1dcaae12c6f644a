"""The offline tiny Qwen3-VL: rebuilt from code it equals the shipped copy, and loads like a checkpoint."""

import json

import pytest
import torch
from safetensors.torch import load_file

from grasp_lightning.generators.tiny import SPECIAL_TOKENS, build_tiny_qwen3vl
from grasp_lightning.policy import PolicyConfig, load_policy, load_processor

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


def test_cli_checks_layers_and_refuses_to_overwrite(tmp_path, capsys):
    """``python -m grasp_lightning.generators.tiny``: layer counts apply to the tiny model too and must be >= 1; a
    folder that already holds files (an export, a checkpoint) is not written into without ``--overwrite``."""
    from grasp_lightning.generators.tiny import main

    for flag in ("--text-layers", "--vision-layers"):
        with pytest.raises(SystemExit) as done:
            main([str(tmp_path / "m"), flag, "0"])
        assert done.value.code == 2 and f"{flag} must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    main([str(tmp_path / "m"), "--text-layers", "3"])
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 3 and config["vision_config"]["depth"] == 2
    with pytest.raises(SystemExit) as done:
        main([str(tmp_path / "m")])
    assert done.value.code == 2 and "already holds files" in capsys.readouterr().err
    main([str(tmp_path / "m"), "--overwrite"])
    assert json.loads((tmp_path / "m" / "config.json").read_text())["text_config"]["num_hidden_layers"] == 2
