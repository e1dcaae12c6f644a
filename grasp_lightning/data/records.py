"""Typed records of the GRASP data: QA items, clip references and ground-truth social events.

Every reader in :mod:`grasp_lightning.data.formats` returns :class:`GraspItem` objects; everything
downstream (prompts, rewards, bench scoring) reads only these. Schemas: ``docs/data-format.md``
and the GRASP dataset card (arXiv 2605.15764, Sec. 3).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grasp_lightning.errors import GraspFormatError

#: The 16 GRASP categories in the paper's table order (gaze T1-T6, gesture G1-G6, joint J1-J4).
CATEGORIES: tuple[str, ...] = (
    "T1", "T2", "T3", "T4", "T5", "T6",
    "G1", "G2", "G3", "G4", "G5", "G6",
    "J1", "J2", "J3", "J4",
)
#: Category groups as reported in the paper's Table 1.
GROUPS: dict[str, tuple[str, ...]] = {
    "gaze": CATEGORIES[0:6],
    "gesture": CATEGORIES[6:12],
    "joint": CATEGORIES[12:16],
}
#: Canonical difficulty of each category (GRASP paper, Table of categories).
CATEGORY_DIFFICULTY: dict[str, str] = {
    "T1": "easy", "T2": "easy", "T3": "medium", "T4": "medium", "T5": "hard", "T6": "hard",
    "G1": "easy", "G2": "easy", "G3": "medium", "G4": "medium", "G5": "hard", "G6": "hard",
    "J1": "medium", "J2": "medium", "J3": "hard", "J4": "hard",
}
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
FORMATS: tuple[str, ...] = ("mcq", "open_ended")


def normalise_category(code: str, where: str) -> str:
    """Return the canonical category code (``T1``..``J4``); the bench's ``C1``..``C4`` map to ``J1``..``J4``.

    Args:
        code: the category as written in the data (case and surrounding spaces are ignored).
        where: file and line (or item) used in the error message.

    Raises:
        GraspFormatError: if ``code`` is not one of the 16 categories (or C1-C4).
    """
    norm = str(code).strip().upper()
    if len(norm) == 2 and norm[0] == "C" and norm[1] in "1234":
        norm = "J" + norm[1]
    if norm not in CATEGORIES:
        raise GraspFormatError(where, f"unknown category {code!r} (expected one of T1-T6, G1-G6, J1-J4 or C1-C4)")
    return norm


def category_group(category: str) -> str:
    """Return ``"gaze"``, ``"gesture"`` or ``"joint"`` for a canonical category code."""
    return {"T": "gaze", "G": "gesture", "J": "joint"}[category[0]]


@dataclass(frozen=True)
class SocialEvent:
    """A ground-truth social event of a clip.

    Attributes:
        source: ``"gaze"`` or ``"gesture"``; any source other than gaze is a gesture event
            (``docs/data-format.md``, data_rl.jsonl).
        persons: 0-based person ids taking part, in the order given by the data.
        kind: the source string exactly as written in the data (e.g. ``"pointing"``, ``"Gaze"``), for
            reports and for the released-code reward variant, which calls only ``"gaze"`` gaze; ``""``
            for an event built in code (then :attr:`source` stands for it).
        span: ``(start, end)`` seconds from the clip start when the data gives the event's time
            (optional keys ``start_seconds``/``end_seconds``; ``0 <= start < end``), else ``None``.
            Read by the ``temporal_grounding`` reward (:mod:`grasp_lightning.grpo.rewards`).
    """

    source: str
    persons: tuple[int, ...]
    kind: str = ""
    span: tuple[float, float] | None = None
    #: The ``persons`` list exactly as written in the data (ints, or the digit strings and integral
    #: floats the reader tolerates), ``None`` for an event built in code; not part of equality. Read
    #: only by the released-code reward variant, which compares ids as Python values (a digit string
    #: ``"1"`` is never Person 1 there). See ``docs/released-recipe.md``.
    persons_written: tuple | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ClipRef:
    """Where a clip lives and which part of it to sample.

    Attributes:
        path: path relative to the extracted videos root, e.g.
            ``"social_gesture/video/153_1_001_qa0000.mp4"`` (train) or ``"video/x.mp4"`` (bench).
        fps: sampling rate in frames per second requested by the data (the DataModule may override).
        start_seconds: first second to sample, ``None`` for the clip start.
        end_seconds: last second to sample, ``None`` for the clip end.
        src_resolution: source ``(height, width)`` in pixels when the data gives it.
    """

    path: str
    fps: float = 2.0
    start_seconds: float | None = None
    end_seconds: float | None = None
    src_resolution: tuple[int, int] | None = None


@dataclass(frozen=True)
class GraspItem:
    """One question about one clip (or image, or both), from any GRASP or generic QA file.

    Attributes:
        uid: unique id (the annotation ``id``, the bench clip stem, or ``"<file>:<line>"``).
        origin: ``"<file>:<line>"`` or ``"<archive>:<member>"``, used in every error and skip log.
        clip: the clip to decode; ``None`` for an image-only row of the generic QA format
            (:mod:`grasp_lightning.data.qa`). Every GRASP file and evaluation suite gives one.
        question: the full user text shown to the model (question, options, instructions).
        options: option strings such as ``"A) Person 0"``; empty for open-ended items.
        answer: the target letter (MCQ) or the reference text (open-ended).
        response: the assistant training target for SFT rows (``<think>...</think><answer>..</answer>``),
            ``None`` where there is none.
        category: canonical category (``T1``..``J4``) or ``None`` when the file does not say.
        difficulty: ``easy``/``medium``/``hard`` or ``None``.
        format: ``"mcq"`` or ``"open_ended"``.
        source: the source dataset (``social_gesture``, ``werewolf``, ...) or ``None``.
        events: ground-truth social events (RL rows, bench items that carry them).
        question_text: the bare question as the row gives it: ``meta.question_text`` of RL/SFT rows
            (``None`` when the meta has none, ``""`` when it is empty: the reader keeps what the row
            says), the ``question`` of annotation, bench and generic QA rows. The released-code reward
            variant leaves out the people it names (none when it is ``None`` or empty, as the released
            code); :func:`grasp_lightning.data.formats.question_only` gives a prompt's bare question.
        reasoning: reference reasoning of a bench item, if any.
        time_range: ``(start, end)`` seconds from the clip start the question is about, if any.
        image: path of an image shown before the clip (or alone), ``None`` for none; generic QA rows
            only, resolved when read (:func:`grasp_lightning.data.qa.read_qa`).
        persons: ground-truth participants given without an event (a generic QA row's
            ``participants``); part of :attr:`participants`, matched by neither modality of the
            released-code reward variant (which reads ``events`` only).
        extra: a generic QA row's columns that the format does not read, by name, with their JSON
            values as written (``{"difficulty_score": 0.7}``); empty for the GRASP files. A reward
            gets them on its ``item`` (as TRL passes dataset columns to reward functions). Not part
            of equality.
    """

    uid: str
    origin: str
    clip: ClipRef | None
    question: str
    options: tuple[str, ...] = ()
    answer: str = ""
    response: str | None = None
    category: str | None = None
    difficulty: str | None = None
    format: str = "mcq"
    source: str | None = None
    events: tuple[SocialEvent, ...] = field(default_factory=tuple)
    question_text: str | None = None
    reasoning: str | None = None
    time_range: tuple[float, float] | None = None
    image: str | None = None
    persons: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def participants(self) -> frozenset[int]:
        """The union of the person ids of all ground-truth events and :attr:`persons` (``P_gt`` of the SGR)."""
        return frozenset(p for e in self.events for p in e.persons) | frozenset(self.persons)

    @property
    def media(self) -> tuple[str, ...]:
        """What the prompt shows, in prompt order: ``("image",)``, ``("video",)`` or ``("image", "video")``."""
        return (("image",) if self.image is not None else ()) + (("video",) if self.clip is not None else ())

    def replace(self, **changes: object) -> "GraspItem":
        """Return a copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)
