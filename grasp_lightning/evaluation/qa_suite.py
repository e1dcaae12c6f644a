"""``QASuite``: a file of the generic QA format (``docs/data-format.md``) as an evaluation suite.

Rows are read exactly as training reads them (:func:`grasp_lightning.data.qa.parse_qa_row`: video
and/or image, paths relative to the annotation file's folder); each needs an ``answer``. A
multiple-choice row is right when the completion's option letter (:func:`grasp_lightning.parsing.extract_answer`)
is the answer; an open-ended row when the ``<answer>`` block (or the whole completion) equals the
reference after case, spaces and end punctuation are folded. Accuracy is reported per ``category``
when rows give one, under ``all`` otherwise, with the mean over categories and the pooled overall.

Select it in a config::

    data:
      eval_suites:
        - class_path: grasp_lightning.evaluation.QASuite
          init_args: {path: /data/my_eval/qa.jsonl, name: my_eval}
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from grasp_lightning import parsing
from grasp_lightning.data.qa import parse_qa_row
from grasp_lightning.data.records import GraspItem
from grasp_lightning.errors import GraspFormatError
from grasp_lightning.evaluation.base import LETTER_INSTRUCTION, EvalSuite, answer_space
from grasp_lightning.evaluation.reports import accuracy_bar_chart

#: Appended to an open-ended question that names no ``<answer>`` tag.
OPEN_INSTRUCTION = "Put only the final answer inside <answer> tags."
#: The category of rows without a ``category``.
NO_CATEGORY = "all"
_FOLD_RE = re.compile(r"\s+")


def fold(text: str) -> str:
    """Lower case, inner whitespace runs as one space, surrounding spaces and a final ``.``/``!`` removed."""
    return _FOLD_RE.sub(" ", text).strip().rstrip(".!").strip().lower()


class QASuite(EvalSuite):
    """Generic QA rows (video and/or image) as an evaluation suite; see the module docstring.

    Args:
        path: the QA file(s) (JSONL, or a JSON list of the same objects), or a folder of them.
        videos: unused by the rows (their paths are relative to their own file); kept for the
            :class:`EvalSuite` interface.
        name: results key (default ``qa``).
        limit: use only the first N items.
        system_prompt: system turn (default :data:`~grasp_lightning.evaluation.base.SYSTEM_PROMPT`).
    """

    default_name = "qa"
    title = "Generic QA"

    def parse_row(self, row: Any, where: str) -> list[GraspItem]:
        """One row -> one GraspItem (``category``: the row's, else :data:`NO_CATEGORY`).

        Raises:
            GraspFormatError: as :func:`~grasp_lightning.data.qa.parse_qa_row`, or no ``answer``.
            ClipNotFoundError: a missing video or image file.
        """
        file = Path(where.rsplit(":", 1)[0])
        item = parse_qa_row(row, where, file.parent, f"{file.name.split('.')[0]}:{where.rsplit(':', 1)[1]}")
        if not item.answer:
            raise GraspFormatError(where, "an evaluation row needs an 'answer' (an option letter, or the reference text)")
        if "<answer>" not in item.question:
            item = item.replace(question=f"{item.question}\n{LETTER_INSTRUCTION if item.options else OPEN_INSTRUCTION}")
        return [item.replace(category=item.category or NO_CATEGORY)]

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """1 when the predicted letter (MCQ) or folded answer text (open-ended) equals the target, else 0;
        ``predicted`` is ``None`` when no letter parses (MCQ, counted as wrong and unparseable)."""
        if item.options:
            letters = "".join(o[0] for o in item.options)
            predicted = parsing.extract_answer(completion, letters)
            return self.record(item, item.answer, predicted, float(predicted == item.answer), completion)
        text, _ = answer_space(completion)
        return self.record(item, item.answer, text, float(fold(text) == fold(item.answer)), completion)

    def figures(self, metrics: dict[str, float], folder: str | os.PathLike) -> dict[str, Any]:
        """``bench/<name>/category_accuracy``: each category's accuracy and the overall
        (:func:`~grasp_lightning.evaluation.reports.accuracy_bar_chart`), saved as ``categories_<name>.png``."""
        chart = accuracy_bar_chart(self.categories, metrics, path=os.path.join(folder, f"categories_{self.name}.png"),
                                   title=f"{self.title} ({self.name}): accuracy per category")
        return {f"bench/{self.name}/category_accuracy": chart}
