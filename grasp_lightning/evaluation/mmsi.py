"""MMSI and Online-MMSI: who-speaks-to-whom in Werewolf game videos, in the video-LLM form GRASP uses.

Items (one JSON list per question type, which MMSI calls a task, e.g. ``mmsi_test_sti.json``; JSONL works too):
``{"id", "task" ("STI" | "PCR" | "MPP"), "clip_name", "video_path" ("MMSI/videos/<clip>.mp4"),
"dataset" ("youtube" | "ego4d"), "speaker" ("P2"), "player_num", "utterance", "context" (list of
utterances; Online-MMSI: past ones only), "choices" (["P0", ...]), "question", "answer" ("P3"),
"answer_idx" (3)}``, plus ``"utterance_masked"`` for MPP. Categories (MMSI's ``"task"`` field): STI speaking-target
identification, PCR pronoun coreference resolution, MPP mentioned-player prediction (Lee et al.,
"Modeling Multimodal Social Interactions", CVPR 2024; Online-MMSI: past context only).

Prompt: the utterance (MPP: the masked one; the unmasked utterance is masked in the context too,
so the answer is not in the prompt), the context, the question and the choices as lettered
options; the model answers a letter (or a player label ``P3``) in ``<answer>`` tags. Metric:
top-1 accuracy per category and the mean over categories (also pooled).
"""

from __future__ import annotations

import re
from typing import Any

from grasp_lightning import parsing
from grasp_lightning.data.formats import lettered
from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.errors import GraspFormatError

from .base import LETTER_INSTRUCTION, EvalSuite, answer_space

#: MMSI's question types (its ``"task"`` field), the suite's categories.
MMSI_CATEGORIES = {"STI": "Speaking target identification", "PCR": "Pronoun coreference resolution",
         "MPP": "Mentioned player prediction"}
_LABEL_RE = re.compile(r"\(?\s*(?:P|Player\s*)(\d+)\s*\)?\s*\.?", re.I)


def _player(value: Any, where: str, key: str) -> str:
    """``"P3"`` from ``"P3"``, ``"Player3"``, ``"[Player3]"`` or ``3``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"P{value}"
    m = _LABEL_RE.fullmatch(str(value).strip().strip("[]"))
    if not m:
        raise GraspFormatError(where, f"{key!r} must be a player label like 'P3', got {value!r}")
    return f"P{int(m.group(1))}"


def _context_lines(raw: Any, where: str) -> list[str]:
    """Context as lines: a list of strings, of ``{"speaker", "utterance"}`` objects, or one string."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [line for line in raw.splitlines() if line.strip()]
    if not isinstance(raw, list):
        raise GraspFormatError(where, f"'context' must be a list of utterances, got {type(raw).__name__}")
    lines = []
    for turn in raw:
        if isinstance(turn, dict):
            text = str(turn.get("utterance", turn.get("text", "")))
            lines.append(f"{turn['speaker']}: {text}" if turn.get("speaker") else text)
        else:
            lines.append(str(turn))
    return lines


class MMSI(EvalSuite):
    """MMSI (offline: context on both sides of the utterance). See the module docstring.

    Args:
        path: annotation file(s) or folder (one file per category: ``mmsi_test_{sti,pcr,mpp}.json``).
        videos: root of ``video_path`` (default: the annotation file's folder).
        name: results key (default ``mmsi``).
        limit: use only the first N items.
        system_prompt: system turn (default :data:`~grasp_lightning.evaluation.base.SYSTEM_PROMPT`).
    """

    default_name = "mmsi"
    title = "MMSI (Werewolf social interactions, full context)"
    category_names = MMSI_CATEGORIES
    context_heading = "Conversation around the utterance"

    def parse_row(self, row: Any, where: str) -> list[GraspItem]:
        """One item -> one GraspItem (``answer``: the letter of the answer's choice)."""
        if not isinstance(row, dict):
            raise GraspFormatError(where, f"expected a JSON object, got {type(row).__name__}")
        for key in ("id", "task", "question", "choices"):
            if row.get(key) is None:
                raise GraspFormatError(where, f"missing key {key!r}")
        task = str(row["task"]).strip().upper()  # MMSI's own field name: read as "task", kept as the category
        if task not in MMSI_CATEGORIES:
            raise GraspFormatError(where, f"unknown task {row['task']!r} (expected STI, PCR or MPP)")
        choices = row["choices"]
        if not isinstance(choices, list) or len(choices) < 2:
            raise GraspFormatError(where, f"'choices' must list at least 2 players, got {choices!r}")
        choices = [_player(c, where, "choices") for c in choices]
        index = self._answer_index(row, choices, where)
        video = row.get("video_path") or (f"{row['clip_name']}" if row.get("clip_name") else None)
        if not video:
            raise GraspFormatError(where, "missing key 'video_path' (or 'clip_name')")
        if not str(video).endswith((".mp4", ".mkv", ".webm", ".avi", ".mov")):
            video = f"{video}.mp4"
        options = lettered(choices)
        if task == "MPP" and not row.get("utterance_masked"):
            raise GraspFormatError(where, "MPP item without 'utterance_masked'")
        return [GraspItem(uid=str(row["id"]), origin=where, clip=ClipRef(path=str(video)),
                          question=self.prompt(row, task, options, where), options=options, answer=chr(65 + index),
                          category=task, source=row.get("dataset"), question_text=str(row["question"]).strip())]

    @staticmethod
    def _answer_index(row: dict, choices: list[str], where: str) -> int:
        """Index of the answer among the choices, from ``answer`` and/or ``answer_idx`` (they must agree)."""
        by_label = None
        if row.get("answer") is not None:
            label = _player(row["answer"], where, "answer")
            if label not in choices:
                raise GraspFormatError(where, f"answer {row['answer']!r} is not among the choices {choices}")
            by_label = choices.index(label)
        by_index = None
        if row.get("answer_idx") is not None:
            try:
                by_index = int(row["answer_idx"])
            except (TypeError, ValueError):
                raise GraspFormatError(where, f"'answer_idx' must be an integer, got {row['answer_idx']!r}") from None
            # answer_idx is the player number (P3 -> 3), which is also the choice index when choices are P0..Pn-1
            by_index = choices.index(f"P{by_index}") if f"P{by_index}" in choices else by_index
            if not 0 <= by_index < len(choices):
                raise GraspFormatError(where, f"'answer_idx' {row['answer_idx']!r} is out of range for "
                                              f"{len(choices)} choices")
        if by_label is None and by_index is None:
            raise GraspFormatError(where, "missing key 'answer' (or 'answer_idx')")
        if by_label is not None and by_index is not None and by_label != by_index:
            raise GraspFormatError(where, f"'answer' {row['answer']!r} and 'answer_idx' {row['answer_idx']!r} disagree")
        return by_label if by_label is not None else by_index

    def prompt(self, row: dict, task: str, options: tuple[str, ...], where: str) -> str:
        """The user text: game, context, utterance, question, lettered choices, answer instruction."""
        utterance = str(row.get("utterance") or "").strip()
        shown = str(row.get("utterance_masked") or utterance).strip() if task == "MPP" else utterance
        context = _context_lines(row.get("context"), where)
        if task == "MPP" and utterance:
            context = [line.replace(utterance, shown) for line in context]
        players = row.get("player_num") or len(options)
        lines = [f"This video is from a game of Werewolf with {players} players, called P0 to P{int(players) - 1}."]
        if context:
            lines += [f"{self.context_heading}:", *context]
        if shown:
            speaker = row.get("speaker")
            lines.append(f"Utterance{f' by {speaker}' if speaker else ''}: \"{shown}\"")
        lines += [f"Question: {str(row['question']).strip()}", "Options:", *options, LETTER_INSTRUCTION]
        return "\n".join(lines)

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """Top-1: the predicted player (a letter, or a label ``P3`` inside ``<answer>``) equals the answer.

        ``predicted`` is the player label (``None`` when nothing parses, counted as wrong).
        """
        labels = {o[0]: o[3:].strip() for o in item.options}
        target = labels[item.answer]
        predicted = None
        text, in_block = answer_space(completion)
        m = _LABEL_RE.fullmatch(text) if in_block else None
        if m:
            predicted = f"P{int(m.group(1))}"
        else:
            letter = parsing.extract_answer(completion, "".join(labels))
            predicted = labels[letter] if letter is not None else None
        return self.record(item, target, predicted, float(predicted == target), completion)


class OnlineMMSI(MMSI):
    """Online-MMSI: the same tasks with only past utterances as context (``online_mmsi_test_*.json``)."""

    default_name = "online_mmsi"
    title = "Online-MMSI (Werewolf social interactions, past context only)"
    context_heading = "Conversation so far"
