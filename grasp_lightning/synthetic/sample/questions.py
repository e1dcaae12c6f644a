"""Questions of the sample data: the 16 category templates, :class:`Question`, and the options.

Each template (``_t1`` .. ``_j4``, :data:`TEMPLATES`) draws the actions of one clip with a seeded
``random.Random`` and derives from them the question, the correct option, an option pool, the
ground-truth social events and the time range, so every answer is consistent with the pixels
(:mod:`.drawing`). :func:`make_options` lays out four lettered options.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

from grasp_lightning.data.formats import lettered
from grasp_lightning.synthetic.sample.drawing import GESTURES, OBJECT, Action


@dataclass(frozen=True)
class Question:
    """A question about a clip, with everything needed to write any GRASP file.

    Attributes:
        category: ``T1``..``J4``.
        text: the bare question (no options).
        answer_text: the correct option text (MCQ), e.g. ``"Person 2"``.
        pool: candidate option texts, the answer included (at least 4).
        actions: what is drawn.
        events: ground-truth social events ``(source, persons)`` of the question, or
            ``(source, persons, (start, end))`` with the event's time span in seconds.
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
    events: tuple[tuple, ...]
    time_range: tuple[float, float]
    summary: str = ""
    sort_options: bool = True
    narration: tuple[str, str] | None = None


def person_name(target: int, short: bool = False) -> str:
    """``"Person N"`` (or ``"PN"``), or ``"the object"``."""
    return "the object" if target == OBJECT else (f"P{target}" if short else f"Person {target}")


def option_text(target: int) -> str:
    """Option text of a target: ``"Person N"`` or ``"An object"``."""
    return "An object" if target == OBJECT else f"Person {target}"


def participants(actor: int, target: int) -> tuple[int, ...]:
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
    return Question("T1", f"Who or what is Person {a} looking at?", option_text(tgt),
                    _people(n, a, extra=("An object", "No one")),
                    (_g(a, tgt, span),), (("gaze", participants(a, tgt)),), span)


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
    return Question("T3", f"Who or what does Person {a} look at first?", option_text(x),
                    _people(n, a, extra=("An object", "No one")),
                    (_g(a, x, s0), _g(a, y, s1)), (("gaze", participants(a, x)), ("gaze", participants(a, y))), (s0[0], s1[1]))


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
    return Question("G1", "Who is gesturing?", f"Person {a}", _people(n), (act,), ((act.kind, participants(a, act.target)),),
                    (act.start, act.end))


def _g2(rng: random.Random, n: int, d: float) -> Question:
    a = rng.randrange(n)
    act = _gesture_at(rng, n, a, (1.0, d - 1.0))
    pool = [k.capitalize() for k in GESTURES]
    rng.shuffle(pool)
    return Question("G2", f"What kind of gesture does Person {a} make?", act.kind.capitalize(), tuple(pool), (act,),
                    ((act.kind, participants(a, act.target)),), (act.start, act.end))


def _g3(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    s0, s1 = _spans(d, 2)
    acts = (_gesture_at(rng, n, a, s0), _gesture_at(rng, n, b, s1))
    return Question("G3", f"Who makes a gesture right after Person {a}?", f"Person {b}", _people(n, a), acts,
                    tuple((x.kind, participants(x.actor, x.target)) for x in acts), (s0[0], s1[1]))


def _g4(rng: random.Random, n: int, d: float) -> Question:
    a, b = rng.sample(range(n), 2)
    s0, s1, s2 = _spans(d, 3)
    acts = (_gesture_at(rng, n, a, s0, kinds=("pointing",)), _gesture_at(rng, n, b, s1),
            _gesture_at(rng, n, a, s2, kinds=("pointing",)))
    return Question("G4", "Who gestures most often?", f"Person {a}", _people(n), acts,
                    tuple((x.kind, participants(x.actor, x.target)) for x in acts), (s0[0], s2[1]))


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
                    (("pointing", participants(a, point.target)), ("gaze", (b, a))), s1)


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
    summary = (f"Person {a} points at {person_name(x)} from {point.start}s to {point.end}s. "
               f"About 0.8 s later, at {look.start}s, "
               f"Person {b} turns to look at {person_name(x)} too, so Person {b}'s gaze follows the gesture.{extra}")
    return Question("J3", f"Person {a} points. Who turns to look where Person {a} points?", f"Person {b}", _people(n, a),
                    acts, (("pointing", participants(a, x)), ("gaze", participants(b, x))), (point.start, look.end), summary=summary)


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
    return lettered(chosen), "ABCD"[chosen.index(q.answer_text)]

