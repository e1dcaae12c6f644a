"""The generic QA format: JSONL rows asking a question about a local video and/or image.

One JSON object per line (``docs/data-format.md``, "Your own data: the generic QA format"):

- ``id`` (optional; default ``"<file stem>:<line>"``);
- ``video`` and/or ``image``: a local path, relative to the JSONL file's folder or absolute; at
  least one is given and non-empty. ``http(s)://`` and other URLs are refused: nothing is downloaded
  at run time;
- ``question`` (required text); ``options`` (optional list of strings, lettered ``A)``, ``B)``, ...
  by position unless they all carry letters); ``answer`` (optional: an option letter when there are
  options, else a reference text); ``response`` (optional SFT target);
- ``participants`` (optional list of 0-based person ids: the ground truth of the Social Grounding
  Reward, :attr:`GraspItem.participants <grasp_lightning.data.records.GraspItem.participants>`);
- ``events`` (optional list of ``{"source": "gaze" | any gesture, "persons": [ids], "start_seconds":
  s, "end_seconds": s}``, the times optional, in seconds from the clip start): ground-truth social
  events as in ``data_rl.jsonl`` (:func:`~grasp_lightning.data.formats.parse_events`), so the
  by-modality, released-code and temporal grounding rewards score the row; their people are part of
  the participants too;
- ``category``, ``difficulty``, ``source`` (optional; a GRASP code such as ``T1`` or ``C2`` is
  normalised, any other category kept as written); ``start``/``end`` (optional seconds of the video);
- any other column is kept as written on the item's ``extra`` (a dict), which rewards receive.

Chosen for files named ``qa.jsonl`` / ``qa.<split>.jsonl`` (:mod:`grasp_lightning.data.readers`). Rows
become :class:`~grasp_lightning.data.records.GraspItem` records like every other reader's:
``clip`` (``None`` for an image-only row), ``image`` and ``persons``. Paths are resolved when read,
and a missing file is a :class:`~grasp_lightning.errors.ClipNotFoundError` naming ``file:line``
(counted and skipped with ``on_error="skip"``, like a bad line). An unreadable image is found when
the item is encoded (:func:`decode_image`), as an undecodable clip is.
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from grasp_lightning.data.formats import (
    ReadResult,
    SkipRecord,
    check_mcq_answer,
    parse_difficulty,
    parse_events,
    parse_options,
    read_lines,
    text_field,
    user_text,
)
from grasp_lightning.data.records import CATEGORIES, ClipRef, GraspItem, normalise_category
from grasp_lightning.errors import ClipDecodeError, ClipNotFoundError, GraspFormatError

log = logging.getLogger(__name__)

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: The columns the generic QA format reads; any other column goes to ``GraspItem.extra``.
QA_COLUMNS = frozenset({"id", "video", "image", "question", "options", "answer", "response", "participants",
                        "events", "category", "difficulty", "source", "start", "end"})


def read_qa(path: str | Path, on_error: str = "raise") -> ReadResult:
    """Read a generic QA JSONL file (the fields in the module docstring) into items.

    ``origin`` is ``"<path>:<line>"``; media paths are resolved against ``path``'s folder.

    Raises:
        GraspFormatError: (``on_error="raise"``) malformed JSON, not an object, no ``question``,
            neither ``video`` nor ``image``, a URL, bad ``options``/``answer``/``participants``/
            ``events``/``start``/``end``; always when ``path`` does not exist.
        ClipNotFoundError: (``on_error="raise"``) a ``video`` or ``image`` file that does not exist.

    An ``id`` given twice is an error at its second line (``on_error="skip"``: that line is skipped).
    """
    base = Path(path).parent
    stem = Path(path).name.split(".")[0]
    result = read_lines(path, on_error, lambda row, where, n: parse_qa_row(row, where, base, f"{stem}:{n}"))
    first: dict[str, str] = {}
    kept = []
    for item in result.items:  # an id names one question: predict's resume and the reports key on it
        if item.uid in first:
            err = GraspFormatError(item.origin, f"id {item.uid!r} is already the id of {first[item.uid]}")
            if on_error == "raise":
                raise err
            log.warning("skipping %s: %s", err.where, err.reason)
            result.skipped.append(SkipRecord(err.where, err.reason, item.uid))
            continue
        first[item.uid] = item.origin
        kept.append(item)
    result.items = kept
    return result


def parse_qa_row(row: Any, where: str, base: Path, default_id: str) -> GraspItem:
    """One generic QA row -> a :class:`GraspItem` (also used by the ``QASuite`` evaluation suite).

    Args:
        row: the parsed JSON value.
        where: ``"<file>:<line>"`` for errors and ``origin``.
        base: folder relative media paths are resolved against.
        default_id: ``uid`` when the row has no ``id``.

    Raises:
        GraspFormatError, ClipNotFoundError: see :func:`read_qa`.
    """
    if not isinstance(row, dict):
        raise GraspFormatError(where, f"expected a JSON object, got {type(row).__name__}")
    video = _media_path(row, "video", where, base)
    image = _media_path(row, "image", where, base)
    if video is None and image is None:
        raise GraspFormatError(where, "neither 'video' nor 'image' is given: a row needs at least one")
    question = text_field(row, "question", where)
    if not question.strip():
        raise GraspFormatError(where, "'question' is empty")
    options = parse_options(row.get("options"), where)
    answer = row.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise GraspFormatError(where, f"'answer' must be a string, got {type(answer).__name__}")
    answer = (answer or "").strip()
    if options and answer:
        answer = check_mcq_answer(answer, options, where)
    start, end = _seconds(row, "start", where), _seconds(row, "end", where)
    if (start is not None or end is not None) and video is None:
        raise GraspFormatError(where, "'start'/'end' are seconds of the video, but the row has no 'video'")
    if start is not None and end is not None and end <= start:
        raise GraspFormatError(where, f"'end' ({end:g} s) must be after 'start' ({start:g} s)")
    uid = row.get("id")
    return GraspItem(
        uid=str(uid) if uid is not None and str(uid).strip() else default_id, origin=where,
        clip=ClipRef(path=video, start_seconds=start, end_seconds=end) if video is not None else None,
        image=image, question=user_text(question, options), options=options, answer=answer,
        response=text_field(row, "response", where, required=False), category=_category(row.get("category"), where),
        difficulty=parse_difficulty(row.get("difficulty"), where), format="mcq" if options else "open_ended",
        source=text_field(row, "source", where, required=False), question_text=question.strip(),
        persons=_participants(row.get("participants"), where), events=parse_events(row.get("events"), where),
        extra={key: value for key, value in row.items() if key not in QA_COLUMNS},
    )


def _media_path(row: dict, key: str, where: str, base: Path) -> str | None:
    """The resolved path of ``row[key]`` (``None`` when absent or empty).

    Raises:
        GraspFormatError: not a string, or a URL.
        ClipNotFoundError: no such file.
    """
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise GraspFormatError(where, f"{key!r} must be a path (a string), got {type(value).__name__}")
    value = value.strip()
    if _URL_RE.match(value):
        raise GraspFormatError(where, f"{key!r} is a URL ({value}); nothing is downloaded at run time: download "
                                      f"the file and give its local path (relative to the JSONL's folder)")
    p = Path(value)
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise ClipNotFoundError(where, f"{key} file {value} not found (looked for {p})")
    return str(p.resolve())


def _seconds(row: dict, key: str, where: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GraspFormatError(where, f"{key!r} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _category(value: Any, where: str) -> str | None:
    """A GRASP code (``T1``..``J4``, ``C1``..``C4``) normalised; any other text kept (stripped)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise GraspFormatError(where, f"'category' must be a non-empty string, got {value!r}")
    if value.strip().upper() in (*CATEGORIES, "C1", "C2", "C3", "C4"):
        return normalise_category(value, where)
    return value.strip()


def _participants(value: Any, where: str) -> tuple[int, ...]:
    """``[0, 2]`` -> ``(0, 2)``: non-negative integer person ids (``Person N`` ids are 0-based)."""
    if value is None:
        return ()
    ok = isinstance(value, list) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in value)
    if not ok:
        raise GraspFormatError(where, f"'participants' must be a list of person ids (integers >= 0), got {value!r}")
    return tuple(value)


# ---------------------------------------------------------------------- opening and decoding
def open_media(store, path: str, where: str) -> bytes:
    """The bytes of a clip or image: an absolute path (generic QA rows) read from disk, a relative
    one through ``store`` (the GRASP shards and folders).

    Raises:
        ClipNotFoundError: no such file (naming ``where``), or ``store.open``'s error.
    """
    p = Path(path)
    if p.is_absolute():
        if not p.is_file():
            raise ClipNotFoundError(where, f"file {path} not found")
        return p.read_bytes()
    return store.open(path)


def media_present(store, path: str) -> bool:
    """Whether :func:`open_media` would find ``path`` (``store`` may be ``None``: only absolute paths then)."""
    p = Path(path)
    if p.is_absolute():
        return p.is_file()
    return store is not None and path in store


def decode_image(data: bytes, where: str) -> np.ndarray:
    """Decode an image file's bytes with PIL into ``(H, W, 3)`` uint8 RGB.

    The pixel cap is applied by the processor (``data.video.max_image_pixels``,
    :func:`~grasp_lightning.data.prompts.encode_example`), which resizes to its patch grid anyway.

    Raises:
        ClipDecodeError: the bytes are not an image PIL can read (names ``where``).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.array(img.convert("RGB"))  # a writable copy (torch.from_numpy in the processor)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        reason = str(err).replace(repr(getattr(err, "filename", None) or ""), "").split(" <_io.")[0]
        raise ClipDecodeError(where, f"unreadable image ({type(err).__name__}: {reason})") from None


class LocalFiles:
    """The store of items whose media paths are all absolute (generic QA rows): no shard index is
    built, and a relative path is not found. Picklable (DataLoader workers receive it)."""

    def __contains__(self, path: str) -> bool:
        return Path(path).is_absolute() and Path(path).is_file()

    def open(self, path: str) -> bytes:
        """The file's bytes.

        Raises:
            ClipNotFoundError: ``path`` is relative or no such file.
        """
        return open_media(self, path, path) if Path(path).is_absolute() else self._missing(path)

    @staticmethod
    def _missing(path: str) -> bytes:
        raise ClipNotFoundError(path, "relative clip path, but the rows were read as generic QA (absolute paths)")


def store_for(items, videos: Path):
    """Where ``items``' media are opened: :class:`LocalFiles` when every path is absolute (generic QA
    rows, which need no ``data.source.videos`` folder), else a :class:`~grasp_lightning.data.shards.ClipStore`
    over ``videos``.

    Raises:
        GraspDataError: a relative path, and ``videos`` does not exist (as ``ClipStore``).
    """
    from grasp_lightning.data.shards import ClipStore

    paths = [p for item in items for p in (item.clip.path if item.clip is not None else None, item.image) if p]
    if all(Path(p).is_absolute() for p in paths):  # (no items at all: nothing to open either)
        return LocalFiles()
    return ClipStore(videos)
