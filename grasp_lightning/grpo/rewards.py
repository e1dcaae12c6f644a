"""Reward terms of the GRPO stage, including the Social Grounding Reward (SGR) of GRASP.

Every term is a function ``(completion: str, item: GraspItem) -> float`` registered in
:data:`REWARDS` under the name a config uses (``configs/sgr.yaml`` lists names and weights).
Registered terms also take a keyword ``opened_think`` (default ``False``): true when the prompt
ended with an opened ``<think>`` (a Thinking template's generation prompt), so the completion
starts inside the think block (``...</think><answer>B</answer>``) and the terms that read the think
block (``format_strict``, ``social_grounding``, ``social_grounding_by_modality``, ``temporal_grounding``)
account for it.

**Rewards of one's own.** A ``reward.terms`` entry of ``GRPOTask`` (and an entry given to
:func:`compute_rewards`) is a registry name, an import path (``my_pkg.rewards:length_bonus``,
``my_pkg.rewards.length_bonus``, or a file ``rewards/mine.py:length_bonus``, relative to the working
directory; :func:`grasp_lightning.plugins.load_object`), or, from Python, the callable itself. So a
new reward is one file plus YAML, with no edit here (:func:`resolve_reward`). Two signatures::

    def length_bonus(completion: str, item: GraspItem, opened_think: bool = False) -> float
    def length_bonus(completions: list[str], items: list[GraspItem], opened_think: list[bool]) -> list[float]

The second (batched: its first parameter is named ``completions``, or the function has an attribute
``batched = True``) gets every completion of a generation call at once, e.g. for a reward model.

- ``completion``: one decoded completion (special tokens removed; the prompt not included);
- ``item``: its prompt's record (:class:`~grasp_lightning.data.records.GraspItem`: ``answer``,
  ``options``, ``participants``, ``events``, ``question_text``, ...; ``question`` is the whole user
  text the model saw, ``extra`` a generic QA row's other columns as written, as TRL passes dataset
  columns to reward functions; ``docs/own-task.md`` lists them); the K completions of a group share
  one item;
- ``opened_think`` (keyword, optional): the prompt ended with an opened ``<think>``; passed only
  when the function has a parameter of that name;
- returns a finite float (batched: a sequence of one finite float per completion), the term's value
  before its ``reward.weights`` weight.

Entries are checked when the task is built (the import, that the object is a function, that it
takes ``(completion, item)``), and every value when it is returned (a finite number; batched: one per
completion), each error naming the entry. A completion holding a vision placeholder gets 0 on every
term without any function being called (:func:`compute_rewards` checks once for all terms). The
paper's recipe uses ``accuracy``, ``format``, ``grounding_presence`` and ``social_grounding`` with
weights 1.0, 0.1, 0.05, 0.2 (GRASP, arXiv 2605.15764; ``docs/data-format.md``, Rewards). The
project's own ``temporal_grounding`` (event time spans named in the reasoning against the events'
``start_seconds``/``end_seconds``) composes with them by weight, e.g. ``reward.terms: [accuracy, format,
grounding_presence, social_grounding, temporal_grounding]``, ``reward.weights: [1.0, 0.1, 0.05, 0.2, 0.2]``.
``social_grounding_by_modality`` is the SGR matched per modality, which a sentence naming the right people
under the wrong relation does not satisfy (:func:`social_grounding_by_modality`).

Rewards are never NaN: every ratio with an empty denominator is defined as 0. A row without
ground-truth participants therefore gets 0 from both grounding terms; the GRPO task layer counts
such rows so a data problem shows in the logs instead of silently flattening the reward.

A completion that contains a vision special token (``VISION_TOKENS`` of
``grasp_lightning/data/prompts.py``: ``<|video_pad|>``, ``<|image_pad|>``, ``<|vision_pad|>``,
``<|vision_start|>``, ``<|vision_end|>``) gets 0 on every term: a sampled placeholder means a broken
rollout (its next forward fails with a token/feature count mismatch), and it must not be rewarded
for a letter it happens to contain.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Callable

import torch

from grasp_lightning.data.prompts import VISION_TOKENS
from grasp_lightning.data.records import GraspItem
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.parsing import (
    answer_block,
    answer_block_released,
    extract_participants,
    extract_participants_released,
    has_format,
    parse_time_spans,
    reasoning_text,
    tag_contents,
    temporal_iou,
)
from grasp_lightning.plugins import load_object

__all__ = [
    "REWARDS",
    "Reward",
    "RewardFn",
    "VISION_PLACEHOLDERS",
    "compute_rewards",
    "enumerates",
    "grounding_precision_recall",
    "has_vision_placeholder",
    "resolve_reward",
]

#: A reward term: completion text and its item (and the keyword ``opened_think``) -> a finite float.
RewardFn = Callable[..., float]

#: Vision special tokens of Qwen3-VL that must never appear in sampled text.
VISION_PLACEHOLDERS: tuple[str, ...] = VISION_TOKENS  # data/prompts.py: the one list


def has_vision_placeholder(text: str) -> bool:
    """Whether ``text`` contains one of :data:`VISION_PLACEHOLDERS` (a broken rollout)."""
    return any(token in text for token in VISION_PLACEHOLDERS)


class Reward:
    """A reward term ready to score: a registered term or a function of one's own.

    Calling it scores one completion (``reward(completion, item, opened_think=False) -> float``; a
    vision placeholder gives 0); :meth:`score` scores many at once, calling a batched function once.

    Args:
        fn: the function (either signature of this module's docstring).
        name: the entry as the config writes it (registry name or import path), used in errors.
        label: the name in metric keys; ``None``: the function's own ``__name__`` (else ``name``).

    Attributes:
        label: the name in metric keys (``train/rewards/<label>/mean``): the registry name, or the
            function's own name for an import path (``my.rewards:length_bonus`` → ``length_bonus``),
            since ``:`` and file paths are not valid in every logger's metric names (MLflow).
        batched: the function takes lists (first parameter ``completions``, or ``fn.batched``).

    Raises:
        GraspConfigError: naming ``name``: ``fn`` is a class or not callable, or it cannot be called
            as ``fn(completion, item)`` (too few or too many required parameters).
    """

    def __init__(self, fn: object, name: str, label: str | None = None) -> None:
        if inspect.isclass(fn) or not callable(fn):
            what = "a class" if inspect.isclass(fn) else f"a {type(fn).__name__}"
            raise GraspConfigError(f"{name} is {what}, not a function (completion, item) -> float")
        self.fn = fn
        self.name = name
        self.label = label or getattr(fn, "__name__", None) or name
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or C callable without a signature
            params = {}
        self.takes_flag = "opened_think" in params
        first = next(iter(params), None)
        self.batched = bool(getattr(fn, "batched", False)) or first == "completions"
        if params:
            try:
                inspect.signature(fn).bind("", None)
            except TypeError as exc:
                call = "fn(completions, items)" if self.batched else "fn(completion, item)"
                raise GraspConfigError(f"{name} cannot be called as {call}: {exc}") from None

    def _call(self, completion, item, flag):
        """``fn`` on one completion (or, batched, on lists); an exception it raises names the entry and item.

        Raises:
            GraspConfigError: ``fn`` raised (the exception is chained).
        """
        try:
            return self.fn(completion, item, opened_think=flag) if self.takes_flag else self.fn(completion, item)
        except Exception as exc:  # noqa: BLE001 - the user's reward: name it and the item instead of a bare traceback
            first = item[0] if isinstance(item, list) and item else item
            which = f"a batch of {len(item)} completions, the first of item" if isinstance(item, list) else "item"
            raise GraspConfigError(f"reward {self.name!r} raised {type(exc).__name__}: {exc} on {which} "
                                   f"{getattr(first, 'uid', '?')} ({getattr(first, 'origin', '?')})") from exc

    def __call__(self, completion: str, item: GraspItem, *, opened_think: bool = False) -> float:
        """The term's value for one completion (0 for a vision placeholder)."""
        return self.score([completion], [item], [opened_think])[0]

    def score(self, completions: list[str], items: list[GraspItem], flags: list[bool]) -> list[float]:
        """Values of ``N`` completions (0 where a completion holds a vision placeholder).

        Raises:
            GraspConfigError: naming the entry and the item: a value is not a finite number, or a
                batched function returned a different number of values than completions.
        """
        keep = [n for n, text in enumerate(completions) if not has_vision_placeholder(text)]
        out = [0.0] * len(completions)
        if not keep:
            return out
        if self.batched:
            sub = [items[n] for n in keep]
            values = self._call([completions[n] for n in keep], sub, [flags[n] for n in keep])
            try:
                values = list(values)
            except TypeError:
                raise GraspConfigError(f"reward {self.name!r} is batched (takes completions) but returned "
                                       f"{type(values).__name__}, not one value per completion") from None
            if len(values) != len(keep):
                raise GraspConfigError(f"reward {self.name!r} returned {len(values)} values for {len(keep)} "
                                       f"completions")
        else:
            values = [self._call(completions[n], items[n], flags[n]) for n in keep]
        for n, value in zip(keep, values):
            out[n] = _finite(value, self.name, items[n])
        return out


#: Registry of reward terms by config name; filled by :func:`_register`.
REWARDS: dict[str, Reward] = {}


def _register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a reward term under ``name`` (as a :class:`Reward`: a vision placeholder gives 0)."""

    def wrap(fn: RewardFn) -> RewardFn:
        REWARDS[name] = Reward(fn, name, label=name)
        return REWARDS[name]

    return wrap


def resolve_reward(entry: str | RewardFn, key: str = "rewards") -> Reward:
    """The :class:`Reward` of a ``reward.terms`` entry: a name in :data:`REWARDS`, an import path
    (``pkg.mod:fn``, ``pkg.mod.fn``, ``file.py:fn``; :func:`grasp_lightning.plugins.load_object`), or a
    callable (either signature of this module's docstring).

    Args:
        entry: the registry name, import path or function.
        key: the config key the entry came from, for the error message.

    Raises:
        GraspConfigError: naming ``key`` and ``entry``: not a registered name and not an import path,
            the module or file does not load, it has no such attribute, the object is not a function,
            or it cannot be called as ``fn(completion, item)``.
    """
    if isinstance(entry, Reward):
        return entry
    if callable(entry) and not isinstance(entry, str):
        name = getattr(entry, "__qualname__", repr(entry))
        try:
            return Reward(entry, name)
        except GraspConfigError as exc:
            raise GraspConfigError(f"{key}: {exc}") from None
    if not isinstance(entry, str):
        raise GraspConfigError(f"{key}: entry {entry!r} must be a reward name, an import path or a function, "
                               f"got a {type(entry).__name__}")
    if entry in REWARDS:
        return REWARDS[entry]
    if ":" not in entry and "." not in entry:
        raise GraspConfigError(f"{key}: unknown reward {entry!r}; known rewards: {sorted(REWARDS)}, or an import "
                               f"path package.module:function or path/to/file.py:function")
    try:
        return Reward(load_object(entry), entry)
    except GraspConfigError as exc:
        raise GraspConfigError(f"{key}: reward {entry!r} is neither a known reward ({sorted(REWARDS)}) nor a "
                               f"usable import path: {exc}") from None


def grounding_precision_recall(pred: set[int] | frozenset[int], gt: set[int] | frozenset[int]) -> tuple[float, float]:
    """Precision and recall of the named participants against the ground truth.

    ``P = |pred ∩ gt| / |pred|`` and ``R = |pred ∩ gt| / |gt|`` (GRASP paper, Social Grounding Reward);
    an empty denominator gives 0 instead of NaN.

    Args:
        pred: person ids named by the model.
        gt: person ids of the ground-truth social events.

    Returns:
        ``(precision, recall)``, each in ``[0, 1]``.
    """
    hits = len(set(pred) & set(gt))
    precision = hits / len(pred) if pred else 0.0
    recall = hits / len(gt) if gt else 0.0
    return precision, recall


def enumerates(named: set[int] | frozenset[int], shown: set[int] | frozenset[int]) -> bool:
    """Whether ``named`` covers every person ``shown`` (the item shows at least two): an enumeration.

    The failure the Social Grounding Reward's precision penalises ("enumerating every visible person
    lowers P", ``docs/data-format.md``): instead of naming the people of the events, the reasoning
    lists everyone. ``shown`` is what the item shows
    (:func:`grasp_lightning.data.formats.persons_shown`: the people of the question, its options and the
    ground truth). Read by the ``grounding/enumeration_rate`` metrics of validation and training.

    Args:
        named: person ids named in the reasoning.
        shown: person ids the item shows.
    """
    return len(shown) >= 2 and set(shown) <= set(named)


@_register("accuracy")
def accuracy(completion: str, item: GraspItem) -> float:
    """1.0 if the stripped content of the first ``<answer>`` block equals ``item.answer`` exactly, else 0.0.

    Case-sensitive (``"b"`` is wrong for ``"B"``); only the first ``<answer>`` block counts; an empty
    block or a missing one gives 0. Source: GRASP reward 1 (accuracy).
    """
    block = answer_block(completion)
    if block is None or block.strip() == "":
        return 0.0
    return 1.0 if block.strip() == item.answer.strip() else 0.0


@_register("format")
def format_reward(completion: str, item: GraspItem) -> float:
    """1.0 if an ``<answer>`` block with content is present (:func:`has_format`, lenient), else 0.0."""
    return 1.0 if has_format(completion) else 0.0


@_register("format_strict")
def format_strict(completion: str, item: GraspItem, opened_think: bool = False) -> float:
    """1.0 for the exact ``<think>...</think><answer>...</answer>`` layout (:func:`has_format`, strict), else 0.0.

    With ``opened_think`` (the prompt ended with ``<think>``) the layout is checked on
    ``"<think>" + completion``, so ``...</think><answer>B</answer>`` scores 1.0; without it, 0.0.
    """
    return 1.0 if has_format(completion, strict=True, opened_think=opened_think) else 0.0


@_register("grounding_presence")
def grounding_presence(completion: str, item: GraspItem) -> float:
    """1.0 if a ``<gaze>`` or ``<gesture>`` block with non-blank content is present, else 0.0 (GRASP reward 3)."""
    blocks = tag_contents(completion, "gaze") + tag_contents(completion, "gesture")
    return 1.0 if any(block.strip() for block in blocks) else 0.0


@_register("social_grounding")
def social_grounding(completion: str, item: GraspItem, opened_think: bool = False) -> float:
    """The paper's Social Grounding Reward ``r_gnd = (1 + R) * P``, in ``[0, 2]``.

    ``pred`` = participants named in :func:`~grasp_lightning.parsing.reasoning_text`, ``gt`` =
    ``item.participants`` (``opened_think``: the prompt opened the think block, see
    :func:`~grasp_lightning.parsing.reasoning_text`); P and R from :func:`grounding_precision_recall`.
    Naming every visible person lowers P; leaving out a key person lowers R. Empty ``pred`` or empty
    ``gt`` gives 0.0.
    Source: GRASP paper (arXiv 2605.15764), grounding-quality reward.
    """
    pred = extract_participants(reasoning_text(completion, opened_think))
    gt = item.participants
    if not pred or not gt:
        return 0.0
    precision, recall = grounding_precision_recall(pred, gt)
    return (1.0 + recall) * precision


@_register("social_grounding_by_modality")
def social_grounding_by_modality(completion: str, item: GraspItem, opened_think: bool = False) -> float:
    """The Social Grounding Reward ``(1 + R) * P`` per modality, in ``[0, 2]``: the people of gaze events
    are looked for in the ``<gaze>`` blocks of the reasoning, the people of every other event in its
    ``<gesture>`` blocks, and the reward is the mean of ``(1 + R_m) * P_m`` over the modalities ``m`` that
    have ground truth or a named person (a modality with either side empty scores 0 there).

    Why: :func:`social_grounding` pools every person named anywhere in the reasoning, so a completion that
    names the event's people under the wrong relation scores the maximum: a gaze event written as a false
    pointing sentence, ``<gesture>Person g points at Person y.</gesture>``, scores 2.0 with
    ``social_grounding`` (a policy trained on it learns to write such sentences: ``experiments/world/README.md``)
    and 0 here. Matching events to their modality's blocks mirrors the
    released code's ``compute_grounding_score`` (:func:`social_grounding_released`), without its exclusion of
    the people the question names.

    Args:
        completion: a completion.
        item: the RL item; only ``item.events`` count (``item.persons``, people without an event, belong to no
            modality).
        opened_think: the prompt opened the think block (:func:`~grasp_lightning.parsing.reasoning_text`).

    Returns:
        0.0 without events or without a modality to score, else the mean above.
    """
    reasoning = reasoning_text(completion, opened_think)
    scores = []
    for modality in ("gaze", "gesture"):
        gt = {p for e in item.events if (e.source == "gaze") == (modality == "gaze") for p in e.persons}
        named = set().union(*(extract_participants(b) for b in tag_contents(reasoning, modality)))
        if not gt and not named:
            continue
        precision, recall = grounding_precision_recall(named, gt)
        scores.append((1.0 + recall) * precision)
    return sum(scores) / len(scores) if scores else 0.0


@_register("temporal_grounding")
def temporal_grounding(completion: str, item: GraspItem, opened_think: bool = False) -> float:
    """How well the time spans named in the reasoning match the events' time spans, in ``[0, 1]``.

    ``gt`` = the spans of ``item.events`` that have one (:attr:`SocialEvent.span
    <grasp_lightning.data.records.SocialEvent>`, seconds from the clip start); ``named`` =
    :func:`~grasp_lightning.parsing.parse_time_spans` of
    :func:`~grasp_lightning.parsing.reasoning_text` (``opened_think`` as for ``social_grounding``),
    e.g. ``from 1.0s to 2.5s`` or ``between 1.5 and 3.5 seconds``. Then::

        r_tmp = sum_{g in gt} max_{n in named} IoU(g, n) / max(|gt|, |named|)

    with :func:`~grasp_lightning.parsing.temporal_iou`. The ``max(|gt|, |named|)`` denominator means
    enumerating many spans does not pay: each extra span beyond the number of events lowers the score.
    Empty ``gt`` (no event gives ``start_seconds``/``end_seconds``) or empty ``named`` gives 0.0; spans
    in the ``<answer>`` block do not count, malformed ones (end not after start) are ignored.
    Source: the GRASP paper's Discussion names temporal alignment as future work; this term is the
    project's own.
    """
    gt = [event.span for event in item.events if event.span is not None]
    if not gt:
        return 0.0
    named = parse_time_spans(reasoning_text(completion, opened_think))
    if not named:
        return 0.0
    hits = sum(max(temporal_iou(g, n) for n in named) for g in gt)
    return hits / max(len(gt), len(named))


# The released GRASP code's three flags (socialmllm/train/reasoning/trainer.py:255-262 of
# github.com/Social-Reaoning/grasp at 805d115), for configs/released/sgr.yaml: its own patterns, and a block
# counts even when it is empty.

@_register("accuracy_released")
def accuracy_released(completion: str, item: GraspItem) -> float:
    """1.0 if the first answer block by the released pattern (:func:`~grasp_lightning.parsing.answer_block_released`,
    no DOTALL: one-line content), stripped, equals ``item.answer`` stripped, else 0.0 (``trainer.py:255-259``).

    Differs from :func:`accuracy` on multi-line content: ``<answer>x\\ny</answer><answer>B</answer>`` is
    correct here for answer B (the first block does not match the pattern, the second does), 0.0 there.
    """
    block = answer_block_released(completion)
    return 1.0 if block is not None and block.strip() == item.answer.strip() else 0.0


@_register("format_released")
def format_released(completion: str, item: GraspItem) -> float:
    """1.0 if the released answer pattern matches at all, an empty ``<answer></answer>`` included
    (``has_format``, ``trainer.py:255-257``), else 0.0. ``<answer>B\\nB</answer>`` alone: 0.0 (ours: 1.0)."""
    return 1.0 if answer_block_released(completion) is not None else 0.0


@_register("grounding_presence_released")
def grounding_presence_released(completion: str, item: GraspItem) -> float:
    """1.0 if a ``<gaze>`` or ``<gesture>`` block is present, an empty one included (``has_grounding``,
    ``trainer.py:261-262``, patterns with DOTALL at ``:10-11``), else 0.0."""
    return 1.0 if tag_contents(completion, "gaze") or tag_contents(completion, "gesture") else 0.0


def _question_people(item: GraspItem) -> frozenset[int]:
    """People named in the item's ``question_text`` by the released pattern
    (:func:`extract_participants_released`); nobody when it is ``None`` or empty.

    As the released code: the row's ``meta.question_text``, ``""`` when the meta has none
    (``socialmllm/utils/train_utils.py:221``, ``socialmllm/train/reasoning/trainer.py:33-37``). The
    reader keeps ``None`` for a missing one (:attr:`GraspItem.question_text`), so a row without it
    excludes nobody, as in the released code.
    """
    return extract_participants_released(item.question_text or "")


def _released_event(event) -> tuple[str, set]:
    """``(modality, persons)`` of an event as the released code reads its JSON: gaze only for a source
    written exactly ``"gaze"`` (``"Gaze"`` is a gesture there), the persons as written, compared as
    Python values (a digit string ``"1"`` never equals Person 1). Events built in code (no written
    form) use :attr:`SocialEvent.source` and :attr:`SocialEvent.persons`."""
    kind = event.kind or event.source
    written = event.persons_written if event.persons_written is not None else event.persons
    return ("gaze" if kind == "gaze" else "gesture"), set(written)


@_register("social_grounding_released")
def social_grounding_released(completion: str, item: GraspItem) -> float:
    """The released-code grounding reward ``0.7 * R + 0.3 * P``, in ``[0, 1]``.

    Mirrors ``compute_grounding_score`` in ``socialmllm/train/reasoning/trainer.py:15-69`` of the GRASP
    repository (github.com/Social-Reaoning/grasp, commit 805d115), end to end from the row:

    - people are read by the pattern ``(?:Person\\s+|\\bP)(\\d+)``
      (:func:`~grasp_lightning.parsing.extract_participants_released`) from all ``<gaze>`` blocks
      (``named_gaze``) and all ``<gesture>`` blocks (``named_gesture``); people named in the row's
      ``question_text`` (:func:`_question_people`; nobody when the row has none) are left out of every
      event and of the named sets;
    - an event whose source is written exactly ``"gaze"`` is matched against ``named_gaze``, any other
      (``"Gaze"`` included) against ``named_gesture``; event persons are compared as written
      (:func:`_released_event`: a digit-string id matches nobody);
    - ``R`` is the mean, over the events with at least one person left, of
      ``|named_m ∩ event| / |event|``;
    - ``P`` is the mean, over the modalities ``m`` with ground truth (``gt_m``: union of its events'
      people) **and** at least one person named, of ``|named_m ∩ gt_m| / |named_m|``; a modality
      named without ground truth, or with ground truth but nobody named, does not enter ``P``;
    - no events, no ``<gaze>``/``<gesture>`` content, or nobody left to find gives 0.0 (so does a
      ``P`` or ``R`` with no terms: that part is 0).

    Args:
        completion: a completion (tags anywhere in it count, inside the think block or not).
        item: the RL item with ``events`` and ``question_text``.
    """
    if not item.events:
        return 0.0
    asked = _question_people(item)
    named = {m: extract_participants_released(" ".join(tag_contents(completion, m))) - asked
             for m in ("gaze", "gesture")}
    events = [(m, people - asked) for m, people in map(_released_event, item.events)]
    gt = {m: set().union(*[p for em, p in events if em == m]) for m in ("gaze", "gesture")}
    if not gt["gaze"] and not gt["gesture"]:
        return 0.0
    recalls = [len(named[m] & people) / len(people) for m, people in events if people]
    precisions = [len(named[m] & gt[m]) / len(named[m]) for m in ("gaze", "gesture") if named[m] and gt[m]]
    recall = sum(recalls) / len(recalls) if recalls else 0.0
    precision = sum(precisions) / len(precisions) if precisions else 0.0
    return 0.7 * recall + 0.3 * precision


def compute_rewards(completions: list[str], items: list[GraspItem], names: Sequence[str | RewardFn],
                    opened_think: bool | Sequence[bool] = False) -> torch.Tensor:
    """Score every completion with every reward term.

    Args:
        completions: ``N`` completion texts (special tokens kept, so placeholders can be seen).
        items: ``N`` items aligned with ``completions`` (the K rollouts of a prompt repeat its item).
        names: reward entries (names in :data:`REWARDS`, import paths or callables;
            :func:`resolve_reward`), in the column order wanted.
        opened_think: whether each completion's prompt ended with an opened ``<think>`` (one flag
            for all, or ``N`` flags, e.g. :attr:`grasp_lightning.engines.decoding.Completions.prompt_opened_think`).

    Returns:
        Float32 tensor of shape ``(N, len(names))``, all values finite; a row whose completion holds
        a vision placeholder is all 0 (checked once here, no function is called for it).

    Raises:
        GraspConfigError: if an entry is neither a name in :data:`REWARDS` nor a usable import path
            (the message names it and lists the known names), or a value is not a finite number.
        ValueError: if ``completions`` and ``items`` (or the ``opened_think`` flags) differ in length.
    """
    rewards = [resolve_reward(name) for name in names]
    if len(completions) != len(items):
        raise ValueError(f"compute_rewards: {len(completions)} completions but {len(items)} items")
    flags = [bool(opened_think)] * len(completions) if isinstance(opened_think, bool) else list(opened_think)
    if len(flags) != len(completions):
        raise ValueError(f"compute_rewards: {len(completions)} completions but {len(flags)} opened_think flags")
    keep = [n for n, text in enumerate(completions) if not has_vision_placeholder(text)]
    out = torch.zeros(len(completions), len(rewards), dtype=torch.float32)
    texts, kept, kept_flags = [completions[n] for n in keep], [items[n] for n in keep], [flags[n] for n in keep]
    for j, reward in enumerate(rewards):
        if keep:
            out[keep, j] = torch.tensor(reward.score(texts, kept, kept_flags), dtype=torch.float32)
    return out


def _finite(value: object, name: str, item: GraspItem) -> float:
    """``value`` as a float, or a GraspConfigError naming the reward and the item.

    Raises:
        GraspConfigError: the reward returned something that is not a finite number (NaN, inf, a string).
    """
    try:
        out = None if isinstance(value, (str, bytes)) else float(value)  # "1.0" is a bug, not a value
    except (TypeError, ValueError):
        out = None
    if out is None or not math.isfinite(out):
        raise GraspConfigError(f"reward {name!r} returned {value!r} for item {item.uid} ({item.origin}); a reward "
                               f"must return a finite number")
    return out
