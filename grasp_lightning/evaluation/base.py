"""The evaluation-suite interface, the clip store of a suite, and the per-category accuracy metric.

An :class:`EvalSuite` is a reader, a scorer and a reporter. :meth:`EvalSuite.read` turns every
item of the suite's annotation file(s) into a :class:`~grasp_lightning.data.records.GraspItem`
(question text with options and an ``<answer>`` instruction, ``answer``, ``category`` = the question type),
so the GRASP prompt, decoding and collate path serve every suite unchanged. :meth:`EvalSuite.score`
turns one completion into a JSON-ready record with ``category``, ``target``, ``predicted`` and
``score`` (1 correct, 0 wrong, a fraction for partial credit); :class:`CategoryAccuracy` sums them per
category with sum-reduced states (exact across ranks); :meth:`EvalSuite.log_values` names the logged
values, :meth:`EvalSuite.markdown` renders the table and :meth:`EvalSuite.report` /
:meth:`EvalSuite.figures` give what ``grasp_lightning.callbacks.eval_reports.EvalReports`` writes.

Configs select suites by ``class_path`` under ``data.eval_suites``; the DataModule gives each one a
validation dataloader and :class:`~grasp_lightning.evaluation.suite.SuiteRunner` routes each
dataloader's completions to its suite.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor
from torchmetrics import Metric

from grasp_lightning import parsing
from grasp_lightning.data.formats import Collector, ReadResult
from grasp_lightning.data.records import GraspItem
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.errors import ClipNotFoundError, GraspConfigError, GraspDataError, GraspFormatError

log = logging.getLogger(__name__)

#: Appended to every lettered multiple-choice question of the suites other than GRASP-Bench.
LETTER_INSTRUCTION = "Give the letter of the correct option inside <answer> tags, e.g. <answer>A</answer>."
#: System turn of the suites other than GRASP-Bench (their questions carry their own answer instruction).
SYSTEM_PROMPT = ("You are watching a video of people interacting. Answer the question about it and put "
                 "only the final answer inside <answer> tags.")


class VideoStore:
    """Opens an evaluation suite's clips: paths relative to ``root`` (folder and/or tar shards, through
    :class:`~grasp_lightning.data.shards.ClipStore`) or absolute paths.

    Picklable, so DataLoader workers receive it. Raises :class:`ClipNotFoundError` naming the path.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._clips: ClipStore | None = None

    def open(self, path: str) -> bytes:
        """The bytes of the clip at ``path`` (absolute, or relative to the root)."""
        p = Path(path)
        if p.is_absolute():
            if not p.is_file():
                raise ClipNotFoundError(path, "no such video file")
            return p.read_bytes()
        if self._clips is None:
            self._clips = ClipStore(self.root)
        return self._clips.open(path)


def load_rows(path: Path) -> list[tuple[str, Any]]:
    """``[(where, row), ...]`` of a JSON list (``<file>:<index>``) or a JSONL file (``<file>:<line>``).

    Raises:
        GraspFormatError: missing file, malformed JSON, or a top level that is neither a list nor lines.
    """
    if not path.is_file():
        raise GraspFormatError(str(path), "no such file")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append((f"{path}:{lineno}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise GraspFormatError(f"{path}:{lineno}", f"malformed JSON line ({e})") from None
        return rows
    if isinstance(data, dict):  # {"data": [...]} or {id: item, ...}
        data = data.get("data", data.get("items", list(data.values())))
    if not isinstance(data, list):
        raise GraspFormatError(str(path), f"expected a JSON list of items, got {type(data).__name__}")
    return [(f"{path}:[{i}]", row) for i, row in enumerate(data)]


def answer_space(completion: str) -> tuple[str, bool]:
    """``(text, in_block)``: the stripped content of the first ``<answer>`` block, else the stripped completion."""
    block = parsing.answer_block(completion)
    return (block.strip(), True) if block is not None else (completion.strip(), False)


@dataclass
class SuiteReport:
    """What ``grasp_lightning.callbacks.eval_reports.EvalReports`` writes for one suite after an evaluation epoch.

    Attributes:
        name: the suite's name.
        section: its ``results.json`` content (JSON-ready; NaN is written as ``null``).
        top_level: ``section``'s keys go to the top level of ``results.json`` (GRASP-Bench, so readers
            of GRASP-only results see no change) instead of under ``"suites": {name: ...}``.
        files: file name -> text, written into every report folder (``bench/step_<N>/``, ``bench/latest/``).
        texts: logger tag -> Markdown text (every logger's, :func:`grasp_lightning.monitoring.loggers.log_text`).
        printout: what ``validate``/``test`` print to stdout for this suite.
    """

    name: str
    section: dict[str, Any]
    top_level: bool = False
    files: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    printout: str = ""


class EvalSuite:
    """Base class of the evaluation suites: read items, score completions, aggregate, report.

    Args:
        path: annotation file (JSON list or JSONL), a list of such files, or a folder whose
            ``*.json``/``*.jsonl`` files are all read (e.g. one file per category).
        videos: root the items' video paths are relative to; default: the folder of the
            (first) annotation file.
        name: key of this suite in logs, ``results.json`` and file names (default per class).
        limit: use only the first N items (after reading, before the audio check).
        system_prompt: system turn of its prompts; default :data:`SYSTEM_PROMPT`.

    Subclasses set :attr:`default_name`, :attr:`title`, :attr:`category_names` and implement
    :meth:`parse_row` and :meth:`score`; the report hooks (:meth:`log_values`, :meth:`summary`,
    :meth:`report`, :meth:`figures`) have defaults that suit a per-category accuracy table.
    """

    default_name: ClassVar[str] = "suite"
    title: ClassVar[str] = "Evaluation suite"
    #: category code -> long name, in table order; categories found in the data but not listed come after, sorted.
    category_names: ClassVar[dict[str, str]] = {}

    def __init__(self, path: str | list[str], videos: str | None = None, name: str | None = None,
                 limit: int | None = None, system_prompt: str | None = None) -> None:
        self.paths = [Path(p) for p in ([path] if isinstance(path, str) else path)]
        if not self.paths:
            raise GraspConfigError(f"{type(self).__name__}: path is empty")
        self.videos = videos
        self.name = name or self.default_name
        self.limit = limit
        self.system_prompt = system_prompt if system_prompt is not None else SYSTEM_PROMPT
        self.items: list[GraspItem] = []  # evaluated items (after load)
        self.not_evaluated: dict[str, int] = {}  # category -> items left out (e.g. they need audio)
        self.not_evaluated_reason = ""
        self.categories: list[str] = []
        self.skipped: list = []

    @property
    def top_level(self) -> bool:
        """True when this suite's ``results.json`` section is the file's top level (see :class:`SuiteReport`)."""
        return False

    # ------------------------------------------------------------------ reading
    def files(self) -> list[Path]:
        """The annotation files: each path, the sorted ``*.json``/``*.jsonl`` of a folder, or the sorted
        matches of a glob pattern (``werewolf/mmsi_test_*.json``).

        Raises:
            GraspFormatError: a pattern that matches no file.
        """
        out: list[Path] = []
        for p in self.paths:
            if any(ch in str(p) for ch in "*?["):
                found = sorted(Path(p.anchor or ".").glob(str(p.relative_to(p.anchor)) if p.anchor else str(p)))
                if not found:
                    raise GraspFormatError(str(p), "the pattern matches no annotation file")
                out += found
            else:
                out += sorted([*p.glob("*.json"), *p.glob("*.jsonl")]) if p.is_dir() else [p]
        return out

    def video_root(self) -> Path:
        """Root of relative video paths (``videos``, else the first annotation file's folder)."""
        if self.videos is not None:
            return Path(self.videos)
        first = self.paths[0]
        while any(ch in first.name for ch in "*?["):
            first = first.parent
        return first if first.is_dir() else first.parent

    def store(self) -> VideoStore:
        """Where the items' ``clip.path`` are opened."""
        return VideoStore(self.video_root())

    def use_protocol(self, protocol: Any) -> None:
        """Take the run's GRASP-Bench evaluation protocol (``model.evaluation.protocol``,
        :mod:`grasp_lightning.evaluation.protocol`); the DataModule hands it to every suite once, when
        it loads them. Only suites whose prompts or scoring follow it keep it (none by default)."""

    def encoder(self, processor: Any) -> Callable | None:  # noqa: ARG002 (GraspBench uses it)
        """What encodes this suite's items (``(processor, item, clip_bytes, max_prompt_tokens=) ->
        EncodedExample``); ``None``: the DataModule's own prompt and 2 fps path."""
        return None

    def parse_row(self, row: Any, where: str) -> list[GraspItem]:
        """Turn one raw item into GraspItems (usually one). Raise :class:`GraspFormatError` naming ``where``."""
        raise NotImplementedError

    def read(self, on_error: str = "raise") -> ReadResult:
        """Read every item of :meth:`files` (``on_error``: ``"raise"`` or ``"skip"`` bad items).

        Raises:
            GraspFormatError: a missing or malformed file (always); a bad item with ``"raise"``.
        """
        col = Collector(on_error)
        for file in self.files():
            for where, row in load_rows(file):
                try:
                    col.result.items.extend(self.parse_row(row, where))
                except GraspDataError as e:
                    col.fail(e)
        uids = [i.uid for i in col.result.items]
        if len(set(uids)) != len(uids):
            dup = next(u for u in uids if uids.count(u) > 1)
            raise GraspFormatError(str(self.paths[0]), f"item id {dup!r} occurs more than once")
        return col.result

    def needs_audio(self, item: GraspItem) -> bool:
        """True when the item cannot be answered without its audio track (none by default)."""
        return False

    def load(self, on_error: str = "raise", audio_unavailable: str | None = "no audio input was configured") -> None:
        """Read the items (first :attr:`limit`), keep those the model can take, count the rest per category.

        Items that need audio are evaluated only when ``audio_unavailable`` is ``None``; otherwise
        they are counted in :attr:`not_evaluated` with that reason (reported, never scored as wrong).
        """
        result = self.read(on_error=on_error)
        items = result.items[: self.limit] if self.limit else list(result.items)
        self.skipped = list(result.skipped)
        self.not_evaluated = {}
        self.items = []
        for item in items:
            if audio_unavailable is not None and self.needs_audio(item):
                self.not_evaluated[item.category] = self.not_evaluated.get(item.category, 0) + 1
            else:
                self.items.append(item)
        if self.not_evaluated:
            self.not_evaluated_reason = audio_unavailable
            log.warning("%s: %d items not evaluated: %s", self.name, sum(self.not_evaluated.values()),
                        self.not_evaluated_reason)
        self.categories = self.category_order({i.category for i in items})
        log.info("%s: %d items to evaluate from %s", self.name, len(self.items), ", ".join(map(str, self.files())))

    def category_order(self, found: set[str | None]) -> list[str]:
        """Categories in table order: :attr:`category_names` first, then the others found, sorted."""
        found = {t for t in found if t is not None}
        return [t for t in self.category_names if t in found] + sorted(found - set(self.category_names))

    # ------------------------------------------------------------------ scoring
    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """Score one completion; the record (``uid``, ``category``, ``target``, ``predicted``, ``score``,
        ``correct``, ``completion``) is written to ``results.json`` and fed to :meth:`metric`."""
        raise NotImplementedError

    def metric(self) -> Metric:
        """A fresh metric over :attr:`categories` (call after :meth:`load`)."""
        return CategoryAccuracy(self.categories)

    def compute(self, metric: Metric) -> dict[str, float]:
        """The metric's values plus ``not_evaluated/<category>`` and ``not_evaluated/overall`` counts."""
        out = dict(metric.compute())  # a copy: torchmetrics caches the computed dict
        for category in self.categories:
            out[f"not_evaluated/{category}"] = float(self.not_evaluated.get(category, 0))
        out["not_evaluated/overall"] = float(sum(self.not_evaluated.values()))
        return out

    # ------------------------------------------------------------------ reporting
    def log_values(self, metrics: dict[str, float]) -> dict[str, float]:
        """What the module logs after an epoch: ``val/<name>/acc/<category>``, ``val/<name>/acc/mean`` and
        ``val/<name>/acc/overall`` (NaN values left out)."""
        return {f"val/{self.name}/{key}": float(value) for key, value in metrics.items()
                if key.startswith("acc/") and value == value}

    def summary(self, metrics: dict[str, float]) -> str | None:  # noqa: ARG002
        """Text the module logs after an epoch (none by default)."""
        return None

    def markdown(self, metrics: dict[str, float]) -> str:
        """A Markdown table: one row per category (accuracy %, n, not evaluated), then mean and overall."""
        return category_table(self.title, self.categories, self.category_names, metrics, self.not_evaluated_reason)

    def report(self, metrics: dict[str, float], records: list[dict], label: str = "ours") -> SuiteReport:  # noqa: ARG002
        """The ``results.json`` section ``{"title", "metrics", "items", "table"}``, ``table_<name>.md``,
        the TensorBoard text ``bench/<name>/table`` and the printed table (``label``: unused here)."""
        table = self.markdown(metrics)
        file = f"table_{self.name}.md"
        return SuiteReport(self.name, {"title": self.title, "metrics": metrics, "items": records, "table": file},
                           files={file: table}, texts={f"bench/{self.name}/table": table}, printout=f"\n{table}\n")

    def figures(self, metrics: dict[str, float], folder: str | Path) -> dict[str, Any]:  # noqa: ARG002
        """TensorBoard tag -> RGB uint8 image ``(H, W, 3)``, each also saved as PNG in ``folder`` (none by default)."""
        return {}

    @staticmethod
    def record(item: GraspItem, target: Any, predicted: Any, score: float, completion: str, **extra: Any) -> dict:
        """The record of one scored item."""
        return {"uid": item.uid, "category": item.category, "target": target, "predicted": predicted,
                "score": float(score), "correct": score == 1.0, **extra, "completion": completion}


# ---------------------------------------------------------------------- metric
class CategoryAccuracy(Metric):
    """Accuracy per category (question type), mean over categories and pooled, with partial credit; exact across ranks.

    States (all ``dist_reduce_fx="sum"``): ``score_sum`` float64 ``(T,)``, ``total`` and
    ``unparseable`` int64 ``(T,)`` for the ``T`` categories given at construction (every rank reads the
    same files, so ``T`` and the order agree). Rows with ``valid=False`` (rank padding) are skipped.

    :meth:`compute` keys: ``acc/<category>`` (score sum / items), ``n/<category>``; ``acc/mean`` (unweighted
    mean over categories with items), ``acc/overall`` (pooled), ``n/overall``, ``unparseable_rate``.
    Undefined values are ``NaN``.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    score_sum: Tensor
    total: Tensor
    unparseable: Tensor

    def __init__(self, categories: Sequence[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.category_list = list(categories)
        self._index = {t: i for i, t in enumerate(self.category_list)}
        n = max(1, len(self.category_list))
        self.add_state("score_sum", torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("unparseable", torch.zeros(n, dtype=torch.long), dist_reduce_fx="sum")

    def update_from_records(self, records: list[dict[str, Any]], valid: Tensor | None = None) -> None:
        """Same as :meth:`update` (the name :class:`~grasp_lightning.evaluation.grasp_score.BenchAccuracy` uses)."""
        self.update(records, valid)

    def update(self, records: list[dict[str, Any]], valid: Tensor | None = None) -> None:
        """Count records of :meth:`EvalSuite.score` (``valid``: bool ``(B,)`` or ``None`` for all).

        Raises:
            GraspDataError: a record's category is not one of the metric's categories (names the uid).
        """
        keep = [True] * len(records) if valid is None else [bool(v) for v in valid.tolist()]
        if len(keep) != len(records):
            raise ValueError(f"CategoryAccuracy: {len(records)} records but valid has {len(keep)} rows")
        for record, ok in zip(records, keep):
            if not ok:
                continue
            idx = self._index.get(record["category"])
            if idx is None:
                raise GraspDataError(str(record.get("uid")), f"category {record['category']!r} is not one of {self.category_list}")
            self.score_sum[idx] += float(record["score"])
            self.total[idx] += 1
            self.unparseable[idx] += int(record["predicted"] is None)

    def compute(self) -> dict[str, float]:
        """The metric dict (accuracies in [0, 1], counts as floats)."""
        out: dict[str, float] = {}
        accs = []
        for category, i in self._index.items():
            n = int(self.total[i])
            acc = float(self.score_sum[i]) / n if n else math.nan
            out[f"acc/{category}"], out[f"n/{category}"] = acc, float(n)
            if n:
                accs.append(acc)
        total = int(self.total.sum())
        out["acc/mean"] = sum(accs) / len(accs) if accs else math.nan
        out["acc/overall"] = float(self.score_sum.sum()) / total if total else math.nan
        out["n/overall"] = float(total)
        out["unparseable_rate"] = float(self.unparseable.sum()) / total if total else math.nan
        return out


# ---------------------------------------------------------------------- table
def _pct(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100.0 * value:.1f}"


def _n(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else str(int(value))


def category_table(title: str, categories: Sequence[str], names: dict[str, str], metrics: dict[str, float],
               reason: str = "") -> str:
    """Markdown: a ``### title`` heading, one row per category (code, name, accuracy %, n, not evaluated),
    the mean over categories and the pooled overall, then the unparseable rate. NaN prints "–"."""
    lines = [f"### {title}", "", "| category | name | accuracy (%) | n | not evaluated |", "|---|---|---:|---:|---:|"]
    for cat in categories:
        lines.append(f"| {cat} | {names.get(cat, cat.replace('_', ' '))} | {_pct(metrics.get(f'acc/{cat}'))} | "
                     f"{_n(metrics.get(f'n/{cat}'))} | {_n(metrics.get(f'not_evaluated/{cat}', 0.0))} |")
    lines.append(f"|  | **Mean over categories** | {_pct(metrics.get('acc/mean'))} |  |  |")
    lines.append(f"|  | **Overall** | {_pct(metrics.get('acc/overall'))} | {_n(metrics.get('n/overall'))} | "
                 f"{_n(metrics.get('not_evaluated/overall', 0.0))} |")
    lines += ["", f"Unparseable answers: {_pct(metrics.get('unparseable_rate'))}% of "
                  f"{_n(metrics.get('n/overall'))} items."]
    skipped = metrics.get("not_evaluated/overall", 0.0)
    if skipped and skipped == skipped:
        lines.append(f"Not evaluated: {int(skipped)} items ({reason or 'see the log'}); they count neither as "
                     f"right nor as wrong.")
    return "\n".join(lines) + "\n"


_WORD_RE = re.compile(r"[A-Za-z]+")


def first_word(text: str) -> str:
    """The first word of ``text`` in lower case (``""`` when there is none)."""
    m = _WORD_RE.search(text)
    return m.group(0).lower() if m else ""
