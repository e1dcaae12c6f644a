"""Deterministic generator of a small GRASP-format sample dataset: synthetic clips plus one real clip.

The output follows ``shared/grasp-format.md`` file by file (train annotations, SFT and RL rows, tar
shards, GRASP-Bench tar with 2 items per category). Synthetic clips are tiny scenes (128x72 pixels,
4-6 s at 10 fps, H.264 yuv420p) in which every person is a coloured square inside an id box with
its number (Person 0 red, 1 green, 2 blue, 3 yellow), a grey square is an object, a gaze is a line
whose white dot travels from the gazer to the target square, and a gesture is drawn as a white bar
(pointing short, reaching long) or an orange held object (showing: raised; giving: travelling to
the receiver). Every question, option, answer and reasoning is derived from the drawn actions, so
answers are consistent with the pixels. One real clip (``kitchen_two_person.mp4``, attribution in
:data:`REAL_CLIP_ATTRIBUTION`) is copied byte for byte into the train shards and the bench.

Usage::

    python -m grasp_lightning.generators.sample_data OUT_DIR [--seed 0] [--real-clip PATH]

Given the seed, the JSON files, the tar layout (member order, mtimes, owners) and, with the same
libx264 build, the mp4 bytes are identical run to run (the mp4 muxer runs with ``+bitexact``; the
x264 version string inside the stream differs between x264 builds). The drawing functions
(:func:`draw_person`, :func:`draw_gaze`, :func:`draw_gesture`, :func:`render_frame`,
:func:`write_mp4`) are meant to be reused by a richer synthetic social-world generator.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import random
import tarfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from grasp_lightning.data.prompts import INSTRUCTION
from grasp_lightning.data.records import CATEGORIES, CATEGORY_DIFFICULTY
from grasp_lightning.errors import GraspDataError

log = logging.getLogger(__name__)

WIDTH, HEIGHT = 128, 72  #: synthetic frame size in pixels
FPS = 10.0  #: synthetic clip frame rate (frames per second)
SAMPLE_FPS = 2.0  #: sampling rate written into the row video specs (frames per second)
SQUARE = 14  #: side of a person square in pixels
OBJECT = -1  #: target id of the scene's object (the grey square)
PERSON_COLOURS = ((220, 40, 40), (40, 200, 60), (50, 90, 230), (230, 210, 40))  #: red, green, blue, yellow
BACKGROUND, OBJECT_COLOUR = (36, 36, 44), (150, 150, 150)  #: RGB of the background and of the object
DOT, HAND, HELD = (255, 255, 255), (245, 245, 245), (255, 150, 0)  #: RGB of gaze dots, arms, held objects
SLOTS = ((22, 20), (106, 20), (106, 52), (22, 52))  #: person centres (x, y) in pixels: corners of a table
OBJECT_CENTRE = (64, 64)
GESTURES = ("pointing", "showing", "giving", "reaching")
SOURCES = ("social_gesture", "werewolf", "embody3d")  #: sources of the synthetic clips
REAL_SOURCE, REAL_VIDEO_ID, REAL_RESOLUTION = "social-iq", "kitchen.two_person", (360, 640)
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets" / "sample"  #: the shipped copy
TAR_MTIME = 1735689600  #: fixed member mtime (2025-01-01 UTC) for byte-stable tars
OPEN_INSTRUCTION = ("Think step by step about the gaze and gesture interactions, describe them in <gaze> and "
                    "<gesture> tags, and give your answer in two to four sentences in <answer> tags.")
REAL_CLIP_ATTRIBUTION = """\
# Real two-person clip

`kitchen_two_person.mp4`: 101 consecutive frames (3.37 s at 30 fps, 640x360, H.264) of two people
at a kitchen counter: the person on the left (Person 0, grey t-shirt) talks and gestures with open
hands; the person on the right (Person 1, blue shirt) looks down at an avocado he is handling.
The camera slowly pans. No person ID boxes are drawn in.

Source: the demo frames `data/demo/frames/00002575.jpg` … `00002675.jpg` of the public repository
ejcgt/attention-target-detection (MIT License, Copyright (c) 2021 ejcgt), which come from the
VideoAttentionTarget dataset (Chong et al., "Detecting Attended Visual Targets in Video", CVPR 2020).
The same repository gives per-frame head boxes, in 1920x1080 pixels (x1, y1, x2, y2):
Person 0 around (553, 71, 752, 275), Person 1 around (1093, 33, 1347, 299).
Frames were resized to 640x360 and encoded with libx264 (crf 23). Keep this attribution wherever
the clip is copied.
"""

# ----------------------------------------------------------------------------------------- drawing
_DIGITS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111",
}


def fill_rect(frame: np.ndarray, x0: int, y0: int, x1: int, y1: int, colour: Sequence[int]) -> None:
    """Fill pixels ``x0 <= x < x1``, ``y0 <= y < y1`` of a ``(H, W, 3)`` uint8 frame, clipped to the frame."""
    h, w = frame.shape[:2]
    frame[max(0, y0):min(h, y1), max(0, x0):min(w, x1)] = colour


def draw_text(frame: np.ndarray, x: int, y: int, text: str, colour: Sequence[int]) -> None:
    """Draw digits in a 3x5-pixel font with its top-left corner at pixel ``(x, y)``."""
    for k, ch in enumerate(text):
        for i, bit in enumerate(_DIGITS[ch]):
            if bit == "1":
                fill_rect(frame, x + 4 * k + i % 3, y + i // 3, x + 4 * k + i % 3 + 1, y + i // 3 + 1, colour)


def draw_line(frame: np.ndarray, p0: tuple[float, float], p1: tuple[float, float], colour: Sequence[int],
              thickness: int = 1) -> None:
    """Draw a straight line between pixel positions ``p0`` and ``p1`` (x, y), ``thickness`` pixels wide."""
    steps = int(max(abs(p1[0] - p0[0]), abs(p1[1] - p0[1]))) + 1
    lo = thickness // 2
    for s in np.linspace(0.0, 1.0, steps):
        x = int(round(p0[0] + s * (p1[0] - p0[0])))
        y = int(round(p0[1] + s * (p1[1] - p0[1])))
        fill_rect(frame, x - lo, y - lo, x - lo + thickness, y - lo + thickness, colour)


def draw_person(frame: np.ndarray, centre: tuple[int, int], pid: int, size: int = SQUARE, label: bool = True) -> None:
    """Draw Person ``pid`` as a coloured square with an id box (outline) and its number tab above-left.

    Args:
        frame: ``(H, W, 3)`` uint8 frame, drawn in place.
        centre: square centre (x, y) in pixels.
        pid: 0-based person id; colour ``PERSON_COLOURS[pid % 4]``.
        size: square side in pixels.
        label: draw the number tab (white digits on black); without it the colour alone identifies the person.
    """
    colour = PERSON_COLOURS[pid % len(PERSON_COLOURS)]
    x0, y0 = centre[0] - size // 2, centre[1] - size // 2
    fill_rect(frame, x0, y0, x0 + size, y0 + size, colour)
    bx0, by0, bx1, by1 = x0 - 2, y0 - 2, x0 + size + 2, y0 + size + 2
    for x_a, y_a, x_b, y_b in ((bx0, by0, bx1, by0 + 1), (bx0, by1 - 1, bx1, by1),
                               (bx0, by0, bx0 + 1, by1), (bx1 - 1, by0, bx1, by1)):
        fill_rect(frame, x_a, y_a, x_b, y_b, colour)
    if label:
        text = str(pid)
        fill_rect(frame, bx0, by0 - 7, bx0 + 4 * len(text) + 1, by0, (0, 0, 0))
        draw_text(frame, bx0 + 1, by0 - 6, text, (255, 255, 255))


def draw_object(frame: np.ndarray, centre: tuple[int, int], size: int = 6, colour: Sequence[int] = OBJECT_COLOUR) -> None:
    """Draw a small square object of ``size`` pixels centred at ``centre`` (x, y)."""
    x0, y0 = centre[0] - size // 2, centre[1] - size // 2
    fill_rect(frame, x0, y0, x0 + size, y0 + size, colour)


def draw_gaze(frame: np.ndarray, src: tuple[int, int], dst: tuple[int, int], progress: float,
              colour: Sequence[int], offset: float = 2.0, thickness: int = 1, dot: int = 3) -> None:
    """Draw a gaze: a line from ``src`` toward ``dst`` with a ``dot`` x ``dot`` white dot at its tip.

    ``progress`` in [0, 1] is how far the dot has travelled; at 1 it sits ``offset`` pixels beside
    ``dst`` (the centre of the target square, so still inside it). The line is shifted ``offset``
    pixels to the right of its direction, so the two gazes of a mutual gaze are drawn side by side.
    ``thickness`` is the line width in pixels (the synthetic world draws 2-pixel lines).
    """
    d = np.array(dst, float) - np.array(src, float)
    n = np.array([-d[1], d[0]]) / max(float(np.hypot(*d)), 1e-6) * offset
    src, dst = (src[0] + n[0], src[1] + n[1]), (dst[0] + n[0], dst[1] + n[1])
    p = min(max(progress, 0.0), 1.0)
    tip = (src[0] + p * (dst[0] - src[0]), src[1] + p * (dst[1] - src[1]))
    draw_line(frame, src, tip, colour, thickness)
    draw_object(frame, (int(round(tip[0])), int(round(tip[1]))), dot, DOT)


def draw_pointing(frame: np.ndarray, src: tuple[int, int], dst: tuple[int, int], length: int = 7,
                  thickness: int = 2, square: int = SQUARE) -> None:
    """Draw a pointing arm: a white bar of ``length`` pixels leaving the ``square``-pixel square at ``src``
    toward ``dst``."""
    d = np.array(dst, float) - np.array(src, float)
    u = d / max(float(np.hypot(*d)), 1e-6)
    start = np.array(src, float) + u * (square / 2 + 1)
    end = start + u * length
    draw_line(frame, (start[0], start[1]), (end[0], end[1]), HAND, thickness)


def draw_gesture(frame: np.ndarray, kind: str, src: tuple[int, int], dst: tuple[int, int], progress: float,
                 square: int = SQUARE) -> None:
    """Draw a deictic gesture of ``kind`` (pointing, reaching, showing, giving) from ``src`` toward ``dst``.

    Pointing is a short bar, reaching a long thick bar, showing an orange object held above the
    actor, giving an orange object travelling from actor to receiver (``progress`` in [0, 1]).
    ``square`` is the side in pixels of the actor's square (arms start at its edge).
    """
    if kind == "pointing":
        draw_pointing(frame, src, dst, square=square)
    elif kind == "reaching":
        draw_pointing(frame, src, dst, length=13, thickness=3, square=square)
    elif kind == "showing":
        draw_object(frame, (src[0], src[1] - square // 2 - 5), 5, HELD)
    elif kind == "giving":
        p = min(max(progress, 0.0), 1.0)
        draw_object(frame, (int(src[0] + p * (dst[0] - src[0])), int(src[1] + p * (dst[1] - src[1]))), 5, HELD)
    else:
        raise ValueError(f"unknown gesture kind {kind!r} (expected one of {GESTURES})")


@dataclass(frozen=True)
class Action:
    """One drawn social action: a directed gaze or a gesture.

    Attributes:
        kind: ``"gaze"`` or a gesture in :data:`GESTURES`.
        actor: person id of the gazer or gesturer.
        target: person id, or :data:`OBJECT` for the scene's object.
        start: first second the action is visible (seconds from clip start).
        end: second it stops (exclusive).
    """

    kind: str
    actor: int
    target: int
    start: float
    end: float

    def progress(self, t: float, ramp: float = 0.4) -> float:
        """Travel fraction at second ``t``: 0 at ``start``, 1 after ``ramp`` of the duration."""
        return (t - self.start) / max(ramp * (self.end - self.start), 1e-6)


@dataclass(frozen=True)
class Scene:
    """Layout of a synthetic clip: person centres and the object, in pixels of a ``width x height`` frame."""

    centres: tuple[tuple[int, int], ...]
    object_centre: tuple[int, int] = OBJECT_CENTRE
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def n_persons(self) -> int:
        """Number of persons in the scene."""
        return len(self.centres)

    def point(self, target: int) -> tuple[int, int]:
        """Centre (x, y) in pixels of a person id or of :data:`OBJECT`."""
        return self.object_centre if target == OBJECT else self.centres[target]


def make_scene(rng: random.Random, n_persons: int) -> Scene:
    """A scene with ``n_persons`` (1-4) at the table corners, each jittered by up to 3 pixels."""
    return Scene(tuple((x + rng.randint(-3, 3), y + rng.randint(-3, 3)) for x, y in SLOTS[:n_persons]))


def render_frame(scene: Scene, actions: Sequence[Action], t: float) -> np.ndarray:
    """Render the frame at second ``t``: background, object, persons, then the actions active at ``t``.

    Returns:
        ``(height, width, 3)`` uint8 RGB frame.
    """
    frame = np.empty((scene.height, scene.width, 3), np.uint8)
    frame[:] = BACKGROUND
    draw_object(frame, scene.object_centre)
    for pid, centre in enumerate(scene.centres):
        draw_person(frame, centre, pid)
    for a in actions:
        if a.start <= t < a.end:
            src, dst = scene.point(a.actor), scene.point(a.target)
            if a.kind == "gaze":
                colour = tuple(min(255, c + 60) for c in PERSON_COLOURS[a.actor % 4])
                draw_gaze(frame, src, dst, a.progress(t), colour, offset=1.0 if a.target == OBJECT else 2.0)
            else:
                draw_gesture(frame, a.kind, src, dst, a.progress(t, ramp=0.8))
    return frame


def render_clip(scene: Scene, actions: Sequence[Action], duration: float, fps: float = FPS) -> list[np.ndarray]:
    """All frames of a clip of ``duration`` seconds at ``fps`` (frame ``i`` shows second ``i / fps``)."""
    return [render_frame(scene, actions, i / fps) for i in range(int(round(duration * fps)))]


def encode_mp4(frames: Sequence[np.ndarray], fps: float = FPS, crf: int = 30) -> bytes:
    """Encode ``(H, W, 3)`` uint8 RGB frames (even H and W) as an mp4, H.264 (libx264) or MPEG-4 Part 2.

    Settings are fixed (one thread, no B-frames, GOP of 2 s, bitexact muxer) so the bytes are stable
    for a given encoder build. Falls back to ``mpeg4`` when PyAV has no ``libx264``.
    """
    import av

    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    options = {"crf": str(crf), "preset": "medium", "bf": "0"} if codec == "libx264" else {"qscale": "6", "bf": "0"}
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4", container_options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001), options=options)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = int(round(2 * fps))
        stream.codec_context.thread_count = 1
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode(None))
    return buf.getvalue()


def write_mp4(frames: Sequence[np.ndarray], path: str | Path, fps: float = FPS) -> None:
    """Encode frames with :func:`encode_mp4` and write the mp4 to ``path``."""
    Path(path).write_bytes(encode_mp4(frames, fps))


# ------------------------------------------------------------------------------------ questions
@dataclass(frozen=True)
class Question:
    """A question about a clip, with everything needed to write any GRASP file.

    Attributes:
        category: ``T1``..``J4``.
        text: the bare question (no options).
        answer_text: the correct option text (MCQ), e.g. ``"Person 2"``.
        pool: candidate option texts, the answer included (at least 4).
        actions: what is drawn.
        events: ground-truth social events ``(source, persons)`` of the question.
        time_range: ``(start, end)`` seconds the question is about.
        summary: 2-4 sentence reference answer for the open-ended form ("" if none).
        sort_options: order the distractors naturally and put the answer at a random position
            (else keep the pool's order, e.g. a hand-written or shuffled pool of exactly 4).
        narration: ``(gaze, gesture)`` descriptions overriding those derived from ``actions``.
    """

    category: str
    text: str
    answer_text: str
    pool: tuple[str, ...]
    actions: tuple[Action, ...]
    events: tuple[tuple[str, tuple[int, ...]], ...]
    time_range: tuple[float, float]
    summary: str = ""
    sort_options: bool = True
    narration: tuple[str, str] | None = None


def _name(target: int, short: bool = False) -> str:
    """``"Person N"`` (or ``"PN"``), or ``"the object"``."""
    return "the object" if target == OBJECT else (f"P{target}" if short else f"Person {target}")


def _opt(target: int) -> str:
    """Option text of a target: ``"Person N"`` or ``"An object"``."""
    return "An object" if target == OBJECT else f"Person {target}"


def _ev(actor: int, target: int) -> tuple[int, ...]:
    """Participants of an action: actor and, when a person, target."""
    return (actor,) if target == OBJECT else (actor, target)


def _people(n: int, *exclude: int, extra: Sequence[str] = ("No one",)) -> tuple[str, ...]:
    """Option pool: every person not excluded, then ``extra``, padded with generic options to 4."""
    pool = [f"Person {i}" for i in range(n) if i not in exclude] + list(extra)
    pool += [p for p in ("No one", "Everyone", "An object") if p not in pool][: max(0, 4 - len(pool))]
    return tuple(pool)


def _spans(duration: float, k: int, gap: float = 0.3) -> list[tuple[float, float]]:
    """``k`` consecutive non-overlapping spans (seconds, 0.1 s steps) covering [0.4, duration - 0.4]."""
    w = (duration - 0.8) / k
    return [(round(0.4 + i * w, 1), round(0.4 + (i + 1) * w - gap, 1)) for i in range(k)]


def _g(actor: int, target: int, span: tuple[float, float]) -> Action:
    """A gaze action over ``span`` seconds."""
    return Action("gaze", actor, target, *span)


def _t1(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    tgt, span = rng.choice([b, OBJECT]), (0.5, d - 0.5)
    return Question("T1", f"Who or what is Person {a} looking at?", _opt(tgt),
                    _people(n, a, extra=("An object", "No one")),
                    (_g(a, tgt, span),), (("gaze", _ev(a, tgt)),), span)


def _t2(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    s0, s1 = _spans(d, 2)
    kind = rng.choice(["Mutual gaze", "Joint attention", "Gaze following"])
    acts = {"Mutual gaze": (_g(a, b, (s0[0], s1[1])), _g(b, a, (s0[0], s1[1]))),
            "Joint attention": (_g(a, OBJECT, (s0[0], s1[1])), _g(b, OBJECT, (s0[0], s1[1]))),
            "Gaze following": (_g(a, OBJECT, s0), _g(b, OBJECT, s1))}[kind]
    pool = ["Mutual gaze", "Joint attention", "Gaze following", "Sudden gaze shift"]
    rng.shuffle(pool)
    return Question("T2", f"Which gaze event happens between Person {a} and Person {b}?", kind, tuple(pool), acts,
                    (("gaze", (a, b)),), (s0[0], s1[1]))


def _t3(rng: random.Random, n: int, d: float) -> Question:
    a = rng.randrange(n)
    x, y = rng.sample([i for i in range(n) if i != a] + [OBJECT], 2)
    s0, s1 = _spans(d, 2)
    return Question("T3", f"Who or what does Person {a} look at first?", _opt(x),
                    _people(n, a, extra=("An object", "No one")),
                    (_g(a, x, s0), _g(a, y, s1)), (("gaze", _ev(a, x)), ("gaze", _ev(a, y))), (s0[0], s1[1]))


def _t4(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    span = (0.5, d - 0.5)
    acts = (_g(a, b, span), _g(b, a, span), _g(c, a, (1.0, d - 1.0)))
    return Question("T4", f"Who shares mutual gaze with Person {a}?", f"Person {b}",
                    _people(n, a, extra=("No one", "Everyone")),
                    acts, (("gaze", (a, b)),), span)


def _t5(rng: random.Random, n: int, d: float) -> Question:
    lead, fol = rng.sample(range(n), 2)
    x = rng.choice([i for i in range(n) if i not in (lead, fol)] + [OBJECT])
    span = (0.5, round(d - 0.5, 1))
    acts = (_g(lead, x, (0.5, 2.5)), _g(fol, x, (1.5, span[1])))
    return Question("T5", f"Between {span[0]}s and {span[1]}s, whose gaze does Person {fol} follow?", f"Person {lead}",
                    _people(n, fol), acts, (("gaze", (lead, fol)),), span)


def _t6(rng: random.Random, n: int, d: float) -> Question:
    ids = rng.sample(range(n), n)
    focus, gazers = ids[0], ids[1:]
    acts = tuple(_g(g, focus, (round(0.5 + 0.8 * i, 1), d - 0.3)) for i, g in enumerate(gazers))
    later = " and ".join(f"Person {a.actor} (at {a.start}s)" for a in acts[1:])
    summary = (f"Person {acts[0].actor} is the first to look at Person {focus}, at {acts[0].start}s. "
               f"Then {later} {'turns' if len(acts) == 2 else 'turn'} to Person {focus} as well. "
               f"From {acts[-1].start}s on, everyone else is looking at Person {focus}, "
               f"who has become the focus of the group's attention.")
    return Question("T6", "Who becomes the focus of the group's attention?", f"Person {focus}", _people(n), acts,
                    tuple(("gaze", (g, focus)) for g in gazers), (0.5, d - 0.3), summary=summary)


def _gesture_at(rng: random.Random, n: int, actor: int, span: tuple[float, float], avoid: Sequence[int] = (),
                kinds: Sequence[str] = GESTURES) -> Action:
    """A random gesture by ``actor``; showing and giving always target a person."""
    kind = rng.choice(list(kinds))
    people = [i for i in range(n) if i != actor and i not in avoid]
    targets = people if kind in ("showing", "giving") else people + [OBJECT]
    return Action(kind, actor, rng.choice(targets), *span)


def _g1(rng: random.Random, n: int, d: float) -> Question:
    a = rng.randrange(n)
    act = _gesture_at(rng, n, a, (1.0, d - 1.0))
    return Question("G1", "Who is gesturing?", f"Person {a}", _people(n), (act,), ((act.kind, _ev(a, act.target)),),
                    (act.start, act.end))


def _g2(rng: random.Random, n: int, d: float) -> Question:
    a = rng.randrange(n)
    act = _gesture_at(rng, n, a, (1.0, d - 1.0))
    pool = [k.capitalize() for k in GESTURES]
    rng.shuffle(pool)
    return Question("G2", f"What kind of gesture does Person {a} make?", act.kind.capitalize(), tuple(pool), (act,),
                    ((act.kind, _ev(a, act.target)),), (act.start, act.end))


def _g3(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    s0, s1 = _spans(d, 2)
    acts = (_gesture_at(rng, n, a, s0), _gesture_at(rng, n, b, s1))
    return Question("G3", f"Who makes a gesture right after Person {a}?", f"Person {b}", _people(n, a), acts,
                    tuple((x.kind, _ev(x.actor, x.target)) for x in acts), (s0[0], s1[1]))


def _g4(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    s0, s1, s2 = _spans(d, 3)
    acts = (_gesture_at(rng, n, a, s0, kinds=("pointing",)), _gesture_at(rng, n, b, s1),
            _gesture_at(rng, n, a, s2, kinds=("pointing",)))
    return Question("G4", "Who gestures most often?", f"Person {a}", _people(n), acts,
                    tuple((x.kind, _ev(x.actor, x.target)) for x in acts), (s0[0], s2[1]))


def _g5(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    s0, s1 = _spans(d, 2)
    acts = (Action("pointing", a, b, *s0), Action("pointing", b, c, *s1))
    summary = (f"Person {a} first points at Person {b}, from {s0[0]}s to {s0[1]}s. "
               f"Person {b} then passes the gesture on by pointing at Person {c}, from {s1[0]}s to {s1[1]}s. "
               f"The pointing forms a chain from Person {a} through Person {b} to Person {c}.")
    return Question("G5", f"Person {a} points at Person {b}. Whom does Person {b} point at next?", f"Person {c}",
                    _people(n, b, extra=("An object", "No one")), acts,
                    (("pointing", (a, b)), ("pointing", (b, c))), (s0[0], s1[1]), summary=summary)


def _g6(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    s0, s1, s2 = _spans(d, 3)
    k1, k2 = rng.choice(["pointing", "giving", "showing"]), rng.choice(["pointing", "giving", "showing"])
    acts = (Action(k1, a, b, *s0), Action(k2, b, a, *s1), Action("reaching", c, OBJECT, *s2))
    return Question("G6", f"Who returns Person {a}'s gesture?", f"Person {b}", _people(n, a), acts,
                    ((k1, (a, b)), (k2, (b, a))), (s0[0], s1[1]))


def _j1(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    s0, s1, s2 = _spans(d, 3)
    point = _gesture_at(rng, n, a, s1, avoid=(b,), kinds=("pointing",))
    acts = (_g(c, a, s0), point, _g(b, a, s1))
    return Question("J1", f"Who looks at Person {a} while Person {a} is pointing?", f"Person {b}", _people(n, a), acts,
                    (("pointing", _ev(a, point.target)), ("gaze", (b, a))), s1)


def _j2(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    span = (1.0, d - 1.0)
    acts = (Action("giving", a, b, *span), _g(a, b, span), _g(b, a, span), _g(c, OBJECT, (0.5, d - 0.5)))
    return Question("J2", f"While Person {a} gives an object, with whom does Person {a} make eye contact?", f"Person {b}",
                    _people(n, a), acts, (("giving", (a, b)), ("gaze", (a, b))), span)


def _j3(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    rest = [i for i in range(n) if i not in (a, b)]
    x = rng.choice(rest + [OBJECT])
    point, look = Action("pointing", a, x, 0.5, round(d * 0.6, 1)), _g(b, x, (1.3, d - 0.4))
    watchers = [i for i in rest if i != x]
    acts = (point, look) + tuple(_g(w, a, (0.5, d - 0.4)) for w in watchers)
    extra = "".join(f" Person {w} keeps looking at Person {a} instead of the target." for w in watchers)
    summary = (f"Person {a} points at {_name(x)} from {point.start}s to {point.end}s. "
               f"About 0.8 s later, at {look.start}s, "
               f"Person {b} turns to look at {_name(x)} too, so Person {b}'s gaze follows the gesture.{extra}")
    return Question("J3", f"Person {a} points. Who turns to look where Person {a} points?", f"Person {b}", _people(n, a),
                    acts, (("pointing", _ev(a, x)), ("gaze", _ev(b, x))), (point.start, look.end), summary=summary)


def _j4(rng: random.Random, n: int, d: float) -> Question:
    a, b, c = rng.sample(range(n), 3)
    s0, s1 = _spans(d, 2)
    acts = (Action("pointing", a, b, s0[0], s1[0]), _g(c, b, (s0[0], s1[1])), _g(b, a, s1))
    summary = (f"Person {a} points at Person {b} while Person {c} looks at Person {b}, so Person {b} is both pointed at "
               f"and looked at. Person {b} responds by looking back at Person {a} from {s1[0]}s. "
               f"Gaze and gesture both converge on Person {b}, who links the others.")
    return Question("J4", "Who is both pointed at and looked at by others?", f"Person {b}", _people(n), acts,
                    (("pointing", (a, b)), ("gaze", (c, b)), ("gaze", (b, a))), (s0[0], s1[1]), summary=summary)


#: Question template of each category and the smallest scene it needs (persons).
TEMPLATES: dict[str, tuple[Callable[[random.Random, int, float], Question], int]] = {
    "T1": (_t1, 3), "T2": (_t2, 2), "T3": (_t3, 3), "T4": (_t4, 3), "T5": (_t5, 3), "T6": (_t6, 3),
    "G1": (_g1, 3), "G2": (_g2, 2), "G3": (_g3, 3), "G4": (_g4, 3), "G5": (_g5, 3), "G6": (_g6, 3),
    "J1": (_j1, 3), "J2": (_j2, 3), "J3": (_j3, 3), "J4": (_j4, 3),
}
OPEN_ENDED_CATEGORIES = ("T6", "G5", "J3", "J4")


def real_questions() -> dict[str, Question]:
    """Hand-written questions about the real kitchen clip (Person 0 gestures, Person 1 looks at the avocado)."""
    narration = ("Person 1 looks down at the avocado he is handling for the whole clip.",
                 "Person 0 talks and gestures with open hands while Person 1 handles the avocado.")
    return {
        "T1": Question("T1", "Who or what is Person 1 looking at?", "An object (the avocado)",
                       ("Person 0", "An object (the avocado)", "The camera", "No one"), (), (("gaze", (1,)),),
                       (0.0, 3.3), sort_options=False, narration=narration),
        "G1": Question("G1", "Who is gesturing?", "Person 0", ("Person 0", "Person 1", "Both people", "No one"), (),
                       (("gesture", (0,)),), (0.0, 3.3), sort_options=False, narration=narration),
    }


# -------------------------------------------------------------------------------------- entries
@dataclass(frozen=True)
class Clip:
    """One clip file of the sample.

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


def make_options(rng: random.Random, q: Question, position: int | None = None) -> tuple[tuple[str, ...], str]:
    """Pick 3 distractors from the pool, lay out 4 options ``"A) ..."`` and return them with the answer letter.

    With ``q.sort_options`` the distractors are ordered (persons by id, then the others in pool
    order) and the answer goes to ``position`` (0-3; random when ``None``); otherwise the options
    keep the pool's order.
    """
    distractors = [p for p in q.pool if p != q.answer_text]
    if len(distractors) < 3 or q.answer_text not in q.pool:
        raise ValueError(f"{q.category} question {q.text!r}: option pool {q.pool} cannot give 4 options")
    if q.sort_options:
        chosen = sorted(rng.sample(distractors, 3),
                        key=lambda p: (0, int(p.split()[1])) if p.startswith("Person ") else (1, q.pool.index(p)))
        chosen.insert(rng.randrange(4) if position is None else position, q.answer_text)
    else:
        chosen = sorted([q.answer_text] + rng.sample(distractors, 3), key=q.pool.index)
    letters = "ABCD"
    return tuple(f"{letters[i]}) {c}" for i, c in enumerate(chosen)), letters[chosen.index(q.answer_text)]


def describe(action: Action, short: bool = False) -> str:
    """One sentence for a drawn action, e.g. ``"Person 0 looks at Person 2 from 0.5s to 3.5s."``."""
    tgt = _name(action.target, short)
    verb = {"gaze": f"looks at {tgt}", "pointing": f"points at {tgt}", "reaching": f"reaches toward {tgt}",
            "showing": f"shows an object to {tgt}", "giving": f"gives an object to {tgt}"}[action.kind]
    return f"{_name(action.actor, short)} {verb} from {action.start}s to {action.end}s."


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
    return "\n".join([entry.question.text, *entry.options, instruction])


# ---------------------------------------------------------------------------------------- plans
#: (category, format) of the SFT rows; the real clip adds one T1 row (24 in all).
SFT_PLAN = ([(c, "mcq") for c in CATEGORIES] + [(c, "open_ended") for c in OPEN_ENDED_CATEGORIES]
            + [("T4", "mcq"), ("G2", "mcq"), ("J1", "mcq")])
#: categories of the RL rows (all MCQ); the real clip adds one G1 row (24 in all).
RL_PLAN = list(CATEGORIES) + ["T2", "T3", "T5", "G3", "G4", "J2", "G6"]


def balanced_positions(rng: random.Random) -> Iterator[int]:
    """Answer positions 0-3, each block of four a random permutation, so answer letters are balanced."""
    while True:
        block = [0, 1, 2, 3]
        rng.shuffle(block)
        yield from block


def _video_id(source: str, k: int) -> str:
    """The ``k``-th synthetic video id of a source (werewolf ids contain a dot)."""
    return {"social_gesture": f"{150 + k}_1_{k % 5 + 1:03d}", "werewolf": f"game{k:02d}.round{k % 3 + 1}",
            "embody3d": f"sess_{k:02d}_cam1"}[source]


class _Builder:
    """Makes synthetic clips two questions per video, cycling through :data:`SOURCES`."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.videos = 0
        self.per_source = {s: 0 for s in SOURCES}

    def _new_video(self) -> tuple[str, str]:
        source = SOURCES[self.videos % len(SOURCES)]
        self.videos += 1
        k = self.per_source[source]
        self.per_source[source] += 1
        return source, _video_id(source, k)

    def clips(self, categories: Sequence[str]) -> list[tuple[Clip, Question]]:
        """Render one clip per category, two consecutive categories sharing a video and its scene."""
        out = []
        for i in range(0, len(categories), 2):
            pair = categories[i:i + 2]
            source, video_id = self._new_video()
            rng = random.Random(f"{self.seed}:scene:{video_id}")
            n = rng.choice(range(max(TEMPLATES[c][1] for c in pair), 5))
            scene = make_scene(rng, n)
            for j, cat in enumerate(pair):
                qrng = random.Random(f"{self.seed}:{video_id}:{j}")
                duration = qrng.choice([4.0, 5.0, 6.0])
                q = TEMPLATES[cat][0](qrng, n, duration)
                data = encode_mp4(render_clip(scene, q.actions, duration))
                out.append((Clip(source, video_id, j, duration, (HEIGHT, WIDTH), data, n), q))
        return out


def load_real_clip(path: str | Path | None = None) -> bytes:
    """Bytes of the real kitchen clip: from ``path``, else from the shipped sample's social-iq shard.

    Raises:
        GraspDataError: the file or the shipped shard member is missing.
    """
    if path is not None:
        if not Path(path).is_file():
            raise GraspDataError(str(path), "real clip not found")
        return Path(path).read_bytes()
    shard = ASSETS_DIR / "train" / "videos" / f"{REAL_SOURCE}_part000.tar"
    member = f"{REAL_SOURCE}/video/{REAL_VIDEO_ID}_qa0000.mp4"
    try:
        with tarfile.open(shard) as tar:
            return tar.extractfile(member).read()
    except (OSError, KeyError, AttributeError, tarfile.TarError) as err:
        raise GraspDataError(f"{shard}:{member}", f"shipped real clip unreadable ({err}); pass --real-clip PATH") from err


def clip_duration(data: bytes) -> float:
    """Duration in seconds of an mp4 (its container duration), floored to 0.01 s."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        seconds = float(stream.duration * stream.time_base) if stream.duration else container.duration / 1e6
    return int(seconds * 100) / 100


# ---------------------------------------------------------------------------------------- rows
def video_spec(clip: Clip) -> dict:
    """The row's video spec: path under the extracted videos root, 2 fps, whole clip, ``[H, W]``."""
    return {"type": "video", "path": clip.train_path, "fps": SAMPLE_FPS, "start_seconds": 0.0,
            "end_seconds": clip.duration, "src_resolution": list(clip.resolution)}


def _maybe_shuffle(rng: random.Random, specs: list[dict]) -> list[dict]:
    """Rotate the spec order in about one row in five (the format allows any order)."""
    return specs[1:] + specs[:1] if rng.random() < 0.2 else specs


def sft_row(rng: random.Random, e: Entry, instruction: str = INSTRUCTION) -> list[dict]:
    """A data_sft.jsonl row: video spec, user text (ending with ``instruction``), assistant reasoning + answer."""
    return _maybe_shuffle(rng, [video_spec(e.clip), {"type": "text", "content": user_text(e, instruction), "output": False},
                                {"type": "text", "content": e.response, "output": True}])


def rl_row(rng: random.Random, e: Entry, k: int, instruction: str = INSTRUCTION) -> list[dict]:
    """A data_rl.jsonl row: video spec, user text (ending with ``instruction``), target letter, meta with
    ground-truth events."""
    meta = {"type": "meta", "difficulty": CATEGORY_DIFFICULTY[e.question.category], "question_text": e.question.text,
            "gt_events": [{"source": s, "persons": list(p)} for s, p in e.question.events]}
    if k % 3 == 2:
        meta["category"] = e.question.category  # an extra key: readers must ignore unknown keys
    return _maybe_shuffle(rng, [video_spec(e.clip), {"type": "text", "content": user_text(e, instruction),
                                                      "output": False},
                                {"type": "text", "content": e.letter, "output": True}, meta])


def _bench_category(category: str) -> str:
    """The bench writes ``C1``..``C4`` for the joint categories."""
    return "C" + category[1] if category[0] == "J" else category


def annotation(e: Entry, k: int, bench: bool = False) -> dict:
    """An annotations.jsonl line; open-ended options alternate between ``null`` and ``[]`` (both occur)."""
    options: list[str] | None = list(e.options) if e.fmt == "mcq" else ([] if k % 2 else None)
    return {"id": e.clip.name[:-4], "video": f"video/{e.clip.name}" if bench else e.clip.train_path,
            "source": e.clip.source, "category": _bench_category(e.question.category) if bench else e.question.category,
            "difficulty": CATEGORY_DIFFICULTY[e.question.category], "format": e.fmt, "question": e.question.text,
            "options": options, "answer": e.answer, "response": None if bench else e.response}


def bench_json(e: Entry, k: int, events_every: int = 4) -> dict:
    """A GRASP-Bench ``json/<clip>.json``; every ``events_every``-th item also carries its ``events``."""
    q = e.question
    qa = {"category": _bench_category(q.category), "difficulty": CATEGORY_DIFFICULTY[q.category], "format": e.fmt,
          "dataset": e.clip.source, "video_id": e.clip.video_id, "question": q.text, "options": list(e.options),
          "answer": e.letter, "answer_text": q.answer_text, "reasoning": e.reasoning,
          "source_event_ids": [2000 + 10 * k + j for j in range(len(q.events))], "time_range": list(q.time_range)}
    if k % events_every == 0:
        qa["events"] = [{"source": s, "persons": list(p)} for s, p in q.events]
    return {"video_name": e.clip.video_id, "clip_file": e.clip.name, "clip_offset": round(e.clip.index * 6.5, 1),
            "clip_duration": e.clip.duration, "qa": qa}


# --------------------------------------------------------------------------------------- writing
def _json(obj: object) -> str:
    """Compact, key-order-preserving JSON (UTF-8 text kept as is)."""
    return json.dumps(obj, ensure_ascii=False)


def write_jsonl(path: Path, rows: Sequence[object]) -> None:
    """Write one JSON value per line, ``\\n``-terminated."""
    path.write_text("".join(_json(r) + "\n" for r in rows), encoding="utf-8")


def _tar_info(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    """A member header with fixed mtime, owner and mode, so archives are byte-stable."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, TAR_MTIME, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
    return info


def write_tar(path: Path, members: Sequence[tuple[str, bytes]], dirs: Sequence[str] = ()) -> None:
    """Write a ustar archive: directory entries ``dirs`` first, then ``(name, bytes)`` members in order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for d in dirs:
            tar.addfile(_tar_info(d.rstrip("/") + "/", directory=True))
        for name, data in members:
            tar.addfile(_tar_info(name, len(data)), io.BytesIO(data))


def write_shards(videos_dir: Path, clips: Sequence[Clip], clips_per_shard: int) -> list[Path]:
    """Write ``<source>_partNNN.tar`` shards (clips sorted by path, ``clips_per_shard`` each); remove stale ones."""
    videos_dir.mkdir(parents=True, exist_ok=True)
    for stale in videos_dir.glob("*_part[0-9][0-9][0-9].tar"):
        stale.unlink()
    paths = []
    for source in sorted({c.source for c in clips}):
        group = sorted((c for c in clips if c.source == source), key=lambda c: c.train_path)
        for part, i in enumerate(range(0, len(group), clips_per_shard)):
            path = videos_dir / f"{source}_part{part:03d}.tar"
            write_tar(path, [(c.train_path, c.data) for c in group[i:i + clips_per_shard]],
                      dirs=(f"{source}/", f"{source}/video/"))
            paths.append(path)
    return paths


def write_bench(path: Path, entries: Sequence[Entry], events_every: int = 4) -> None:
    """Write ``grasp_bench.tar``: per clip (sorted by name) ``json/<clip>.json`` then ``video/<clip>.mp4``
    (``events_every``: see :func:`bench_json`; 1 gives every item its events)."""
    members: list[tuple[str, bytes]] = []
    for k, e in sorted(enumerate(entries), key=lambda ke: ke[1].clip.name):
        stem = e.clip.name[:-4]
        text = json.dumps(bench_json(e, k, events_every), ensure_ascii=False, indent=2) + "\n"
        members.append((f"json/{stem}.json", text.encode()))
        members.append((f"video/{e.clip.name}", e.clip.data))
    write_tar(path, members)


@dataclass(frozen=True)
class SampleSummary:
    """What :func:`generate_sample` wrote.

    Attributes:
        out_dir: the output root.
        files: every written file, relative to ``out_dir``, sorted.
        n_sft: SFT rows; n_rl: RL rows; n_bench: bench items.
        bench: bench clip names per canonical category (``T1``..``J4``).
    """

    out_dir: Path
    files: tuple[str, ...]
    n_sft: int
    n_rl: int
    n_bench: int
    bench: dict[str, tuple[str, ...]]


def _readme(seed: int, sft: Sequence[Entry], rl: Sequence[Entry], bench: Sequence[Entry], shards: Sequence[Path]) -> str:
    """The sample's README.md: what it is, how it was made, the real clip's attribution (verbatim)."""
    per_cat = "\n".join(f"| {c} | {CATEGORY_DIFFICULTY[c]} | " + ", ".join(f"`{e.clip.name}`" for e in bench
                                                                         if e.question.category == c) + " |"
                        for c in CATEGORIES)
    shard_list = "\n".join(f"  - `{p.name}`" for p in shards)
    return f"""# GRASP-format sample data (seed {seed})

A small dataset in the exact file layout of GRASP (`interlive/GRASP`; schemas in
`shared/grasp-format.md`), made by `python -m grasp_lightning.generators.sample_data OUT_DIR --seed {seed}`
(module `grasp_lightning/generators/sample_data.py`). It exists so that readers, training and GRASP-Bench
evaluation can run offline; it is not GRASP data.

- `train/data_sft.jsonl`: {len(sft)} SFT rows (MCQ, and open-ended rows for {", ".join(OPEN_ENDED_CATEGORIES)}).
- `train/data_rl.jsonl`: {len(rl)} RL rows (MCQ, target letter, `meta` with `gt_events`); a few rows
  list their specs in another order, a few carry an extra `meta` key.
- `train/annotations.jsonl`: all {len(sft) + len(rl)} training QA (SFT first, then RL); open-ended
  options are written as `null` or `[]` (both occur).
- `train/videos/`: {len(shards)} shards, each extracting to `<source>/video/<video_id>_qa<NNNN>.mp4`
  (`werewolf` and `social-iq` video ids contain dots):
{shard_list}
- `test/grasp_bench.tar`: {len(bench)} items, 2 per category, `json/<clip>.json` + `video/<clip>.mp4`;
  joint categories are written `C1`-`C4`; every fourth item carries `qa.events`.
- `test/annotations.jsonl`: the bench QA, one per line (`video` is `video/<clip>.mp4`).

Synthetic clips: {WIDTH}x{HEIGHT} pixels, 4-6 s at {FPS:g} fps, H.264 (libx264, yuv420p). Each person is
a coloured square inside an id box with its number (Person 0 red, 1 green, 2 blue, 3 yellow); the
grey square at the bottom is "an object". A gaze is a line in the gazer's colour whose white dot
travels to the target and stays inside the target square; pointing is a short white bar, reaching a
long one, showing an orange object held above the person, giving an orange object travelling to the
receiver. Questions, options, answers, reasoning and events are derived from the drawn actions.
The JSON and tar structure are byte-identical for a given seed; the mp4 bytes are identical for a
given libx264 build.

## Bench items per category

| category | difficulty | clips |
|---|---|---|
{per_cat}

## Real clip

`social-iq/video/{REAL_VIDEO_ID}_qa0000.mp4` (SFT, T1), `..._qa0001.mp4` (RL, G1) and
`video/{REAL_VIDEO_ID}_qa0002.mp4` (bench, T1) are byte copies of the clip described below. Its
attribution, copied verbatim from the clip's own README:

{REAL_CLIP_ATTRIBUTION}"""


def _real_clip(data: bytes, index: int) -> Clip:
    return Clip(REAL_SOURCE, REAL_VIDEO_ID, index, clip_duration(data), REAL_RESOLUTION, data, 2)


def generate_sample(out_dir: str | Path, seed: int = 0, real_clip: str | Path | None = None,
                    clips_per_shard: int = 8) -> SampleSummary:
    """Generate the GRASP-format sample dataset under ``out_dir`` (deterministic for a given ``seed``).

    Args:
        out_dir: output root; ``train/`` and ``test/`` are created, existing files overwritten.
        seed: seed of every random choice (layouts, events, options, clip durations).
        real_clip: path of ``kitchen_two_person.mp4``; ``None`` takes it from the shipped sample.
        clips_per_shard: clips per train tar shard.

    Returns:
        A :class:`SampleSummary` of what was written.

    Raises:
        GraspDataError: the real clip cannot be found.
    """
    out = Path(out_dir)
    real = load_real_clip(real_clip)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "test").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:entries")
    builder = _Builder(seed)
    real_q = real_questions()
    pos = balanced_positions(random.Random(f"{seed}:positions"))
    sft = [make_entry(rng, real_q["T1"], _real_clip(real, 0), "mcq")]
    sft += [make_entry(rng, q, c, fmt, position=next(pos))
            for (c, q), (_, fmt) in zip(builder.clips([p[0] for p in SFT_PLAN]), SFT_PLAN)]
    rl = [make_entry(rng, real_q["G1"], _real_clip(real, 1), "mcq")]
    rl += [make_entry(rng, q, c, "mcq", position=next(pos)) for c, q in builder.clips(RL_PLAN)]
    bench_cats = [c for c in CATEGORIES for _ in range(2)]
    bench_cats.remove("T1")
    bench = [make_entry(rng, real_q["T1"], _real_clip(real, 2), "mcq")]
    bench += [make_entry(rng, q, c, "mcq", short=k % 2 == 1, position=next(pos))
              for k, (c, q) in enumerate(builder.clips(bench_cats))]
    bench.sort(key=lambda e: CATEGORIES.index(e.question.category))
    write_jsonl(out / "train" / "data_sft.jsonl", [sft_row(rng, e) for e in sft])
    write_jsonl(out / "train" / "data_rl.jsonl", [rl_row(rng, e, k) for k, e in enumerate(rl)])
    write_jsonl(out / "train" / "annotations.jsonl", [annotation(e, k) for k, e in enumerate(sft + rl)])
    shards = write_shards(out / "train" / "videos", [e.clip for e in sft + rl], clips_per_shard)
    write_jsonl(out / "test" / "annotations.jsonl", [annotation(e, k, bench=True) for k, e in enumerate(bench)])
    write_bench(out / "test" / "grasp_bench.tar", bench)
    (out / "README.md").write_text(_readme(seed, sft, rl, bench, shards), encoding="utf-8")
    files = tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
    per_cat = {c: tuple(e.clip.name for e in bench if e.question.category == c) for c in CATEGORIES}
    log.info("wrote GRASP sample to %s: %d SFT rows, %d RL rows, %d shards, %d bench items",
             out, len(sft), len(rl), len(shards), len(bench))
    return SampleSummary(out, files, len(sft), len(rl), len(bench), per_cat)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: ``python -m grasp_lightning.generators.sample_data OUT_DIR [--seed 0] [--real-clip PATH] [--clips-per-shard 8]``."""
    parser = argparse.ArgumentParser(description="Generate a small GRASP-format sample dataset.")
    parser.add_argument("out_dir", type=Path, help="output root (train/, test/, README.md)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--real-clip", type=Path, default=None,
                        help="kitchen_two_person.mp4 (default: the copy in the shipped sample)")
    parser.add_argument("--clips-per-shard", type=int, default=8, help="clips per train tar shard")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    generate_sample(args.out_dir, args.seed, args.real_clip, args.clips_per_shard)


if __name__ == "__main__":
    main()
