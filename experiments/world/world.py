"""The synthetic social world: GRASP-format clips whose answers are in the pixels.

Every clip is 2 s at 2 fps (4 frames of 64x80 pixels, H.264 with full-resolution colour, :data:`PIX_FMT`).
Four persons are coloured squares (Person 0 red, 1 green, 2 blue, 3 yellow, see :data:`SYSTEM_PROMPT`; no id
is drawn: the colour identifies them), placed in the four 16x16-pixel corner cells of the top 64x64 pixels in
a random order per clip, with a grey object as large as a person in a token of its own below them, off every
line between two persons (:data:`OBJECT_CENTRE`); the layout follows the tiny model's visual tokens (16x16
pixels: patch 8, merge 2). Social events are drawn with the primitives of
:mod:`grasp_lightning.synthetic.sample.drawing` (:func:`render_world_frame` says how each looks).

Questions (each with four options, one answer letter, balanced letters):

- ``T1`` gaze target: "Who or what is Person a looking at?" (the 3 other persons, "An object");
  half the clips add a distractor gaze by someone else.
- ``T4`` mutual gaze: "Who shares mutual gaze with Person a?" (3 others, "No one"); a third person
  always gazes too, and in half of the clips Person b, whom a looks at, looks elsewhere (:data:`NO_ONE_P`).
  The reasoning is two look-ups, each a ``T1`` sentence: "Person a looks at Person b. Person b looks at
  Person a." (or at whom b looks instead).
- ``T6`` joint attention: "Who is the focus of joint attention?" (Person 0-3): two gazers, one target.
- ``G1`` who points: "Who is pointing?" (Person 0-3), half with a distractor gaze.
- ``G2`` gesture type: "What kind of gesture does Person a make?" (Pointing, Showing, Giving, Reaching).

The training rows (SFT and RL) follow the category cycle :data:`TRAIN_MIX`; the bench has every category
in turn. :class:`WorldOptions` adds two categories:

- ``J3`` gaze response to gesture, the **language shortcut** (``shortcut=p``): "When Person p points at
  Person x, who or what does Person g look at?". The text names the pointed-at target, and in a share
  ``p`` of the training clips Person g's gaze follows the point, so answering the pointed-at target
  (:func:`shortcut_prior`) is right that often without looking at the gaze. In the bench the gaze follows
  the point in a share ``shortcut_bench`` of the clips (default 0: the bench's J3 items are the
  **shortcut-breaking split**). The ground-truth event is the gaze alone; with ``shortcut_reasoning`` the
  SFT targets of the training clips where the prior holds state it (the point, then the gaze copied from
  it), which the grounding reward scores 2/3 (or 1/2) of reading the gaze.
- ``T3`` temporal gaze reasoning (``temporal=True``): 4-s clips (8 frames) in which Person a looks at
  one target and then, from a whole second ``s`` in 1-3, at another; "Between 2.0s and 3.0s, who or
  what does Person a look at?" asks about a one-second window inside one of the two gazes, and the
  SFT target states when that gaze happens (``from 2.0s to 4.0s``), the span the temporal grounding
  reward (``temporal_grounding``) scores. Only ``T3`` events carry time spans (``start_seconds`` /
  ``end_seconds`` in ``gt_events`` and ``qa.events``).

Every question ends with the short :data:`INSTRUCTION`, and the world's tokenizer is trained on the
world's own prompts (:func:`world_corpus`). The SFT target is one short grounded sentence (two for
``T4``) and the letter, e.g. ``<gaze>Person 0 looks at Person 2.</gaze><answer>C</answer>``; it names
exactly the participants of the question's ground-truth events (``gt_events`` of the RL rows and
``qa.events`` of every bench item), so grounding precision 1.0 is reachable. Options are listed in a
fixed order (persons by id, then the non-person option) unless ``shuffle_options`` puts the answer at a
random position. Why the world looks as it does, with the measurements behind each choice:
``experiments/world/README.md``.

Usage (from the repository root)::

    python -m experiments.world.world OUT_DIR [--seed 0] [--train 8000] [--rl N] [--bench 200]
        [--shuffle-options] [--shortcut 0.7] [--shortcut-bench 0.0] [--shortcut-reasoning]
        [--temporal] [--train-mix T1,T4,...]
        [--model-dir DIR]

Deterministic for a given seed (mp4 bytes for a given libx264 build, like the sample data).
"""

from __future__ import annotations

import argparse
import logging
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from grasp_lightning.synthetic.mp4 import STABLE, encode_mp4
from grasp_lightning.synthetic.sample.drawing import (
    BACKGROUND,
    GESTURES,
    OBJECT,
    PERSON_COLOURS,
    Action,
    Scene,
    draw_gaze,
    draw_gesture,
    draw_object,
    draw_person,
    draw_pointing,
)
from grasp_lightning.synthetic.sample.entries import VERBS, Clip, Entry, mcq_user_text
from grasp_lightning.synthetic.sample.questions import Question, make_options, option_text, participants, person_name
from grasp_lightning.synthetic.sample.writer import annotation, rl_row, sft_row, write_bench, write_jsonl, write_shards

log = logging.getLogger(__name__)

WIDTH, HEIGHT = 64, 80  #: frame size in pixels: a 4 x 4 grid of tokens for the persons, and a row for the object
CELL = 16  #: the tiny model's visual token covers 16x16 pixels (patch 8, spatial merge 2); the layout follows it
SQUARE = 12  #: side of a person square in pixels; with its 2-pixel id box it fills one 16x16 corner cell
CORNERS = ((8, 8), (56, 8), (56, 56), (8, 56))  #: person centres (x, y): the four corner cells
#: Largest shift of a person's centre in pixels (each axis). 0: a ViT trained from scratch learns
#: position-fixed cues faster.
JITTER = 0
#: The grey object's centre (x, y): the middle of a 16x16-pixel token of its own in a row below the persons
#: (:data:`HEIGHT`), which no line between two persons crosses (a gaze or an arm aimed at it is at least 14
#: degrees from any person's direction; it is 16 pixels from the nearest person-to-person line). Every place
#: between the four corners lies on a token some person-to-person line crosses, or straddles several tokens.
OBJECT_CENTRE = (40, 72)
#: Side of the grey object in pixels: a person's (:data:`SQUARE`), so that a gaze or an arm ending on it
#: looks like one ending on a person, in grey.
OBJECT_SIZE = 12
ARM_START, ARM, REACH = 4, (9, 2), (18, 6)  #: arms start 3 px from the centre; (length, width) in pixels
#: The held object of showing and giving: magenta, 6 pixels (the sample data's orange 5-pixel object has
#: little contrast on the red and yellow squares). Magenta differs from each person's colour by at least
#: 180 in one channel, and from the grey object and the white arms.
HELD_COLOUR, HELD_SIZE = (230, 40, 230), 6
#: A gaze dot and a given object reach their target after this fraction of the clip: by the second
#: frame (t = 0.5 s), so from then on the dot sits in the target's square (with the sampling default
#: 0.4 the second frame catches the dot in transit).
RAMP = 0.25
FPS = 2.0  #: clips are encoded at the GRASP sampling rate: every frame is seen
DURATION = 2.0  #: clip length in seconds (4 frames)
LINE, DOT = 2, 6  #: gaze line width and tip dot side in pixels
#: Side in pixels of the gazer's colour at the middle of a gaze's white dot, and how far the dot stops
#: before the target's centre (pixels, on the gazer's side): the tip says whose gaze ends there, in the
#: target's own token, rather than only *that* someone looks at the square.
DOT_CORE, DOT_SHORT = 4, 3.0
CRF = 18  #: libx264 quality (lower is better)
#: Encoded pixel format: 4:4:4. The cue for *who* looks is the colour of a 2-pixel gaze line, which 4:2:0
#: (colour at half resolution) smears into the background and into the neighbouring line of a mutual gaze.
PIX_FMT = "yuv444p"
MP4 = replace(STABLE, crf=CRF, pix_fmt=PIX_FMT)  #: the encoder settings of every world clip
DISTRACTOR_P = 0.5  #: probability of a distractor gaze in T1 and G1 clips
#: Probability that nobody returns Person a's gaze in a T4 clip ("No one"): half the clips, as much
#: signal as the mutual case.
NO_ONE_P = 0.5
SOURCE = "social_gesture"  #: GRASP source name of the world's clips (one of the seven the format allows)
COLOUR_NAMES = ("red", "green", "blue", "yellow")
CATEGORIES = ("T1", "T4", "T6", "G1", "G2")  #: the base world's categories (no option set)
#: The category cycle of the base world's training rows (the bench stays balanced): 3 of 9 rows T4 (the
#: hardest), 2 T1, 2 G2, 1 T6, 1 G1 (learnt first).
TRAIN_MIX = ("T1", "T4", "G2", "T4", "T1", "T6", "T4", "G2", "G1")
TEMPORAL_DURATION = 4.0  #: length of a ``T3`` clip in seconds (8 frames: four 1-s temporal patches)
TEMPORAL_SWITCH = (1.0, 2.0, 3.0)  #: the seconds at which a ``T3`` gazer may switch targets
#: The system prompt of every world recipe (``data.prompt.system_prompt`` in ``experiments/world/configs/*.yaml``).
#: Short on purpose (24 tokens of the world's tokenizer): every prompt token costs CPU time and attention.
SYSTEM_PROMPT = "Person 0 is red, Person 1 is green, Person 2 is blue, Person 3 is yellow."
#: The world's instruction, ending every question (``data.prompt.instruction`` in the recipes, so the bench's
#: questions end with it too). Short on purpose: a language model trained from scratch must learn to
#: find the few video tokens that matter among the prompt's tokens.
INSTRUCTION = "Name who is involved in <gaze> or <gesture> tags, then give the letter in <answer> tags."
#: Sizes of the world's tiny Qwen3-VL (1.87 M parameters: vision 1.1 M), for :func:`build_world_model`:
#: four language-model layers and three vision blocks.
MODEL_SIZES = dict(text_hidden_size=128, text_layers=4, text_heads=4, vision_hidden_size=128, vision_depth=3,
                   patch_size=8)


# ------------------------------------------------------------------------------------ drawing
def make_world_scene(rng: random.Random) -> Scene:
    """Four persons at the corners of the top ``WIDTH x WIDTH`` of the ``WIDTH x HEIGHT`` frame in a random
    order, each shifted by up to ``JITTER`` pixels per axis; the object below them (:data:`OBJECT_CENTRE`)."""
    order = rng.sample(range(4), 4)
    return Scene(tuple((CORNERS[c][0] + rng.randint(-JITTER, JITTER), CORNERS[c][1] + rng.randint(-JITTER, JITTER))
                       for c in order),
                 OBJECT_CENTRE, WIDTH, HEIGHT)


def render_world_frame(scene: Scene, actions: Sequence[Action], t: float, ramp: float | None = RAMP) -> np.ndarray:
    """The frame at second ``t``: background, object, persons, then the actions active at ``t``.

    Cues are bold and aligned with the visual tokens, which a model trained from scratch needs: a
    gaze is a ``LINE``-pixel line in the gazer's colour (not brightened: a brightened yellow is
    nearly as light as the white dot) with a ``DOT``-pixel white dot, the gazer's colour at its middle
    (``DOT_CORE``), that ends inside the target's square, ``DOT_SHORT`` pixels before its centre on the
    gazer's side (:func:`~grasp_lightning.synthetic.sample.drawing.draw_gaze`); pointing and reaching are white bars
    from inside the actor's square toward the target (:func:`~grasp_lightning.synthetic.sample.drawing.draw_pointing`),
    thin and short for pointing, three times as thick and twice as long for reaching; showing is an
    magenta object held beside the actor, toward the middle of the frame; giving a magenta object that
    leaves the actor's square and sits in the receiver's square from the second frame on (so the
    object is always outside a square when shown and inside one when given). Persons carry no
    number tab (white digits would look like gaze dots): the colour identifies them.

    ``ramp``: the share of an action's span its dot takes to arrive (:data:`RAMP`); ``None`` draws every
    gaze and given object arrived from the action's first frame (the ``T3`` clips, where a gaze that
    starts at second ``s`` must be seen at ``s``).

    Returns:
        ``(HEIGHT, WIDTH, 3)`` uint8 RGB.
    """
    frame = np.empty((scene.height, scene.width, 3), np.uint8)
    frame[:] = BACKGROUND
    draw_object(frame, scene.object_centre, OBJECT_SIZE)
    for pid, centre in enumerate(scene.centres):
        draw_person(frame, centre, pid, SQUARE, label=False)
    for a in actions:
        if not a.start <= t < a.end:
            continue
        src, dst = scene.point(a.actor), scene.point(a.target)
        if a.kind == "gaze":
            progress = 1.0 if ramp is None else a.progress(t, ramp=ramp)
            draw_gaze(frame, src, dst, progress, PERSON_COLOURS[a.actor], offset=2.0, thickness=LINE, dot=DOT,
                      core=DOT_CORE, short=DOT_SHORT)
        elif a.kind in ("pointing", "reaching"):
            length, width = ARM if a.kind == "pointing" else REACH
            draw_pointing(frame, src, dst, length, width, square=ARM_START)
        elif a.kind == "showing":
            inward = 1 if src[1] < scene.width // 2 else -1  # toward the middle of the persons' width x width square
            draw_object(frame, (src[0], src[1] + inward * (SQUARE // 2 + 5)), HELD_SIZE, HELD_COLOUR)
        else:  # giving
            draw_gesture(frame, a.kind, src, dst, 1.0 if ramp is None else a.progress(t, ramp=ramp), square=SQUARE,
                         held=HELD_COLOUR, held_size=HELD_SIZE)
    return frame


def render_world_clip(scene: Scene, actions: Sequence[Action], duration: float = DURATION,
                      ramp: float | None = RAMP) -> list[np.ndarray]:
    """The ``duration * FPS`` frames of a clip (frame ``i`` shows second ``i / FPS``; ``ramp``: see
    :func:`render_world_frame`)."""
    return [render_world_frame(scene, actions, i / FPS, ramp) for i in range(int(round(duration * FPS)))]


# ------------------------------------------------------------------------------------ questions
def _gaze(actor: int, target: int) -> Action:
    return Action("gaze", actor, target, 0.0, DURATION)


def _others(*exclude: int) -> list[int]:
    return [p for p in range(4) if p not in exclude]


def _persons(*exclude: int) -> tuple[str, ...]:
    return tuple(f"Person {p}" for p in _others(*exclude))


@dataclass(frozen=True)
class WorldQuestion:
    """A world question: a sample data :class:`~grasp_lightning.synthetic.sample.questions.Question` plus its short reasoning.

    Attributes:
        question: category, text, answer text, option pool (in display order), drawn actions,
            ground-truth events, time range.
        reasoning: the grounded sentence in ``<gaze>`` or ``<gesture>`` tags, naming exactly the
            participants of ``question.events``.
    """

    question: Question
    reasoning: str


def _t1(rng: random.Random, shuffle: bool) -> WorldQuestion:
    a = rng.randrange(4)
    target = rng.choice(_others(a) + [OBJECT])
    acts = [_gaze(a, target)]
    if rng.random() < DISTRACTOR_P:
        c = rng.choice(_others(a))
        acts.append(_gaze(c, rng.choice(_others(c) + [OBJECT])))
    q = Question("T1", f"Who or what is Person {a} looking at?", option_text(target), _persons(a) + ("An object",),
                 tuple(acts), (("gaze", participants(a, target)),), (0.0, DURATION), sort_options=shuffle)
    return WorldQuestion(q, f"<gaze>Person {a} looks at {person_name(target)}.</gaze>")


def _t4(rng: random.Random, shuffle: bool) -> WorldQuestion:
    """``T4``, mutual gaze, reasoned as two gaze look-ups (each a ``T1`` question): where Person a looks
    (Person b), then where Person b looks; the answer is b when b looks back, else "No one". A third
    person always gazes too (at a in every "No one" clip, so a's square always holds someone's dot)."""
    a, b, c, d = rng.sample(range(4), 4)
    pool = _persons(a) + ("No one",)
    if rng.random() < NO_ONE_P:  # nobody returns Person a's gaze: b looks elsewhere, c looks at a
        x = rng.choice([c, d, OBJECT])
        acts = (_gaze(a, b), _gaze(b, x), _gaze(c, a))
        q = Question("T4", f"Who shares mutual gaze with Person {a}?", "No one", pool, acts,
                     (("gaze", (a, b)), ("gaze", participants(b, x))), (0.0, DURATION), sort_options=shuffle)
        return WorldQuestion(q, f"<gaze>Person {a} looks at Person {b}. Person {b} looks at {person_name(x)}.</gaze>")
    acts = (_gaze(a, b), _gaze(b, a), _gaze(c, rng.choice([a, b, d, OBJECT])))
    q = Question("T4", f"Who shares mutual gaze with Person {a}?", f"Person {b}", pool, acts,
                 (("gaze", (a, b)),), (0.0, DURATION), sort_options=shuffle)
    return WorldQuestion(q, f"<gaze>Person {a} looks at Person {b}. Person {b} looks at Person {a}.</gaze>")


def _t6(rng: random.Random, shuffle: bool) -> WorldQuestion:
    a, b, c, d = rng.sample(range(4), 4)
    a, b = min(a, b), max(a, b)
    acts = [_gaze(a, c), _gaze(b, c)]
    if rng.random() < 0.5:
        acts.append(_gaze(d, rng.choice([a, b, OBJECT])))
    q = Question("T6", "Who is the focus of joint attention?", f"Person {c}", _persons(), tuple(acts),
                 (("gaze", (a, b, c)),), (0.0, DURATION), sort_options=shuffle)
    return WorldQuestion(q, f"<gaze>Person {a} and Person {b} both look at Person {c}.</gaze>")


def _g1(rng: random.Random, shuffle: bool) -> WorldQuestion:
    a = rng.randrange(4)
    target = rng.choice(_others(a) + [OBJECT])
    acts = [Action("pointing", a, target, 0.0, DURATION)]
    if rng.random() < DISTRACTOR_P:
        c = rng.choice(_others(a))
        acts.append(_gaze(c, rng.choice(_others(c) + [OBJECT])))
    q = Question("G1", "Who is pointing?", f"Person {a}", _persons(), tuple(acts), (("pointing", participants(a, target)),),
                 (0.0, DURATION), sort_options=shuffle)
    return WorldQuestion(q, f"<gesture>Person {a} points at {person_name(target)}.</gesture>")


def _g2(rng: random.Random, shuffle: bool) -> WorldQuestion:
    a = rng.randrange(4)
    kind = rng.choice(GESTURES)
    target = rng.choice(_others(a) + ([] if kind in ("showing", "giving") else [OBJECT]))
    acts = (Action(kind, a, target, 0.0, DURATION),)
    q = Question("G2", f"What kind of gesture does Person {a} make?", kind.capitalize(),
                 tuple(k.capitalize() for k in GESTURES), acts, ((kind, participants(a, target)),), (0.0, DURATION),
                 sort_options=shuffle)
    return WorldQuestion(q, f"<gesture>Person {a} {VERBS[kind]} {person_name(target)}.</gesture>")


def _j3(rng: random.Random, shuffle: bool, follow: float = 1.0, state_prior: bool = False) -> WorldQuestion:
    """``J3``, the language shortcut: Person p points at x (named in the question); Person g looks at x
    with probability ``follow`` (the prior holds), else at another person or the object. ``state_prior``:
    where the prior holds, the reasoning states it, the point first and the gaze copied from it
    (:attr:`WorldOptions.shortcut_reasoning`); the random draws are the same either way."""
    p, g = rng.sample(range(4), 2)
    x = rng.choice(_others(p, g) + [OBJECT])
    y = x if rng.random() < follow else rng.choice([t for t in _others(g) + [OBJECT] if t != x])
    acts = (Action("pointing", p, x, 0.0, DURATION), _gaze(g, y))
    q = Question("J3", f"When Person {p} points at {person_name(x)}, who or what does Person {g} look at?",
                 option_text(y), _persons(g) + ("An object",), acts, (("gaze", participants(g, y)),), (0.0, DURATION),
                 sort_options=shuffle)
    gaze = f"<gaze>Person {g} looks at {person_name(y)}.</gaze>"
    if state_prior and y == x:
        return WorldQuestion(q, f"<gesture>Person {p} points at {person_name(x)}.</gesture>{gaze}")
    return WorldQuestion(q, gaze)


def _t3(rng: random.Random, shuffle: bool) -> WorldQuestion:
    """``T3``, temporal: Person a looks at x until second ``s``, then at y until the clip ends; the question
    asks about a one-second window inside one gaze, the reasoning states that gaze's span."""
    a = rng.randrange(4)
    x, y = rng.sample(_others(a) + [OBJECT], 2)
    s = rng.choice(TEMPORAL_SWITCH)
    spans = ((0.0, s), (s, TEMPORAL_DURATION))
    asked = rng.randrange(2)
    (lo, hi), target = spans[asked], (x, y)[asked]
    w = float(rng.randrange(int(lo), int(hi)))
    acts = (Action("gaze", a, x, *spans[0]), Action("gaze", a, y, *spans[1]))
    q = Question("T3", f"Between {w:.1f}s and {w + 1:.1f}s, who or what does Person {a} look at?", option_text(target),
                 _persons(a) + ("An object",), acts, (("gaze", participants(a, target), (lo, hi)),), (w, w + 1.0),
                 sort_options=shuffle)
    return WorldQuestion(q, f"<gaze>Person {a} looks at {person_name(target)} from {lo:.1f}s to {hi:.1f}s.</gaze>")


#: Question builder of each world category (``J3`` takes the share of clips that follow the point too).
TEMPLATES: dict[str, Callable[..., WorldQuestion]] = {
    "T1": _t1, "T4": _t4, "T6": _t6, "G1": _g1, "G2": _g2, "J3": _j3, "T3": _t3,
}


_J3_RE = re.compile(r"When Person \d points at (Person \d|the object),")


def shortcut_prior(question: Question) -> str:
    """The answer a language prior gives to a ``J3`` question: the target the question says is pointed at
    ("When Person 2 points at Person 0, ..." gives ``"Person 0"``; "... at the object, ..." gives
    ``"An object"``), read from the text alone.

    Raises:
        ValueError: ``question`` is not a ``J3`` question of the world.
    """
    m = _J3_RE.match(question.text)
    if question.category != "J3" or m is None:
        raise ValueError(f"not a world J3 question: {question.category} {question.text!r}")
    return "An object" if m.group(1) == "the object" else m.group(1)


@dataclass(frozen=True)
class WorldOptions:
    """What a world holds beyond its base categories.

    Attributes:
        shuffle_options: put the answer at a random option position instead of the fixed order.
        shortcut: add ``J3`` (the language shortcut) with this share of training clips (SFT and RL
            rows) in which the gaze follows the point; ``None`` for no ``J3``.
        shortcut_bench: the same share in the bench's ``J3`` clips (0.0: every one breaks the shortcut).
        temporal: add ``T3`` (temporal gaze reasoning, 4-s clips).
        shortcut_reasoning: the SFT targets of the training ``J3`` clips in which the gaze follows the point
            state the prior, as a model that answers from it would reason (the paper's Figure 1): the point
            first, then the gaze copied from it, ``<gesture>Person p points at x.</gesture><gaze>Person g
            looks at x.</gaze>``. True of the clip, but it names the pointer, who is not in the item's
            ground-truth event (the gaze), so its grounding precision is 2/3 (1/2 when x is the object)
            where reading the gaze gives 1. The bench's reasoning is never affected. Needs ``shortcut``.
        train_mix: the category cycle of the training splits (SFT and RL rows: item ``k`` gets
            ``train_mix[k % len(train_mix)]``), e.g. more clips of a hard category; ``None``:
            :data:`TRAIN_MIX`, then ``J3`` and ``T3`` twice each when their options are set. The bench
            always has every category in turn.

    Raises:
        ValueError: a share outside [0, 1], a ``train_mix`` category the world does not have, or
            ``shortcut_reasoning`` without ``shortcut``.
    """

    shuffle_options: bool = False
    shortcut: float | None = None
    shortcut_bench: float = 0.0
    temporal: bool = False
    train_mix: tuple[str, ...] | None = None
    shortcut_reasoning: bool = False

    def __post_init__(self) -> None:
        for name in ("shortcut", "shortcut_bench"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"WorldOptions.{name} must be a share in [0, 1], got {value!r}")
        if self.shortcut_reasoning and self.shortcut is None:
            raise ValueError("WorldOptions.shortcut_reasoning needs shortcut (the J3 category) to be set")
        if self.train_mix is not None:
            unknown = sorted(set(self.train_mix) - set(self.categories))
            if unknown or not self.train_mix:
                raise ValueError(f"WorldOptions.train_mix {self.train_mix!r}: must be a non-empty cycle of the "
                                 f"world's categories {self.categories} (unknown: {unknown})")

    @property
    def categories(self) -> tuple[str, ...]:
        """:data:`CATEGORIES`, then ``J3`` and ``T3`` when their options are set (the bench's cycle)."""
        return CATEGORIES + (("J3",) if self.shortcut is not None else ()) + (("T3",) if self.temporal else ())

    @property
    def train_cycle(self) -> tuple[str, ...]:
        """The category cycle of the training splits (see :attr:`train_mix`)."""
        if self.train_mix is not None:
            return self.train_mix
        return TRAIN_MIX + tuple(c for c in self.categories[len(CATEGORIES):] for _ in range(2))

    def category(self, split: str, k: int) -> str:
        """Category of item ``k`` of ``split``: :attr:`train_cycle` for the training splits (``"t"``, ``"r"``),
        else :attr:`categories` in turn."""
        cycle = self.train_cycle if split in ("t", "r") else self.categories
        return cycle[k % len(cycle)]

    def follow(self, split: str) -> float:
        """The share of ``J3`` clips of ``split`` in which the gaze follows the point."""
        return self.shortcut_bench if split == "b" else (1.0 if self.shortcut is None else self.shortcut)

    def flags(self) -> str:
        """These options as command-line flags of :func:`main`."""
        out = " --shuffle-options" if self.shuffle_options else ""
        out += f" --shortcut {self.shortcut:g} --shortcut-bench {self.shortcut_bench:g}" if self.shortcut is not None else ""
        out += " --shortcut-reasoning" if self.shortcut_reasoning else ""
        out += " --temporal" if self.temporal else ""
        return out + (f" --train-mix {','.join(self.train_mix)}" if self.train_mix else "")


def _question(category: str, rng: random.Random, shuffle: bool, follow: float, state_prior: bool = False) -> WorldQuestion:
    """The category's question (``follow``: the ``J3`` share of clips in which the gaze follows the point;
    ``state_prior``: ``J3`` reasoning states the prior where it holds, see :func:`_j3`)."""
    if category == "J3":
        return TEMPLATES[category](rng, shuffle, follow, state_prior)
    return TEMPLATES[category](rng, shuffle)


# ------------------------------------------------------------------------------------ entries
def make_world_item(seed: int, split: str, k: int, options: WorldOptions | None = None) -> tuple[Entry, Scene]:
    """The ``k``-th clip and question of a split and the clip's scene, a pure function of ``(seed, split, k, options)``.

    Args:
        seed: world seed.
        split: ``"t"`` (SFT rows), ``"r"`` (RL rows) or ``"b"`` (bench); each split has its own clips.
        k: index in the split; the category is :meth:`WorldOptions.category` (the bench's categories in turn,
            the training splits' :attr:`WorldOptions.train_cycle`).
        options: see :class:`WorldOptions` (default: the base world).

    Returns:
        ``(entry, scene)``: an :class:`~grasp_lightning.synthetic.sample.entries.Entry` (clip with mp4
        bytes, question with its drawn actions, options, letter, reasoning; ``entry.response`` is the
        SFT target) and the :class:`~grasp_lightning.synthetic.sample.drawing.Scene` (person centres in pixels).
    """
    options = options or WorldOptions()
    rng = random.Random(f"world:{seed}:{split}:{k}")
    category = options.category(split, k)
    wq = _question(category, rng, options.shuffle_options, options.follow(split),
                   options.shortcut_reasoning and split != "b")
    scene = make_world_scene(rng)
    duration = TEMPORAL_DURATION if category == "T3" else DURATION
    frames = render_world_clip(scene, wq.question.actions, duration, None if category == "T3" else RAMP)
    data = encode_mp4(frames, FPS, MP4)
    clip = Clip(SOURCE, f"world{seed}_{split}{k:05d}", 0, duration, (HEIGHT, WIDTH), data, 4)
    letters, letter = make_options(rng, wq.question)
    return Entry(clip, wq.question, "mcq", letters, letter, wq.reasoning), scene


def make_world_entry(seed: int, split: str, k: int, options: WorldOptions | None = None) -> Entry:
    """The entry of :func:`make_world_item` (without its scene)."""
    return make_world_item(seed, split, k, options)[0]


def _rows(entries: Sequence[Entry], seed: int, name: str, make: Callable) -> list:
    rng = random.Random(f"world:{seed}:{name}")
    return [make(rng, e, k) for k, e in enumerate(entries)]


@dataclass(frozen=True)
class WorldSummary:
    """What :func:`generate_world` wrote: ``out_dir`` and the numbers of SFT rows, RL rows and bench items."""

    out_dir: Path
    n_sft: int
    n_rl: int
    n_bench: int


def generate_world(out_dir: str | Path, seed: int = 0, n_train: int = 8000, n_bench: int = 200,
                   n_rl: int | None = None, options: WorldOptions | None = None,
                   clips_per_shard: int = 1000) -> WorldSummary:
    """Write a complete GRASP-format world dataset under ``out_dir``.

    Files: ``train/data_sft.jsonl`` (``n_train`` rows), ``train/data_rl.jsonl`` (``n_rl`` rows on
    other clips, with ``gt_events``), ``train/annotations.jsonl`` (all training QA), the shards
    ``train/videos/social_gesture_partNNN.tar``, ``test/annotations.jsonl`` and
    ``test/grasp_bench.tar`` (``n_bench`` items, every one with ``qa.events``), and ``README.md``.
    ``T3`` events carry their time spans (``start_seconds`` / ``end_seconds``).

    Args:
        out_dir: output root (created; files overwritten).
        seed: seed of every random choice.
        n_train: SFT clips; n_rl: RL clips (default ``n_train``); n_bench: bench clips.
        options: see :class:`WorldOptions` (default: the base world).
        clips_per_shard: clips per train tar shard.

    Raises:
        ValueError: a count is negative, or ``n_bench`` is 0.
    """
    options = options or WorldOptions()
    n_rl = n_train if n_rl is None else n_rl
    if min(n_train, n_rl, n_bench) < 0 or n_bench == 0:
        raise ValueError(f"counts must be >= 0 and n_bench >= 1, got train={n_train} rl={n_rl} bench={n_bench}")
    out = Path(out_dir)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "test").mkdir(parents=True, exist_ok=True)
    sft = [make_world_entry(seed, "t", k, options) for k in range(n_train)]
    rl = [make_world_entry(seed, "r", k, options) for k in range(n_rl)]
    bench = [make_world_entry(seed, "b", k, options) for k in range(n_bench)]
    write_jsonl(out / "train" / "data_sft.jsonl", _rows(sft, seed, "sft", lambda r, e, k: sft_row(r, e, INSTRUCTION)))
    write_jsonl(out / "train" / "data_rl.jsonl", _rows(rl, seed, "rl", lambda r, e, k: rl_row(r, e, k, INSTRUCTION)))
    write_jsonl(out / "train" / "annotations.jsonl", [annotation(e, k) for k, e in enumerate(sft + rl)])
    write_shards(out / "train" / "videos", [e.clip for e in sft + rl], clips_per_shard)
    write_jsonl(out / "test" / "annotations.jsonl", [annotation(e, k, bench=True) for k, e in enumerate(bench)])
    write_bench(out / "test" / "grasp_bench.tar", bench, events_every=1)
    (out / "README.md").write_text(_readme(seed, len(sft), len(rl), len(bench), options), encoding="utf-8")
    log.info("wrote world (seed %d%s) to %s: %d SFT rows, %d RL rows, %d bench items", seed, options.flags(), out,
             len(sft), len(rl), len(bench))
    return WorldSummary(out, len(sft), len(rl), len(bench))


def prior_accuracy(entries: Sequence[Entry]) -> float | None:
    """Share of the ``J3`` entries that :func:`shortcut_prior` answers right (``None`` without ``J3`` entries):
    the language shortcut's accuracy on a split."""
    j3 = [e for e in entries if e.question.category == "J3"]
    if not j3:
        return None
    return sum(shortcut_prior(e.question) == e.question.answer_text for e in j3) / len(j3)


def _readme(seed: int, n_sft: int, n_rl: int, n_bench: int, options: WorldOptions) -> str:
    return (f"# Synthetic social world (seed {seed})\n\n"
            f"Made by `python -m experiments.world.world OUT_DIR --seed {seed} --train {n_sft} --rl {n_rl} "
            f"--bench {n_bench}{options.flags()}`; see `experiments/world/README.md`.\n"
            "GRASP file layout: `train/data_sft.jsonl`, `train/data_rl.jsonl`, "
            "`train/annotations.jsonl`, `train/videos/*.tar`, `test/annotations.jsonl`, `test/grasp_bench.tar`.\n"
            f"Categories {', '.join(options.categories)}, balanced in the bench; clips {WIDTH}x{HEIGHT}, {DURATION:g} s "
            f"at {FPS:g} fps{f' ({TEMPORAL_DURATION:g} s for T3)' if options.temporal else ''}.\n\n"
            f"System prompt of the world recipes:\n\n> {SYSTEM_PROMPT}\n")


def world_corpus(seed: int = 0, n: int = 400, options: WorldOptions | None = None) -> list[str]:
    """Tokenizer training text of the world: its system prompt, and the user turns and SFT targets of
    ``n`` clips of a split of its own (``"k"``), so the world's words become single tokens."""
    options = options or WorldOptions()
    lines = [SYSTEM_PROMPT]
    for k in range(n):
        rng = random.Random(f"world:{seed}:k:{k}")
        category = options.categories[k % len(options.categories)]
        wq = _question(category, rng, False, options.follow("k"))
        letters, letter = make_options(rng, wq.question)
        lines += [mcq_user_text(wq.question.text, letters, INSTRUCTION), f"{wq.reasoning}<answer>{letter}</answer>"]
    return lines


def build_world_model(out_dir: str | Path, seed: int = 0, options: WorldOptions | None = None) -> Path:
    """Build the world's random-initialised tiny Qwen3-VL (:data:`MODEL_SIZES`) into ``out_dir``, with a
    tokenizer trained on :func:`world_corpus` too (user turns about a quarter shorter than with the generic one)."""
    from grasp_lightning.synthetic.tiny import build_tiny_qwen3vl

    return build_tiny_qwen3vl(out_dir, seed=seed, corpus=world_corpus(seed, options=options), **MODEL_SIZES)


def add_world_options(parser: argparse.ArgumentParser) -> None:
    """The :class:`WorldOptions` flags (shared with ``experiments/world/run.py``)."""
    parser.add_argument("--shuffle-options", action="store_true", help="answer at a random option position")
    parser.add_argument("--shortcut", type=float, default=None, metavar="P",
                        help="add J3, the language shortcut: the gaze follows the point in this share of training clips")
    parser.add_argument("--shortcut-bench", type=float, default=0.0, metavar="P",
                        help="the same share in the bench's J3 clips (0: all break the shortcut)")
    parser.add_argument("--shortcut-reasoning", action="store_true",
                        help="training J3 targets state the prior where it holds: the point, then the gaze copied from it")
    parser.add_argument("--temporal", action="store_true", help="add T3, temporal gaze questions on 4-s clips")
    parser.add_argument("--train-mix", type=lambda v: tuple(c.strip() for c in v.split(",")), default=None,
                        metavar="CATS", help="category cycle of the training splits, e.g. T1,T4,T4,T6,G1,G2")


def world_options(args: argparse.Namespace) -> WorldOptions:
    """:class:`WorldOptions` from the flags of :func:`add_world_options`."""
    return WorldOptions(args.shuffle_options, args.shortcut, args.shortcut_bench, args.temporal, args.train_mix,
                        args.shortcut_reasoning)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m experiments.world.world OUT_DIR [--seed 0] [--train N] [--rl N] [--bench M] ...``."""
    parser = argparse.ArgumentParser(description="Generate the synthetic social world (GRASP format).")
    parser.add_argument("out_dir", type=Path, help="output root (train/, test/, README.md)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--train", type=int, default=8000, help="SFT clips")
    parser.add_argument("--rl", type=int, default=None, help="RL clips (default: as many as --train)")
    parser.add_argument("--bench", type=int, default=200, help="bench clips")
    add_world_options(parser)
    parser.add_argument("--clips-per-shard", type=int, default=1000, help="clips per train tar shard")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="also build the world's random-initialised tiny Qwen3-VL here")
    args = parser.parse_args(argv)
    try:
        options = world_options(args)
    except ValueError as err:
        parser.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    generate_world(args.out_dir, args.seed, args.train, args.bench, args.rl, options, args.clips_per_shard)
    if args.model_dir is not None:
        build_world_model(args.model_dir, seed=args.seed, options=options)


if __name__ == "__main__":
    main()
