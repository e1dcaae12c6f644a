"""The released GRASP evaluation (``Social-Reaoning/grasp`` at 805d115, ``eval/eval_social_qa.py``) written out by
hand: its system prompt and instruction verbatim, the sample bench's first item, and :func:`released_reference`,
the inputs its ``generate()`` builds for that item, re-done without the module under test."""

from __future__ import annotations

import io

import numpy as np
import torch

from grasp_lightning.evaluation.protocol import compose_prompt
from tests.helpers.paths import SAMPLE

# eval_social_qa.py, generate() and compose_prompt(reasoning=True), verbatim.
RELEASED_SYSTEM = ("Answer multiple-choice questions with only the option letter (A, B, C, or D) inside <answer> tags. "
                   "Example: <answer>A</answer>")
RELEASED_INSTRUCTION = ("Think step by step about the gaze and gesture interactions you observe. Use <gaze> and "
                        "<gesture> tags to describe what you see, then select the best answer wrapped in <answer> "
                        "tags, e.g. <answer>A</answer>.")
BENCH_QUESTION = "Who or what is Person 0 looking at?"  # the first item of the sample bench
BENCH_OPTIONS = ("A) Person 2", "B) An object", "C) Person 1", "D) No one")
SAMPLE_BENCH = SAMPLE / "test" / "grasp_bench.tar"


def first_bench_item():
    """``(item, clip bytes)`` of the sample bench's first item (:data:`BENCH_QUESTION`, :data:`BENCH_OPTIONS`)."""
    from grasp_lightning.data.formats import bench_store, read_bench

    item = read_bench(SAMPLE_BENCH).items[0]
    return item, bench_store(SAMPLE_BENCH).open(item.clip.path)


def released_reference(processor, clip: bytes, height: int, width: int, max_frames: int = 240, reasoning=True):
    """The released generate() inputs of :func:`first_bench_item`, re-done by hand: linspace frames, area resize
    to ``height`` x ``width`` (the resolve_resolution size), MOCK_FPS metadata, the chat template on its
    messages, then "<think>\\n". Returns ``(input_ids (L,), pixel_values_videos, frame count)``."""
    import decord
    from PIL import Image

    vr = decord.VideoReader(io.BytesIO(clip), num_threads=1)
    n = min(max_frames, len(vr))
    frames = vr.get_batch(np.linspace(0, len(vr) - 1, n, dtype=int).tolist()).asnumpy()
    frames = np.stack([np.asarray(Image.fromarray(f).resize((width, height), Image.Resampling.BOX)) for f in frames])
    text = compose_prompt(BENCH_QUESTION, BENCH_OPTIONS, reasoning)
    messages = [{"role": "system", "content": [{"type": "text", "text": RELEASED_SYSTEM}]},
                {"role": "user", "content": [{"type": "video", "video": frames}, {"type": "text", "text": text}]}]
    metadata = {"fps": 100, "frames_indices": [i * 50 for i in range(n)], "total_num_frames": n}
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_tensors="pt",
                                           return_dict=True, videos_kwargs={"do_sample_frames": False,
                                                                            "do_resize": False,
                                                                            "video_metadata": [metadata]})
    think = processor.tokenizer.encode("<think>\n", add_special_tokens=False)
    return torch.cat([inputs["input_ids"][0], torch.tensor(think)]), inputs["pixel_values_videos"], n
