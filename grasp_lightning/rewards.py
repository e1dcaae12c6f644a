"""Reward terms of the GRPO stage, including the Social Grounding Reward (SGR) of GRASP.

Every term is a pure function ``(completion: str, item: GraspItem) -> float`` registered in
:data:`REWARDS` under the name a config uses (``configs/sgr.yaml`` lists names and weights). The
paper's recipe uses ``accuracy``, ``format``, ``grounding_presence`` and ``social_grounding`` with
weights 1.0, 0.1, 0.05, 0.2 (GRASP, arXiv 2605.15764; ``shared/grasp-format.md``, Rewards).

Rewards are never NaN: every ratio with an empty denominator is defined as 0. A row without
ground-truth participants therefore gets 0 from both grounding terms; the GRPO task layer counts
such rows so a data problem shows in the logs instead of silently flattening the reward.

A completion that contains a vision placeholder token (``<|video_pad|>``, ``<|image_pad|>``,
``<|vision_start|>``, ``<|vision_end|>``) gets 0 on every term: a sampled placeholder means a broken
rollout (its next forward fails with a token/feature count mismatch, ``shared/stack-notes.md``), and
it must not be rewarded for a letter it happens to contain.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from grasp_lightning.data.records import GraspItem
from grasp_lightning.errors import GraspConfigError
from grasp_lightning.parsing import (
    answer_block,
    extract_participants,
    has_format,
    reasoning_text,
    tag_contents,
)

__all__ = [
    "REWARDS",
    "RewardFn",
    "VISION_PLACEHOLDERS",
    "compute_rewards",
    "grounding_precision_recall",
    "has_vision_placeholder",
]

#: A reward term: completion text and its item -> a finite float.
RewardFn = Callable[[str, GraspItem], float]

#: Vision special tokens of Qwen3-VL that must never appear in sampled text.
VISION_PLACEHOLDERS: tuple[str, ...] = ("<|video_pad|>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>")

#: Registry of reward terms by config name; filled by :func:`_register`.
REWARDS: dict[str, RewardFn] = {}


def has_vision_placeholder(text: str) -> bool:
    """Whether ``text`` contains one of :data:`VISION_PLACEHOLDERS` (a broken rollout)."""
    return any(token in text for token in VISION_PLACEHOLDERS)


def _register(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a reward term under ``name``, wrapped so a vision placeholder gives 0."""

    def wrap(fn: RewardFn) -> RewardFn:
        @functools.wraps(fn)
        def guarded(completion: str, item: GraspItem) -> float:
            if has_vision_placeholder(completion):
                return 0.0
            return float(fn(completion, item))

        REWARDS[name] = guarded
        return guarded

    return wrap


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
def format_strict(completion: str, item: GraspItem) -> float:
    """1.0 for the exact ``<think>...</think><answer>...</answer>`` layout (:func:`has_format`, strict), else 0.0."""
    return 1.0 if has_format(completion, strict=True) else 0.0


@_register("grounding_presence")
def grounding_presence(completion: str, item: GraspItem) -> float:
    """1.0 if a ``<gaze>`` or ``<gesture>`` block with non-blank content is present, else 0.0 (GRASP reward 3)."""
    blocks = tag_contents(completion, "gaze") + tag_contents(completion, "gesture")
    return 1.0 if any(block.strip() for block in blocks) else 0.0


@_register("social_grounding")
def social_grounding(completion: str, item: GraspItem) -> float:
    """The paper's Social Grounding Reward ``r_gnd = (1 + R) * P``, in ``[0, 2]``.

    ``pred`` = participants named in :func:`~grasp_lightning.parsing.reasoning_text`, ``gt`` =
    ``item.participants``; P and R from :func:`grounding_precision_recall`. Naming every visible
    person lowers P; leaving out a key person lowers R. Empty ``pred`` or empty ``gt`` gives 0.0.
    Source: GRASP paper (arXiv 2605.15764), grounding-quality reward.
    """
    pred = extract_participants(reasoning_text(completion))
    gt = item.participants
    if not pred or not gt:
        return 0.0
    precision, recall = grounding_precision_recall(pred, gt)
    return (1.0 + recall) * precision


def _question_people(item: GraspItem) -> frozenset[int]:
    """People named in the bare question: ``item.question_text``, else ``item.question`` minus its options.

    Options (``"A) Person 0"``) are cut from the fallback text because the released code reads the
    bare question only; otherwise every option person would be left out of the reward.
    """
    if item.question_text is not None:
        return extract_participants(item.question_text)
    text = item.question
    for option in item.options:
        text = text.replace(option, " ")
    return extract_participants(text)


@_register("social_grounding_released")
def social_grounding_released(completion: str, item: GraspItem) -> float:
    """The released-code grounding reward ``0.7 * R + 0.3 * P``, in ``[0, 1]``.

    Per modality: gaze events are matched against people named inside ``<gaze>`` blocks, gesture
    events (any source other than ``"gaze"``) against ``<gesture>`` blocks. People named in the
    question (:func:`_question_people`) are removed from both sides. Counts are pooled over the two
    modalities: ``P = Σ|pred_m ∩ gt_m| / Σ|pred_m|``, ``R = Σ|pred_m ∩ gt_m| / Σ|gt_m|``. Nothing
    predicted or nothing to find gives 0.0. Source: GRASP released training code
    (``shared/grasp-format.md``, Rewards).
    """
    asked = _question_people(item)
    hits = n_pred = n_gt = 0
    for modality in ("gaze", "gesture"):
        gt = {p for e in item.events if (e.source == "gaze") == (modality == "gaze") for p in e.persons} - asked
        named = " ".join(tag_contents(completion, modality))
        pred = set(extract_participants(named)) - asked
        hits += len(pred & gt)
        n_pred += len(pred)
        n_gt += len(gt)
    if n_pred == 0 or n_gt == 0:
        return 0.0
    return 0.7 * (hits / n_gt) + 0.3 * (hits / n_pred)


def compute_rewards(completions: list[str], items: list[GraspItem], names: list[str]) -> torch.Tensor:
    """Score every completion with every named reward term.

    Args:
        completions: ``N`` completion texts (special tokens kept, so placeholders can be seen).
        items: ``N`` items aligned with ``completions`` (the K rollouts of a prompt repeat its item).
        names: reward term names from :data:`REWARDS`, in the column order wanted.

    Returns:
        Float32 tensor of shape ``(N, len(names))``, all values finite.

    Raises:
        GraspConfigError: if a name is not in :data:`REWARDS` (the message lists the known names).
        ValueError: if ``completions`` and ``items`` differ in length.
    """
    unknown = [name for name in names if name not in REWARDS]
    if unknown:
        raise GraspConfigError(f"unknown reward name(s) {unknown}; known rewards: {sorted(REWARDS)}")
    if len(completions) != len(items):
        raise ValueError(f"compute_rewards: {len(completions)} completions but {len(items)} items")
    fns = [REWARDS[name] for name in names]
    values = [[fn(text, item) for fn in fns] for text, item in zip(completions, items)]
    return torch.tensor(values, dtype=torch.float32).reshape(len(completions), len(names))
