"""Tests of grasp_lightning.grpo.rewards with hand-worked values of the Social Grounding Reward and of the temporal
grounding term (alone and composed with the paper's four terms)."""

from __future__ import annotations

import math

import pytest
import torch

from grasp_lightning.data.records import ClipRef, GraspItem, SocialEvent
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.grpo.rewards import (
    REWARDS,
    VISION_PLACEHOLDERS,
    compute_rewards,
    grounding_precision_recall,
    temporal_grounding,
)
from grasp_lightning.sequence_parallel import SequenceParallel

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
    # sides: gaze event {0}, gesture event {1, 2}.
    item = make_item(
        events=(("gaze", (0, 3)), ("pointing", (1, 2))),
        question_text="Whose gaze does Person 3 follow?",
    )
    # gaze tag names {0, 3, 1} -> minus {3} -> {0, 1}; gesture tag names {2}.
    # R per event: gaze {0}: |{0,1} & {0}| / 1 = 1; gesture {1,2}: |{2} & {1,2}| / 2 = 1/2 -> R = 3/4
    # P per modality: gaze |{0,1} & {0}| / 2 = 1/2; gesture |{2} & {1,2}| / 1 = 1 -> P = 3/4
    # 0.7 * 3/4 + 0.3 * 3/4 = 0.75   (the old pooled form gave 2/3)
    text = ("<think><gaze>Person 0 follows Person 3, then Person 1</gaze><gesture>P2 points</gesture></think>"
            "<answer>A</answer>")
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(0.75, abs=1e-12)
    # The paper's form on the same text: reasoning names {0, 1, 2, 3}, gt {0, 1, 2, 3}: P = R = 1 -> 2.0
    assert REWARDS["social_grounding"](text, item) == pytest.approx(2.0)


def _pooled(completion: str, item: GraspItem) -> float:
    """The previous (pooled-count) version, for the cases where it differs from the released code."""
    from grasp_lightning.parsing import extract_participants, tag_contents

    asked = extract_participants(item.question_text or "")
    hits = n_pred = n_gt = 0
    for modality in ("gaze", "gesture"):
        gt = {p for e in item.events if (e.source == "gaze") == (modality == "gaze") for p in e.persons} - asked
        pred = set(extract_participants(" ".join(tag_contents(completion, modality)))) - asked
        hits, n_pred, n_gt = hits + len(pred & gt), n_pred + len(pred), n_gt + len(gt)
    return 0.0 if n_pred == 0 or n_gt == 0 else 0.7 * hits / n_gt + 0.3 * hits / n_pred


# Golden values of socialmllm/train/reasoning/trainer.py::compute_grounding_score (Social-Reaoning/grasp),
# worked by hand: R = mean over events (people left after the question's) of |named_m & e| / |e|;
# P = mean over modalities with gt and with somebody named of |named_m & gt_m| / |named_m|; 0.7 R + 0.3 P.
RELEASED_GOLDEN = [
    # recall per event, not pooled: gaze events {0,1} and {2}; named gaze {0,2}.
    # R = (1/2 + 1/1) / 2 = 3/4; P = |{0,2} & {0,1,2}| / 2 = 1 -> 0.7*0.75 + 0.3 = 0.825 (pooled: 0.7*2/3 + 0.3)
    ("gaze-per-event", (("gaze", (0, 1)), ("gaze", (2,))), "Who looks?", "<gaze>Person 0 and Person 2</gaze>",
     0.825, 0.7 * 2 / 3 + 0.3),
    # precision per modality: gaze {0}, gesture {1}; named gaze {0}, gesture {1,2,3}.
    # R = (1 + 1) / 2 = 1; P = (1/1 + 1/3) / 2 = 2/3 -> 0.7 + 0.2 = 0.9 (pooled: 0.7 + 0.3 * 2/4 = 0.85)
    ("precision-per-modality", (("gaze", (0,)), ("pointing", (1,))), "Who looks?",
     "<gaze>P0</gaze><gesture>P1, P2, P3</gesture>", 0.9, 0.85),
    # a modality named without ground truth is not in P: gaze {0,1}; named gaze {0}, gesture {5}.
    # R = 1/2; P = gaze only = 1/1 -> 0.35 + 0.3 = 0.65 (pooled: 0.7/2 + 0.3 * 1/2 = 0.5)
    ("named-modality-without-gt", (("gaze", (0, 1)),), "Who looks?", "<gaze>Person 0</gaze><gesture>Person 5</gesture>",
     0.65, 0.5),
    # a modality with ground truth but nobody named is in R only: gaze {0}, giving {1}; named gaze {0}.
    # R = (1 + 0) / 2 = 1/2; P = gaze only = 1 -> 0.65 (pooled agrees: 0.7 * 1/2 + 0.3 * 1/1)
    ("gt-modality-unnamed", (("gaze", (0,)), ("giving", (1,))), "Who looks?", "<gaze>Person 0</gaze>", 0.65, 0.65),
    # an event made only of question people is left out of R's mean: events {3} and {0,1}, question names 3.
    # events left: {0,1}; named gaze {3,0} - {3} = {0}: R = 1/2 (not (x + 1/2)/2); P = 1 -> 0.65
    ("asked-event-skipped", (("gaze", (3,)), ("gaze", (0, 1))), "Whose gaze does Person 3 follow?",
     "<gaze>Person 3 and P0</gaze>", 0.65, 0.65),
    # the released person pattern: "Person12" (no space) is nobody, "P1a" is Person 1 (no end boundary).
    # gaze {1}; named {1}: R = 1, P = 1 -> 1.0 (pooled, with our stricter pattern: named {12} -> 0.0)
    ("released-pattern", (("gaze", (1,)),), "Who looks?", "<gaze>Person12 looks at P1a</gaze>", 1.0, 0.0),
    # the same person in two events of two modalities: gaze {0,1}, pointing {1}; named gaze {1}, gesture {1}.
    # R = (1/2 + 1) / 2 = 3/4; P = (1 + 1) / 2 = 1 -> 0.525 + 0.3 = 0.825 (pooled: hits 2, |gt| 3, |pred| 2)
    ("shared-person", (("gaze", (0, 1)), ("pointing", (1,))), "Who?", "<gaze>P1</gaze> <gesture>P1</gesture>",
     0.825, 0.7 * 2 / 3 + 0.3),
    # empty cases: no events; no tags at all; everybody to find is named in the question.
    ("no-events", (), "Who?", "<gaze>Person 0</gaze>", 0.0, 0.0),
    ("no-tags", (("gaze", (0,)),), "Who?", "Person 0 looks", 0.0, 0.0),
    ("all-asked", (("gaze", (0,)),), "Does Person 0 look?", "<gaze>Person 0</gaze>", 0.0, 0.0),
]


@pytest.mark.parametrize("name, events, question, tags, expected, pooled", RELEASED_GOLDEN,
                         ids=[case[0] for case in RELEASED_GOLDEN])
def test_released_variant_golden(name, events, question, tags, expected, pooled) -> None:
    item = make_item(events=events, question_text=question)
    text = think(tags)
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(expected, abs=1e-12)
    assert _pooled(text, item) == pytest.approx(pooled, abs=1e-12)  # where the two differ, the case shows it


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


def test_released_variant_without_question_text_excludes_nobody() -> None:
    # question_text None (a row whose meta has none): the released code reads "" and leaves nobody out,
    # though the question names Person 3. gt {1, 3}; named {1}: R = 1/2, P = 1 -> 0.35 + 0.3 = 0.65
    item = make_item(events=(("gaze", (1, 3)),), question_text=None)
    assert REWARDS["social_grounding_released"](think("<gaze>P1</gaze>"), item) == pytest.approx(0.65)


# --- the released variant through our reader (data_rl.jsonl rows) --------------------------------
# The row (tests/helpers.py rl_row): "Who does Person 1 point at?" with options Person 0/2/4.
# Expected values are compute_grounding_score (socialmllm/train/reasoning/trainer.py:15-69) worked by hand
# on the row's JSON: question_text from the meta ("" when missing, train_utils.py:221), sources compared
# with "gaze" exactly, persons as written.
QUESTION = "Who does Person 1 point at?"


def _read_rl_row(tmp_path, events: list[dict], **meta) -> GraspItem:
    from grasp_lightning.data.formats import read_rl
    from tests.helpers import rl_row, write_jsonl

    row = rl_row(meta={"type": "meta", "difficulty": "easy", "gt_events": events, **meta})
    return read_rl(write_jsonl(tmp_path / "data_rl.jsonl", [row]))[0]


def test_released_variant_through_the_reader_without_question_text(tmp_path) -> None:
    events = [{"source": "gaze", "persons": [0, 3]}, {"source": "pointing", "persons": [1, 2]}]
    item = _read_rl_row(tmp_path, events)  # no question_text in the meta
    assert item.question_text is None
    text = think("<gaze>Person 0</gaze><gesture>Person 2</gesture>")
    # released, question_text "": nobody left out. R = mean(gaze {0,3}: 1/2, pointing {1,2}: 1/2) = 1/2;
    # P = mean(gaze {0}/{0} = 1, gesture {2}/{2} = 1) = 1 -> 0.35 + 0.3 = 0.65. (Leaving out Person 1, named in
    # the bare question, as the reader used to: R = (1/2 + 1) / 2 -> 0.825.)
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(0.65, abs=1e-12)
    with_question = _read_rl_row(tmp_path, events, question_text=QUESTION)
    assert REWARDS["social_grounding_released"](text, with_question) == pytest.approx(0.825, abs=1e-12)
    # an empty question_text is kept as written and excludes nobody either
    empty = _read_rl_row(tmp_path, events, question_text="")
    assert empty.question_text == "" and REWARDS["social_grounding_released"](text, empty) == pytest.approx(0.65)
    # the paper's reward never reads question_text: the same with or without it (reasoning names {0, 2}, gt
    # {0, 1, 2, 3}: P = 1, R = 1/2 -> 1.5)
    for row in (item, with_question, empty):
        assert REWARDS["social_grounding"](text, row) == pytest.approx(1.5)


def test_released_variant_through_the_reader_gaze_spelling(tmp_path) -> None:
    item = _read_rl_row(tmp_path, [{"source": "Gaze", "persons": [0, 3]}], question_text=QUESTION)
    assert item.events[0].source == "gaze" and item.events[0].kind == "Gaze"  # ours: gaze
    # released: "Gaze" != "gaze", a gesture event {0, 3}: named gesture {0, 3} -> R = 1, P = 1 -> 1.0
    assert REWARDS["social_grounding_released"](think("<gesture>Person 0 and Person 3</gesture>"), item) == 1.0
    # and the same people under <gaze> find nothing: R = 0; gaze named without gaze ground truth is not in P -> 0
    assert REWARDS["social_grounding_released"](think("<gaze>Person 0 and Person 3</gaze>"), item) == 0.0
    # " gaze " (spaces) is not "gaze" for the released code either
    spaced = _read_rl_row(tmp_path, [{"source": " gaze ", "persons": [0]}], question_text=QUESTION)
    assert spaced.events[0].source == "gaze"
    assert REWARDS["social_grounding_released"](think("<gesture>Person 0</gesture>"), spaced) == 1.0


def test_released_variant_through_the_reader_digit_string_ids(tmp_path) -> None:
    item = _read_rl_row(tmp_path, [{"source": "gaze", "persons": ["0", 3]}], question_text=QUESTION)
    assert item.events[0].persons == (0, 3) and item.participants == {0, 3}  # ours: "0" is Person 0
    text = think("<gaze>Person 0 and Person 3</gaze>")
    # released: the event is {"0", 3}; named gaze {0, 3}: R = |{3}| / 2 = 1/2, P = |{3}| / 2 = 1/2 -> 0.5
    assert REWARDS["social_grounding_released"](text, item) == pytest.approx(0.5, abs=1e-12)
    # a digit string is never left out as a question person either: question names Person 1, event {"1"}
    asked = _read_rl_row(tmp_path, [{"source": "gaze", "persons": ["1"]}], question_text=QUESTION)
    # released: {"1"} - {1} = {"1"}, gt {"1"}; named gaze {1} - {1} = {} -> R = 0, no P -> 0.0 (not "nobody left")
    assert REWARDS["social_grounding_released"](think("<gaze>Person 1</gaze>"), asked) == 0.0
    # an integral float is that person for Python's sets, hence for the released code: {0.0} & {0} = {0}
    floats = _read_rl_row(tmp_path, [{"source": "gaze", "persons": [0.0]}], question_text=QUESTION)
    assert REWARDS["social_grounding_released"](think("<gaze>P0</gaze>"), floats) == 1.0


@pytest.mark.parametrize("event", [{"source": "gaze"}, {"source": "gaze", "persons": [True]}])
def test_rows_the_released_code_scores_are_refused_by_the_reader(tmp_path, event) -> None:
    # Ours: an event without persons and a `true` person are data errors naming the line (the released code
    # scores them: an empty event; True as Person 1). docs/released-recipe.md.
    from grasp_lightning.errors import GraspFormatError

    with pytest.raises(GraspFormatError, match="data_rl.jsonl:1"):
        _read_rl_row(tmp_path, [event], question_text=QUESTION)


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


def test_format_strict_after_a_thinking_prompt() -> None:
    item = make_item()
    inside = "Person 0 looks at <gaze>Person 1</gaze>.</think>\n<answer>B</answer>"  # started inside <think>
    strict = REWARDS["format_strict"]
    assert strict(inside, item, opened_think=True) == 1.0
    assert strict(inside, item) == 0.0  # an Instruct prompt opened nothing
    assert strict(think("why"), item, opened_think=True) == 0.0  # a second <think> after the prompt's
    assert strict("why<answer>B</answer>", item, opened_think=True) == 0.0  # never closed
    # compute_rewards passes one flag per row (Completions.prompt_opened_think)
    out = compute_rewards([inside, inside], [item, item], ["format_strict", "format", "social_grounding"],
                          opened_think=[True, False])
    # social_grounding: reasoning before </think> names {0, 1} = gt {0, 1} -> 2.0 in both rows
    assert out.tolist() == [[1.0, 1.0, 2.0], [0.0, 1.0, 2.0]]
    with pytest.raises(ValueError, match="opened_think"):
        compute_rewards([inside], [item], ["format"], opened_think=[True, False])


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


# --- reward plugins: an import path instead of a registry name --------------------------------------

def answer_is_b(completion: str, item: GraspItem) -> float:
    """A reward plugin of the tests (``tests.unit.grpo.test_rewards.answer_is_b``): 3 for ``<answer>B</answer>``, else 0.5."""
    return 3.0 if "<answer>B</answer>" in completion else 0.5


def opened(completion: str, item: GraspItem, opened_think: bool = False) -> float:
    """A plugin that reads the ``opened_think`` flag (``tests.unit.grpo.test_rewards.opened``)."""
    return 2.0 if opened_think else -1.0


def not_a_number(completion: str, item: GraspItem) -> float:
    """A broken plugin (``tests.unit.grpo.test_rewards.not_a_number``): NaN for B, a string otherwise."""
    return float("nan") if "<answer>B</answer>" in completion else "high"


NOT_A_FUNCTION = 42
PLUGIN, OPENED = "tests.unit.grpo.test_rewards.answer_is_b", "tests.unit.grpo.test_rewards.opened"


def test_compute_rewards_with_plugins_by_import_path() -> None:
    item = make_item()
    texts = ["<answer>B</answer>", "<answer>A</answer>", "<|video_pad|><answer>B</answer>"]
    out = compute_rewards(texts, [item] * 3, ["accuracy", PLUGIN, OPENED], opened_think=[True, False, True])
    # the vision placeholder gives 0 on every term, the plugins included, as for registered terms
    assert out.tolist() == [[1.0, 3.0, 2.0], [0.0, 0.5, -1.0], [0.0, 0.0, 0.0]]
    assert PLUGIN not in REWARDS  # resolving does not register


@pytest.mark.parametrize("text, shown", [("<answer>B</answer>", "nan"), ("<answer>A</answer>", "'high'")])
def test_a_reward_that_returns_no_finite_number_is_an_error_naming_it(text, shown) -> None:
    item = make_item()
    with pytest.raises(GraspConfigError, match=rf"reward 'tests.unit.grpo.test_rewards.not_a_number' returned {shown} for item "
                                               rf"{item.uid}.*finite number"):
        compute_rewards([text], [item], ["accuracy", "tests.unit.grpo.test_rewards.not_a_number"])


@pytest.mark.parametrize("entry, says", [
    ("sgr", "unknown reward 'sgr'"),
    ("tests.unit.grpo.test_rewards.missing", "has no attribute 'missing'"),
    ("no_such_package_xyz.rewards.fn", "cannot import module 'no_such_package_xyz.rewards'"),
    ("tests.unit.grpo.test_rewards.NOT_A_FUNCTION", "is a int, not a function"),
])
def test_bad_reward_entries_fail_at_task_init_naming_the_entry(entry: str, says: str) -> None:
    from grasp_lightning.tasks.grpo import GRPOTask, RewardConfig

    with pytest.raises(GraspConfigError) as info:
        GRPOTask(reward=RewardConfig(terms=["accuracy", entry], weights=[1.0, 1.0]))
    msg = str(info.value)
    assert "model.task.init_args.reward.terms" in msg and repr(entry) in msg and says in msg, msg
    with pytest.raises(GraspConfigError, match="social_grounding"):
        compute_rewards(["x"], [make_item()], [entry])  # the known names are listed


def test_a_plugin_reward_reaches_the_rollout_terms_and_advantages(monkeypatch) -> None:
    """GRPOTask.rollout with a scripted sampler: the plugin's values are a column of the terms and, weighted,
    drive the rewards and the (centred) advantages."""
    import contextlib
    from types import SimpleNamespace

    import grasp_lightning.engines.hf as engines_hf
    import grasp_lightning.tasks.grpo as grpo_task
    from grasp_lightning.data.collate import Batch
    from grasp_lightning.engines.decoding import Completions, RolloutConfig
    from grasp_lightning.task import CrossRank

    texts = ["<answer>B</answer>", "<answer>A</answer>"]

    def sample(policy, tokenizer, prompt, *, num_return_sequences, **kwargs):
        n = prompt["input_ids"].shape[0] * num_return_sequences
        return Completions(ids=torch.full((n, 3), 7), mask=torch.ones(n, 3, dtype=torch.bool), texts=texts * (n // 2),
                           truncated=torch.zeros(n, dtype=torch.bool), prompt_opened_think=[False] * n)

    monkeypatch.setattr(engines_hf, "sample_completions", sample)
    ctx = SimpleNamespace(sequence_parallel=SequenceParallel(), policy=torch.nn.Linear(1, 1), tokenizer=None, device=torch.device("cpu"),
                          rollout_cfg=RolloutConfig(num_generations=2, max_new_tokens=8), cross_rank=CrossRank(),
                          reference=contextlib.nullcontext, rollout_engine=engines_hf.HFEngine(), policy_version=0)
    task = grpo_task.GRPOTask(reward=grpo_task.RewardConfig(terms=["accuracy", PLUGIN], weights=[1.0, 0.5]),
                              loss=grpo_task.LossConfig(beta=0.0), compute=grpo_task.ComputeConfig(share_prompt=False),
                              advantage=grpo_task.AdvantageConfig(kind="none"))
    task.setup(ctx)
    batch = Batch(inputs={"input_ids": torch.ones(1, 2, dtype=torch.long),
                          "attention_mask": torch.ones(1, 2, dtype=torch.long)},
                  items=[make_item()], indices=[0], valid=torch.ones(1, dtype=torch.bool), prompt_lengths=torch.tensor([2]),
                  padding_side="left")
    ro = task.rollout(ctx, batch)
    assert ro.terms.tolist() == [[1.0, 3.0], [0.0, 0.5]]
    # rewards 1 + 0.5 * 3 = 2.5 and 0 + 0.5 * 0.5 = 0.25; centred over the group (mean 1.375)
    assert ro.rewards.tolist() == [2.5, 0.25] and ro.advantages.tolist() == [1.125, -1.125]


# --- rewards of one's own: colon paths, files, batched functions, callables --------------------------

def answers_per_batch(completions: list[str], items: list[GraspItem]) -> list[float]:
    """A batched plugin (``tests.unit.grpo.test_rewards:answers_per_batch``): records each call's batch size."""
    answers_per_batch.calls.append(len(completions))
    return [float(len(completions))] * len(completions)


answers_per_batch.calls = []


def wrong_length(completions: list[str], items: list[GraspItem]) -> list[float]:
    """A batched plugin returning one value too few."""
    return [1.0] * (len(completions) - 1)


def one_argument(completion: str) -> float:
    """A plugin with the wrong signature."""
    return 1.0


class NotAFunction:
    """A class where a function is expected."""


FILE_REWARD = '''
from grasp_lightning.parsing import answer_block


def brevity(completion, item):
    """1 for an answer block under 40 characters of completion, else 0."""
    return 1.0 if answer_block(completion) is not None and len(completion) < 40 else 0.0
'''


def test_colon_paths_files_and_callables_resolve_to_the_same_scores(tmp_path, monkeypatch) -> None:
    item = make_item()
    texts = ["<answer>B</answer>", "<think>" + "x" * 50 + "</think><answer>A</answer>"]
    (tmp_path / "my_rewards.py").write_text(FILE_REWARD)
    monkeypatch.chdir(tmp_path)  # a file path is read from the working directory
    out = compute_rewards(texts, [item] * 2, ["tests.unit.grpo.test_rewards:answer_is_b", "my_rewards.py:brevity", answer_is_b,
                                              f"{tmp_path}/my_rewards.py:brevity"])
    assert out.tolist() == [[3.0, 1.0, 3.0, 1.0], [0.5, 0.0, 0.5, 0.0]]


def test_a_batched_reward_is_called_once_without_the_broken_rollouts() -> None:
    item = make_item()
    texts = ["<answer>B</answer>", "<|image_pad|><answer>B</answer>", "<answer>C</answer>"]
    answers_per_batch.calls.clear()
    out = compute_rewards(texts, [item] * 3, ["accuracy", "tests.unit.grpo.test_rewards:answers_per_batch"])
    assert answers_per_batch.calls == [2]  # one call, the placeholder row left out
    assert out.tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 2.0]]
    with pytest.raises(GraspConfigError, match=r"reward 'tests.unit.grpo.test_rewards:wrong_length' returned 1 values for 2"):
        compute_rewards(texts[:1] + texts[2:], [item] * 2, ["tests.unit.grpo.test_rewards:wrong_length"])


@pytest.mark.parametrize("entry, says", [
    ("tests.unit.grpo.test_rewards:one_argument", r"cannot be called as fn\(completion, item\): too many positional"),
    ("tests.unit.grpo.test_rewards:NotAFunction", "is a class, not a function"),
    ("missing_file.py:fn", "file 'missing_file.py' does not exist"),
    ("broken.py:fn", "file 'broken.py' fails to load: SyntaxError"),
    ("tests.unit.grpo.test_rewards:", "is not an import path"),
])
def test_bad_plugin_entries_name_the_entry_and_what_is_wrong(entry, says, tmp_path, monkeypatch) -> None:
    from grasp_lightning.tasks.grpo import GRPOTask, RewardConfig

    (tmp_path / "broken.py").write_text("def fn(completion, item):\n    return (\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GraspConfigError, match=says) as info:
        GRPOTask(reward=RewardConfig(terms=["accuracy", entry], weights=[1.0, 1.0]))
    assert "model.task.init_args.reward.terms" in str(info.value) and entry in str(info.value)


def test_metric_labels_are_function_names_and_must_be_distinct(tmp_path, monkeypatch) -> None:
    from grasp_lightning.tasks.grpo import GRPOTask, RewardConfig

    (tmp_path / "a.py").write_text(FILE_REWARD)
    (tmp_path / "b.py").write_text(FILE_REWARD)
    monkeypatch.chdir(tmp_path)
    task = GRPOTask(reward=RewardConfig(terms=["accuracy", "a.py:brevity", answer_is_b], weights=[1.0, 0.5, 0.5]))
    assert task.reward_labels == ["accuracy", "brevity", "answer_is_b"]
    with pytest.raises(GraspConfigError, match=r"share a metric name in \['brevity', 'brevity'\]"):
        GRPOTask(reward=RewardConfig(terms=["a.py:brevity", "b.py:brevity"], weights=[1.0, 1.0]))


def numeric_string(completion: str, item: GraspItem) -> float:
    """A broken plugin: a number written as a string."""
    return "1.0"


def raises(completion: str, item: GraspItem) -> float:
    """A broken plugin: raises."""
    raise KeyError("boom")


def raises_batched(completions: list[str], items: list[GraspItem]) -> list[float]:
    """A broken batched plugin: raises."""
    raise RuntimeError("model down")


@pytest.mark.parametrize("entry, says", [
    ("tests.unit.grpo.test_rewards:numeric_string", r"returned '1.0' for item t \(test:1\); a reward must return a finite"),
    ("tests.unit.grpo.test_rewards:raises", r"reward 'tests.unit.grpo.test_rewards:raises' raised KeyError: 'boom' on item t \(test:1\)"),
    ("tests.unit.grpo.test_rewards:raises_batched", r"raised RuntimeError: model down on a batch of 2 completions, the first "
                                          r"of item t \(test:1\)"),
])
def test_a_reward_that_raises_or_returns_a_string_is_named_with_its_item(entry, says) -> None:
    with pytest.raises(GraspConfigError, match=says):
        compute_rewards(["<answer>B</answer>", "<answer>A</answer>"], [make_item()] * 2, [entry])


# --- enumeration: naming every person the item shows ------------------------------------------------

def test_enumerates_and_the_training_enumeration_rate() -> None:
    """``enumerates`` against ``persons_shown`` (question, options, gt), and ``grounding/enumeration_rate``
    of the GRPO step metrics: among completions with gt that name someone, the share naming all shown."""
    from grasp_lightning.data.formats import persons_shown
    from grasp_lightning.grpo.rewards import enumerates
    from grasp_lightning.tasks.grpo import _grounding_metrics

    item = make_item(events=(("gaze", (0, 1)),))  # the question names Person 3; options 0, 1, 2
    assert persons_shown(item) == {0, 1, 2, 3}
    assert persons_shown(make_item(events=(("gaze", (5,)),))) == {0, 1, 2, 3, 5}
    assert enumerates({0, 1, 2, 3}, {0, 1, 2, 3}) and enumerates({0, 1, 2, 3, 7}, {0, 1, 2, 3})
    assert not enumerates({0, 1, 2}, {0, 1, 2, 3}) and not enumerates({0}, {0}) and not enumerates(set(), set())
    no_gt = make_item(events=())
    texts = [think("Person 0, P1, Person 2 and Person 3."),  # enumerates; P = 2/4, R = 1
             think("Person 0 looks at Person 1."),  # does not; P = 1, R = 1
             think("Someone looks."),  # names nobody: P = R = 0, not in the rate
             think("P0 P1 P2 P3"),  # enumerates; P = 2/4, R = 1
             think("Person 0, Person 1, Person 2, Person 3"), think("P0")]  # no gt: left out of everything
    out, without = _grounding_metrics(texts, [item, item, no_gt], k=2)
    assert without == 2
    assert out == {"grounding/precision": (0.5 + 1.0 + 0.0 + 0.5) / 4, "grounding/recall": 3 / 4,
                   "grounding/enumeration_rate": 2 / 3}
    assert _grounding_metrics([think("Someone.")] * 2, [item], k=2)[0] == {"grounding/precision": 0.0,
                                                                           "grounding/recall": 0.0}


#: (name, events, reasoning, by modality, pooled ``social_grounding``), worked by hand.
BY_MODALITY_GOLDEN = [
    # gaze gt {2, 0}; <gaze> names {2, 0}: (1 + 1) * 1 = 2 in the only modality with anything in it
    ("gaze-right", (("gaze", (2, 0)),), "<gaze>Person 2 looks at Person 0.</gaze>", 2.0, 2.0),
    # the same people written as a false pointing sentence: gaze has gt, nobody named -> 0; gesture named
    # {2, 0} without gt -> 0; mean 0. Pooled, the people match: 2.
    ("wrong-modality", (("gaze", (2, 0)),), "<gesture>Person 2 points at Person 0.</gesture>", 0.0, 2.0),
    # the shortcut's reasoning: the point (3 -> 0), then the gaze (2 -> 0): gaze 2.0, gesture {3, 0} without gt 0
    # -> 1.0; pooled {3, 2, 0} against {2, 0}: P 2/3, R 1 -> 4/3
    ("point-then-gaze", (("gaze", (2, 0)),),
     "<gesture>Person 3 points at Person 0.</gesture><gaze>Person 2 looks at Person 0.</gaze>", 1.0, 4 / 3),
    # two modalities with gt: gaze {0, 1} named {0}: (1 + 1/2) * 1 = 1.5; gesture {2, 3} named {2, 3, 1}:
    # (1 + 1) * 2/3 = 4/3 -> mean 17/12; pooled {0, 1, 2, 3} named {0, 1, 2, 3}: 2
    ("both", (("gaze", (0, 1)), ("pointing", (2, 3))),
     "<gaze>Person 0 looks.</gaze><gesture>Person 2 points at Person 3 and Person 1.</gesture>", 17 / 12, 2.0),
    # nobody tagged at all: gaze has gt, nothing named -> 0
    ("untagged", (("gaze", (0,)),), "Person 0 looks at the object.", 0.0, 2.0),
]


@pytest.mark.parametrize("name, events, reasoning, expected, pooled", BY_MODALITY_GOLDEN,
                         ids=[case[0] for case in BY_MODALITY_GOLDEN])
def test_grounding_by_modality_golden(name, events, reasoning, expected, pooled) -> None:
    item = make_item(events=events)
    text = think(reasoning)
    assert REWARDS["social_grounding_by_modality"](text, item) == pytest.approx(expected, abs=1e-12)
    assert REWARDS["social_grounding"](text, item) == pytest.approx(pooled, abs=1e-12)


def test_grounding_by_modality_reads_the_reasoning_only_and_needs_events() -> None:
    item = make_item(events=(("gaze", (0,)),))
    after = "<gaze>Person 1 looks.</gaze></think><answer>B</answer><gaze>Person 0 looks.</gaze>"
    assert REWARDS["social_grounding_by_modality"]("<think>" + after, item) == 0.0  # the answer's tags do not count
    assert REWARDS["social_grounding_by_modality"](after, item, opened_think=True) == 0.0
    assert REWARDS["social_grounding_by_modality"](think("<gaze>Person 0</gaze>"), make_item(events=())) == 0.0


TEMPORAL_TERMS = ["accuracy", "format", "grounding_presence", "social_grounding", "temporal_grounding"]
TEMPORAL_WEIGHTS = [1.0, 0.1, 0.05, 0.2, 0.2]


def make_timed_item(spans: tuple[tuple[float, float] | None, ...] = ((1.0, 3.0),), persons=(0, 1)) -> GraspItem:
    """An RL item with one gaze event per entry of ``spans`` (``None``: an event without a time)."""
    return GraspItem(
        uid="tmp", origin="test:1", clip=ClipRef(path="x/video/c_qa0000.mp4"),
        question="Whom does Person 0 look at?\nA) Person 0\nB) Person 1\nC) Person 2\nD) No one",
        options=("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"), answer="B",
        events=tuple(SocialEvent("gaze", tuple(persons), "gaze", span=s) for s in spans),
    )


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
    assert temporal_grounding(completion, make_timed_item(spans)) == expected


def test_temporal_grounding_after_an_opened_think_mirrors_social_grounding() -> None:
    item = make_timed_item()
    text = "Person 0 looks from 1s to 3s.</think><answer>B</answer>"
    assert temporal_grounding(text, item, opened_think=True) == 1.0
    assert temporal_grounding(text, item) == 1.0  # no <think>: everything before </think>
    # a second, opened <think> after a Thinking prompt: the reasoning is up to the first </think>
    both = "from 1s to 3s <think>from 5s to 6s</think><answer>B</answer>"
    assert temporal_grounding(both, item, opened_think=True) == 1 / 2
    assert temporal_grounding(both, item) == 0.0  # without the flag, the <think> block's content only
    assert REWARDS["social_grounding"].takes_flag and REWARDS["temporal_grounding"].takes_flag


def test_temporal_grounding_vision_placeholder_is_zero() -> None:
    assert temporal_grounding(think("from 1s to 3s <|video_pad|>"), make_timed_item()) == 0.0


# --- composition with the paper's terms ------------------------------------------------------------

def test_compute_rewards_with_the_temporal_term_and_the_task_weighting() -> None:
    """The five-term list through ``compute_rewards`` and ``GRPOTask.advantages``' weighted sum."""
    from grasp_lightning.tasks.grpo import GRPOTask, RewardConfig

    item = make_timed_item(((1.0, 3.0),), persons=(0, 1))
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
    task = GRPOTask(reward=RewardConfig(terms=TEMPORAL_TERMS, weights=TEMPORAL_WEIGHTS))
    assert task.reward_labels == TEMPORAL_TERMS
    terms = compute_rewards(completions, [item] * 4, task.reward_terms)
    expected = torch.tensor([
        [1.0, 1.0, 1.0, 2.0, 1.0],
        [0.0, 1.0, 1.0, 1.0, 0.5],
        [1.0, 1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 0.0, 1.5, 1 / 3],
    ])
    torch.testing.assert_close(terms, expected, rtol=0, atol=0)
    assert compute_rewards(completions, [item] * 4, TEMPORAL_TERMS).equal(terms)  # names resolve to the same terms
    rewards, _ = task.advantages(terms, k=2)
    # 1 + 0.1 + 0.05 + 0.4 + 0.2; 0.1 + 0.05 + 0.2 + 0.1; 1 + 0.1; 1 + 0.1 + 0.3 + 0.2/3
    torch.testing.assert_close(rewards, torch.tensor([1.75, 0.45, 1.1, 1.1 + 0.3 + 0.2 / 3]))
    torch.testing.assert_close(rewards, terms @ torch.tensor(TEMPORAL_WEIGHTS), rtol=0, atol=0)
