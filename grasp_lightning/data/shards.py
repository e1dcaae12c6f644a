"""Clips read straight out of uncompressed tar shards, without extracting anything to disk.

GRASP ships its training clips as ``train/videos/<source>_partNNN.tar`` shards that extract to
``<source>/video/<clip>.mp4`` and the bench as ``test/grasp_bench.tar`` (``docs/data-format.md``).
:class:`ClipStore` scans the tar headers once (Python's ``tarfile``, ``TarInfo.offset_data``),
keeps ``{member path -> (shard, data offset, size)}``, caches that index as JSON and then serves
each clip with one positioned read (``os.pread``, i.e. seek + read) from a per-process handle.

Rules:
- an extracted file ``<root>/<path>`` is used when it exists, else the shard index;
- members with an absolute path, a ``..`` component, links and other non-regular types are never
  indexed (counted and logged with a warning naming shard and member);
- a member name present in several shards resolves to the last one in sorted shard order (what
  extracting the shards in that order would leave on disk), with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tarfile
import threading
from pathlib import Path

from grasp_lightning.errors import ArchiveError, ClipNotFoundError, GraspDataError

log = logging.getLogger(__name__)

INDEX_NAME = ".grasp_index.json"
INDEX_VERSION = 1
_BLOCK = tarfile.BLOCKSIZE
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


def clean_member_path(name: str) -> str | None:
    """Return ``name`` as a safe relative POSIX path (``./`` and empty parts dropped), or ``None``.

    ``None`` means unsafe: absolute (``/x``, ``C:x``, ``\\\\x``), a backslash, or a ``..`` component.
    """
    if not name or name.startswith(("/", "\\")) or "\\" in name or re.match(r"^[A-Za-z]:", name):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def scan_shard(shard: Path) -> tuple[dict[str, tuple[int, int]], list[tuple[str, str]]]:
    """Scan the headers of one uncompressed tar and return its regular members.

    Returns:
        ``({member path: (data offset in bytes, size in bytes)}, [(member name, why left out)])``;
        directories are neither indexed nor reported.

    Raises:
        ArchiveError: the file is not an uncompressed tar, is truncated (a member's data or the
            end-of-archive marker is missing) or has a corrupt header; ``where`` is
            ``"<shard>"`` or ``"<shard>:<member>"`` (the last member read).
    """
    members: dict[str, tuple[int, int]] = {}
    left_out: list[tuple[str, str]] = []
    file_size = shard.stat().st_size
    last: tarfile.TarInfo | None = None
    try:
        with tarfile.open(shard, mode="r:") as tf:
            while (ti := tf.next()) is not None:
                last = ti
                why = _unsafe_reason(ti)
                if why is None:
                    members[clean_member_path(ti.name) or ""] = (ti.offset_data, ti.size)
                elif why:
                    left_out.append((ti.name, why))
            end = tf.offset
    except (tarfile.TarError, OSError, EOFError) as e:
        where = f"{shard}:{last.name}" if last is not None else str(shard)
        raise ArchiveError(where, f"corrupt or truncated tar ({e})") from e
    _check_tail(shard, file_size, end, last)
    return members, left_out


def _unsafe_reason(ti: tarfile.TarInfo) -> str | None:
    """``None`` for an indexable member, ``""`` for a directory (skipped quietly), else why not."""
    if ti.isdir():
        return ""
    if ti.issym() or ti.islnk():
        return f"link to {ti.linkname!r}"
    if ti.type not in _REGULAR or ti.issparse():
        return f"non-regular member (type {ti.type!r})"
    if clean_member_path(ti.name) is None:
        return "absolute path or '..' component"
    return None


def _check_tail(shard: Path, file_size: int, end: int, last: tarfile.TarInfo | None) -> None:
    """Require an all-zero end-of-archive block where ``tarfile`` stopped reading (it stops
    silently on a truncated or corrupt header)."""
    if last is not None and last.offset_data + last.size > file_size:
        raise ArchiveError(f"{shard}:{last.name}", f"truncated tar: member needs {last.size} bytes, file ends first")
    where = f"{shard}:{last.name}" if last is not None else str(shard)
    if file_size - end < _BLOCK:
        raise ArchiveError(where, f"truncated tar: no end-of-archive marker at byte {end} (file is {file_size} bytes)")
    with open(shard, "rb") as f:
        f.seek(end)
        if f.read(_BLOCK) != bytes(_BLOCK):
            raise ArchiveError(where, f"corrupt tar header at byte {end}")


class ClipStore:
    """Read clips by relative path from an extracted folder and/or tar shards.

    Args:
        root: a videos root (folder holding ``*.tar`` shards and/or extracted ``<source>/video/``
            trees), or a single tar file (e.g. ``grasp_bench.tar``).
        cache_dir: folder for the JSON index when it cannot (or should not) live beside the data;
            when given it is used first. Default: ``<root>/.grasp_index.json`` (or
            ``.<tar name>.grasp_index.json`` beside a tar file), falling back to
            ``$XDG_CACHE_HOME/grasp_lightning`` (``~/.cache``), then to memory only.
        pattern: glob of shard file names.
        recursive: look for shards in sub-folders too.
        prefix: prepended to every requested path (e.g. ``"grasp_bench/"`` for a bench tar whose
            members sit under a top-level folder).

    Raises:
        GraspDataError: ``root`` does not exist.
        ArchiveError: a shard is corrupt or truncated (see :func:`scan_shard`).
    """

    def __init__(self, root: str | Path, *, cache_dir: str | Path | None = None, pattern: str = "*.tar",
                 recursive: bool = True, prefix: str = "") -> None:
        self.root = Path(root).expanduser().resolve()
        if not self.root.exists():
            raise GraspDataError(str(root), "videos root does not exist")
        self.prefix = prefix
        self._folder = self.root if self.root.is_dir() else None
        self._base = self.root if self._folder is not None else self.root.parent
        if self._folder is None:
            shards = [self.root]
        else:
            shards = sorted(self.root.rglob(pattern) if recursive else self.root.glob(pattern))
            shards = [s for s in shards if s.is_file()]
        self.shards: list[Path] = shards
        self.index_rebuilt = False
        self.unsafe_members = 0
        self.index_path: Path | None = None
        self._members: dict[str, tuple[str, int, int]] = {}
        self._cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._load_or_build()
        self._pid: int | None = None
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- index
    def _stats(self) -> dict[str, list[int]]:
        out = {}
        for s in self.shards:
            st = s.stat()
            out[s.relative_to(self._base).as_posix()] = [st.st_size, st.st_mtime_ns]
        return out

    def _index_candidates(self) -> list[Path]:
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:16]
        beside = (self.root / INDEX_NAME) if self._folder is not None else \
            self.root.parent / f".{self.root.name}{INDEX_NAME}"
        xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grasp_lightning"
        fallback = [beside, xdg / f"index_{digest}.json"]
        if self._cache_dir is not None:
            return [self._cache_dir / f"index_{digest}.json"] + fallback
        return fallback

    def _load_or_build(self) -> None:
        stats = self._stats()
        if not stats:  # an extracted folder only: nothing to index or cache
            return
        for cand in self._index_candidates():
            cached = _read_json(cand)
            if cached and cached.get("version") == INDEX_VERSION and cached.get("shards") == stats:
                try:
                    self._members = {str(k): (str(s), int(o), int(n)) for k, (s, o, n) in cached["members"].items()}
                except (AttributeError, KeyError, TypeError, ValueError):
                    log.warning("ClipStore: ignoring the malformed index %s", cand)
                    continue
                self.unsafe_members = int(cached.get("unsafe_members", 0))
                self.index_path = cand
                return
        self._build(stats)
        payload = {"version": INDEX_VERSION, "root": str(self.root), "shards": stats,
                   "unsafe_members": self.unsafe_members, "members": self._members}
        for cand in self._index_candidates():
            if _write_json(cand, payload):
                self.index_path = cand
                return
        log.warning("ClipStore %s: no writable place for the index; it lives in memory only", self.root)

    def _build(self, stats: dict[str, list[int]]) -> None:
        members: dict[str, tuple[str, int, int]] = {}
        duplicates = 0
        for shard, rel in zip(self.shards, stats):
            found, left_out = scan_shard(shard)
            for name, why in left_out:
                log.warning("ClipStore: not indexing %s:%s (%s)", shard, name, why)
            self.unsafe_members += len(left_out)
            for name, (offset, size) in found.items():
                duplicates += name in members
                members[name] = (rel, offset, size)
        if duplicates:
            log.warning("ClipStore %s: %d member paths occur in more than one shard; the last shard wins",
                        self.root, duplicates)
        self._members = members
        self.index_rebuilt = True
        log.info("ClipStore %s: indexed %d members from %d shards", self.root, len(members), len(self.shards))

    # ---------------------------------------------------------------- reading
    @property
    def members(self) -> list[str]:
        """All indexed member paths (shards only, prefix included), sorted."""
        return sorted(self._members)

    def __contains__(self, path: str) -> bool:
        key = clean_member_path(self.prefix + path)
        if key is None:
            return False
        return key in self._members or (self._folder is not None and (self._folder / key).is_file())

    def open(self, path: str) -> bytes:
        """Return the bytes of the clip (or any member) at ``path`` relative to the root.

        Raises:
            ClipNotFoundError: ``path`` is unsafe or in neither the extracted folder nor the shards.
            ArchiveError: the shard is shorter than its index says (truncated after indexing).
        """
        key = clean_member_path(self.prefix + path)
        if key is None:
            raise ClipNotFoundError(path, f"unsafe clip path (absolute or '..') under {self.root}")
        if self._folder is not None and (self._folder / key).is_file():
            return (self._folder / key).read_bytes()
        ref = self._members.get(key)
        if ref is None:
            raise ClipNotFoundError(path, f"clip not found in the extracted folder or the "
                                          f"{len(self.shards)} tar shard(s) under {self.root}")
        shard, offset, size = ref
        data = _pread(self._fd(shard), size, offset)
        if len(data) != size:
            raise ArchiveError(f"{self._base / shard}:{key}",
                               f"truncated tar: expected {size} bytes at offset {offset}, got {len(data)}")
        return data

    def _fd(self, shard: str) -> int:
        """The read-only descriptor of ``shard`` for this process; reopened after a fork."""
        pid = os.getpid()
        if pid != self._pid:  # new process: never use a descriptor inherited across fork
            self._lock = threading.Lock()
            self._fds, self._pid = {}, pid
        with self._lock:
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._fds[shard] = os.open(self._base / shard, os.O_RDONLY)
            return fd

    def close(self) -> None:
        """Close the descriptors this process opened."""
        if self._pid == os.getpid():
            for fd in self._fds.values():
                os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        if getattr(self, "_fds", None):
            self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fds={}, _pid=None, _lock=None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ClipStore({str(self.root)!r}, shards={len(self.shards)}, members={len(self._members)})"


def _pread(fd: int, size: int, offset: int) -> bytes:
    if hasattr(os, "pread"):
        return os.pread(fd, size, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - platforms without pread
    return os.read(fd, size)


def _read_json(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: Path, payload: dict) -> bool:
    """Write atomically (temp file + rename); ``False`` if the place is not writable."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(tmp, path)
        return True
    except OSError as e:
        log.debug("cannot write index %s: %s", path, e)
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
