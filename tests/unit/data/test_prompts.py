"""Frames, timestamps and token ids of a known clip through the real processor and chat template."""

import re

import torch

from grasp_lightning.data.formats import read_sft
from grasp_lightning.data.prompts import IGNORE_INDEX, encode_example
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.data.video import decode_clip, video_metadata
from tests.helpers import SAMPLE

REAL = "social-iq/video/kitchen.two_person_qa0000.mp4"


def _real_item():
    items = read_sft(SAMPLE / "train" / "data_sft.jsonl").items
    return next(i for i in items if i.clip.path == REAL)


def test_known_clip_frames_and_timestamps_reach_the_prompt(processor, tmp_path):
    store = ClipStore(SAMPLE / "train" / "videos", cache_dir=tmp_path)
    clip = decode_clip(store.open(REAL), fps=2.0, max_pixels=64 * 64, where=REAL)
    # 101 frames at 30 fps (3.37 s): 2 fps gives t = 0, 0.5, ..., 3.0 s -> 7 frames, indices 0, 15, ..., 90.
    assert clip.frames.shape[0] == 7 and clip.frames.dtype.name == "uint8"
    assert clip.indices.tolist() == [0, 15, 30, 45, 60, 75, 90]
    assert clip.timestamps[0] == 0.0 and abs(clip.timestamps[-1] - 3.0) < 1e-9
    assert clip.source_fps == 30.0 and clip.total_frames == 101

    item = _real_item()
    enc = encode_example(processor, item, clip.frames, video_metadata(clip), target=item.response)
    text = processor.tokenizer.decode(enc.input_ids[: enc.prompt_length])
    # Qwen3-VL merges frame pairs (temporal patch 2) and writes the mean time of each pair:
    # (0+0.5)/2=0.25 -> "0.2", 1.25 -> "1.2", 2.25 -> "2.2"; the odd 7th frame is paired with itself: 3.0.
    assert re.findall(r"<(\d+\.\d) seconds>", text) == ["0.2", "1.2", "2.2", "3.0"]
    assert int(enc.video_grid_thw[0, 0]) == 4
    n_video = int((enc.input_ids == processor.video_token_id).sum())
    assert n_video == int(enc.video_grid_thw.prod()) // 4  # merge 2x2 patches per token


def test_labels_cover_only_the_assistant_target(processor, tmp_path):
    store = ClipStore(SAMPLE / "train" / "videos", cache_dir=tmp_path)
    item = _real_item()
    clip = decode_clip(store.open(REAL), fps=2.0, max_pixels=64 * 64, where=REAL)
    enc = encode_example(processor, item, clip.frames, video_metadata(clip), target=item.response)
    labelled = enc.labels != IGNORE_INDEX
    assert not labelled[: enc.prompt_length].any() and labelled[enc.prompt_length:].all()
    target = processor.tokenizer.decode(enc.input_ids[labelled])
    assert target == item.response + "<|im_end|>\n"
    # The prompt ids equal the generation prompt alone: SFT and rollouts see the same tokens.
    prompt_only = encode_example(processor, item, clip.frames, video_metadata(clip), target=None)
    assert torch.equal(prompt_only.input_ids, enc.input_ids[: enc.prompt_length])
    assert prompt_only.labels is None


def test_prompt_over_budget_is_refused_not_truncated(processor, tmp_path):
    import pytest

    from grasp_lightning.errors import TokenBudgetError

    store = ClipStore(SAMPLE / "train" / "videos", cache_dir=tmp_path)
    item = _real_item()
    clip = decode_clip(store.open(REAL), fps=2.0, max_pixels=64 * 64, where=REAL)
    with pytest.raises(TokenBudgetError, match=r"data_sft.jsonl:\d+.*over the budget of 50"):
        encode_example(processor, item, clip.frames, video_metadata(clip), target=None, max_prompt_tokens=50)


# --- Thinking templates: the generation prompt already opens <think> -------------------------------

def _thinking_processor(processor):
    """The tiny processor with a Qwen3 Thinking-format template: ChatML, generation prompt ends ``<think>\\n``."""
    import copy

    thinking = copy.copy(processor)
    template = processor.chat_template
    instruct_prompt = "{{- '<|im_start|>assistant\\n' }}"
    assert template.count(instruct_prompt) == 1
    thinking.chat_template = template.replace(instruct_prompt, "{{- '<|im_start|>assistant\\n<think>\\n' }}")
    return thinking


def test_thinking_template_target_does_not_repeat_think(processor, tmp_path):
    thinking = _thinking_processor(processor)
    store = ClipStore(SAMPLE / "train" / "videos", cache_dir=tmp_path)
    item = _real_item()
    assert item.response.startswith("<think>There are 2 people")
    clip = decode_clip(store.open(REAL), fps=2.0, max_pixels=64 * 64, where=REAL)
    enc = encode_example(thinking, item, clip.frames, video_metadata(clip), target=item.response)
    tok = thinking.tokenizer
    prompt_text = tok.decode(enc.input_ids[: enc.prompt_length])
    assert prompt_text.endswith("<|im_start|>assistant\n<think>\n")
    labelled = enc.labels != IGNORE_INDEX
    # Labels start exactly after the generation prompt.
    assert not labelled[: enc.prompt_length].any() and labelled[enc.prompt_length:].all()
    # The target is the response without its leading "<think>": "There are 2 people ..." + end of turn.
    assert tok.decode(enc.input_ids[labelled]) == item.response[len("<think>"):] + "<|im_end|>\n"
    # Prompt + target hold exactly one <think> in the assistant turn.
    assistant = tok.decode(enc.input_ids).rsplit("<|im_start|>assistant\n", 1)[1]
    assert assistant.count("<think>") == 1 and assistant.startswith("<think>\nThere are 2 people")
    # The prompt ids are the generation prompt alone, as rollouts see it.
    prompt_only = encode_example(thinking, item, clip.frames, video_metadata(clip), target=None)
    assert torch.equal(prompt_only.input_ids, enc.input_ids[: enc.prompt_length])


def test_thinking_template_render_texts_strips_whitespace_after_think(processor):
    from grasp_lightning.data.prompts import render_texts

    thinking = _thinking_processor(processor)
    item = _real_item()
    prompt, suffix = render_texts(thinking, item, "<think>\nP1 looks</think><answer>B</answer>", "sys")
    assert prompt.endswith("assistant\n<think>\n") and suffix == "P1 looks</think><answer>B</answer><|im_end|>\n"
    # A target without <think> is appended as it is; the Instruct template is unchanged.
    assert render_texts(thinking, item, "B", "sys")[1] == "B<|im_end|>\n"
    prompt, suffix = render_texts(processor, item, "<think>x</think><answer>B</answer>", "sys")
    assert prompt.endswith("assistant\n") and suffix == "<think>x</think><answer>B</answer><|im_end|>\n"
