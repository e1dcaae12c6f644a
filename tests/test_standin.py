"""Stand-ins of real Qwen3-VL checkpoints (:mod:`grasp_lightning.generators.standin`): the real Qwen3 vocabulary,
the published generation config and processor settings, our Instruct/Thinking templates written in the
published formats, the published parameter counts, and the command line that writes a loadable model.

Fast: no 2B-width model is built here (parameter counts use the meta device); the command-line test
writes a 1 + 1 layer stand-in with the real widths. The 2B-width runs are in ``tests/test_real_shapes.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from grasp_lightning.errors import GraspConfigError

from .conftest import REPO, SAMPLE

#: A sample RL item (``grasp_lightning/assets/sample/train/data_rl.jsonl``, line 1) rendered by the
#: published Qwen3-VL Instruct chat template, written out by hand: ChatML turns, the system turn
#: first, the video placeholder straight before the user text, the generation prompt last.
PUBLISHED_INSTRUCT_PROMPT = (
    "<|im_start|>system\n"
    "You are watching a video of several people, named Person 0, Person 1, and so on. "
    "Answer the multiple-choice question with only the option letter inside <answer> tags.<|im_end|>\n"
    "<|im_start|>user\n"
    "<|vision_start|><|video_pad|><|vision_end|>Who is gesturing?\n"
    "A) Person 0\n"
    "B) Person 1\n"
    "C) Both people\n"
    "D) No one\n"
    "Think step by step about the gaze and gesture interactions, describe them in <gaze> and <gesture> "
    "tags, and give the letter in <answer> tags.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
TARGET = "<think><gaze>Person 0 looks at Person 1.</gaze></think><answer>A</answer>"


@pytest.fixture(scope="module")
def instruct():
    from grasp_lightning.generators.standin import build_processor

    return build_processor("Qwen3-VL-2B-Instruct")


@pytest.fixture(scope="module")
def thinking():
    from grasp_lightning.generators.standin import build_processor

    return build_processor("Qwen3-VL-8B-Thinking")


@pytest.fixture(scope="module")
def rl_item():
    from grasp_lightning.data.formats import read_rl

    return read_rl(SAMPLE / "train" / "data_rl.jsonl").items[0]


def test_the_real_qwen3_vocabulary_and_special_token_ids(instruct):
    tok = instruct.tokenizer
    assert len(tok) == 151_669  # 151,643 BPE entries + 26 added tokens
    assert tok.convert_ids_to_tokens(list(range(151_643, 151_669)))[0] == "<|endoftext|>"
    assert tok.convert_ids_to_tokens(151_668) == "</think>"
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656,
                "<think>": 151667, "</think>": 151668}
    assert {t: tok.convert_tokens_to_ids(t) for t in expected} == expected
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]  # Qwen's BPE ranks
    assert tok("<answer>B</answer>", add_special_tokens=False)["input_ids"] == [27, 9217, 36721, 522, 9217, 29]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token, tok.pad_token_id) == \
        ("<|im_end|>", 151645, "<|endoftext|>", 151643)


def test_instruct_template_renders_the_published_format(instruct, rl_item):
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, render_texts

    prompt, suffix = render_texts(instruct, rl_item, TARGET, DEFAULT_SYSTEM_PROMPT)
    assert prompt == PUBLISHED_INSTRUCT_PROMPT
    assert suffix == TARGET + "<|im_end|>\n"
    no_system = instruct.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Q?"}]}],
        add_generation_prompt=True, tokenize=False)
    assert no_system == "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Q?<|im_end|>\n<|im_start|>assistant\n"


def test_thinking_template_opens_the_reasoning_and_writes_the_published_assistant_turn(thinking, rl_item):
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, build_messages

    messages = build_messages(rl_item, DEFAULT_SYSTEM_PROMPT)
    prompt = thinking.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == PUBLISHED_INSTRUCT_PROMPT + "<think>\n"
    assistant = {"role": "assistant", "content": [{"type": "text", "text": TARGET}]}
    full = thinking.apply_chat_template(messages + [assistant], tokenize=False)
    assert full == (PUBLISHED_INSTRUCT_PROMPT + "<think>\n<gaze>Person 0 looks at Person 1.</gaze>\n</think>\n\n"
                    "<answer>A</answer><|im_end|>\n")
    plain = thinking.apply_chat_template(messages + [{"role": "assistant", "content": "A"}], tokenize=False)
    assert plain == PUBLISHED_INSTRUCT_PROMPT + "A<|im_end|>\n"


def test_processor_has_the_published_preprocessing(instruct):
    v, i = instruct.video_processor, instruct.image_processor
    assert (v.patch_size, v.temporal_patch_size, v.merge_size) == (16, 2, 2)
    assert (i.patch_size, i.temporal_patch_size, i.merge_size) == (16, 2, 2)
    assert (v.size["shortest_edge"], v.size["longest_edge"]) == (4_096, 25_165_824)
    assert (i.size["shortest_edge"], i.size["longest_edge"]) == (65_536, 16_777_216)
    assert (v.fps, v.min_frames, v.max_frames) == (2.0, 4, 768)
    assert list(v.image_mean) == list(v.image_std) == list(i.image_mean) == list(i.image_std) == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("like, published", [("Qwen3-VL-2B-Instruct", 2.128e9), ("Qwen3-VL-4B-Thinking", 4.438e9),
                                             ("Qwen3-VL-8B-Instruct", 8.767e9)])
def test_full_depth_config_has_the_published_parameter_count(like, published):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from grasp_lightning.generators.standin import standin_config

    config = standin_config(like, text_layers=None, vision_layers=None)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - published) / published < 0.005, (like, n)
    assert config.text_config.vocab_size == 151_936 and config.video_token_id == 151656


def test_a_few_layers_keep_the_real_widths():
    from grasp_lightning.generators.standin import standin_config

    config = standin_config("Qwen/Qwen3-VL-8B-Thinking", text_layers=2, vision_layers=2)
    t, v = config.text_config, config.vision_config
    assert (t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == \
        (4096, 12288, 32, 8, 128)
    assert (t.num_hidden_layers, v.depth, v.hidden_size, v.out_hidden_size) == (2, 2, 1152, 4096)
    assert v.deepstack_visual_indexes == [0, 1] and not config.tie_word_embeddings
    with pytest.raises(GraspConfigError, match="--text-layers must be >= 1"):
        standin_config("Qwen3-VL-2B-Instruct", text_layers=0)


def test_unknown_checkpoint_name_is_a_clear_error(tmp_path):
    from grasp_lightning.generators.standin import parse_like

    with pytest.raises(GraspConfigError, match=r"'Qwen3-VL-3B-Instruct': not a known checkpoint; known: .*"
                                               r"'Qwen3-VL-2B-Instruct', 'Qwen3-VL-2B-Thinking'"):
        parse_like("Qwen3-VL-3B-Instruct")
    out = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning.generators.tiny", str(out), "--like", "Qwen3-VL-8B-Base"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "error: --like 'Qwen3-VL-8B-Base': not a known checkpoint; known: " in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_cli_writes_a_stand_in_that_loads_like_a_download(tmp_path):
    """``python -m grasp_lightning.generators.tiny OUT --like ...``: real widths, 1 + 1 layers (for speed), loaded
    back through the policy loader (``AutoModelForImageTextToText`` / ``AutoProcessor``)."""
    import json

    import torch

    from grasp_lightning.generators.tiny import main
    from grasp_lightning.policy import load_model, load_processor

    out = tmp_path / "standin"
    main([str(out), "--like", "Qwen3-VL-2B-Thinking", "--text-layers", "1", "--vision-layers", "1"])
    model = load_model(str(out), dtype="auto")
    processor = load_processor(str(out))
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    t = model.config.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.vocab_size, model.config.vision_config.depth) == (2048, 1, 151_936, 1)
    assert model.dtype == torch.bfloat16
    g = model.generation_config
    assert (g.eos_token_id, g.pad_token_id, g.do_sample, g.top_k, g.top_p, g.temperature) == \
        ([151645, 151643], 151643, True, 20, 0.95, 1.0)
    assert len(processor.tokenizer) == 151_669 and processor.tokenizer.pad_token_id == 151643
    assert processor.video_processor.size["longest_edge"] == 25_165_824 and processor.video_processor.patch_size == 16
    assert processor.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert (out / "processor_config.json").is_file()
    info = json.loads((out / "STANDIN.json").read_text())
    assert info["like"] == "Qwen3-VL-2B-Thinking" and info["parameters"] == sum(p.numel() for p in model.parameters())
