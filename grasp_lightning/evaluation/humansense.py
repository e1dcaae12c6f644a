"""HumanSense: human-centred perception and interaction questions on video (and audio) clips.

File (a JSON list; Qin et al., arXiv 2508.10576, ``antgroup/HumanSense``)::

    [{"video_path": "videos/x.mp4",
      "questions": {"question": "...", "options": ["A. ...", "B. ..."], "answer": "A",
                    "task_type": "Gesture_Recognition", "question_pattern": "...",
                    "full_frame_number": 240, "fps": 30, "asr_en": "..."}}, ...]

``questions`` may also be a list of such objects (one item each). Four question patterns
(matched on key words, so the released strings and short names both work):

==============================================================  ==================  =======================
released ``question_pattern``                                   ``format`` here     score
==============================================================  ==================  =======================
Multiple-choice question (select one answer choice)             ``mcq``             letter equality (2-5 options)
Multiple-choice question (select one or more answer choices)    ``mcq_multi``       exact set 1, strict subset 0.5,
                                                                                    any wrong letter 0
Question and answer (Arabic numerals)                           ``number``          integer equality (0-10)
Judgment question (Yes or No)                                   ``yes_no``          yes/no equality
==============================================================  ==================  =======================

Accuracy per category (HumanSense's ``task_type`` field, read as such) and overall. Items that need audio — the audio-visual task types the
release feeds audio for (:data:`AUDIO_TASK_TYPES`) and audio-only files — are evaluated only when
the model's processor accepts audio, else reported as not evaluated (never as wrong). With
``asr=True`` the ``asr_en`` transcript is put in the prompt (the release's ASR setting) and an
audio-visual item that has one no longer needs audio.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from grasp_lightning import parsing
from grasp_lightning.data.formats import option_letters
from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.errors import GraspFormatError

from .audio import AUDIO_SUFFIXES
from .base import EvalSuite, answer_space

#: Task types for which the HumanSense release passes the audio track to omni models.
AUDIO_TASK_TYPES = ("Rapport_Recognition", "Emo_Strategy", "Talkingperson_Recognition", "Familiarity_Recognition",
                    "Relation_Recognition", "Fraud_Recognition", "Psychological_Chat")
PATTERNS = {"mcq": "Multiple-choice question (select one answer choice)",
            "mcq_multi": "Multiple-choice question (select one or more answer choices)",
            "number": "Question and answer (Arabic numerals)",
            "yes_no": "Judgment question (Yes or No)"}
INSTRUCTIONS = {
    "mcq": "Which one of the options is correct? Answer with one option letter inside <answer> tags.",
    "mcq_multi": "Which of the options are correct? (Select all.) Answer with all correct option letters inside "
                 "<answer> tags, e.g. <answer>A, C</answer>.",
    "number": "Answer with a single Arabic numeral between 0 and 10 inside <answer> tags.",
    "yes_no": "Answer Yes or No inside <answer> tags.",
}
_NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
_LETTERS_RE = re.compile(r"(?<![A-Za-z])([A-Z])(?![a-z])")
_LEADING_LETTERS_RE = re.compile(r"^\(?([A-Z])\)?(?:\s*(?:,|;|/|&|and)?\s*\(?([A-Z])\)?)*[.\s]*$")
_NUMBER_RE = re.compile(r"(?<![\d.])(\d+)(?![\d.])|\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.I)
_YES_NO_RE = re.compile(r"\b(yes|no)\b", re.I)


def pattern_of(value: Any, where: str) -> str:
    """``mcq``, ``mcq_multi``, ``number`` or ``yes_no`` from a ``question_pattern`` string.

    Raises:
        GraspFormatError: a pattern none of the four key-word rules recognises.
    """
    text = str(value or "").lower()
    if "one or more" in text or "select all" in text:
        return "mcq_multi"
    if "numeral" in text or "number" in text or "count" in text:
        return "number"
    if "judg" in text or "yes" in text:
        return "yes_no"
    if "one answer" in text or "single" in text:
        return "mcq"
    if re.search(r"multi[-_ ]?(answer|select|choice)|multiple answers", text):
        return "mcq_multi"
    if "choice" in text or text == "mcq":
        return "mcq"
    raise GraspFormatError(where, f"unknown question_pattern {value!r} (expected one of {list(PATTERNS.values())})")


def _letter_set(value: Any, letters: list[str], where: str) -> str:
    """Target letters of a multi-answer item, sorted and joined (``"AC"``) from ``"AC"``, ``"A, C"`` or a list."""
    raw = "".join(value) if isinstance(value, list) else str(value)
    found = sorted(set(re.findall(r"[A-Z]", raw.upper())))
    if not found or any(x not in letters for x in found):
        raise GraspFormatError(where, f"answer {value!r} is not a set of the option letters {''.join(letters)}")
    return "".join(found)


def predicted_letters(completion: str) -> str | None:
    """The letters a multi-answer completion picks (sorted, joined), or ``None`` if none parse.

    Inside ``<answer>``: every standalone capital letter (``"A, C"``, ``"A and C"``, ``"(A)(C)"``) or a
    run of capitals (``"AC"``). Without the block, the whole stripped text must be such a list.
    """
    text, in_block = answer_space(completion)
    if re.fullmatch(r"[A-Z]{1,26}\.?", text):
        found = set(text.rstrip("."))
    elif in_block:
        found = set(_LETTERS_RE.findall(text))
    else:
        found = set(re.findall(r"[A-Z]", text)) if _LEADING_LETTERS_RE.match(text) else set()
    return "".join(sorted(found)) or None


def multi_score(predicted: str | None, target: str) -> float:
    """1 for the exact set, 0.5 for a strict non-empty subset, 0 with any wrong letter (or nothing).

    Source: ``one_or_more_answeracore`` of the HumanSense release (``HumanSense_bench/src/score.py``).
    """
    if not predicted or any(x not in target for x in predicted):
        return 0.0
    return 1.0 if set(predicted) == set(target) else 0.5


def predicted_number(completion: str) -> int | None:
    """The first integer (digits or a word zero-ten) inside ``<answer>``, or leading the text."""
    text, in_block = answer_space(completion)
    m = _NUMBER_RE.search(text) if in_block else _NUMBER_RE.match(text)
    if not m:
        return None
    return int(m.group(1)) if m.group(1) is not None else _NUMBER_WORDS[m.group(2).lower()]


def predicted_yes_no(completion: str) -> str | None:
    """``"yes"``/``"no"``: the first such word inside ``<answer>``, or leading the text."""
    text, in_block = answer_space(completion)
    m = _YES_NO_RE.search(text) if in_block else _YES_NO_RE.match(text)
    return m.group(1).lower() if m else None


class HumanSense(EvalSuite):
    """HumanSense (see the module docstring).

    Args:
        path: the HumanSense JSON (or a list of files / a folder).
        videos: root of ``video_path`` (default: the JSON's folder).
        name: results key (default ``humansense``).
        limit: use only the first N items.
        audio_task_types: task types that need the audio track.
        asr: put ``asr_en`` in the prompt; then those items no longer need audio.
        system_prompt: system turn.
    """

    default_name = "humansense"
    title = "HumanSense (accuracy per category: its task_type)"

    def __init__(self, path: str | list[str], videos: str | None = None, name: str | None = None,
                 limit: int | None = None, audio_task_types: list[str] = list(AUDIO_TASK_TYPES),  # noqa: B006
                 asr: bool = False, system_prompt: str | None = None) -> None:
        super().__init__(path, videos=videos, name=name, limit=limit, system_prompt=system_prompt)
        self.audio_task_types = tuple(audio_task_types)
        self.asr = asr
        self._with_asr: set[str] = set()  # uids whose prompt carries the asr_en transcript

    def parse_row(self, row: Any, where: str) -> list[GraspItem]:
        """One ``{"video_path", "questions"}`` entry -> one GraspItem per question."""
        if not isinstance(row, dict) or row.get("video_path") is None or row.get("questions") is None:
            raise GraspFormatError(where, "expected an object with 'video_path' and 'questions'")
        questions = row["questions"] if isinstance(row["questions"], list) else [row["questions"]]
        file, index = where.rsplit(":", 1)
        items = []
        for k, q in enumerate(questions):
            at = where if len(questions) == 1 else f"{where}.questions[{k}]"
            uid = f"{Path(file).stem}{index}" + ("" if len(questions) == 1 else f".{k}")  # e.g. humansense[3]
            items.append(self._item(row, q, at, uid))
        return items

    def _item(self, row: dict, q: Any, where: str, uid: str) -> GraspItem:
        if not isinstance(q, dict):
            raise GraspFormatError(where, "'questions' must be an object (or a list of objects)")
        for key in ("question", "answer", "task_type", "question_pattern"):
            if q.get(key) is None:
                raise GraspFormatError(where, f"missing key {key!r}")
        fmt = pattern_of(q["question_pattern"], where)
        options = tuple(str(o).strip() for o in q.get("options") or ())
        letters = option_letters(options)
        if fmt.startswith("mcq") and (len(letters) != len(options) or not 2 <= len(options) <= 26):
            raise GraspFormatError(where, f"options must be lettered 'A. ...' strings, got {list(options)!r}")
        answer = self._target(fmt, q["answer"], options, letters, where)
        lines = []
        asr = str(q.get("asr_en") or "").strip()
        if self.asr and asr:
            self._with_asr.add(uid)
            lines.append(f"The following provides the ASR (automatic speech recognition) text of the video: {asr}")
        lines.append(f"Question: {str(q['question']).strip()}")
        if options and fmt.startswith("mcq"):
            lines += ["Options:", *options]
        lines.append(INSTRUCTIONS[fmt])
        clip = ClipRef(path=str(row["video_path"]), fps=float(q.get("fps") or 2.0))
        return GraspItem(uid=uid, origin=where, clip=clip,
                         question="\n".join(lines), options=options if fmt.startswith("mcq") else (), answer=answer,
                         category=str(q["task_type"]), format=fmt, source="humansense",
                         question_text=str(q["question"]).strip())

    @staticmethod
    def _target(fmt: str, raw: Any, options: tuple[str, ...], letters: list[str], where: str) -> str:
        """The canonical target: a letter, sorted letters, ``"0"``-``"10"``, or ``"yes"``/``"no"``."""
        if fmt == "mcq":
            letter = str(raw[0] if isinstance(raw, list) and raw else raw).strip()[:1].upper()
            if letter not in letters:
                raise GraspFormatError(where, f"answer {raw!r} is not one of the option letters {''.join(letters)}")
            return letter
        if fmt == "mcq_multi":
            return _letter_set(raw, letters, where)
        if fmt == "number":
            try:
                value = int(str(raw).strip())
            except ValueError:
                raise GraspFormatError(where, f"answer {raw!r} is not an integer") from None
            if not 0 <= value <= 10:
                raise GraspFormatError(where, f"answer {raw!r} is outside 0-10")
            return str(value)
        text = str(raw).strip().rstrip(".").lower()
        if text in (letter.lower() for letter in letters):  # a letter of "A. Yes" / "B. No" options
            text = options[letters.index(text.upper())][2:].strip().rstrip(".").lower()
        if text not in ("yes", "no"):
            raise GraspFormatError(where, f"answer {raw!r} is not Yes or No")
        return text

    def needs_audio(self, item: GraspItem) -> bool:
        """Audio-only files always; the audio-visual task types unless ``asr`` supplies their transcript."""
        if item.clip.path.lower().endswith(AUDIO_SUFFIXES):
            return True
        return item.category in self.audio_task_types and item.uid not in self._with_asr

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """Score by the item's pattern (see the module docstring); ``predicted`` is ``None`` when unparseable."""
        fmt = item.format
        if fmt == "mcq":
            predicted = parsing.extract_answer(completion, "".join(option_letters(item.options)))
            score = float(predicted == item.answer)
        elif fmt == "mcq_multi":
            predicted = predicted_letters(completion)
            score = multi_score(predicted, item.answer)
        elif fmt == "number":
            number = predicted_number(completion)
            predicted = None if number is None else str(number)
            score = float(predicted == item.answer)
        else:
            predicted = predicted_yes_no(completion)
            score = float(predicted == item.answer)
        return self.record(item, item.answer, predicted, score, completion, pattern=fmt)
