"""``python -m grasp_lightning check-data``: find everything wrong with a GRASP dataset before training.

Checks, over every GRASP file present under ``data.source.root`` (``train/data_sft.jsonl``,
``train/data_rl.jsonl``, ``train/annotations.jsonl``, ``test/annotations.jsonl`` and the bench), or
only those named with ``--files``:

- every tar shard is whole, and has no member with an absolute path, a ``..`` component, a link or
  another non-regular type (such members are never read; each is listed);
- every JSONL line parses and follows the schema; every MCQ answer is one of its option letters
  (the readers of :mod:`grasp_lightning.data.formats`, with ``on_error="skip"``);
- every RL row has ground-truth participants (``meta.gt_events`` naming at least one person);
- every generic QA row of a GRPO run's ``data.source.train_file`` has an ``answer``;
- ``data.source.train_file`` (as ``GraspDataModule`` resolves it) exists and is a GRASP training file or a
  generic QA file (``qa.jsonl``: video and/or image rows, :mod:`grasp_lightning.data.qa`; its images
  are decoded and encoded like its clips, with ``max_image_pixels``);
- every clip window ends within its clip (``end_seconds`` at most 0.5 s past the clip's end);
- warnings only (exit status unchanged): RL events with an unknown source or persons the question
  and options never name;
- every referenced clip exists and decodes at the configured fps within ``max_frames`` and
  ``max_pixels``, and the prompt (video tokens included) and SFT target fit ``max_prompt_tokens``
  and ``max_target_tokens`` -- exactly the decoding and encoding training does: the DataModule's
  own dataset (``GraspDataModule._dataset``) encodes each item (``GraspDataset.encode``).

It prints per file its rows, its bad rows (a row with several problems counted once, the rows no
reader could parse among them) and its problems, and its rows by source, category, difficulty and
format, each adding up to the rows (the unparsed ones under ``unreadable``), then every problem as
``file:line: reason``, and exits with status 1 when anything is bad (0 otherwise). Decoding runs
in a process pool over all CPU cores (``--workers``), with a progress bar on stderr; workers are
replaced every 256 clips so native decoder memory cannot accumulate.

The run's configuration is read as ``fit`` reads it (:func:`grasp_lightning.commands.config.load_run`):
the same ``--config`` files and overrides (``--config configs/sft.yaml --config configs/demo.yaml
--data.source.root /data/GRASP``); the DataModule it instantiates does the checking, with the processor of
``model.policy.name_or_path`` and the task's batch kind (an SFT task encodes the train file's targets).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grasp_lightning.data.formats import bench_store, event_warnings, read_bench
from grasp_lightning.data.qa import media_present
from grasp_lightning.data.readers import READERS
from grasp_lightning.data.records import GraspItem
from grasp_lightning.data.shards import ClipStore, clean_member_path, scan_shard
from grasp_lightning.errors import ClipNotFoundError, GraspConfigError, GraspDataError

if TYPE_CHECKING:
    from grasp_lightning.datamodule import GraspDataModule

log = logging.getLogger(__name__)

#: Known files: path relative to the root -> (reader kind, which clip store resolves its clips).
KNOWN_FILES = {
    "train/data_sft.jsonl": ("sft", "videos"),
    "train/data_rl.jsonl": ("rl", "videos"),
    "train/annotations.jsonl": ("annotations", "videos"),
    "test/annotations.jsonl": ("annotations", "bench"),
}
_KINDS = {"data_sft": "sft", "data_rl": "rl", "annotations": "annotations", "qa": "qa"}  # file stem -> kind
_READERS = {kind: READERS[stem] for stem, kind in _KINDS.items()}  # data/readers.py: one reader per file
RECYCLE_AFTER = 256  # clips per worker process before it is replaced (native decoder memory)
_CHUNK = 4  # clips per job sent to a worker


@dataclass(frozen=True)
class Problem:
    """One bad thing: ``where`` (``file:line``, ``shard:member`` or a folder), ``reason``, the item id."""

    where: str
    reason: str
    uid: str = ""
    check: str = ""


# ---------------------------------------------------------------------- clip stores
class ShardSet:
    """Clip lookup over an extracted folder and the shards that scanned cleanly (last shard wins),
    used when a corrupt shard makes :class:`ClipStore` of the whole folder impossible."""

    def __init__(self, folder: Path, shards: list[Path], cache_dir: str) -> None:
        self.folder = folder
        self.stores = [ClipStore(s, cache_dir=cache_dir) for s in shards]

    def __contains__(self, path: str) -> bool:
        key = clean_member_path(path)
        return key is not None and ((self.folder / key).is_file() or any(path in s for s in self.stores))

    def open(self, path: str) -> bytes:
        """The clip's bytes: the extracted file if present, else the last clean shard that holds it.

        Raises:
            ClipNotFoundError: in neither (as :meth:`ClipStore.open`).
        """
        key = clean_member_path(path)
        if key is not None and (self.folder / key).is_file():
            return (self.folder / key).read_bytes()
        for store in reversed(self.stores):
            if path in store:
                return store.open(path)
        raise ClipNotFoundError(path, f"clip not found under {self.folder}")


def _videos_store(folder: Path, good_shards: list[Path], cache_dir: str, problems: list[Problem]):
    if not folder.exists():
        problems.append(Problem(str(folder), "videos folder does not exist", check="archive"))
        return None
    try:
        return ClipStore(folder)
    except GraspDataError:  # a corrupt shard (already listed by the scan): use the good ones
        return ShardSet(folder, good_shards, cache_dir)


# ---------------------------------------------------------------------- worker side
_STATE: dict = {}


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


#: An end_seconds this far past the clip's real end is reported (decoders' durations differ by a frame).
END_TOLERANCE_S = 0.5


def clip_duration(data: bytes) -> float | None:
    """The clip's duration in seconds from its container header (``None`` when it does not say)."""
    import io

    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            if stream.frames and stream.average_rate:
                return float(stream.frames / stream.average_rate)
            if container.duration:
                return container.duration / 1e6
    except av.FFmpegError:
        return None  # the decode below reports it
    return None


def window_problem(item: GraspItem, duration: float | None) -> str | None:
    """The reason an item's ``end_seconds`` lies past its clip's end (training samples only up to the
    end), or ``None``."""
    end = item.clip.end_seconds if item.clip is not None else None
    if duration is None or end is None or end <= duration + END_TOLERANCE_S:
        return None
    return f"end_seconds {end:g} is beyond the clip's duration of {duration:.2f} s ({item.clip.path})"


def _check_item(job: tuple[int, str, bool, GraspItem]) -> tuple[int, Problem | None]:
    """Decode one item's clip and encode its prompt (and target) with the dataset the DataModule builds
    for training (``GraspDataModule._dataset``, ``GraspDataset.encode``), then check its time window
    against the clip's duration."""
    index, store_name, with_target, item = job
    data: GraspDataModule = _STATE["data"]
    store = _STATE["stores"].get(store_name)
    try:
        if not all(media_present(store, path) for path in _media(item)):
            return index, _missing(item, data.root, store)
        data.dataset([item], store, with_target).encode(item)
        reason = window_problem(item, clip_duration(_open(store, item.clip.path))) if item.clip is not None else None
        if reason:
            return index, Problem(item.origin, reason, item.uid, "window")
    except GraspDataError as err:
        return index, Problem(item.origin, err.reason, item.uid, type(err).__name__)
    except Exception as err:  # noqa: BLE001 - any failure here would also stop training: report it
        return index, Problem(item.origin, f"unexpected {type(err).__name__}: {err}", item.uid, "unexpected")
    return index, None


def _media(item: GraspItem) -> list[str]:
    """The clip and image paths of an item (generic QA rows may have an image, or no clip)."""
    return [p for p in ((item.clip.path if item.clip is not None else None), item.image) if p is not None]


def _open(store, path: str) -> bytes:
    return Path(path).read_bytes() if Path(path).is_absolute() else store.open(path)


def _missing(item: GraspItem, root: Path, store=None) -> Problem:
    path = next((p for p in _media(item) if not media_present(store, p)), _media(item)[0])
    what = "image" if path == item.image else "clip"
    where = "" if Path(path).is_absolute() else f" under {root}"
    return Problem(item.origin, f"{what} {path} not found{where}", item.uid, "ClipNotFoundError")


def _scan(shard: Path) -> list[Problem]:
    try:
        _, left_out = scan_shard(shard)
    except GraspDataError as err:
        return [Problem(err.where, err.reason, check="archive")]
    return [Problem(f"{shard}:{name}", f"unsafe tar member ({why}); never read", check="archive")
            for name, why in left_out]


# ---------------------------------------------------------------------- the check
def _map(func, jobs: list, workers: int, progress: str | None = None, ordered: bool = True):
    """``func`` over ``jobs`` in a fresh pool of forked workers (which inherit ``_STATE``), or in this
    process when ``workers`` is 0; results in job order unless ``ordered`` is False."""
    if workers == 0 or len(jobs) <= 1:
        yield from _progress(map(func, jobs), len(jobs), progress)
        return
    ctx = multiprocessing.get_context("fork")
    chunk = 1 if ordered else _CHUNK
    with ctx.Pool(min(workers, len(jobs)), initializer=_init_worker,
                  maxtasksperchild=max(1, RECYCLE_AFTER // chunk)) as pool:
        results = pool.imap(func, jobs) if ordered else pool.imap_unordered(func, jobs, chunksize=chunk)
        yield from _progress(results, len(jobs), progress)


def _progress(iterable, total: int, desc: str | None):
    if desc is None:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="item", file=sys.stderr, dynamic_ncols=True)


#: The bucket of the per-key counts that holds the rows no reader could turn into an item.
UNREADABLE = "unreadable"


def _counts(items: list[GraspItem], unreadable: int) -> dict:
    """A file's counts: ``rows`` (every line or member read, ``unreadable`` of them failing the schema),
    and per key (source, category, difficulty, format) the rows by value, the unreadable ones under
    :data:`UNREADABLE`, so every breakdown adds up to ``rows``."""
    out: dict = {"rows": len(items) + unreadable, "unreadable": unreadable}
    for key in ("source", "category", "difficulty", "format"):
        counts = Counter(str(getattr(i, key)) for i in items)
        out[key] = {**dict(sorted(counts.items())), **({UNREADABLE: unreadable} if unreadable else {})}
    return out


def _row_of(problem: Problem) -> str:
    """The row a problem is about: its ``where`` without the clip named in parentheses."""
    return problem.where.split(" (")[0]


def _in_file(where: str, path: str) -> bool:
    """True when ``where`` (``file:line``, ``archive:member`` or a bench folder's JSON file) lies in ``path``."""
    return where == path or (where.startswith(path) and where[len(path)] in ":/")


def run_check(data: GraspDataModule, files: list[str] | None = None, workers: int | None = None, decode: bool = True,
              progress: bool = True) -> dict:
    """Run every check and return the report ``{"root", "files": {name: {"rows", "unreadable", "bad",
    "problems", "warnings", counts}}, "problems": [Problem as dict], "ok"}`` (see the module docstring for
    the checks). Per file: ``rows`` every line (bench: item), ``unreadable`` those no reader could parse,
    ``bad`` the rows with at least one problem (a row is counted once however many it has), ``problems``
    its problems, and per key (source, category, difficulty, format) the rows by value, the unreadable ones
    under ``"unreadable"``, so each adds up to ``rows``.

    Args:
        data: the run's DataModule (``load_run``): its settings (``source``: root, train_file, videos,
            bench; ``video``, ``prompt``: fps, budgets, prompts), its batch kind (``data_mode``: ``"sft"`` encodes the train file's
            targets) and its processor.
        files: files relative to the root to check (default: every known file present, and the bench).
        workers: processes for decoding and archive scans (default: all CPU cores; 0: this process).
        decode: decode every clip and check the token budgets (False: formats, archives and
            clip presence only).
        progress: show a progress bar on stderr.
    """
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    h, root = data.source, data.root
    problems: list[Problem] = []
    warnings: list[Problem] = []
    wanted = [f for f in files if f != h.bench] if files is not None else \
        [f for f in KNOWN_FILES if (root / f).is_file()]
    if files is None and h.train_file is not None:  # the file the run reads, as GraspDataModule resolves it
        wanted = [f for f in wanted if root / f != root / h.train_file] + [h.train_file]
    check_bench = h.bench is not None and (files is None or h.bench in files)
    shards = sorted(p for p in (root / h.videos).rglob("*.tar") if p.is_file()) if (root / h.videos).is_dir() \
        else []
    bench_path = root / h.bench if h.bench else None
    bench_tars = [bench_path] if bench_path is not None and bench_path.is_file() else []
    bad_shards = _scan_archives(shards + bench_tars, workers, problems)
    with tempfile.TemporaryDirectory(prefix="grasp_check_") as cache_dir:
        qa_only = bool(wanted) and all(_file_kind(f, root / f == root / (h.train_file or ""))[0] == "qa" for f in wanted)
        stores = {"videos": _videos_store(root / h.videos, [x for x in shards if x not in bad_shards],
                                          cache_dir, [] if qa_only else problems)}
        report_files: dict[str, dict] = {}
        jobs: list[tuple[int, str, bool, GraspItem]] = []
        for rel in wanted:
            is_train = h.train_file is not None and root / rel == root / h.train_file
            kind, store_name = _file_kind(rel, is_train)
            problem = _file_problem(root, rel, kind, is_train)
            if problem is not None:
                problems.append(problem)
                continue
            if store_name == "bench" and "bench" not in stores:
                stores["bench"] = _bench_store(bench_path, bad_shards, problems)
            report_files[rel] = _read_rows(data, rel, kind, store_name, is_train, jobs, problems, warnings)
        if check_bench:
            if "bench" not in stores:
                stores["bench"] = _bench_store(bench_path, bad_shards, problems)
            counts = _read_bench_items(bench_path, bad_shards, jobs, problems)
            if counts is not None:
                report_files[h.bench] = counts
        if decode and jobs:
            problems.extend(_decode_all(data, stores, jobs, workers, progress))
        else:
            problems.extend(_missing(it, root, stores.get(name)) for _, name, _, it in jobs
                            if not all(media_present(stores.get(name), path) for path in _media(it)))
    for name, info in report_files.items():  # a row with two problems is one bad row; archive members are no rows
        path = str(root / name)
        mine = [p for p in problems if _in_file(_row_of(p), path)]
        info["bad"] = len({_row_of(p) for p in mine if p.check != "archive"})
        info["problems"] = len(mine)
        info["warnings"] = sum(1 for p in warnings if _in_file(_row_of(p), path))
    problems.sort(key=lambda p: _sort_key(p.where.split(" (")[0]))
    warnings.sort(key=lambda p: _sort_key(p.where))
    return {"root": str(root), "files": report_files, "problems": [asdict(p) for p in problems],
            "warnings": [asdict(p) for p in warnings], "ok": not problems}


def _scan_archives(tars: list[Path], workers: int, problems: list[Problem]) -> set:
    """Scan every tar (in ``workers`` processes) into ``problems``; the tars that are not whole (a
    problem other than an unsafe member), so no clip is read from them."""
    bad = set()
    for tar, found in zip(tars, _map(_scan, tars, workers)):
        problems.extend(found)
        if any(not p.reason.startswith("unsafe") for p in found):
            bad.add(tar)
    return bad


def _file_kind(rel: str, is_train: bool) -> tuple[str | None, str]:
    """``(kind, store)`` of a file: the run's train file by its name, as GraspDataModule reads it;
    another by its place in the GRASP layout (:data:`KNOWN_FILES`), else by its name."""
    by_name = _KINDS.get(Path(rel).name.split(".")[0])
    if is_train:
        return by_name, "videos"
    return KNOWN_FILES.get(rel, (by_name, "videos"))


def _file_problem(root: Path, rel: str, kind: str | None, is_train: bool) -> Problem | None:
    """Why the file cannot be read at all (not a GRASP file, or missing), else ``None``."""
    what = "data.source.train_file " if is_train else ""
    if kind is None:
        return Problem(str(root / rel), f"{what}not a GRASP file (expected data_sft.jsonl, data_rl.jsonl, "
                                        "annotations.jsonl, qa.jsonl or the bench)", check="file")
    if not (root / rel).is_file():
        return Problem(str(root / rel), "data.source.train_file: no such file" if is_train else "no such file", check="file")
    return None


def _read_rows(data: GraspDataModule, rel: str, kind: str, store_name: str, is_train: bool, jobs: list,
               problems: list[Problem], warnings: list[Problem]) -> dict:
    """Read one GRASP file with the reader fit uses, record its format, participant and event problems,
    queue its items for decoding (``jobs``) and return its counts for the report."""
    result = _READERS[kind](data.root / rel, on_error="skip")
    problems.extend(Problem(k.where, k.reason, k.uid, "format") for k in result.skipped)
    for item in result.items:
        if kind == "rl" and not item.participants:
            problems.append(Problem(item.origin, "RL row has no ground-truth participants "
                                                 "(meta.gt_events is missing or names nobody)", item.uid,
                                    "participants"))
        if kind == "rl":
            warnings.extend(Problem(item.origin, w, item.uid, "events") for w in event_warnings(item))
        if kind == "qa" and is_train and data.data_mode == "rl" and not item.answer:
            problems.append(Problem(item.origin, "GRPO needs an 'answer' (the accuracy reward's target); this "
                                                 "generic QA row has none", item.uid, "answer"))
        with_target = (data.data_mode == "sft") if is_train else (kind == "sft" or (kind in ("annotations", "qa")
                                                                                and bool(item.response)))
        jobs.append((len(jobs), store_name, with_target, item))
    return _counts(result.items, len(result.skipped))


def _read_bench_items(bench_path: Path | None, bad_shards: set, jobs: list, problems: list[Problem]) -> dict | None:
    """Read GRASP-Bench, queue its items for decoding and return its counts (``None``: not read)."""
    if bench_path is None or not bench_path.exists():
        problems.append(Problem(str(bench_path), "bench not found", check="file"))
        return None
    if bench_path in bad_shards:
        return None
    result = read_bench(bench_path, on_error="skip")
    problems.extend(Problem(k.where, k.reason, k.uid, "format") for k in result.skipped)
    jobs += [(len(jobs) + i, "bench", False, item) for i, item in enumerate(result.items)]
    return _counts(result.items, len(result.skipped))


def _bench_store(path: Path | None, bad_shards: set, problems: list[Problem]):
    if path is None or not path.exists() or path in bad_shards:
        return None
    try:
        return bench_store(path)
    except GraspDataError as err:
        problems.append(Problem(err.where, err.reason, check="archive"))
        return None


def _decode_all(data: GraspDataModule, stores: dict, jobs: list, workers: int, progress: bool) -> list[Problem]:
    if data.prompt.processor is None:
        raise GraspDataError("data.prompt.processor", "check-data needs a processor to count prompt tokens: pass "
                                               "--config with model.policy.name_or_path")
    data.processor  # loaded once here (the property loads it); the forked workers inherit it
    _STATE.update(data=data, stores=stores)
    try:
        results = _map(_check_item, jobs, workers, "check-data" if progress else None, ordered=False)
        found = [p for _, p in results if p is not None]
    finally:
        _STATE.clear()
    return found


def _sort_key(where: str) -> tuple[str, int]:
    head, _, tail = where.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (where, 0)


# ---------------------------------------------------------------------- command line
def add_arguments(parser) -> None:
    """The command's own arguments, beside the run's configuration (``--config``, ``--data.*``, ...):
    ``--files``, ``--workers``, ``--decode``, ``--progress``, ``--report``."""
    parser.add_argument("--files", type=list[str] | None, default=None,
                        help="files relative to data.source.root to check (default: every GRASP file present and the bench)")
    parser.add_argument("--workers", type=int | None, default=None, help="processes (default: all CPU cores)")
    parser.add_argument("--decode", type=bool, default=True, help="decode clips and check token budgets")
    parser.add_argument("--progress", type=bool, default=True, help="progress bar on stderr")
    parser.add_argument("--report", type=str | None, default=None, help="also write the report as JSON here")


def format_report(report: dict) -> str:
    """The human-readable report: per file its row count, its bad rows (rows with at least one problem,
    the unreadable ones included), its problems, and its rows by source, category, difficulty and format
    (each adding up to the rows); then every problem as ``where: reason [uid]``."""
    lines = [f"GRASP data check of {report['root']}"]
    for name, info in report["files"].items():
        unreadable = f" ({info['unreadable']} unreadable)" if info.get("unreadable") else ""
        lines.append(f"\n{name}: {info['rows']} rows, {info['bad']} bad{unreadable}, {info['problems']} problem(s)")
        for key in ("source", "category", "difficulty", "format"):
            lines.append(f"  {key:<11}" + ", ".join(f"{k} {v}" for k, v in info[key].items()))
    warnings = report.get("warnings", [])
    if warnings:
        lines.append(f"\n{len(warnings)} warning(s) (allowed by the format, not counted as problems):")
        lines += [f"  {p['where']}: {p['reason']}" + (f" [{p['uid']}]" if p["uid"] else "") for p in warnings]
    problems = report["problems"]
    lines.append(f"\n{len(problems)} problem(s)" + (":" if problems else "; the data is ready for training."))
    lines += [f"  {p['where']}: {p['reason']}" + (f" [{p['uid']}]" if p["uid"] else "") for p in problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Load the run's configuration (``argv``: ``--config`` files, overrides and :func:`add_arguments`),
    run :func:`run_check` with its DataModule, print the report; return 1 if anything is bad, 2 if the
    configuration is refused, else 0."""
    from grasp_lightning.commands.config import load_run

    try:
        run = load_run(sys.argv[1:] if argv is None else list(argv), arguments=add_arguments,
                       prog="python -m grasp_lightning check-data")
        run.datamodule.connect(data_mode=run.task.data_mode)  # the task's batch kind, as GraspModule.setup passes it
    except GraspConfigError as err:
        print(f"check-data: error: {err}", file=sys.stderr)  # noqa: T201 - the command's output
        return 2
    cfg = run.config
    report = run_check(run.datamodule, files=cfg.files, workers=cfg.workers, decode=cfg.decode, progress=cfg.progress)
    print(format_report(report))  # noqa: T201 - the command's output
    if cfg.report:
        Path(cfg.report).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0 if report["ok"] else 1
