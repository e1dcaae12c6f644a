"""Golden tests of the temporal grounding term: time-span parsing, temporal IoU, the
``temporal_grounding`` reward and its composition with the paper's four terms (hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from grasp_lightning.data.records import ClipRef, GraspItem, SocialEvent
from grasp_lightning.parsing import parse_time_spans, temporal_iou
from grasp_lightning.rewards import REWARDS, compute_rewards, temporal_grounding

TERMS = ["accuracy", "format", "grounding_presence", "social_grounding", "temporal_grounding"]
WEIGHTS = [1.0, 0.1, 0.05, 0.2, 0.2]


def make_item(spans: tuple[tuple[float, float] | None, ...] = ((1.0, 3.0),), persons=(0, 1)) -> GraspItem:
    """An RL item with one gaze event per entry of ``spans`` (``None``: an event without a time)."""
    return GraspItem(
        uid="tmp", origin="test:1", clip=ClipRef(path="x/video/c_qa0000.mp4"),
        question="Whom does Person 0 look at?\nA) Person 0\nB) Person 1\nC) Person 2\nD) No one",
        options=("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"), answer="B",
        events=tuple(SocialEvent("gaze", tuple(persons), "gaze", span=s) for s in spans),
    )


def think(reasoning: str, answer: str = "B") -> str:
    return f"<think>{reasoning}</think><answer>{answer}</answer>"


# --- parse_time_spans ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, spans", [
    # the two forms, case-insensitive keywords
    ("Person 0 looks at Person 1 from 1s to 2.5s.", [(1.0, 2.5)]),
    ("Between 1.5s and 3.5s, whose gaze does Person 3 follow?", [(1.5, 3.5)]),
    ("FROM 0.25s TO 2s", [(0.25, 2.0)]),
    # unit variants; the unit may be spaced off, and is optional on the start only
    ("from 1 to 2.5s", [(1.0, 2.5)]),
    ("from 1 sec to 2 secs", [(1.0, 2.0)]),
    ("between 1 second and 2 seconds", [(1.0, 2.0)]),
    ("from 1 s to 2 s.", [(1.0, 2.0)]),
    ("from 1secs to 2sec", [(1.0, 2.0)]),
    ("from 1 to 2", []),  # no unit on the end: persons or counts, not times
    ("between Person 1 and Person 2", []),
    # inside tags
    ("<think><gaze>Person 0 looks at Person 1 from 1.0s to 2.5s</gaze></think>", [(1.0, 2.5)]),
    ("<gaze>between 0s and 1s</gaze><gesture>from 2s to 4s</gesture>", [(0.0, 1.0), (2.0, 4.0)]),
    # several spans, in order of appearance
    ("from 3s to 4s, then between 0.5s and 1s, and from 6 to 7 seconds", [(3.0, 4.0), (0.5, 1.0), (6.0, 7.0)]),
    # numbers are read whole: 10.5s is 10.5, never 0.5
    ("from 0s to 10.5s", [(0.0, 10.5)]),
    ("from 10.5s to 12s", [(10.5, 12.0)]),
    # malformed: end before start, equal, missing end, odd numbers, negative, comma decimals
    ("from 3s to 1s", []),
    ("from 2s to 2s", []),
    ("from 2.0s to 2s", []),
    ("from 3s to 1s and from 1s to 3s", [(1.0, 3.0)]),  # the malformed one is skipped, the next one read
    ("from 1.0s to", []),
    ("from 1.0s", []),
    ("between 1s and", []),
    ("from 1..0s to 2s", []),
    ("from 0s to 1..5s", []),
    ("from 1.s to 2s", []),
    ("from abc s to 2s", []),
    ("from 0s to abc s", []),
    ("from -1s to 2s", []),
    ("from 0s to -2s", []),
    ("from 1,5s to 2s", []),
    ("from 0s to 1,5s", []),
    ("from .5s to 1s", []),
    ("from 1e3s to 2s", []),
    ("from 1s to 2sx", []),
    ("from 1s to 2 sets", []),
    ("therefrom 1s to 2s", []),
    # odd and nested whitespace
    ("from\n1.0s\t to  \n 2.5 s", [(1.0, 2.5)]),
    ("between\t\t0s\nand\n\n3 seconds", [(0.0, 3.0)]),
    ("from1s to 2s", []),
    ("from 1s to2s", []),
])
def test_parse_time_spans_golden(text: str, spans: list[tuple[float, float]]) -> None:
    assert parse_time_spans(text) == spans


def test_parse_time_spans_returns_floats() -> None:
    (span,) = parse_time_spans("from 1 to 2s")
    assert all(type(t) is float for t in span)


# --- temporal_iou ----------------------------------------------------------------------------------

@pytest.mark.parametrize("a, b, iou", [
    ((1.0, 3.0), (1.0, 3.0), 1.0),  # identical
    ((0.0, 2.0), (1.0, 3.0), 1 / 3),  # half of each overlaps: 1 / (2 + 2 - 1)
    ((0.0, 4.0), (1.0, 2.0), 1 / 4),  # contained: 1 / 4
    ((1.0, 2.0), (0.0, 4.0), 1 / 4),  # symmetric
    ((0.0, 1.0), (2.0, 3.0), 0.0),  # disjoint
    ((0.0, 1.0), (1.0, 2.0), 0.0),  # touching
    ((1.5, 3.5), (2.5, 4.5), 1 / 3),
    ((0.0, 0.0), (0.0, 0.0), 0.0),  # no length: no union
])
def test_temporal_iou_golden(a, b, iou) -> None:
    assert temporal_iou(a, b) == iou


# --- the temporal_grounding reward -----------------------------------------------------------------

@pytest.mark.parametrize("spans, completion, expected", [
    # exact span -> 1.0
    (((1.0, 3.0),), think("Person 0 looks at Person 1 from 1s to 3s."), 1.0),
    # half overlap -> the IoU: (2, 4) against (1, 3) is 1/3
    (((1.0, 3.0),), think("between 2s and 4s"), 1 / 3),
    # two named spans against one gt -> IoU / 2 (the denominator is max(|gt|, |named|) = 2)
    (((1.0, 3.0),), think("from 1s to 3s, and from 5s to 6s"), 1.0 / 2),
    # two gt spans, one named: best IoUs 1 and 0 over max(2, 1) = 2
    (((1.0, 3.0), (5.0, 6.0)), think("from 1s to 3s"), 1.0 / 2),
    # two gt spans, both named (in any order) -> 1.0
    (((1.0, 3.0), (5.0, 6.0)), think("from 5s to 6s, then from 1s to 3s"), 1.0),
    # an event without a span does not enter gt
    (((1.0, 3.0), None), think("from 1s to 3s"), 1.0),
    # no span named -> 0.0
    (((1.0, 3.0),), think("Person 0 looks at Person 1."), 0.0),
    # item without spans -> 0.0
    ((None,), think("from 1s to 3s"), 0.0),
    ((), think("from 1s to 3s"), 0.0),
    # a span only in the <answer> part is not counted
    (((1.0, 3.0),), think("Person 0 looks.", answer="B from 1s to 3s"), 0.0),
    (((1.0, 3.0),), "<answer>B</answer> from 1s to 3s", 0.0),
    # malformed spans are ignored (and do not count in the denominator)
    (((1.0, 3.0),), think("from 3s to 1s, from 2s to 2s, from 1s to 3s, from 1..5s to 3s"), 1.0),
    (((1.0, 3.0),), think("from 3s to 1s"), 0.0),
])
def test_temporal_grounding_golden(spans, completion: str, expected: float) -> None:
    assert temporal_grounding(completion, make_item(spans)) == expected


def test_temporal_grounding_after_an_opened_think_mirrors_social_grounding() -> None:
    item = make_item()
    text = "Person 0 looks from 1s to 3s.</think><answer>B</answer>"
    assert temporal_grounding(text, item, opened_think=True) == 1.0
    assert temporal_grounding(text, item) == 1.0  # no <think>: everything before </think>
    # a second, opened <think> after a Thinking prompt: the reasoning is up to the first </think>
    both = "from 1s to 3s <think>from 5s to 6s</think><answer>B</answer>"
    assert temporal_grounding(both, item, opened_think=True) == 1 / 2
    assert temporal_grounding(both, item) == 0.0  # without the flag, the <think> block's content only
    assert REWARDS["social_grounding"].takes_flag and REWARDS["temporal_grounding"].takes_flag


def test_temporal_grounding_vision_placeholder_is_zero() -> None:
    assert temporal_grounding(think("from 1s to 3s <|video_pad|>"), make_item()) == 0.0


# --- composition with the paper's terms ------------------------------------------------------------

def test_compute_rewards_with_the_temporal_term_and_the_task_weighting() -> None:
    """The five-term list through ``compute_rewards`` and ``GRPOTask.advantages``' weighted sum."""
    from grasp_lightning.tasks.grpo import GRPOTask, RewardConfig

    item = make_item(((1.0, 3.0),), persons=(0, 1))
    completions = [
        # right, formatted, gaze tag, exact persons (SGR 2), exact span (1)
        think("<gaze>Person 0 looks at Person 1 from 1s to 3s</gaze>"),
        # wrong, formatted, gaze tag; persons {0,1,2,3}: P = 1/2, R = 1 -> 1.0; spans (1,3),(5,6): 1/2
        think("<gaze>Person 0, Person 1, Person 2, Person 3 from 1s to 3s, from 5s to 6s</gaze>", answer="A"),
        # right, formatted, no tag, nobody, the span only after the reasoning -> 0
        "<answer>B</answer> Person 0 from 1s to 3s",
        # right, formatted, no tag; P = 1, R = 1/2 -> 1.5; half overlap (2,4) vs (1,3) -> 1/3
        think("Person 0 acts between 2s and 4s"),
    ]
    task = GRPOTask(reward=RewardConfig(terms=TERMS, weights=WEIGHTS))
    assert task.reward_labels == TERMS
    terms = compute_rewards(completions, [item] * 4, task.reward_terms)
    expected = torch.tensor([
        [1.0, 1.0, 1.0, 2.0, 1.0],
        [0.0, 1.0, 1.0, 1.0, 0.5],
        [1.0, 1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 1.5, 1 / 3],
    ])
    torch.testing.assert_close(terms, expected, rtol=0, atol=0)
    assert compute_rewards(completions, [item] * 4, TERMS).equal(terms)  # names resolve to the same terms
    rewards, _ = task.advantages(terms, k=2)
    # 1 + 0.1 + 0.05 + 0.4 + 0.2; 0.1 + 0.05 + 0.2 + 0.1; 1 + 0.1; 1 + 0.1 + 0.3 + 0.2/3
    torch.testing.assert_close(rewards, torch.tensor([1.75, 0.45, 1.1, 1.1 + 0.3 + 0.2 / 3]))
    torch.testing.assert_close(rewards, terms @ torch.tensor(WEIGHTS), rtol=0, atol=0)
