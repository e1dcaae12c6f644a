"""Readers of the GRASP files into :class:`~grasp_lightning.data.records.GraspItem` records.

Schemas: ``docs/data-format.md``. Every reader returns a :class:`ReadResult`: the items, plus a
:class:`SkipRecord` for every line or member left out with ``on_error="skip"`` (each also logged
with ``logging.warning``). With ``on_error="raise"`` (default) the first bad line raises. Errors
about a whole file (missing file, corrupt tar) always raise. Blank lines are not items.

``ReadResult`` behaves as a read-only list of its items (``len``, indexing, iteration).
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grasp_lightning.data.records import DIFFICULTIES, ClipRef, GraspItem, SocialEvent, normalise_category
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.errors import ClipNotFoundError, GraspConfigError, GraspDataError, GraspFormatError

log = logging.getLogger(__name__)

_OPTION_RE = re.compile(r"^\s*([A-Z])\s*[).]\s*(\S.*)?$")
_ANSWER_TAG_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S)
_LETTER_RE = re.compile(r"^\s*([A-Za-z])\s*[).]?\s*$")


@dataclass(frozen=True)
class SkipRecord:
    """A line, member or item left out with ``on_error="skip"`` (readers, and the training loop
    for unreadable clips); counted, logged and written to ``skipped.jsonl``.

    Attributes:
        where: ``"<file>:<line>"`` or ``"<archive>:<member>"``.
        reason: what was wrong.
        uid: the item id when the row parsed far enough to have one, else ``""``.
    """

    where: str
    reason: str
    uid: str = ""


@dataclass
class ReadResult(Sequence):
    """What a reader returns: ``items`` in file order and the ``skipped`` lines or members."""

    items: list[GraspItem] = field(default_factory=list)
    skipped: list[SkipRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):  # type: ignore[override]
        return self.items[i]

    def __iter__(self) -> Iterator[GraspItem]:
        return iter(self.items)


class Collector:
    """Applies the ``on_error`` policy: re-raise, or log a warning and keep a :class:`SkipRecord`."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ("raise", "skip"):
            raise GraspConfigError("on_error", f"must be 'raise' or 'skip', got {on_error!r}")
        self.on_error = on_error
        self.result = ReadResult()

    def fail(self, err: GraspDataError, uid: str = "") -> None:
        """Handle one bad line or member (``uid``: the row's own id, when it gives one)."""
        if self.on_error == "raise":
            raise err
        log.warning("skipping %s: %s", err.where, err.reason)
        self.result.skipped.append(SkipRecord(err.where, err.reason, uid))


def _jsonl(path: str | Path) -> Iterator[tuple[int, str, Any]]:
    """Yield ``(line number (1-based), "<path>:<line>", value or GraspFormatError)`` per non-blank line."""
    p = Path(path)
    if not p.is_file():
        raise GraspFormatError(str(path), "no such file")
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                text = raw.decode("utf-8")
                if not text.strip():
                    continue
                yield lineno, where, json.loads(text)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                yield lineno, where, GraspFormatError(where, f"malformed JSON line ({e})")


def read_lines(path: str | Path, on_error: str, parse: Callable[[Any, str, int], GraspItem]) -> ReadResult:
    """Every line of a JSONL file through ``parse(row, "<file>:<line>", line)``, with the ``on_error``
    policy of :class:`Collector` (the one line loop of every JSONL reader: GRASP rows and generic QA).

    Raises:
        GraspFormatError: missing file; with ``on_error="raise"``, the first bad line (JSON or schema).
    """
    col = Collector(on_error)
    for lineno, where, value in _jsonl(path):
        try:
            if isinstance(value, GraspFormatError):
                raise value
            col.result.items.append(parse(value, where, lineno))
        except GraspDataError as e:
            col.fail(e, str(value.get("id") or "") if isinstance(value, dict) else "")
    return col.result


# ------------------------------------------------------------------ field helpers (shared with bench)
def require(d: dict, key: str, where: str) -> Any:
    """``d[key]``, or GraspFormatError naming ``key`` when it is missing or null."""
    if d.get(key) is None:
        raise GraspFormatError(where, f"missing key {key!r}")
    return d[key]


def text_field(d: dict, key: str, where: str, required: bool = True) -> str | None:
    """A string field (``None`` when optional and absent)."""
    value = require(d, key, where) if required else d.get(key)
    if value is not None and not isinstance(value, str):
        raise GraspFormatError(where, f"{key!r} must be a string, got {type(value).__name__}")
    return value


def parse_difficulty(value: Any, where: str) -> str | None:
    """``easy``/``medium``/``hard`` (case ignored) or ``None``."""
    if value is None:
        return None
    norm = str(value).strip().lower()
    if norm not in DIFFICULTIES:
        raise GraspFormatError(where, f"unknown difficulty {value!r} (expected easy, medium or hard)")
    return norm


def parse_format(value: Any, where: str) -> str:
    """``"mcq"`` or ``"open_ended"`` (``open-ended``, ``open`` accepted)."""
    norm = str(value).strip().lower().replace("-", "_")
    norm = "open_ended" if norm == "open" else norm
    if norm not in ("mcq", "open_ended"):
        raise GraspFormatError(where, f"unknown format {value!r} (expected 'mcq' or 'open_ended')")
    return norm


def lettered(options: Sequence[str]) -> tuple[str, ...]:
    """``"A) first"``, ``"B) second"``, ...: options lettered by position (whitespace stripped).

    The one lettering of the codebase: GRASP rows with unlettered options and the evaluation
    suites' multiple-choice items (``grasp_lightning/evaluation/``) are both written this way.
    """
    return tuple(f"{chr(65 + i)}) {str(o).strip()}" for i, o in enumerate(options))


def parse_options(raw: Any, where: str) -> tuple[str, ...]:
    """Option strings, each ``"A) ..."``; unlettered options get ``A)``, ``B)``, ... by position."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(o, str) for o in raw):
        raise GraspFormatError(where, "'options' must be a list of strings")
    has_letter = [bool(_OPTION_RE.match(o)) for o in raw]
    if all(has_letter):
        return tuple(o.strip() for o in raw)
    if any(has_letter):
        raise GraspFormatError(where, "some options start with a letter like 'A)' and some do not")
    return lettered(raw)


def option_letters(options: Sequence[str]) -> list[str]:
    """The letters of lettered option strings (``"B) Person 2"`` -> ``"B"``)."""
    return [m.group(1) for o in options if (m := _OPTION_RE.match(o))]


def answer_letter(text: str) -> str | None:
    """The letter of an MCQ answer: ``"B"``, ``"b"``, ``"B)"``, ``"<answer>B</answer>"``; else ``None``."""
    tag = _ANSWER_TAG_RE.search(text)
    m = _LETTER_RE.match(tag.group(1) if tag else text)
    return m.group(1).upper() if m else None


def check_mcq_answer(answer: str, options: Sequence[str], where: str) -> str:
    """Return the answer letter; GraspFormatError if it is not one of the option letters."""
    letters = option_letters(options)
    if not letters:
        raise GraspFormatError(where, "MCQ item has no options")
    letter = answer_letter(answer)
    if letter is None or letter not in letters:
        raise GraspFormatError(where, f"MCQ answer {answer!r} is not among the option letters {''.join(letters)}")
    return letter


def user_text(question: str, options: Sequence[str]) -> str:
    """The question followed by the options, one per line."""
    return "\n".join([question.strip(), *options])


#: Event sources the format names: ``gaze`` and gesture (the generic word and the four deictic types).
#: Any other source is still a gesture event (``docs/data-format.md``); check-data warns about it.
KNOWN_EVENT_SOURCES = frozenset({"gaze", "gesture", "pointing", "showing", "giving", "reaching"})
_PERSON_RE = re.compile(r"\bPerson\s+(\d+)\b|\bP(\d+)\b")


def _person_id(p: Any) -> int | None:
    """A 0-based person id: a non-negative int (an integral float or a digit string is tolerated)."""
    if isinstance(p, bool):
        return None
    if isinstance(p, int):
        return p if p >= 0 else None
    if isinstance(p, float):
        return int(p) if p.is_integer() and p >= 0 else None
    if isinstance(p, str) and p.strip().isdigit():
        return int(p.strip())
    return None


def parse_events(raw: Any, where: str) -> tuple[SocialEvent, ...]:
    """``[{"source": "gaze", "persons": [0, 3]}, ...]`` -> events; any non-gaze source is a gesture.

    ``"gaze"`` is matched ignoring case and spaces (``"Gaze"`` is gaze here) and a digit-string person
    id is that person (ours); each event also keeps its source and persons exactly as written
    (:attr:`SocialEvent.kind`, :attr:`SocialEvent.persons_written`), which the released-code reward
    variant reads as the released code does. An event without ``persons``, or with a person that is not
    an id (``true``, ``-1``, ``"P1"``), is refused, where the released code scores it (an empty event;
    ``true`` as Person 1): ``docs/released-recipe.md``.

    An event may also give its time as ``"start_seconds"`` and ``"end_seconds"`` (seconds from the
    clip start; both or neither): it then gets ``span=(start, end)``, else ``span=None``.

    Raises:
        GraspFormatError: naming ``where``: not a list of ``{source: str, persons: list}``, a person
            that is not a non-negative integer id (``Person N`` ids are 0-based), or a bad time span
            (:func:`_event_span`).
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise GraspFormatError(where, "events must be a list of {source, persons}")
    events = []
    for n, ev in enumerate(raw):
        if not isinstance(ev, dict) or not isinstance(ev.get("source"), str) or not isinstance(ev.get("persons"), list):
            raise GraspFormatError(where, f"bad event {ev!r} (expected {{'source': str, 'persons': [int, ...]}})")
        persons = tuple(_person_id(p) for p in ev["persons"])
        if any(p is None for p in persons):
            raise GraspFormatError(where, f"event persons must be non-negative integer ids, got {ev['persons']!r}")
        kind = ev["source"]
        events.append(SocialEvent("gaze" if kind.strip().lower() == "gaze" else "gesture", persons, kind,
                                  span=_event_span(ev, n, where), persons_written=tuple(ev["persons"])))
    return tuple(events)


def _event_span(ev: dict, n: int, where: str) -> tuple[float, float] | None:
    """``(start_seconds, end_seconds)`` of event number ``n`` (0-based), ``None`` when it gives neither key
    (a key set to ``null`` counts as not given, as for the other optional numbers of the format).

    Raises:
        GraspFormatError: naming ``where`` and the event: only one of the two keys, a value that is not
            a finite number (``bool`` is not a number), a negative start, or an end not after the start.
    """
    has_start, has_end = ev.get("start_seconds") is not None, ev.get("end_seconds") is not None
    if not has_start and not has_end:
        return None
    if has_start != has_end:
        given, missing = ("start_seconds", "end_seconds") if has_start else ("end_seconds", "start_seconds")
        raise GraspFormatError(where, f"event {n}: {given!r} given without {missing!r} (give both or neither)")
    times = []
    for key in ("start_seconds", "end_seconds"):
        value = ev[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise GraspFormatError(where, f"event {n}: {key!r} must be a finite number of seconds, got {value!r}")
        times.append(float(value))
    start, end = times
    if start < 0:
        raise GraspFormatError(where, f"event {n}: 'start_seconds' {start} must be >= 0")
    if end <= start:
        raise GraspFormatError(where, f"event {n}: 'end_seconds' {end} must be greater than 'start_seconds' {start}")
    return start, end


def persons_named(text: str) -> set[int]:
    """The person ids mentioned in ``text`` as ``Person N`` or a standalone ``PN``."""
    return {int(a or b) for a, b in _PERSON_RE.findall(text or "")}


def persons_shown(item: GraspItem) -> frozenset[int]:
    """The people an item shows: those :func:`persons_named` in its question text (which our readers
    build with the options, :func:`user_text`) and in its options, plus its ground-truth participants.

    What ``grounding/enumeration_rate`` compares the named people with
    (:func:`grasp_lightning.grpo.rewards.enumerates`).
    """
    named = persons_named(item.question) | persons_named("\n".join(item.options))
    return frozenset(named) | item.participants


def event_warnings(item: GraspItem) -> list[str]:
    """Doubtful but allowed things about an item's ground-truth events (the format is tolerant here):
    a source outside :data:`KNOWN_EVENT_SOURCES` (read as a gesture), and event persons that the
    question and options never name (when they name anyone at all)."""
    out = []
    unknown = sorted({e.kind for e in item.events if e.kind.strip().lower() not in KNOWN_EVENT_SOURCES})
    if unknown:
        out.append(f"meta.gt_events source(s) {', '.join(map(repr, unknown))} unknown, read as gesture events")
    named = persons_named(item.question)
    extra = sorted({p for e in item.events for p in e.persons} - named) if named else []
    if extra:
        out.append(f"meta.gt_events person(s) {extra} are not named in the question or options "
                   f"(which name {sorted(named)})")
    return out


def _float(d: dict, key: str, where: str, default: float | None) -> float | None:
    value = d.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise GraspFormatError(where, f"{key!r} must be a number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------ annotations.jsonl
def read_annotations(path: str | Path, on_error: str = "raise") -> ReadResult:
    """Read ``annotations.jsonl`` (keys id, video, source, category, difficulty, format, question,
    options, answer, response).

    ``GraspItem.question`` is the question then the options one per line; ``question_text`` the
    bare question; ``uid`` the ``id``; ``origin`` ``"<path>:<line>"``.

    Raises:
        GraspFormatError: (``on_error="raise"``) malformed JSON, not an object, a missing key
            (id, video, category, format, question, answer), unknown category/difficulty/format,
            an MCQ answer not among the option letters; always when ``path`` does not exist.
    """
    return read_lines(path, on_error, _annotation)


def _annotation(row: Any, where: str, lineno: int) -> GraspItem:
    if not isinstance(row, dict):
        raise GraspFormatError(where, f"expected a JSON object, got {type(row).__name__}")
    for key in ("id", "video", "category", "format", "question", "answer"):
        require(row, key, where)
    fmt = parse_format(row["format"], where)
    question = text_field(row, "question", where)
    options = parse_options(row.get("options"), where)
    answer = str(row["answer"]).strip()
    if fmt == "mcq":
        answer = check_mcq_answer(answer, options, where)
    return GraspItem(
        uid=str(row["id"]), origin=where, clip=ClipRef(path=text_field(row, "video", where)),
        question=user_text(question, options), options=options, answer=answer,
        response=text_field(row, "response", where, required=False),
        category=normalise_category(row["category"], where), difficulty=parse_difficulty(row.get("difficulty"), where),
        format=fmt, source=text_field(row, "source", where, required=False), question_text=question.strip(),
    )


# ------------------------------------------------------------------ data_sft.jsonl / data_rl.jsonl
def read_sft(path: str | Path, on_error: str = "raise") -> ReadResult:
    """Read ``data_sft.jsonl``: each line a JSON list of video/text/meta specs, in any order.

    ``question`` = the ``output: false`` texts joined by newlines; ``response`` = the last
    ``output: true`` text; ``answer`` = the letter inside its ``<answer>`` tag when that is a single
    letter (checked against the options), else ``""``. ``format`` is ``"mcq"`` when options
    (``A) ...``/``A. ...`` lines) are found in the user text. uid ``"<stem>:<line>"``.

    Raises:
        GraspFormatError: see :func:`read_rl`.
    """
    return read_lines(path, on_error, lambda row, where, n: _spec_row(row, where, f"{Path(path).stem}:{n}", rl=False))


def read_rl(path: str | Path, on_error: str = "raise") -> ReadResult:
    """Read ``data_rl.jsonl``: like :func:`read_sft`, with ``answer`` = the target letter (required,
    one of the option letters), ``response=None``, ``events`` from ``meta.gt_events``.

    Raises:
        GraspFormatError: (``on_error="raise"``) malformed JSON, a line that is not a list of specs,
            no or several video specs, no ``output: true`` target, bad meta (difficulty, events,
            category), an answer not among the options; always when ``path`` does not exist.
    """
    return read_lines(path, on_error, lambda row, where, n: _spec_row(row, where, f"{Path(path).stem}:{n}", rl=True))


def _spec_row(row: Any, where: str, uid: str, rl: bool) -> GraspItem:
    if not isinstance(row, list) or not all(isinstance(s, dict) for s in row):
        raise GraspFormatError(where, "expected a JSON list of spec objects")
    videos = [s for s in row if s.get("type") == "video"]
    if len(videos) != 1:
        raise GraspFormatError(where, f"expected exactly one video spec, found {len(videos)}")
    texts = [(text_field(s, "content", where), _is_output(s)) for s in row if s.get("type") == "text"]
    prompt = [text for text, output in texts if not output]
    targets = [text for text, output in texts if output]
    if not targets:
        raise GraspFormatError(where, "missing target: no text spec with output: true")
    meta: dict = {}
    for s in row:
        if s.get("type") == "meta":
            meta.update(s)
    question = "\n".join(prompt)
    options = options_from_text(question)
    target = targets[-1]
    if not rl and not target.strip():
        raise GraspFormatError(where, "SFT needs an assistant target (an `output: true` text or `response`), "
                                      "this row's is empty")
    if rl:
        answer, response = check_mcq_answer(target, options, where), None
    else:
        tag = _ANSWER_TAG_RE.search(target)
        letter = answer_letter(tag.group(1)) if tag else None
        answer = check_mcq_answer(letter, options, where) if (letter and options) else (letter or "")
        response = target
    category = meta.get("category")
    return GraspItem(
        uid=uid, origin=where, clip=_clip_ref(videos[0], where), question=question, options=options,
        answer=answer, response=response,
        category=normalise_category(category, where) if category is not None else None,
        difficulty=parse_difficulty(meta.get("difficulty"), where), format="mcq" if options else "open_ended",
        source=_source_of(videos[0].get("path")), events=parse_events(meta.get("gt_events"), where),
        question_text=text_field(meta, "question_text", where, required=False),
    )


def _is_output(spec: dict) -> bool:
    """``output: true`` (JSON true or the string "true") marks the assistant turn."""
    value = spec.get("output", False)
    return value is True or str(value).strip().lower() == "true"


def _clip_ref(spec: dict, where: str) -> ClipRef:
    res = spec.get("src_resolution")
    if res is not None and not (isinstance(res, list) and len(res) == 2 and all(isinstance(v, int) for v in res)):
        raise GraspFormatError(where, f"'src_resolution' must be [height, width], got {res!r}")
    return ClipRef(path=text_field(spec, "path", where), fps=_float(spec, "fps", where, 2.0),
                   start_seconds=_float(spec, "start_seconds", where, None),
                   end_seconds=_float(spec, "end_seconds", where, None),
                   src_resolution=tuple(res) if res is not None else None)


def options_from_text(text: str) -> tuple[str, ...]:
    """The first run of option lines ``A) ...``/``A. ...``, ``B) ...``, ... in ``text`` (blank lines
    between them allowed); ``()`` when there is none."""
    options: list[str] = []
    for line in text.splitlines():
        m = _OPTION_RE.match(line)
        if m and m.group(1) == chr(65 + len(options)):
            options.append(line.strip())
        elif options and line.strip():
            break
    return tuple(options)


def question_only(item: GraspItem) -> str:
    """The item's question without options: its ``question_text`` when non-empty, else its user text
    up to the first option line (a data_sft/data_rl row whose meta gives no ``question_text``)."""
    return item.question_text or _bare_question(item.question)


def _bare_question(text: str) -> str:
    """The user text before its first option line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _OPTION_RE.match(line)
        if m and m.group(1) == "A":
            lines = lines[:i]
            break
    return "\n".join(lines).strip()


def _source_of(video_path: Any) -> str | None:
    """``"social_gesture"`` for ``"social_gesture/video/x.mp4"``; ``None`` for other layouts."""
    parts = str(video_path or "").split("/")
    return parts[0] if len(parts) >= 3 and parts[-2] == "video" else None


# ------------------------------------------------------------------ GRASP-Bench
def read_bench(path: str | Path, on_error: str = "raise", *, cache_dir: str | Path | None = None) -> ReadResult:
    """Read GRASP-Bench from a folder (``json/*.json`` + ``video/*.mp4``, maybe one folder down) or
    from ``grasp_bench.tar`` (members ``json/<clip>.json``, ``video/<clip>.mp4``, maybe under one
    top-level folder), joining JSON and video by clip stem (stems may contain dots).

    Items: ``uid`` = clip stem, ``origin`` = ``"<archive>:<member>"`` (or the JSON file path),
    ``clip.path`` = ``"video/<stem>.mp4"`` relative to the bench root: open it with
    :func:`bench_store`. Category C1-C4 becomes J1-J4; ``events`` kept when the JSON carries
    ``events`` (``source_event_ids`` alone gives no events); ``time_range`` kept.

    Raises:
        GraspFormatError: no bench layout at ``path`` (always); per item (``on_error="raise"``):
            malformed JSON, missing ``qa``/category/format/question/answer, unknown category,
            an MCQ answer not among the options.
        ClipNotFoundError: (per item) no ``video/<stem>.mp4`` for a ``json/<stem>.json``.
        ArchiveError: the bench tar is corrupt or truncated (always).
    """
    store, jsons = _bench_layout(path, cache_dir)
    tar = store.root if store.root.is_file() else None
    col = Collector(on_error)
    stems = set()
    for member in jsons:
        stem = member[len("json/"):-len(".json")]
        stems.add(stem)
        where = f"{tar}:{store.prefix}{member}" if tar else str(store.root / store.prefix / member)
        try:
            try:
                row = json.loads(store.open(member).decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise GraspFormatError(where, f"malformed JSON ({e})") from None
            clip_path = f"video/{stem}.mp4"
            if clip_path not in store:
                raise ClipNotFoundError(where, f"no video {store.prefix}{clip_path} for this item")
            col.result.items.append(_bench_item(row, where, stem, clip_path))
        except GraspDataError as e:
            col.fail(e)
    orphans = [v for v in _bench_videos(store) if v not in stems]
    if orphans:
        log.warning("%s: %d videos have no json/<clip>.json and are not items, e.g. %s", path, len(orphans), orphans[0])
    return col.result


def bench_store(path: str | Path, cache_dir: str | Path | None = None) -> ClipStore:
    """The :class:`ClipStore` that opens the ``clip.path`` of :func:`read_bench` items."""
    return _bench_layout(path, cache_dir)[0]


def _bench_layout(path: str | Path, cache_dir: str | Path | None) -> tuple[ClipStore, list[str]]:
    """(store with the bench root as prefix, JSON members relative to the bench root)."""
    p = Path(path)
    if p.is_dir():
        for sub in [p, *sorted(d for d in p.iterdir() if d.is_dir())]:
            jsons = sorted((sub / "json").glob("*.json"))
            if jsons:
                prefix = "" if sub == p else f"{sub.name}/"
                return ClipStore(p, cache_dir=cache_dir, prefix=prefix), [f"json/{j.name}" for j in jsons]
        tars = [p / "grasp_bench.tar"] if (p / "grasp_bench.tar").is_file() else sorted(p.glob("*.tar"))
        if len(tars) != 1:
            raise GraspFormatError(str(path), "no json/*.json folder and not exactly one bench tar")
        p = tars[0]
    if not p.is_file():
        raise GraspFormatError(str(path), "no such bench file or folder")
    store = ClipStore(p, cache_dir=cache_dir)
    by_prefix: dict[str, list[str]] = {}
    for m in store.members:
        head, _, name = m.rpartition("json/")
        if name.endswith(".json") and "/" not in name and (head == "" or head.endswith("/")) and head.count("/") <= 1:
            by_prefix.setdefault(head, []).append(f"json/{name}")
    if len(by_prefix) != 1:
        raise GraspFormatError(str(p), f"expected json/<clip>.json members under one root, found roots {sorted(by_prefix)}")
    store.prefix, jsons = next(iter(by_prefix.items()))
    return store, jsons


def _bench_videos(store: ClipStore) -> list[str]:
    """Stems of the ``video/*.mp4`` of the bench (tar members and extracted files)."""
    head = f"{store.prefix}video/"
    names = [m[len(head):] for m in store.members if m.startswith(head)]
    if store.root.is_dir():
        names += [f.name for f in (store.root / store.prefix / "video").glob("*.mp4")]
    return sorted({n[:-4] for n in names if n.endswith(".mp4") and "/" not in n})


def _bench_item(row: Any, where: str, stem: str, clip_path: str) -> GraspItem:
    if not isinstance(row, dict) or not isinstance(row.get("qa"), dict):
        raise GraspFormatError(where, "missing key 'qa' (expected an object with a 'qa' object)")
    qa = row["qa"]
    for key in ("category", "format", "question", "answer"):
        require(qa, key, where)
    fmt = parse_format(qa["format"], where)
    question = text_field(qa, "question", where)
    options = parse_options(qa.get("options"), where)
    answer = str(qa["answer"]).strip()
    if fmt == "mcq":
        answer = check_mcq_answer(answer, options, where)
    tr = qa.get("time_range")
    if tr is not None and not (isinstance(tr, list) and len(tr) == 2 and all(isinstance(v, (int, float)) for v in tr)):
        raise GraspFormatError(where, f"'time_range' must be [start, end] seconds, got {tr!r}")
    return GraspItem(
        uid=stem, origin=where, clip=ClipRef(path=clip_path), question=user_text(question, options), options=options,
        answer=answer, category=normalise_category(qa["category"], where),
        difficulty=parse_difficulty(qa.get("difficulty"), where), format=fmt,
        source=text_field(qa, "dataset", where, required=False),
        events=parse_events(qa.get("events", row.get("events")), where), question_text=question.strip(),
        reasoning=text_field(qa, "reasoning", where, required=False),
        time_range=(float(tr[0]), float(tr[1])) if tr is not None else None,
    )
