"""Tests of grasp_lightning.parsing: answer extraction order, tags, reasoning, participants, format, time spans
and their temporal IoU (golden values)."""

from __future__ import annotations

import pytest

from grasp_lightning.parsing import (
    answer_block,
    extract_answer,
    extract_participants,
    extract_participants_released,
    has_format,
    opens_think,
    parse_time_spans,
    reasoning_text,
    tag_contents,
    temporal_iou,
)

GOOD = "<think>Person 0 looks at <gaze>Person 2</gaze>.</think><answer>B</answer>"


# --- extract_answer -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>B</answer>", "B"),
        ("<answer>  C \n</answer>", "C"),
        ("<answer>B) Person 2</answer>", "B"),
        ("<answer>(D)</answer>", "D"),
        ("<answer>A.</answer>", "A"),
        ("<answer>C: No one</answer>", "C"),
        (GOOD, "B"),
    ],
)
def test_answer_tag_stage(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_only_first_answer_block_counts() -> None:
    assert extract_answer("<answer>C</answer> then <answer>A</answer>") == "C"


def test_boxed_stage() -> None:
    assert extract_answer("I think the answer is \\boxed{D}.") == "D"
    # Stage 2 wins over stage 3: "A)" appears first but \boxed is tried before markers.
    assert extract_answer("Options A) and \\boxed{C}") == "C"


def test_marker_stage() -> None:
    assert extract_answer("The correct option is C) Person 4") == "C"
    assert extract_answer("So: B. Person 2 follows") == "B"
    # Not markers: glued to a word, or the last letter of an abbreviation.
    assert extract_answer("in the U.S.A. today") is None
    assert extract_answer("xA) nothing") is None


def test_leading_letter_stage() -> None:
    assert extract_answer("B") == "B"
    assert extract_answer("  D because Person 1 points") == "D"
    # A leading letter followed by another letter is a word, not an answer.
    assert extract_answer("Because of the gaze") is None
    assert extract_answer("E") is None  # not one of ABCD


def test_lowercase_letter_is_not_an_answer_but_extraction_continues() -> None:
    assert extract_answer("<answer>b</answer>") is None
    # Stage 1 fails on "b", stage 2 finds the boxed capital.
    assert extract_answer("\\boxed{A} <answer>b</answer>") == "A"
    assert extract_answer("\\boxed{a}") is None


def test_answer_block_content_searched_before_the_whole_text() -> None:
    text = "<think>A) Person 0 is wrong</think><answer>The answer is C) Person 4</answer>"
    assert extract_answer(text) == "C"


def test_no_tags_nothing_parses() -> None:
    assert extract_answer("the people look at each other") is None
    assert extract_answer("") is None
    assert extract_answer("<answer></answer>") is None


def test_custom_letters() -> None:
    assert extract_answer("<answer>E</answer>", letters="ABCDE") == "E"
    assert extract_answer("<answer>E</answer>") is None


# --- blocks and reasoning --------------------------------------------------------------------------

def test_answer_block() -> None:
    assert answer_block("x <answer> B </answer> <answer>C</answer>") == " B "
    assert answer_block("<answer></answer>") == ""
    assert answer_block("no tags") is None
    assert answer_block("<answer>unterminated") is None


def test_tag_contents_non_greedy_multiline() -> None:
    text = "<gaze>P1 at\nP2</gaze> mid <gaze>P3</gaze><gesture>Person 4</gesture>"
    assert tag_contents(text, "gaze") == ["P1 at\nP2", "P3"]
    assert tag_contents(text, "gesture") == ["Person 4"]
    assert tag_contents(text, "think") == []


def test_reasoning_text() -> None:
    assert reasoning_text("<think>why</think><answer>A</answer>") == "why"
    # Prompt ended with "<think>\n": the completion starts inside the block.
    assert reasoning_text("Person 1 looks</think><answer>A</answer>") == "Person 1 looks"
    assert reasoning_text("Person 3 points <answer>A</answer> Person 9") == "Person 3 points "
    assert reasoning_text("just text") == "just text"


# --- participants ----------------------------------------------------------------------------------

def test_person_1_vs_person_12() -> None:
    assert extract_participants("Person 12 waves") == frozenset({12})
    assert extract_participants("Person 1 and Person 12") == frozenset({1, 12})
    assert extract_participants("Person\n\t3 and Person7") == frozenset({3, 7})


def test_p_short_form_needs_word_boundaries() -> None:
    assert extract_participants("P3 looks at P12.") == frozenset({3, 12})
    assert extract_participants("AP1 and P1a and P2_x") == frozenset()
    assert extract_participants("(P0)") == frozenset({0})


def test_person_is_case_sensitive() -> None:
    assert extract_participants("person 2 and PERSON 3") == frozenset()
    assert extract_participants("p4") == frozenset()


# --- format ----------------------------------------------------------------------------------------

def test_has_format_lenient() -> None:
    assert has_format("blah <answer>B</answer>")
    assert not has_format("<answer>  </answer>")
    assert not has_format("B")


def test_has_format_strict() -> None:
    assert has_format(GOOD, strict=True)
    assert has_format("  <think>x</think>\n<answer>A</answer>\n", strict=True)
    assert not has_format("<answer>A</answer>", strict=True)
    assert not has_format("pre <think>x</think><answer>A</answer>", strict=True)
    assert not has_format("<think>x</think><answer>A</answer> post", strict=True)
    assert not has_format("<think>x</think><answer>A</answer><answer>B</answer>", strict=True)
    assert not has_format("<think> </think><answer>A</answer>", strict=True)
    assert not has_format("<answer>A</answer><think>x</think>", strict=True)


# --- Thinking prompts (the generation prompt opened <think>) and the released person pattern -------

def test_opens_think() -> None:
    assert opens_think("<|im_start|>assistant\n<think>\n")
    assert opens_think("...assistant\n<think>")
    assert not opens_think("<|im_start|>assistant\n")
    assert not opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking switched off
    assert not opens_think("<think>x")


def test_has_format_strict_after_a_thinking_prompt() -> None:
    inside = "Person 0 looks.\n</think>\n\n<answer>B</answer>"
    assert has_format(inside, strict=True, opened_think=True)
    assert not has_format(inside, strict=True)  # Instruct prompt: no <think> was opened
    assert not has_format(GOOD, strict=True, opened_think=True)  # a second <think>
    assert not has_format(" \n</think><answer>B</answer>", strict=True, opened_think=True)  # empty thinking
    assert not has_format("x</think><answer>B</answer> more", strict=True, opened_think=True)
    assert has_format(inside, opened_think=True) and has_format(inside)  # lenient: only <answer> matters


def test_reasoning_text_after_a_thinking_prompt() -> None:
    assert reasoning_text("Person 1 looks</think><answer>A</answer>", opened_think=True) == "Person 1 looks"
    # The reasoning is what precedes the first </think>, even when a block is re-opened inside it.
    text = "P1 looks</think><think>P2</think><answer>A</answer>"
    assert reasoning_text(text, opened_think=True) == "P1 looks"
    assert reasoning_text(text) == "P2"
    assert reasoning_text("P1 looks and then", opened_think=True) == "P1 looks and then"  # truncated in thought


def test_released_person_pattern() -> None:
    # (?:Person\s+|\bP)(\d+): a space is needed after "Person"; "P" needs a boundary before only.
    assert extract_participants_released("Person 0, Person\n12, P3, P4a, P5_") == {0, 12, 3, 4, 5}
    assert extract_participants_released("Person12 and AP1") == frozenset()
    assert extract_participants("Person12 and AP1 and P4a") == {12}  # our pattern differs at the edges


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
