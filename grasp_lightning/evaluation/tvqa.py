"""TVQA+: 5-way multiple-choice questions about moments of TV episodes (Lei et al., ACL 2020).

Items (``tvqa_plus_val.json``, a JSON list; JSONL works too): ``{"qid", "q", "a0".."a4",
"answer_idx" (int or string), "ts" ([start, end] seconds, or TVQA's "start-end" string),
"vid_name", "subtitle" (optional: a string, or a list of ``{"start", "end", "text"}``)}``; other
keys (``bbox``, ...) are ignored. The clip is ``<videos>/<video_pattern with vid_name>``
(default ``videos/<vid_name>.mp4``) or the item's ``video_path``; only the ``ts`` window is
decoded (``ClipRef.start_seconds``/``end_seconds``), and only the subtitle lines overlapping it
are shown. Metric: 5-way accuracy, also per question word (what/who/where/why/how/other).
"""

from __future__ import annotations

import re
from typing import Any

from grasp_lightning import parsing
from grasp_lightning.data.formats import lettered
from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.errors import GraspFormatError

from .base import LETTER_INSTRUCTION, EvalSuite, first_word

QUESTION_WORDS = {"what": "What …", "who": "Who …", "where": "Where …", "why": "Why …", "how": "How …",
                  "when": "When …", "which": "Which …", "other": "Other questions"}
_TS_RE = re.compile(r"^\s*([0-9.]+)\s*-\s*([0-9.]+)\s*$")


def parse_ts(value: Any, where: str) -> tuple[float, float]:
    """``(start, end)`` seconds from ``[start, end]`` or ``"start-end"``.

    Raises:
        GraspFormatError: another shape, non-numbers, or ``end <= start``.
    """
    if isinstance(value, str):
        m = _TS_RE.match(value)
        pair = (m.group(1), m.group(2)) if m else None
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        pair = tuple(value)
    else:
        pair = None
    try:
        start, end = (float(v) for v in pair) if pair is not None else (None, None)
    except (TypeError, ValueError):
        start = end = None
    if start is None or end is None or not end > start or start < 0:
        raise GraspFormatError(where, f"'ts' must be [start, end] seconds with end > start >= 0, got {value!r}")
    return start, end


def _subtitle_text(raw: Any, window: tuple[float, float]) -> str:
    """The subtitle lines to show: a string as is; timed lines overlapping ``window`` (seconds)."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw.strip()
    lines = []
    for line in raw if isinstance(raw, list) else []:
        if isinstance(line, dict):
            start, end = float(line.get("start", 0.0)), float(line.get("end", float("inf")))
            if end >= window[0] and start <= window[1]:
                lines.append(str(line.get("text", "")).strip())
        else:
            lines.append(str(line).strip())
    return "\n".join(line for line in lines if line)


class TVQAPlus(EvalSuite):
    """TVQA+ validation set (see the module docstring).

    Args:
        path: ``tvqa_plus_val.json`` (or a list of files / a folder).
        videos: root of the clips (default: the annotation file's folder).
        video_pattern: clip path under ``videos``, formatted with ``vid_name``.
        name: results key (default ``tvqa_plus``).
        limit: use only the first N items.
        system_prompt: system turn.
    """

    default_name = "tvqa_plus"
    title = "TVQA+ (5-way accuracy on the ts window)"
    category_names = QUESTION_WORDS

    def __init__(self, path: str | list[str], videos: str | None = None, video_pattern: str = "videos/{vid_name}.mp4",
                 name: str | None = None, limit: int | None = None, system_prompt: str | None = None) -> None:
        super().__init__(path, videos=videos, name=name, limit=limit, system_prompt=system_prompt)
        self.video_pattern = video_pattern

    def parse_row(self, row: Any, where: str) -> list[GraspItem]:
        """One item -> one GraspItem with the clip window ``ts`` and options ``A)``..``E)``."""
        if not isinstance(row, dict):
            raise GraspFormatError(where, f"expected a JSON object, got {type(row).__name__}")
        for key in ("qid", "q", "vid_name", "ts", "answer_idx"):
            if row.get(key) is None:
                raise GraspFormatError(where, f"missing key {key!r}")
        answers = []
        for k in range(5):
            if not isinstance(row.get(f"a{k}"), str):
                raise GraspFormatError(where, f"missing answer 'a{k}' (TVQA+ has 5 candidate answers a0..a4)")
            answers.append(row[f"a{k}"])
        try:
            index = int(str(row["answer_idx"]).strip())
        except ValueError:
            raise GraspFormatError(where, f"'answer_idx' must be 0-4, got {row['answer_idx']!r}") from None
        if not 0 <= index < 5:
            raise GraspFormatError(where, f"'answer_idx' must be 0-4, got {row['answer_idx']!r}")
        start, end = parse_ts(row["ts"], where)
        question = str(row["q"]).strip()
        options = lettered(answers)
        lines = []
        subtitle = _subtitle_text(row.get("subtitle"), (start, end))
        if subtitle:
            lines += ["Subtitles:", subtitle]
        lines += [f"Question: {question}", "Options:", *options, LETTER_INSTRUCTION]
        word = first_word(question)
        path = row.get("video_path") or self.video_pattern.format(vid_name=row["vid_name"])
        return [GraspItem(uid=str(row["qid"]), origin=where,
                          clip=ClipRef(path=str(path), start_seconds=start, end_seconds=end),
                          question="\n".join(lines), options=options, answer=chr(65 + index),
                          category=word if word in QUESTION_WORDS else "other", source="tvqa_plus",
                          question_text=question, time_range=(start, end))]

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """Correct when the extracted letter (A-E) is the answer's; ``predicted`` is the letter or ``None``."""
        predicted = parsing.extract_answer(completion, "ABCDE")
        return self.record(item, item.answer, predicted, float(predicted == item.answer), completion)
