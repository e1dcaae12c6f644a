"""Drawing of the synthetic clips: frames, persons, the object, gaze and gesture, whole clips.

A scene is a few coloured squares at the corners of a table (:class:`Scene`); each person is a
square inside an id box with its number (Person 0 red, 1 green, 2 blue, 3 yellow), a grey square is
the object. An :class:`Action` is drawn while it lasts: a gaze is a line whose white dot travels from
the gazer to the target square (:func:`draw_gaze`), a gesture a white bar (pointing short, reaching
long) or an orange held object (showing: raised; giving: travelling to the receiver;
:func:`draw_gesture`). :func:`render_clip` gives the frames; :func:`grasp_lightning.synthetic.mp4.encode_mp4`
encodes them. The primitives take sizes, colours and line widths as arguments, so other scenes (the
synthetic world of ``experiments/world``) draw with them too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

WIDTH, HEIGHT = 128, 72  #: synthetic frame size in pixels
FPS = 10.0  #: synthetic clip frame rate (frames per second)
SQUARE = 14  #: side of a person square in pixels
OBJECT = -1  #: target id of the scene's object (the grey square)
PERSON_COLOURS = ((220, 40, 40), (40, 200, 60), (50, 90, 230), (230, 210, 40))  #: red, green, blue, yellow
BACKGROUND, OBJECT_COLOUR = (36, 36, 44), (150, 150, 150)  #: RGB of the background and of the object
DOT, HAND, HELD = (255, 255, 255), (245, 245, 245), (255, 150, 0)  #: RGB of gaze dots, arms, held objects
SLOTS = ((22, 20), (106, 20), (106, 52), (22, 52))  #: person centres (x, y) in pixels: corners of a table
OBJECT_CENTRE = (64, 64)
GESTURES = ("pointing", "showing", "giving", "reaching")


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
              colour: Sequence[int], offset: float = 2.0, thickness: int = 1, dot: int = 3, core: int = 0,
              short: float = 0.0) -> None:
    """Draw a gaze: a line from ``src`` toward ``dst`` with a ``dot`` x ``dot`` white dot at its tip.

    ``progress`` in [0, 1] is how far the dot has travelled; at 1 it sits ``offset`` pixels beside
    ``dst`` (the centre of the target square, so still inside it), and ``short`` pixels before it along
    the gaze (gazes arriving from different directions then end on different sides of the centre). The
    line is shifted ``offset`` pixels to the right of its direction, so the two gazes of a mutual gaze are
    drawn side by side. ``thickness`` is the line width in pixels. ``core`` > 0 fills the dot's middle ``core`` x ``core`` pixels with the gazer's ``colour``: a white
    ring around it, so the tip shows both that a gaze ends there and whose it is.
    """
    d = np.array(dst, float) - np.array(src, float)
    length = max(float(np.hypot(*d)), 1e-6)
    n = np.array([-d[1], d[0]]) / length * offset
    if short:
        dst = tuple(np.array(dst, float) - d / length * short)
    src, dst = (src[0] + n[0], src[1] + n[1]), (dst[0] + n[0], dst[1] + n[1])
    p = min(max(progress, 0.0), 1.0)
    tip = (src[0] + p * (dst[0] - src[0]), src[1] + p * (dst[1] - src[1]))
    draw_line(frame, src, tip, colour, thickness)
    centre = (int(round(tip[0])), int(round(tip[1])))
    draw_object(frame, centre, dot, DOT)
    if core:
        draw_object(frame, centre, core, colour)


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
                 square: int = SQUARE, held: Sequence[int] = HELD, held_size: int = 5) -> None:
    """Draw a deictic gesture of ``kind`` (pointing, reaching, showing, giving) from ``src`` toward ``dst``.

    Pointing is a short bar, reaching a long thick bar, showing an object held above the actor,
    giving an object travelling from actor to receiver (``progress`` in [0, 1]); the object is
    ``held_size`` pixels of colour ``held`` (default: orange, 5 pixels).
    ``square`` is the side in pixels of the actor's square (arms start at its edge).
    """
    if kind == "pointing":
        draw_pointing(frame, src, dst, square=square)
    elif kind == "reaching":
        draw_pointing(frame, src, dst, length=13, thickness=3, square=square)
    elif kind == "showing":
        draw_object(frame, (src[0], src[1] - square // 2 - 5), held_size, held)
    elif kind == "giving":
        p = min(max(progress, 0.0), 1.0)
        draw_object(frame, (int(src[0] + p * (dst[0] - src[0])), int(src[1] + p * (dst[1] - src[1]))), held_size, held)
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

