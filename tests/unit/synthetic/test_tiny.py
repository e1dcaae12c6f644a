"""The offline tiny models (Qwen3-VL and the hybrid Qwen3.5): rebuilt from code each equals its shipped
copy, and loads like a checkpoint."""

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from grasp_lightning.policy import PolicyConfig, load_policy, load_processor
from grasp_lightning.synthetic.tiny import SPECIAL_TOKENS, TINY_BUILDERS
from tests.helpers import FAMILIES, TINY_MODELS

#: What each family's tiny model is, as ``from_pretrained`` builds it.
CLASSES = {"qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen2Tokenizer"),
           "qwen3_5": ("Qwen3_5ForConditionalGeneration", "Qwen3_5Tokenizer")}


@pytest.mark.parametrize("family", FAMILIES)
def test_rebuild_equals_the_shipped_model(tmp_path, family):
    shipped_dir = TINY_MODELS[family]
    out = TINY_BUILDERS[family](tmp_path / "tiny", seed=0)
    assert (out / "tokenizer.json").read_text() == (shipped_dir / "tokenizer.json").read_text()
    fresh_config, shipped_config = (json.loads((d / "config.json").read_text()) for d in (out, shipped_dir))
    assert fresh_config.pop("transformers_version") == transformers.__version__  # who wrote it, not what it is
    shipped_config.pop("transformers_version")
    assert fresh_config == shipped_config
    fresh, shipped = load_file(out / "model.safetensors"), load_file(shipped_dir / "model.safetensors")
    assert fresh.keys() == shipped.keys()
    assert all(torch.equal(fresh[k], shipped[k]) for k in fresh)


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_through_from_pretrained_with_frozen_vision_and_special_tokens(family):
    model = load_policy(PolicyConfig(name_or_path=str(TINY_MODELS[family]), dtype="float32", freeze_vision=True))
    assert model.training  # from_pretrained returns eval mode; the loader switches to train
    visual = model.model.visual
    assert not any(p.requires_grad for p in visual.parameters())
    assert all(p.requires_grad for p in model.model.language_model.parameters())
    tok = load_processor(str(TINY_MODELS[family])).tokenizer
    assert (type(model).__name__, type(tok).__name__) == CLASSES[family]
    ids = [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS) and tok.unk_token_id not in ids
    assert model.config.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


def test_tiny_qwen3_5_is_hybrid_with_slow_decays_and_refuses_one_kind_of_layer(tmp_path, capsys):
    """The tiny Qwen3.5 holds both layer kinds in the published 3:1 pattern, its linear-attention decay
    rates lie in [0.001, 0.05] (so its recurrent state keeps the prompt), and a pattern with only one
    kind is refused by the builder and the command line alike."""
    from grasp_lightning.synthetic.tiny import build_tiny_qwen3_5, main

    config = json.loads((TINY_MODELS["qwen3_5"] / "config.json").read_text())["text_config"]
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    weights = load_file(TINY_MODELS["qwen3_5"] / "model.safetensors")
    rates = torch.cat([w.exp() for k, w in weights.items() if k.endswith("linear_attn.A_log")])
    assert rates.numel() == 3 * config["linear_num_value_heads"]
    assert 1e-3 <= rates.min() and rates.max() <= 5e-2
    with pytest.raises(ValueError, match="do not hold both a linear-attention and a full-attention layer"):
        build_tiny_qwen3_5(tmp_path / "x", text_layers=3, full_attention_interval=4)
    with pytest.raises(SystemExit) as done:
        main([str(tmp_path / "y"), "--family", "qwen3_5", "--text-layers", "2"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--text-layers 2: 2 layers with full_attention_interval 4 do not hold both" in err
    with pytest.raises(SystemExit) as done:  # --family names a tiny model, --like a stand-in: not both
        main([str(tmp_path / "z"), "--family", "qwen3_vl", "--like", "Qwen3.5-9B"])
    assert done.value.code == 2 and "give one of them" in capsys.readouterr().err
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()


def test_cli_checks_layers_and_refuses_to_overwrite(tmp_path, capsys):
    """``python -m grasp_lightning.synthetic.tiny``: layer counts apply to the tiny model too and must be >= 1; a
    folder that already holds files (an export, a checkpoint) is not written into without ``--overwrite``."""
    from grasp_lightning.synthetic.tiny import main

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


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_targets_must_reach_the_language_model_and_spare_a_frozen_vision_tower(family):
    """peft accepts a pattern that matches only vision blocks; the loader does not (both tiny families)."""
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.policy import LoraConfig

    cfg = PolicyConfig(name_or_path=str(TINY_MODELS[family]), dtype="float32", freeze_vision=True)
    with pytest.raises(GraspConfigError, match=r"put adapters in the vision tower \(\['base_model.model.model.visual"):
        load_policy(cfg, LoraConfig(enabled=True, target_modules=["qkv", "down_proj"]))
    with pytest.raises(GraspConfigError, match="put no adapter in the language model"):
        load_policy(PolicyConfig(name_or_path=str(TINY_MODELS[family]), dtype="float32", freeze_vision=False),
                    LoraConfig(enabled=True, target_modules=["qkv"]))
    model = load_policy(cfg, LoraConfig(enabled=True))  # the default targets: language model only
    adapted = {n for n, _ in model.named_parameters() if "lora_A" in n}
    assert adapted and all("language_model" in n for n in adapted)
