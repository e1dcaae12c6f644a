"""The released GRASP-Bench evaluation protocol (issue 14, part 4).

Expected values come from the released code's definitions (``Social-Reaoning/grasp`` at 805d115:
``eval/eval_social_qa.py``, ``eval/metric_report.py``, ``socialmllm/utils/input_processing.py``),
written out by hand here and in ``tests/helpers/released.py``, never computed by the module under test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.evaluation.protocol import (
    compose_prompt,
    extract_answer_released,
    make_protocol,
    released_messages,
    released_report,
    resolve_resolution,
    split_reasoning,
)
from tests.helpers import (
    BENCH_OPTIONS,
    BENCH_QUESTION,
    RELEASED_INSTRUCTION,
    RELEASED_SYSTEM,
    first_bench_item,
    released_reference,
)


def _item(category="T1", answer="A", options=BENCH_OPTIONS, difficulty="easy", uid="x") -> GraspItem:
    return GraspItem(uid=uid, origin=f"test:{uid}", clip=ClipRef(path="video/x.mp4"),
                     question="\n".join([BENCH_QUESTION, *options]), options=tuple(options), answer=answer,
                     category=category, difficulty=difficulty, format="mcq" if options else "open_ended",
                     question_text=BENCH_QUESTION)


def test_user_text_and_system_prompt_are_the_released_ones():
    expected = BENCH_QUESTION + "\nA) Person 2\nB) An object\nC) Person 1\nD) No one\n" + RELEASED_INSTRUCTION
    assert compose_prompt(BENCH_QUESTION, BENCH_OPTIONS, reasoning=True) == expected
    assert compose_prompt(BENCH_QUESTION, BENCH_OPTIONS, reasoning=False) == (
        BENCH_QUESTION + "\nA) Person 2\nB) An object\nC) Person 1\nD) No one\nAnswer with just the letter.")
    assert compose_prompt("Describe the gaze.", (), reasoning=True) == "Describe the gaze."  # open-ended: as is
    assert released_messages(_item()) == [
        {"role": "system", "content": [{"type": "text", "text": RELEASED_SYSTEM}]},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": expected}]},
    ]
    assert [m["role"] for m in released_messages(_item(), reasoning=False)] == ["user"]  # no system turn


def test_frame_indices_spread_uniformly_over_the_clip():
    from grasp_lightning.data.video import uniform_indices

    for n in (1, 2, 41, 165, 240, 241, 1000, 9000):
        assert np.array_equal(uniform_indices(n), np.linspace(0, n - 1, min(240, n)).astype(int)), n
    idx = uniform_indices(1000)
    assert len(idx) == 240 and idx[:3].tolist() == [0, 4, 8] and idx[-1] == 999  # 999 / 239 = 4.18 apart
    assert uniform_indices(100).tolist() == list(range(100))  # fewer than 240 frames: every frame, any fps
    assert uniform_indices(1000, max_frames=4).tolist() == [0, 333, 666, 999]


@pytest.mark.parametrize(("src", "patch", "dst"), [
    ((480, 640), 32, (448, 576)),    # 14 x 18 = 252 tokens (15 x 20 = 300 is over 256)
    ((720, 1280), 32, (384, 672)),   # 12 x 21 = 252 (12 x 22 = 264 is over)
    ((1080, 1920), 32, (384, 672)),  # same aspect ratio, same grid
    ((360, 640), 32, (352, 640)),    # 11 x 20 = 220: only 11 rows of 32 pixels fit in 360
    ((1920, 1080), 32, (672, 384)),  # portrait: 21 x 12 = 252
    ((1000, 1000), 32, (512, 512)),  # 16 x 16 = 256 exactly
    ((72, 128), 32, (64, 128)),      # the sample clips: 2 x 4 = 8 tokens
    ((360, 640), 16, (192, 336)),    # the tiny model's 16-pixel tokens: 12 x 21 = 252
])
def test_resize_target_is_the_released_resolve_resolution(src, patch, dst):
    assert resolve_resolution(*src, spatial_patch=patch, max_tokens=256) == dst


def test_resize_target_refuses_a_frame_smaller_than_a_patch():
    with pytest.raises(GraspConfigError, match="20x40"):
        resolve_resolution(20, 40, spatial_patch=32)


@pytest.mark.parametrize(("text", "letter"), [
    ("<think>I pick <answer>A</answer></think><answer>C</answer>", "C"),  # only the text after </think>
    ("<think>a</think>x</think>Answer: d", "D"),            # after the last </think>; leading letter, upper-cased
    ("<answer> b) Person 2 </answer>", "B"),                 # first character of the answer block
    ("<answer>\nB\n</answer>", "B"),                         # whitespace around the letter
    ("<answer>Person 2</answer> \\boxed{D}", "D"),           # block does not start with A-D: then \boxed{}
    ("\\boxed{ c }", "C"),
    ("Answer: C) Person 1", "C"),                            # "Answer:" stripped, then "C)"
    ("The answer is D. A) was wrong", "A"),                  # X) / X. tried in A, B, C, D order, not by position
    ("because Person 3 waves", "B"),                         # leading letter of any word
    ("<answer>The B option\nreally</answer>", ""),           # the block regex does not cross lines
    ("Person 3 looks at Person 1", ""),
    ("", ""),
])
def test_answer_extraction_follows_the_released_order(text, letter):
    assert extract_answer_released(text) == letter


def test_reasoning_split_and_scoring_rule():
    assert split_reasoning("<think> a <gaze>P1</gaze> </think> <answer>B</answer>") == ("a <gaze>P1</gaze>",
                                                                                        "<answer>B</answer>")
    assert split_reasoning("opened by the prompt</think>rest") == ("opened by the prompt", "rest")
    assert split_reasoning(" no tags ") == ("", "no tags")
    protocol = make_protocol("released")
    right = protocol.score("<think>Person 0 looks at Person 2</think><answer>A</answer>", _item())
    assert (right["predicted"], right["correct"], right["category"], right["participants_named"]) == ("A", True, "T1",
                                                                                                      [0, 2])
    unparsed = protocol.score("Person 3", _item())
    assert (unparsed["predicted"], unparsed["correct"]) == (None, False)
    open_ended = _item(category="G5", answer="Person 1 points at Person 2.", options=(), difficulty="hard")
    assert protocol.score("<think>x</think>Person 1 points at Person 2.", open_ended)["correct"] is True
    assert protocol.score("<think>x</think>Person 1 points.", open_ended)["correct"] is False


def test_report_is_the_released_metric_report():
    """Hand-computed as metric_report.py prints it: count-weighted groups and overall, C1-C4 names."""
    from grasp_lightning.evaluation.grasp_score import BenchAccuracy

    protocol = make_protocol("released")
    cases = [("T1", "easy", "<answer>A</answer>"), ("T1", "easy", "<answer>B</answer>"),
             ("T4", "medium", "<answer>A</answer>"), ("J1", "medium", "<answer>A</answer>"),
             ("J3", "hard", "Person 2")]
    metric = BenchAccuracy()
    metric.update_from_records([protocol.score(text, _item(cat, difficulty=diff, uid=str(i)))
                                for i, (cat, diff, text) in enumerate(cases)])
    metrics = metric.compute()
    assert released_report(metrics) == (
        "\n===== Gaze =====\n  T1: 1/2 = 0.500\n  T4: 1/1 = 1.000\n  Avg: 2/3 = 0.667"
        "\n\n===== Gesture ====="
        "\n\n===== Joint =====\n  C1: 1/1 = 1.000\n  C3: 0/1 = 0.000\n  Avg: 1/2 = 0.500"
        "\n\n===== By Difficulty =====\n  easy: 1/2 = 0.500\n  medium: 2/2 = 1.000\n  hard: 0/1 = 0.000"
        "\n\n===== Overall: 3/5 = 0.600 =====")
    # Our keys agree with it where they overlap (count-weighted); the macro average is ours alone.
    assert metrics["acc/gaze"] == pytest.approx(2 / 3) and metrics["acc/overall"] == pytest.approx(0.6)
    assert metrics["acc_macro/gaze"] == pytest.approx(0.75) and metrics["unparseable_rate"] == pytest.approx(0.2)


def test_protocol_settings_are_checked():
    from grasp_lightning.module import EvalConfig, ReleasedEvalConfig

    assert EvalConfig().protocol == "grasp" and make_protocol("grasp").bench_encoder(None) is None
    for bad, key in ((dict(protocol="paper"), "model.evaluation.protocol"),
                     (dict(protocol="released", released=ReleasedEvalConfig(timestamps="fake")),
                      "model.evaluation.released.timestamps"),
                     (dict(protocol="released", released={"model_type": "llava"}), "model.evaluation.released.model_type")):
        with pytest.raises(GraspConfigError, match=key):
            EvalConfig(**bad).make_protocol()
    released_cfg = EvalConfig(protocol="released", released=ReleasedEvalConfig(reasoning=False, max_frames=8))
    assert released_cfg.make_protocol().settings == dict(reasoning=False, model_type="qwen3_vl", max_frames=8,
                                                         frame_max_tokens=256, timestamps="released")
    released = make_protocol("released")
    assert released.decoding_deviations(2048, False, True) == []
    assert released.decoding_deviations(24, True, True) == ["max_new_tokens=24 (released: 2048)",
                                                            "do_sample=true (released: greedy)"]


def test_spatial_patch_must_split_into_whole_tokens(processor):
    assert make_protocol("released").bench_encoder(processor).spatial_patch == 16  # tiny: patch 8 x merge 2
    assert make_protocol("released", frame_spatial_patch=32).bench_encoder(processor).spatial_patch == 32
    with pytest.raises(GraspConfigError, match="multiple"):
        make_protocol("released", frame_spatial_patch=24).bench_encoder(processor)


def test_encoder_gives_the_released_inputs(processor):
    item, clip = first_bench_item()
    assert item.question_text == BENCH_QUESTION and item.options == BENCH_OPTIONS
    enc = make_protocol("released").bench_encoder(processor)(processor, item, clip)
    ids, pixels, n = released_reference(processor, clip, 64, 128)  # 72x128 -> 4 x 8 tokens of 16 px
    assert n == 40  # every frame of the 4 s, 10 fps clip (not 2 fps)
    assert torch.equal(enc.input_ids, ids) and torch.equal(enc.pixel_values_videos, pixels)
    assert enc.video_grid_thw.tolist() == [[20, 8, 16]]  # 40 frames / 2, 64/8 x 128/8 patches
    text = processor.tokenizer.decode(enc.input_ids)
    stamps = [float(t) for t in re.findall(r"<([\d.]+) seconds>", text)]
    assert stamps[:3] == [0.2, 1.2, 2.2] and stamps[-1] == 19.2  # frame i labelled i / 2 s: a 4 s clip "lasts 20 s"
    assert text.endswith(f"{RELEASED_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    real = make_protocol("released", timestamps="real").bench_encoder(processor)(processor, item, clip)
    stamps = [float(t) for t in re.findall(r"<([\d.]+) seconds>", processor.tokenizer.decode(real.input_ids))]
    assert stamps[0] == 0.1 and stamps[-1] == 3.8  # frames 2k, 2k+1 at 10 fps: 0.2 k + 0.05 s (3.85 prints 3.8)
