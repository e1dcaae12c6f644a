"""``python -m grasp_lightning check-data``: find everything wrong with a GRASP dataset before training.

Checks, over every GRASP file present under ``data.root`` (``train/data_sft.jsonl``,
``train/data_rl.jsonl``, ``train/annotations.jsonl``, ``test/annotations.jsonl`` and the bench), or
only those named with ``--files``:

- every tar shard is whole, and has no member with an absolute path, a ``..`` component, a link or
  another non-regular type (such members are never read; each is listed);
- every JSONL line parses and follows the schema; every MCQ answer is one of its option letters
  (the readers of :mod:`grasp_lightning.data.formats`, with ``on_error="skip"``);
- every RL row has ground-truth participants (``meta.gt_events`` naming at least one person);
- ``data.train_file`` (as ``GraspDataModule`` resolves it) exists and is a GRASP training file;
- every clip window ends within its clip (``end_seconds`` at most 0.5 s past the clip's end);
- warnings only (exit status unchanged): RL events with an unknown source or persons the question
  and options never name;
- every referenced clip exists and decodes at the configured fps within ``max_frames`` and
  ``max_pixels``, and the prompt (video tokens included) and SFT target fit ``max_prompt_tokens``
  and ``max_target_tokens`` -- exactly the decoding and encoding training does
  (``GraspDataset.encode``).

It prints counts per file by source, category, difficulty and format, then every bad item as
``file:line: reason``, and exits with status 1 when anything is bad (0 otherwise). Decoding runs
in a process pool over all CPU cores (``--workers``), with a progress bar on stderr; workers are
replaced every 256 clips so native decoder memory cannot accumulate.

Settings come from the same YAML files as training (``--config configs/sft.yaml --config
configs/demo.yaml``: the ``data:`` section and ``model.policy.name_or_path`` for the processor)
and ``--data.*`` flags, e.g. ``python -m grasp_lightning check-data --data.root /data/GRASP``.
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

from grasp_lightning.data.formats import READERS, bench_store, event_warnings, read_bench
from grasp_lightning.data.records import GraspItem
from grasp_lightning.data.shards import ClipStore, clean_member_path, scan_shard
from grasp_lightning.errors import ClipNotFoundError, GraspDataError

log = logging.getLogger(__name__)

#: Known files: path relative to the root -> (reader kind, which clip store resolves its clips).
KNOWN_FILES = {
    "train/data_sft.jsonl": ("sft", "videos"),
    "train/data_rl.jsonl": ("rl", "videos"),
    "train/annotations.jsonl": ("annotations", "videos"),
    "test/annotations.jsonl": ("annotations", "bench"),
}
_KINDS = {"data_sft": "sft", "data_rl": "rl", "annotations": "annotations"}  # file stem -> kind
_READERS = {kind: READERS[stem] for stem, kind in _KINDS.items()}  # data/formats.py: one reader per file
RECYCLE_AFTER = 256  # clips per worker process before it is replaced (native decoder memory)
_CHUNK = 4  # clips per task sent to a worker


@dataclass(frozen=True)
class Problem:
    """One bad thing: ``where`` (``file:line``, ``shard:member`` or a folder), ``reason``, the item id."""

    where: str
    reason: str
    uid: str = ""
    check: str = ""


@dataclass
class Settings:
    """What the check needs from the data config (``GraspDataModule`` arguments of the same names)."""

    root: Path
    videos: str
    bench: str | None
    fps: float
    max_frames: int
    max_pixels: int
    max_prompt_tokens: int | None
    max_target_tokens: int | None
    system_prompt: str
    processor: str | None
    trust_remote_code: bool
    instruction: str | None = None  #: ``None``: the GRASP instruction (``grasp_lightning.data.prompts.INSTRUCTION``)
    train_file: str | None = None  #: ``data.train_file``: always checked (reported when missing or misnamed)
    mode: str = "sft"  #: ``data.mode``: ``"sft"`` encodes the train file's targets, as ``fit`` does


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
    end = item.clip.end_seconds
    if duration is None or end is None or end <= duration + END_TOLERANCE_S:
        return None
    return f"end_seconds {end:g} is beyond the clip's duration of {duration:.2f} s ({item.clip.path})"


def _check_item(job: tuple[int, str, bool, GraspItem]) -> tuple[int, Problem | None]:
    """Decode one item's clip and encode its prompt (and target) with the dataset training uses
    (``GraspDataset.encode``), then check its time window against the clip's duration."""
    from grasp_lightning.data.prompts import INSTRUCTION
    from grasp_lightning.datamodule import GraspDataset

    index, store_name, with_target, item = job
    s: Settings = _STATE["settings"]
    store = _STATE["stores"].get(store_name)
    try:
        if store is None or item.clip.path not in store:
            return index, _missing(item, s.root)
        dataset = GraspDataset([item], store, _STATE["processor"], with_target=with_target, fps=s.fps,
                               max_frames=s.max_frames, max_pixels=s.max_pixels, max_prompt_tokens=s.max_prompt_tokens,
                               max_target_tokens=s.max_target_tokens, system_prompt=s.system_prompt, skip_bad=False,
                               instruction=INSTRUCTION if s.instruction is None else s.instruction)
        dataset.encode(item)
        reason = window_problem(item, clip_duration(store.open(item.clip.path)))
        if reason:
            return index, Problem(item.origin, reason, item.uid, "window")
    except GraspDataError as err:
        return index, Problem(item.origin, err.reason, item.uid, type(err).__name__)
    except Exception as err:  # noqa: BLE001 - any failure here would also stop training: report it
        return index, Problem(item.origin, f"unexpected {type(err).__name__}: {err}", item.uid, "unexpected")
    return index, None


def _missing(item: GraspItem, root: Path) -> Problem:
    return Problem(item.origin, f"clip {item.clip.path} not found under {root}", item.uid, "ClipNotFoundError")


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


def _counts(items: list[GraspItem]) -> dict[str, dict[str, int]]:
    out = {}
    for key in ("source", "category", "difficulty", "format"):
        out[key] = dict(sorted(Counter(str(getattr(i, key)) for i in items).items()))
    return out


def run_check(s: Settings, files: list[str] | None = None, workers: int | None = None, decode: bool = True,
              progress: bool = True) -> dict:
    """Run every check and return the report ``{"root", "files": {name: {"rows", "bad", counts}},
    "problems": [Problem as dict], "ok"}`` (see the module docstring for the checks).

    Args:
        s: data settings.
        files: files relative to the root to check (default: every known file present, and the bench).
        workers: processes for decoding and archive scans (default: all CPU cores; 0: this process).
        decode: decode every clip and check the token budgets (False: formats, archives and
            clip presence only).
        progress: show a progress bar on stderr.
    """
    workers = len(os.sched_getaffinity(0)) if workers is None else workers
    problems: list[Problem] = []
    warnings: list[Problem] = []
    wanted = [f for f in files if f != s.bench] if files is not None else \
        [f for f in KNOWN_FILES if (s.root / f).is_file()]
    if files is None and s.train_file is not None:  # the file the run reads, as GraspDataModule resolves it
        wanted = [f for f in wanted if s.root / f != s.root / s.train_file] + [s.train_file]
    check_bench = s.bench is not None and (files is None or s.bench in files)
    shards = sorted(p for p in (s.root / s.videos).rglob("*.tar") if p.is_file()) if (s.root / s.videos).is_dir() \
        else []
    bench_path = s.root / s.bench if s.bench else None
    bench_tars = [bench_path] if bench_path is not None and bench_path.is_file() else []
    bad_shards = set()
    for shard, found in zip(shards + bench_tars, _map(_scan, shards + bench_tars, workers)):
        problems.extend(found)
        if any(not p.reason.startswith("unsafe") for p in found):
            bad_shards.add(shard)
    with tempfile.TemporaryDirectory(prefix="grasp_check_") as cache_dir:
        stores = {"videos": _videos_store(s.root / s.videos, [x for x in shards if x not in bad_shards],
                                          cache_dir, problems)}
        report_files: dict[str, dict] = {}
        jobs: list[tuple[int, str, bool, GraspItem]] = []
        for rel in wanted:
            is_train = s.train_file is not None and s.root / rel == s.root / s.train_file
            kind, store_name = KNOWN_FILES.get(rel, (_KINDS.get(Path(rel).name.split(".")[0]), "videos"))
            if is_train:
                kind, store_name = _KINDS.get(Path(rel).name.split(".")[0]), "videos"  # as GraspDataModule reads it
            if kind is None:
                what = "data.train_file " if is_train else ""
                problems.append(Problem(str(s.root / rel), f"{what}not a GRASP file (expected data_sft.jsonl, "
                                                           "data_rl.jsonl, annotations.jsonl or the bench)",
                                        check="file"))
                continue
            if not (s.root / rel).is_file():
                problems.append(Problem(str(s.root / rel), "data.train_file: no such file" if is_train
                                        else "no such file", check="file"))
                continue
            if store_name == "bench" and "bench" not in stores:
                stores["bench"] = _bench_store(bench_path, bad_shards, problems)
            result = _READERS[kind](s.root / rel, on_error="skip")
            problems.extend(Problem(k.where, k.reason, k.uid, "format") for k in result.skipped)
            for item in result.items:
                if kind == "rl" and not item.participants:
                    problems.append(Problem(item.origin, "RL row has no ground-truth participants "
                                                         "(meta.gt_events is missing or names nobody)",
                                            item.uid, "participants"))
                if kind == "rl":
                    warnings.extend(Problem(item.origin, w, item.uid, "events") for w in event_warnings(item))
                with_target = (s.mode == "sft") if is_train else (kind == "sft" or (kind == "annotations"
                                                                                     and bool(item.response)))
                jobs.append((len(jobs), store_name, with_target, item))
            report_files[rel] = {"rows": len(result.items) + len(result.skipped), **_counts(result.items)}
        if check_bench:
            if "bench" not in stores:
                stores["bench"] = _bench_store(bench_path, bad_shards, problems)
            if bench_path is None or not bench_path.exists():
                problems.append(Problem(str(bench_path), "bench not found", check="file"))
            elif bench_path not in bad_shards:
                result = read_bench(bench_path, on_error="skip")
                problems.extend(Problem(k.where, k.reason, k.uid, "format") for k in result.skipped)
                jobs += [(len(jobs) + i, "bench", False, item) for i, item in enumerate(result.items)]
                report_files[s.bench] = {"rows": len(result.items) + len(result.skipped), **_counts(result.items)}
        if decode and jobs:
            problems.extend(_decode_all(s, stores, jobs, workers, progress))
        else:
            problems.extend(_missing(it, s.root) for _, name, _, it in jobs
                            if stores.get(name) is None or it.clip.path not in stores[name])
    for name, info in report_files.items():
        prefix = str(s.root / name)
        info["bad"] = sum(1 for p in problems if p.where.startswith(prefix))
        info["warnings"] = sum(1 for p in warnings if p.where.startswith(prefix))
    problems.sort(key=lambda p: _sort_key(p.where.split(" (")[0]))
    warnings.sort(key=lambda p: _sort_key(p.where))
    return {"root": str(s.root), "files": report_files, "problems": [asdict(p) for p in problems],
            "warnings": [asdict(p) for p in warnings], "ok": not problems}


def _bench_store(path: Path | None, bad_shards: set, problems: list[Problem]):
    if path is None or not path.exists() or path in bad_shards:
        return None
    try:
        return bench_store(path)
    except GraspDataError as err:
        problems.append(Problem(err.where, err.reason, check="archive"))
        return None


def _decode_all(s: Settings, stores: dict, jobs: list, workers: int, progress: bool) -> list[Problem]:
    from grasp_lightning.policy import load_processor

    if s.processor is None:
        raise GraspDataError("data.processor", "check-data needs a processor to count prompt tokens: pass "
                                               "--config with model.policy.name_or_path, or --data.processor")
    _STATE.update(settings=s, stores=stores,
                  processor=load_processor(s.processor, trust_remote_code=s.trust_remote_code))
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
def _merged_yaml(paths: list[str]) -> dict:
    """The ``--config`` files merged in order (nested mappings merged, other values replaced)."""
    import yaml

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    merged: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            merged = merge(merged, yaml.safe_load(fh) or {})
    return merged


def build_parser(defaults: dict):
    """The jsonargparse parser: ``--data.*`` (the :class:`GraspDataModule` arguments), ``--files``,
    ``--workers``, ``--decode``, ``--progress``, ``--report``; ``defaults`` from the YAML files."""
    from jsonargparse import ArgumentParser

    from grasp_lightning.datamodule import GraspDataModule

    parser = ArgumentParser(prog="python -m grasp_lightning check-data", description=__doc__.split("\n\n")[0],
                            default_env=False)
    parser.add_argument("--config", type=list[str], default=[], help="recipe YAML files (training configs), in order")
    parser.add_class_arguments(GraspDataModule, "data")
    parser.add_argument("--files", type=list[str] | None, default=None,
                        help="files relative to data.root to check (default: every GRASP file present and the bench)")
    parser.add_argument("--workers", type=int | None, default=None, help="processes (default: all CPU cores)")
    parser.add_argument("--decode", type=bool, default=True, help="decode clips and check token budgets")
    parser.add_argument("--progress", type=bool, default=True, help="progress bar on stderr")
    parser.add_argument("--report", type=str | None, default=None, help="also write the report as JSON here")
    parser.set_defaults({f"data.{k}": v for k, v in defaults.items()})
    return parser


def _split_configs(argv: list[str]) -> tuple[list[str], list[str]]:
    configs, rest, it = [], [], iter(argv)
    for arg in it:
        if arg == "--config":
            configs.append(next(it))
        elif arg.startswith("--config="):
            configs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return configs, rest


def format_report(report: dict) -> str:
    """The human-readable report: per file its row count, bad count and counts by source, category,
    difficulty and format; then every problem as ``where: reason [uid]``."""
    lines = [f"GRASP data check of {report['root']}"]
    for name, info in report["files"].items():
        lines.append(f"\n{name}: {info['rows']} rows, {info['bad']} bad")
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
    """Parse ``argv``, run :func:`run_check`, print the report; return 1 if anything is bad, else 0."""
    configs, rest = _split_configs(sys.argv[1:] if argv is None else list(argv))
    merged = _merged_yaml(configs)
    defaults = dict(merged.get("data") or {})
    policy = (merged.get("model") or {}).get("policy") or {}
    defaults.setdefault("processor", policy.get("name_or_path"))
    defaults.setdefault("trust_remote_code", bool(policy.get("trust_remote_code", False)))
    cfg = build_parser(defaults).parse_args(rest)
    d = cfg.data
    from grasp_lightning.datamodule import validate_numbers
    from grasp_lightning.errors import GraspConfigError

    try:
        validate_numbers(fps=d.fps, max_frames=d.max_frames, max_pixels=d.max_pixels,
                         max_prompt_tokens=d.max_prompt_tokens, max_target_tokens=d.max_target_tokens)
    except GraspConfigError as err:
        print(f"check-data: error: {err}", file=sys.stderr)  # noqa: T201 - the command's output
        return 2
    settings = Settings(root=Path(d.root), videos=d.videos, bench=d.bench, fps=d.fps, max_frames=d.max_frames,
                        max_pixels=d.max_pixels, max_prompt_tokens=d.max_prompt_tokens,
                        max_target_tokens=d.max_target_tokens, system_prompt=d.system_prompt, processor=d.processor,
                        trust_remote_code=d.trust_remote_code, instruction=d.instruction, train_file=d.train_file,
                        mode=d.mode)
    report = run_check(settings, files=cfg.files, workers=cfg.workers, decode=cfg.decode, progress=cfg.progress)
    print(format_report(report))  # noqa: T201 - the command's output
    if cfg.report:
        Path(cfg.report).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0 if report["ok"] else 1
