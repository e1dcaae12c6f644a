"""Entries of the sample data: a question bound to its clip, options, letter and reasoning.

:class:`Clip` is one mp4 file of the dataset (its name and path inside the train archives),
:class:`Entry` the question on it with everything a row needs: the lettered options, the answer
letter, the ``<think>`` reasoning with its ``<gaze>`` and ``<gesture>`` blocks (:func:`reasoning_text`)
and the user turn (:func:`user_text`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from grasp_lightning.data.formats import user_text as formats_user_text
from grasp_lightning.data.prompts import INSTRUCTION
from grasp_lightning.synthetic.sample.drawing import Action
from grasp_lightning.synthetic.sample.questions import Question, make_options, person_name

#: Instruction ending the open-ended user turns (MCQ turns end with :data:`grasp_lightning.data.prompts.INSTRUCTION`).
OPEN_INSTRUCTION = ("Think step by step about the gaze and gesture interactions, describe them in <gaze> and "
                    "<gesture> tags, and give your answer in two to four sentences in <answer> tags.")


@dataclass(frozen=True)
class Clip:
    """One clip file of the sample data.

    Attributes:
        source: source dataset, e.g. ``"werewolf"``.
        video_id: id of the source video (may contain dots and underscores).
        index: QA number within the video (the ``NNNN`` of ``<video_id>_qa<NNNN>.mp4``).
        duration: clip length in seconds.
        resolution: ``(height, width)`` in pixels.
        data: the mp4 bytes.
        n_persons: persons visible.
    """

    source: str
    video_id: str
    index: int
    duration: float
    resolution: tuple[int, int]
    data: bytes
    n_persons: int

    @property
    def name(self) -> str:
        """File name ``<video_id>_qa<NNNN>.mp4``."""
        return f"{self.video_id}_qa{self.index:04d}.mp4"

    @property
    def train_path(self) -> str:
        """Path inside the extracted train archives: ``<source>/video/<clip>.mp4``."""
        return f"{self.source}/video/{self.name}"


@dataclass(frozen=True)
class Entry:
    """A question bound to its clip, options and targets.

    Attributes:
        clip: the clip.
        question: the question.
        fmt: ``"mcq"`` or ``"open_ended"``.
        options: ``"A) ..."`` strings (empty for open-ended).
        letter: the MCQ answer letter ("" for open-ended).
        reasoning: ``<think>...</think>`` with ``<gaze>`` and ``<gesture>`` blocks.
    """

    clip: Clip
    question: Question
    fmt: str
    options: tuple[str, ...]
    letter: str
    reasoning: str

    @property
    def answer(self) -> str:
        """The letter (MCQ) or the 2-4 sentence reference answer (open-ended)."""
        return self.letter if self.fmt == "mcq" else self.question.summary

    @property
    def response(self) -> str:
        """The SFT target: reasoning then ``<answer>...</answer>``."""
        return f"{self.reasoning}<answer>{self.answer}</answer>"


#: The verb of each action kind in a reasoning sentence ("Person 0 looks at Person 2").
VERBS = {"gaze": "looks at", "pointing": "points at", "reaching": "reaches toward",
         "showing": "shows an object to", "giving": "gives an object to"}


def describe(action: Action, short: bool = False) -> str:
    """One sentence for a drawn action, e.g. ``"Person 0 looks at Person 2 from 0.5s to 3.5s."``."""
    return (f"{person_name(action.actor, short)} {VERBS[action.kind]} {person_name(action.target, short)} "
            f"from {action.start}s to {action.end}s.")


def reasoning_text(q: Question, n_persons: int, conclusion: str, short: bool = False) -> str:
    """The ``<think>`` block: scene, ``<gaze>`` and ``<gesture>`` descriptions, conclusion."""
    if q.narration is not None:
        gaze, gesture = q.narration
    else:
        ordered = sorted(q.actions, key=lambda a: (a.start, a.actor))
        gaze = " ".join(describe(a, short) for a in ordered if a.kind == "gaze") or "No one looks at anyone in particular."
        gesture = " ".join(describe(a, short) for a in ordered if a.kind != "gaze") or "No one gestures."
    return (f"<think>There are {n_persons} people in the clip. <gaze>{gaze}</gaze> <gesture>{gesture}</gesture> "
            f"{conclusion}</think>")


def make_entry(rng: random.Random, q: Question, clip: Clip, fmt: str, short: bool = False,
               position: int | None = None) -> Entry:
    """Bind a question to its clip: options, letter (at ``position``) and reasoning (``short`` writes ``PN``)."""
    if fmt == "open_ended":
        think = reasoning_text(q, clip.n_persons, "Putting these together answers the question.", short)
        return Entry(clip, q, fmt, (), "", think)
    options, letter = make_options(rng, q, position)
    think = reasoning_text(q, clip.n_persons, f"So the answer is {q.answer_text}.", short)
    return Entry(clip, q, fmt, options, letter, think)


def user_text(entry: Entry, instruction: str = INSTRUCTION) -> str:
    """The user turn: question, options one per line, then ``instruction`` (MCQ) or the open-ended one."""
    if entry.fmt == "open_ended":
        return f"{entry.question.text}\n{OPEN_INSTRUCTION}"
    return mcq_user_text(entry.question.text, entry.options, instruction)


def mcq_user_text(question: str, options: Sequence[str], instruction: str = INSTRUCTION) -> str:
    """An MCQ user turn: the question and its options one per line (:func:`grasp_lightning.data.formats.user_text`),
    then ``instruction``."""
    return f"{formats_user_text(question, options)}\n{instruction}"

