"""Text parsing of model completions: answer letters, tag blocks, reasoning, named participants and time spans.

Pure functions on strings, shared by the rewards (:mod:`grasp_lightning.grpo.rewards`), the GRPO task and
GRASP-Bench scoring. The formats follow ``docs/data-format.md``: a completion looks like
``<think> ... <gaze>...</gaze> ... <gesture>...</gesture> ... </think><answer>B</answer>``, people
are written ``Person N`` (0-based) or ``PN``.

Tag names are matched case-sensitively (``<answer>``, not ``<Answer>``), as the prompt asks for
lowercase tags. All block matches are non-greedy and span newlines.
"""

from __future__ import annotations

import functools
import re

__all__ = [
    "answer_block",
    "answer_block_released",
    "extract_answer",
    "extract_participants",
    "extract_participants_released",
    "has_format",
    "opens_think",
    "parse_time_spans",
    "reasoning_text",
    "tag_contents",
    "temporal_iou",
]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The released GRASP training code's answer pattern (socialmllm/train/reasoning/trainer.py:9 of
# github.com/Social-Reaoning/grasp at 805d115): whitespace around the content is outside the group, and
# without DOTALL the content stops at a newline, so "<answer>B\nB</answer>" is no block and the search
# goes on to a later <answer>.
_RELEASED_ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>")
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
# ``Person N`` with any (or no) whitespace; ``\d+`` is greedy and may not be followed by another digit,
# so "Person 12" is 12, never 1.
_PERSON_RE = re.compile(r"\bPerson\s*(\d+)(?!\d)")
# A standalone ``PN``: a word boundary on both sides, so "P12" is 12 while "AP1", "P1a" and "P1_" are not ids.
_P_SHORT_RE = re.compile(r"\bP(\d+)\b")
# The released GRASP training code's person pattern (``socialmllm/train/reasoning/trainer.py`` of
# github.com/Social-Reaoning/grasp): ``Person`` needs at least one space, ``P`` a word boundary before only.
_RELEASED_PERSON_RE = re.compile(r"(?:Person\s+|\bP)(\d+)")
# A prompt that ends inside an opened think block: ``<think>`` then only whitespace.
_OPENS_THINK_RE = re.compile(r"<think>\s*\Z")
_STRICT_RE = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
# A time in seconds: a non-negative decimal not glued to a digit, dot, comma, minus or word character
# before it, then an optional unit (longest spelling first) ending on a word boundary.
_NUMBER = r"(?<![\w.,\-])(\d+(?:\.\d+)?)"
_UNIT = r"(?:\s*(?:seconds|second|secs|sec|s)\b)"
# "from <t> to <t>" / "between <t> and <t>": the unit is optional on the start, required on the end;
# a start without a unit must be followed by whitespace (so "1.s", "1..5s", "1,5s" never read as "1").
_SPAN_RE = re.compile(
    rf"\b(?:from\s+{_NUMBER}(?:{_UNIT}|(?=\s))\s+to|between\s+{_NUMBER}(?:{_UNIT}|(?=\s))\s+and)"
    rf"\s+{_NUMBER}{_UNIT}",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=16)
def _letter_patterns(letters: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """Compile the four extraction patterns for one set of option letters (cached)."""
    cls = "[" + re.escape(letters) + "]"
    # Stage 1, on the stripped <answer> content: "B", "B)", "(B)", "B.", "B:", "B) Person 2".
    in_block = re.compile(r"\(?(" + cls + r")(?:[).:]|$)", re.DOTALL)
    # Stage 2: \boxed{B} (spaces allowed inside the braces).
    boxed = re.compile(r"\\boxed\{\s*(" + cls + r")\s*\}")
    # Stage 3: a standalone option marker "B)" or "B." not glued to a preceding word character or dot
    # (so the "A." of "U.S.A." is not a marker).
    marker = re.compile(r"(?<![A-Za-z0-9_.])(" + cls + r")[).](?=\s|$|[^A-Za-z0-9_])")
    # Stage 4: the text (stripped) starts with the letter, followed by a non-letter or the end.
    leading = re.compile(r"(" + cls + r")(?![A-Za-z])")
    return in_block, boxed, marker, leading


def answer_block(text: str) -> str | None:
    """Return the raw content of the first ``<answer>...</answer>`` block, or ``None`` if there is none.

    The content is returned unstripped; callers strip it. Later ``<answer>`` blocks are ignored
    (only the first counts, as in the GRASP accuracy reward).

    Args:
        text: a completion.
    """
    match = _ANSWER_RE.search(text)
    return match.group(1) if match else None


def answer_block_released(text: str) -> str | None:
    """The content of the first ``<answer>`` block by the released GRASP training code's pattern, or ``None``.

    The pattern is ``<answer>\\s*(.*?)\\s*</answer>`` without DOTALL
    (``socialmllm/train/reasoning/trainer.py:9``, used at ``:255-259``): the content is one line (the
    whitespace around it may span lines), so ``<answer>B\\nB</answer>`` is not a block and
    ``<answer>x\\ny</answer><answer>B</answer>`` gives ``"B"``. An empty block gives ``""``.

    Args:
        text: a completion.
    """
    match = _RELEASED_ANSWER_RE.search(text)
    return match.group(1) if match else None


def extract_answer(text: str, letters: str = "ABCD") -> str | None:
    """Extract the chosen option letter from a completion, or ``None`` when nothing parses.

    Stages, in the order of ``docs/data-format.md`` (Metrics); the first that matches wins:

    1. the stripped content of the first ``<answer>`` block is a letter, optionally wrapped as
       ``(B)`` or followed by ``)``, ``.`` or ``:`` and more text (``"B) Person 2"``);
    2. ``\\boxed{B}``;
    3. a standalone option marker ``B)`` or ``B.`` (first occurrence);
    4. a leading letter: the stripped text starts with the letter followed by a non-letter or the end.

    Stages 2-4 look first inside the first ``<answer>`` block (when there is one), then in the whole
    text. Only the upper-case letters in ``letters`` count anywhere: ``<answer>b</answer>`` fails
    stage 1 and extraction goes on down the stages.

    Args:
        text: a completion.
        letters: the valid option letters (upper case), ``"ABCD"`` for GRASP.

    Returns:
        One character of ``letters``, or ``None`` (counted as unparseable by the bench scorer).
    """
    in_block, boxed, marker, leading = _letter_patterns(letters)
    block = answer_block(text)
    if block is not None:
        match = in_block.match(block.strip())
        if match:
            return match.group(1)
    spaces = [block.strip(), text] if block is not None else [text]
    for pattern in (boxed, marker):
        for space in spaces:
            match = pattern.search(space)
            if match:
                return match.group(1)
    for space in spaces:
        match = leading.match(space.strip())
        if match:
            return match.group(1)
    return None


def extract_participants(text: str) -> frozenset[int]:
    """Return the person ids named in ``text`` by ``Person N`` or a standalone ``PN``.

    ``Person`` is case-sensitive and may be followed by any whitespace (or none) before the number.
    Numbers are read whole, so ``Person 12`` is 12 and never 1. ``PN`` needs a word boundary on both
    sides: ``P3`` and ``P12`` count, ``AP1`` and ``P1a`` do not. Source: the participant matching rule
    of the GRASP Social Grounding Reward (``docs/data-format.md``, Social events).

    Args:
        text: any text (usually the reasoning of a completion).

    Returns:
        The set of 0-based person ids (empty when nobody is named).
    """
    ids = {int(m.group(1)) for m in _PERSON_RE.finditer(text)}
    ids.update(int(m.group(1)) for m in _P_SHORT_RE.finditer(text))
    return frozenset(ids)


def extract_participants_released(text: str) -> frozenset[int]:
    """Person ids by the released GRASP training code's pattern ``(?:Person\\s+|\\bP)(\\d+)``.

    Differs from :func:`extract_participants` at the edges: ``Person12`` (no space) is not a
    mention, while ``P1a`` and ``P1_`` are (there is no boundary after the number). Source:
    ``socialmllm/train/reasoning/trainer.py`` (``_PERSON_ID_RE``) of github.com/Social-Reaoning/grasp.

    Args:
        text: any text.

    Returns:
        The set of person ids (empty when nobody is named).
    """
    return frozenset(int(m) for m in _RELEASED_PERSON_RE.findall(text))


def opens_think(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an opened ``<think>`` block (``<think>`` then whitespace).

    True for a Qwen3 Thinking generation prompt (``<|im_start|>assistant\\n<think>\\n``): the
    completion then starts inside the think block and carries only its closing ``</think>``.

    Args:
        prompt: the rendered prompt text (special tokens written out), or its tail.
    """
    return bool(_OPENS_THINK_RE.search(prompt))


def tag_contents(text: str, tag: str) -> list[str]:
    """Return the raw content of every ``<tag>...</tag>`` block, in order (non-greedy, across newlines).

    Args:
        text: a completion.
        tag: the tag name without brackets, e.g. ``"gaze"``.
    """
    name = re.escape(tag)
    return re.findall(rf"<{name}>(.*?)</{name}>", text, flags=re.DOTALL)


def reasoning_text(text: str, opened_think: bool = False) -> str:
    """Return the part of a completion that counts as reasoning for the grounding rewards.

    ``opened_think=True`` (the prompt ended with an opened ``<think>``, :func:`opens_think`): the
    completion starts inside the think block, so the reasoning is everything before the first
    ``</think>``; without one, everything before the first ``<answer>``; else the whole text.

    ``opened_think=False``, in order: the content of the first ``<think>...</think>`` block; else,
    when only ``</think>`` is present, everything before it; else everything before the first
    ``<answer>``; else the whole text.

    Args:
        text: a completion.
        opened_think: the prompt opened the think block.
    """
    if not opened_think:
        match = _THINK_RE.search(text)
        if match:
            return match.group(1)
    for marker in ("</think>", "<answer>"):
        index = text.find(marker)
        if index >= 0:
            return text[:index]
    return text


def has_format(text: str, strict: bool = False, opened_think: bool = False) -> bool:
    """Whether a completion follows the answer format.

    Lenient (default): an ``<answer>...</answer>`` block with non-blank content is present.
    Strict: the whole assistant turn is ``<think>...</think>`` then ``<answer>...</answer>``, with only
    whitespace around and between them, exactly one of each tag, and non-blank content in both.
    With ``opened_think`` the prompt already wrote the ``<think>`` (a Thinking template), so the
    assistant turn is ``"<think>" + text``: a completion ``...</think><answer>B</answer>`` passes and
    one that opens a second ``<think>`` fails. Without it, that completion fails (an Instruct
    prompt opened nothing).

    Args:
        text: a completion.
        strict: use the think-then-answer layout check.
        opened_think: the prompt ended with an opened ``<think>`` (:func:`opens_think`).
    """
    if not strict:
        block = answer_block(text)
        return block is not None and block.strip() != ""
    if opened_think:
        text = "<think>" + text
    if any(text.count(tag) != 1 for tag in ("<think>", "</think>", "<answer>", "</answer>")):
        return False
    match = _STRICT_RE.fullmatch(text)
    return bool(match) and match.group(1).strip() != "" and match.group(2).strip() != ""


def parse_time_spans(text: str) -> list[tuple[float, float]]:
    """Return the time spans ``(start, end)`` in seconds named in ``text``, in order of appearance.

    Grammar (keywords and units case-insensitive, any whitespace, newlines included, between words)::

        span  := "from" t "to" t_end | "between" t "and" t_end
        t     := number [unit]          # the unit is optional on the start ...
        t_end := number unit            # ... and required on the end
        number:= digits ["." digits]    # non-negative decimal: 2, 2.5, 0.25
        unit  := "s" | "sec" | "secs" | "second" | "seconds"   (optionally after whitespace)

    A number must stand alone: nothing of a word, digit, ``.``, ``,`` or ``-`` right before it, and a
    unit (then a word boundary) or whitespace right after it. So the ``0.5s`` inside ``10.5s`` is never
    read alone, and ``1..5s``, ``1.s``, ``-1s``, ``1,5s`` and ``.5s`` are not times. ``from 1 to 2``
    (no unit on the end) is not a span: it may count persons or options. A span whose end is not after
    its start (``from 3s to 1s``, ``from 2s to 2s``) is malformed and skipped. Tags are not special:
    ``<gaze>from 1.0s to 2.5s</gaze>`` gives ``(1.0, 2.5)``. Source: the project's own format for the
    ``temporal_grounding`` reward (:mod:`grasp_lightning.grpo.rewards`), written to match the bench
    questions' wording ("Between 1.5s and 3.5s, ...", ``docs/data-format.md``).

    Args:
        text: any text (usually the reasoning of a completion).

    Returns:
        ``(start, end)`` pairs of floats (seconds, ``0 <= start < end``); empty when none is named.
    """
    spans = []
    for match in _SPAN_RE.finditer(text):
        start = float(match.group(1) if match.group(1) is not None else match.group(2))
        end = float(match.group(3))
        if end > start:
            spans.append((start, end))
    return spans


def temporal_iou(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Temporal intersection over union of two spans ``(start, end)`` (seconds, or any one unit).

    ``|a ∩ b| / |a ∪ b|`` with ``|a ∪ b| = |a| + |b| - |a ∩ b|``: 1.0 for identical spans, 0.0 for
    disjoint or merely touching ones (``(0, 1)`` and ``(1, 2)``) and whenever the union has no length
    (spans with ``end <= start``). Range ``[0, 1]``. Source: the usual temporal IoU of
    temporal-grounding benchmarks (e.g. Charades-STA's R@IoU).

    Args:
        a: ``(start, end)``.
        b: ``(start, end)``.
    """
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = max(0.0, a[1] - a[0]) + max(0.0, b[1] - b[0]) - inter
    return inter / union if union > 0 else 0.0
