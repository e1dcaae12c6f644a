"""Tests of grasp_lightning.rewards with hand-worked values of the Social Grounding Reward."""

from __future__ import annotations

import math

import pytest
import torch

from grasp_lightning.data.records import ClipRef, GraspItem, SocialEvent
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.rewards import (
    REWARDS,
    VISION_PLACEHOLDERS,
    compute_rewards,
    grounding_precision_recall,
)

PAPER_TERMS = ["accuracy", "format", "grounding_presence", "social_grounding"]


def make_item(
    events: tuple[tuple[str, tuple[int, ...]], ...] = (("gaze", (0, 1)),),
    answer: str = "B",
    question: str = "Whose gaze does Person 3 follow?\nA) Person 0\nB) Person 1\nC) Person 2\nD) No one",
    options: tuple[str, ...] = ("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"),
    question_text: str | None = None,
) -> GraspItem:
    """A small RL item; ``events`` as ``(source, persons)`` pairs."""
    return GraspItem(
        uid="t", origin="test:1", clip=ClipRef(path="x/video/c_qa0000.mp4"), question=question,
        options=options, answer=answer, events=tuple(SocialEvent(s, p, s) for s, p in events),
        question_text=question_text,
    )


def think(reasoning: str, answer: str = "B") -> str:
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


# --- precision / recall and the paper's SGR ----------------------------------------------------------

def test_precision_recall_helper() -> None:
    assert grounding_precision_recall({0, 1, 2, 3}, {0, 1}) == (0.5, 1.0)  # 2/4, 2/2
    assert grounding_precision_recall(set(), {0}) == (0.0, 0.0)
    assert grounding_precision_recall({0}, set()) == (0.0, 0.0)


@pytest.mark.parametrize(
    "gt, reasoning, expected",
    [
        # exact match: gt {0,1}, pred {0,1}: P = 2/2 = 1, R = 2/2 = 1 -> (1 + 1) * 1 = 2.0
        (((0, 1),), "Person 0 looks at Person 1.", 2.0),
        # naming every visible person: gt {0,1}, pred {0,1,2,3}: P = 2/4 = 0.5, R = 2/2 = 1 -> 2 * 0.5 = 1.0
        (((0, 1),), "Person 0, Person 1, Person 2 and P3 are visible.", 1.0),
        # leaving out a key person: gt {0,1,2}, pred {0}: P = 1/1 = 1, R = 1/3 -> (1 + 1/3) * 1 = 4/3
        (((0, 1, 2),), "Person 0 points.", 4 / 3),
        # empty pred -> 0
        (((0, 1),), "Someone looks somewhere.", 0.0),
        # Person 12 is not Person 1: gt {1}, pred {12}: P = 0 -> 0
        (((1,),), "Person 12 waves.", 0.0),
        # P3 standalone: gt {3, 5}, pred {3}: P = 1, R = 1/2 -> 1.5; "AP5" is not P5
        (((3, 5),), "P3 looks at AP5.", 1.5),
        # gt is the union over events: gt {0,1,2}, pred {1,2}: P = 1, R = 2/3 -> 5/3
        (((0, 1), (2,)), "P1 hands it to P2.", 5 / 3),
    ],
)
def test_social_grounding_golden(gt: tuple[tuple[int, ...], ...], reasoning: str, expected: float) -> None:
    item = make_item(events=tuple(("gaze", p) for p in gt))
    assert REWARDS["social_grounding"](think(reasoning), item) == pytest.approx(expected, abs=1e-12)


def test_social_grounding_reads_only_reasoning() -> None:
    item = make_item(events=(("gaze", (0, 1)),))
    # Person 2 in the answer block is not reasoning: pred {0, 1} -> 2.0
    assert REWARDS["social_grounding"]("<think>Person 0 and Person 1</think><answer>Person 2</answer>", item) == 2.0


def test_social_grounding_empty_gt_is_zero_not_nan() -> None:
    item = make_item(events=())
    value = REWARDS["social_grounding"](think("Person 0 looks at Person 1"), item)
    assert value == 0.0 and not math.isnan(value)


# --- released variant ------------------------------------------------------------------------------

def test_released_variant_per_modality_and_question_people() -> None:
    # gaze gt {0, 3}, gesture gt {1, 2}; Person 3 is named in the question, so it is removed from both
    # sides: gaze gt {0}, gesture gt {1, 2}.
    item = make_item(
        events=(("gaze", (0, 3)), ("pointing", (1, 2))),
        question_text="Whose gaze does Person 3 follow?",
    )
    # gaze tag names {0, 3, 1} -> minus {3} -> {0, 1}: hits {0} = 1 (Person 1 is a gesture person, so a miss here)
    # gesture tag names {2} -> hits 1
    # pooled: hits = 2, |pred| = 2 + 1 = 3, |gt| = 1 + 2 = 3 -> 0.7 * 2/3 + 0.3 * 2/3 = 2/3
    text = ("<think><gaze>Person 0 follows Person 3, then Person 1</gaze><gesture>P2 points</gesture></think>"
            "<answer>A</answer>")
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(2 / 3, abs=1e-12)
    # The paper's form on the same text: reasoning names {0, 1, 2, 3}, gt {0, 1, 2, 3}: P = R = 1 -> 2.0
    assert REWARDS["social_grounding"](text, item) == pytest.approx(2.0)


def test_released_variant_recall_weighted() -> None:
    # gaze gt {0, 1, 2}; pred {0}: hits 1, R = 1/3, P = 1 -> 0.7/3 + 0.3 = 0.5333...
    item = make_item(events=(("gaze", (0, 1, 2)),), question_text="Who looks at the ball?")
    text = think("<gaze>Person 0 looks</gaze>")
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(0.7 / 3 + 0.3, abs=1e-12)


def test_released_variant_ignores_untagged_people_and_empty_cases() -> None:
    item = make_item(events=(("gaze", (0,)),), question_text="Who looks?")
    assert REWARDS["social_grounding_released"](think("Person 0 looks"), item) == 0.0  # no tags
    assert REWARDS["social_grounding_released"](think("<gesture>Person 0</gesture>"), item) == 0.0  # wrong modality
    # Everyone in the ground truth is named in the question -> nothing left to find -> 0
    asked = make_item(events=(("gaze", (0,)),), question_text="Does Person 0 look?")
    assert REWARDS["social_grounding_released"](think("<gaze>Person 0</gaze>"), asked) == 0.0


def test_released_variant_falls_back_to_question_without_options() -> None:
    # question_text None: the question minus its options names Person 3 only; options name 0, 1, 2.
    item = make_item(events=(("gaze", (1, 3)),), question_text=None)
    # gt {1, 3} - {3} = {1}; pred {1, 3} - {3} = {1} -> R = P = 1 -> 1.0
    assert REWARDS["social_grounding_released"](think("<gaze>P1 and P3</gaze>"), item) == pytest.approx(1.0)


# --- accuracy, format, presence ------------------------------------------------------------------

def test_accuracy_cases() -> None:
    item = make_item(answer="B")
    acc = REWARDS["accuracy"]
    assert acc(think("x", "B"), item) == 1.0
    assert acc(think("x", " B\n"), item) == 1.0
    assert acc(think("x", "b"), item) == 0.0  # lowercase is wrong
    assert acc(think("x", "B) Person 1"), item) == 0.0  # exact equality only
    assert acc("<answer>A</answer><answer>B</answer>", item) == 0.0  # only the first block counts
    assert acc("<answer>B</answer><answer>A</answer>", item) == 1.0
    assert acc("<answer></answer>", make_item(answer="")) == 0.0  # empty answer never matches
    assert acc("B", item) == 0.0  # no tags


def test_format_and_presence() -> None:
    item = make_item()
    assert REWARDS["format"]("<answer>A</answer>", item) == 1.0
    assert REWARDS["format"]("<answer></answer>", item) == 0.0
    assert REWARDS["format_strict"]("<answer>A</answer>", item) == 0.0
    assert REWARDS["format_strict"](think("why"), item) == 1.0
    assert REWARDS["grounding_presence"](think("<gesture>P1 points</gesture>"), item) == 1.0
    assert REWARDS["grounding_presence"](think("<gaze> </gaze>"), item) == 0.0
    assert REWARDS["grounding_presence"](think("no tags"), item) == 0.0


@pytest.mark.parametrize("token", VISION_PLACEHOLDERS)
def test_vision_placeholder_zeroes_every_term(token: str) -> None:
    item = make_item(events=(("gaze", (0, 1)),))
    text = f"<think><gaze>Person 0 and Person 1</gaze>{token}</think><answer>B</answer>"
    clean = text.replace(token, "")
    names = sorted(REWARDS)
    assert compute_rewards([clean], [item], names).sum() > 0
    assert compute_rewards([text], [item], names).tolist() == [[0.0] * len(names)]


# --- compute_rewards -------------------------------------------------------------------------------

def test_compute_rewards_table() -> None:
    item = make_item(events=(("gaze", (0, 1)),), answer="B")
    completions = [
        "<think><gaze>Person 0 looks at Person 1</gaze></think><answer>B</answer>",
        "no tags at all",
        "<think>Person 0, Person 1, Person 2, Person 3</think><answer>b</answer>",
    ]
    out = compute_rewards(completions, [item] * 3, PAPER_TERMS)
    assert out.dtype == torch.float32 and out.shape == (3, 4)
    expected = torch.tensor([
        [1.0, 1.0, 1.0, 2.0],  # right, formatted, gaze tag, exact participants
        [0.0, 0.0, 0.0, 0.0],  # nothing
        [0.0, 1.0, 0.0, 1.0],  # lowercase answer; P = 2/4, R = 1 -> 1.0
    ])
    torch.testing.assert_close(out, expected)


def test_compute_rewards_unknown_name_lists_known() -> None:
    with pytest.raises(GraspConfigError) as info:
        compute_rewards(["x"], [make_item()], ["accuracy", "sgr"])
    assert "sgr" in str(info.value) and "social_grounding" in str(info.value)


def test_compute_rewards_length_mismatch_and_empty() -> None:
    with pytest.raises(ValueError):
        compute_rewards(["x", "y"], [make_item()], ["accuracy"])
    assert compute_rewards([], [], PAPER_TERMS).shape == (0, 4)
