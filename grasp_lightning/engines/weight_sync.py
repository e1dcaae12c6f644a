"""Where the vLLM engine leaves the policy's weights and the prompts' video and image embeddings for its server.

One folder per run and node, ``<weight_sync_dir>/grasp-vllm-<run>-<host>`` (mode ``0o700``, files
``0o600``: a node's ``/dev/shm`` is world-readable by default), shared by every rank of the run on
that node:

* ``weights/model.safetensors``: the language model at one policy version, written **once per node**
  per optimizer step. Under DDP and ZeRO-2 every rank holds the same weights after a step, so the
  node's first local rank writes version ``v`` while holding ``write.lock`` (``flock``) and then
  ``weights.json``; the others wait for that marker and have their servers load the same file
  (:meth:`SyncFolder.publish`). No collective is used, and a rank that samples nothing in a window
  (all its clips skipped) never leaves the others waiting: past a bounded wait they write it. The previous version is unlinked before the next is
  written (the servers have loaded it already), and tensors are written one at a time
  (:func:`write_safetensors`), so a node holds one copy of the weights, not one per rank plus a
  staging copy.
* ``embeds-rank<r>-<n>.raw``: one generate request's video and image embeddings, written once by the trainer
  and mapped by the server (no pickling); removed after the answer.
* ``lock``: every live engine of the run holds it shared. A folder whose ``lock`` can be taken
  exclusively belongs to no live process: a run killed with SIGKILL left it, and the next start on
  the node removes it (the run's own folder is emptied instead, so a requeued job reuses its name).

``<run>`` comes from the launcher, so every rank of one run and a requeued job name the same folder
(:func:`run_key`).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from grasp_lightning.errors import GraspConfigError

log = logging.getLogger(__name__)

PREFIX = "grasp-vllm-"
WEIGHTS = "weights"
FILE = "model.safetensors"
#: safetensors' dtype names (the format's specification, ``safetensors`` ``Dtype``)
ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}
_ENGINES = 0  # engines this process opened without a launcher's run id (tests): each gets its own folder


@dataclass
class Entry:
    """One tensor of the weight file: its checkpoint ``name``, ``shape``, and ``make``, which returns it
    (computed only when written: a LoRA merge or a 4-bit dequantization)."""

    name: str
    shape: tuple[int, ...]
    make: Callable[[], torch.Tensor]


def run_key() -> str:
    """What names a run's folder: the same on every rank of one launch and for a requeued job.

    ``GRASP_RUN_ID`` if set; else SLURM's job (and step) id, which a requeued job keeps; else
    ``torchrun``'s ``TORCHELASTIC_RUN_ID``; else, with more than one rank, the rendezvous address
    ``MASTER_ADDR:MASTER_PORT`` (Lightning's and torchrun's launchers set it for every rank); else this
    process alone (its pid and a counter, one folder per engine). No collective is used.
    """
    global _ENGINES
    env = os.environ
    if env.get("GRASP_RUN_ID"):
        return f"id:{env['GRASP_RUN_ID']}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '')}"
    if env.get("TORCHELASTIC_RUN_ID", "none") != "none":
        return f"elastic:{env['TORCHELASTIC_RUN_ID']}"
    if env.get("MASTER_PORT") and max(int(env.get("WORLD_SIZE", "1")), _world_size()) > 1:
        return f"rdzv:{env.get('MASTER_ADDR', '')}:{env['MASTER_PORT']}"
    _ENGINES += 1
    return f"pid:{os.getpid()}.{_ENGINES}"


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def folder_name(key: str, host: str | None = None) -> str:
    """``grasp-vllm-<12 hex digits of the key's SHA-1>-<host>``: short, safe, one per run and node."""
    host = (host or socket.gethostname()).replace("/", "_") or "host"
    return f"{PREFIX}{hashlib.sha1(key.encode()).hexdigest()[:12]}-{host}"


def default_root() -> Path:
    """``/dev/shm`` where it exists (RAM-backed: the server reads the weights at memory speed), else the temp dir."""
    import tempfile

    return Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())


def _open_private(path: Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # whatever the umask
    return fd


def _try_exclusive(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def sweep_leftovers(root: Path, keep: Path | None = None, host: str | None = None) -> list[Path]:
    """Remove this user's folders in ``root`` that no live engine holds: those of runs killed before they
    could clean up (SIGKILL, OOM killer). Only this node's folders are considered (a lock on a shared
    filesystem says nothing about other nodes); ``keep`` is left alone.

    A folder is a leftover when its ``lock`` can be taken exclusively (``flock`` is released by the kernel
    when its holder dies), or, for the pid-named folders of earlier versions
    (``grasp-vllm-weights-<pid>-rank<r>``), when that pid is gone.

    Returns:
        The folders removed.
    """
    host = (host or socket.gethostname()).replace("/", "_") or "host"
    removed = []
    for d in sorted(root.glob(PREFIX + "*")) if root.is_dir() else []:
        try:
            if d == keep or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if d.name.startswith(PREFIX + "weights-"):  # the pid-named folders of earlier versions
            pid = d.name.removeprefix(PREFIX + "weights-").split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
            continue
        if not d.name.endswith("-" + host):
            continue
        try:
            fd = os.open(d / "lock", os.O_RDWR)
        except FileNotFoundError:  # being created (lock comes first), or not ours
            if time.time() - d.stat().st_mtime > 600:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
            continue
        except OSError:
            continue
        try:
            if _try_exclusive(fd):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        finally:
            os.close(fd)
    for d in removed:
        log.warning("vLLM engine: removed %s, left behind by a run that was killed", d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def safetensors_header(entries: list[Entry], dtype: torch.dtype) -> tuple[bytes, int]:
    """The safetensors header of ``entries`` cast to ``dtype``: ``(8-byte length + JSON, padded to 8 bytes;
    bytes of tensor data)``. Format: safetensors' specification (offsets relative to the data start)."""
    size = torch.empty((), dtype=dtype).element_size()
    header, offset = {}, 0
    for e in entries:
        n = math.prod(e.shape) * size
        header[e.name] = {"dtype": ST_DTYPES[dtype], "shape": list(e.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the specification allows trailing spaces; 8-byte alignment of the data
    return struct.pack("<Q", len(text)) + text, offset


def write_safetensors(path: Path, entries: list[Entry], dtype: torch.dtype) -> int:
    """Write ``entries`` cast to ``dtype`` as one safetensors file, one tensor at a time.

    ``safetensors.torch.save_file`` needs every tensor at once (for a GPU policy: a full CPU copy of
    the weights beside the file); here at most one tensor is held on the CPU. The file is created
    ``0o600``. Readable by ``safetensors.safe_open`` and vLLM's loader.

    Returns:
        The file's size in bytes.

    Raises:
        ValueError: a tensor's shape differs from its entry's.
        OSError: from the filesystem (``ENOSPC`` when it is full).
    """
    head, data = safetensors_header(entries, dtype)
    fd = _open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb", buffering=0) as f:
        f.write(head)
        for e in entries:
            t = e.make().detach()
            if tuple(t.shape) != tuple(e.shape):
                raise ValueError(f"weight {e.name}: shape {tuple(t.shape)}, expected {e.shape}")
            t = t.to("cpu", dtype).contiguous()
            f.write(t.reshape(-1).view(torch.uint8).numpy().data)
    return len(head) + data


class SyncFolder:
    """The run's folder on this node (see the module docstring): opened by each rank's engine.

    Attributes:
        first_local_rank: this rank writes the node's weight files (``LOCAL_RANK``, else ``SLURM_LOCALID``,
            is 0 or unset; with neither set every rank may write, and the first to take the lock does).
        writer_wait_s: how long another rank waits for that writer before writing itself (seconds).
        writes: weight files this rank wrote.

    Args:
        root: ``model.rollout.vllm.weight_sync_dir`` (``None``: :func:`default_root`).
        rank: the trainer rank (names its embedding files).
        key: the run's key (``None``: :func:`run_key`).

    Raises:
        GraspConfigError: the folder exists and belongs to another user.
    """

    def __init__(self, root: str | Path | None, rank: int, key: str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.setting_given = root is not None
        self.rank = rank
        self.path = self.root / folder_name(key or run_key())
        self.writes = 0  # weight files this rank wrote
        local = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        self.first_local_rank = local == "0"  # the node's writer
        self.writer_wait_s = 60.0  # how long the others wait for it before writing themselves
        self._requests = 0
        self._lock_fd: int | None = None
        self._open()
        atexit.register(self.close)

    def _open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        sweep_leftovers(self.root, keep=self.path)
        while True:
            self.path.mkdir(mode=0o700, exist_ok=True)
            st = self.path.stat()
            if st.st_uid != os.getuid():
                raise GraspConfigError(f"model.rollout.vllm.weight_sync_dir: {self.path} belongs to user id "
                                       f"{st.st_uid}, not this run's ({os.getuid()}); remove it or set another "
                                       f"model.rollout.vllm.weight_sync_dir")
            os.chmod(self.path, 0o700)
            fd = _open_private(self.path / "lock")
            if _try_exclusive(fd):  # no live engine of this run here: what is in it is a killed launch's
                for p in self.path.iterdir():
                    if p.name != "lock":
                        shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            fcntl.flock(fd, fcntl.LOCK_SH)  # converts an exclusive lock; waits for one being converted
            try:
                same = os.stat(self.path / "lock").st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd = fd
                return
            os.close(fd)  # swept between our open and our lock (by another run's start): open it again

    # ------------------------------------------------------------------ weights
    @property
    def weights_dir(self) -> Path:
        """The folder the server loads (``model.safetensors`` alone in it)."""
        return self.path / WEIGHTS

    def check_space(self, entries: list[Entry], dtype: torch.dtype) -> int:
        """Refuse to start when the filesystem cannot hold one weight file.

        Returns:
            The bytes one weight file takes.

        Raises:
            GraspConfigError: fewer bytes free (plus those of a weight file already there, which is
                replaced) than one file needs; names the folder, both figures and the setting.
        """
        head, data = safetensors_header(entries, dtype)
        need = len(head) + data
        old = self.weights_dir / FILE
        free = shutil.disk_usage(self.path).free + (old.stat().st_size if old.exists() else 0)
        if free < need:
            where = ("model.rollout.vllm.weight_sync_dir" if self.setting_given else
                     "model.rollout.vllm.weight_sync_dir (unset: /dev/shm, else the temp dir)")
            raise GraspConfigError(
                f"vLLM engine: {self.root} has {free} bytes ({_human(free)}) free, but the policy's "
                f"language-model weights need {need} bytes ({_human(need)}) there: one copy per node, "
                f"rewritten after each optimizer step for the vLLM server to reload. Set {where} to a directory "
                f"with room (a local disk works; /dev/shm is faster), or enlarge it (docker run --shm-size)")
        return need

    def _marker_version(self) -> int | None:
        try:
            return json.loads((self.path / "weights.json").read_text()).get("version")
        except (FileNotFoundError, ValueError):
            return None

    def publish(self, version: int, entries: list[Entry], dtype: torch.dtype) -> bool:
        """Make ``weights/model.safetensors`` hold policy version ``version``, written once per node.

        The node's first local rank (:attr:`first_local_rank`) writes it. The others wait
        for it up to :attr:`writer_wait_s` seconds (and as long as it holds the write lock), then load
        its file; past that, with no writer in sight (its rank sampled nothing this step: every clip of
        its window skipped), the first of them to need the version writes it. So no rank ever waits on
        one that will not come, and no collective is needed.

        Returns:
            ``True`` when this rank wrote the file.
        """
        if not self.first_local_rank:
            deadline = time.monotonic() + self.writer_wait_s
            while self._marker_version() != version and time.monotonic() < deadline:
                time.sleep(0.05)
        fd = _open_private(self.path / "write.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits while another rank writes
            if self._marker_version() == version:
                return False
            marker = self.path / "weights.json"
            marker.unlink(missing_ok=True)
            self.weights_dir.mkdir(mode=0o700, exist_ok=True)
            (self.weights_dir / FILE).unlink(missing_ok=True)  # every server loaded it: one copy, not two
            tmp = self.weights_dir / (FILE + ".tmp")
            try:
                size = write_safetensors(tmp, entries, dtype)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                self._raise_if_full(e, "the weights")
                raise
            os.replace(tmp, self.weights_dir / FILE)
            mfd = _open_private(self.path / "weights.json.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(mfd, "w") as f:
                json.dump({"version": version, "bytes": size, "rank": self.rank}, f)
            os.replace(self.path / "weights.json.tmp", marker)  # readers see the whole marker or none
            self.writes += 1
            return True
        finally:
            os.close(fd)  # releases the lock

    # ------------------------------------------------------------------ embeddings
    def write_embeddings(self, tensors: list[torch.Tensor]) -> tuple[Path, list[dict]]:
        """Write one request's embeddings to a new file, once, for the server to map.

        Args:
            tensors: per prompt ``(tokens, width)``, any device and dtype.

        Returns:
            ``(file, [{"file", "offset", "dtype", "shape"}] per tensor)``; offsets in bytes, 64-aligned.
        """
        self._requests += 1
        path = self.path / f"embeds-rank{self.rank}-{self._requests}.raw"
        metas, offset = [], 0
        for t in tensors:
            metas.append({"file": str(path), "offset": offset, "dtype": str(t.dtype).removeprefix("torch."),
                          "shape": list(t.shape)})
            offset += -(-t.numel() * t.element_size() // 64) * 64
        fd = _open_private(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            os.posix_fallocate(fd, 0, max(offset, 1))  # ENOSPC here, not a SIGBUS while copying into the mapping
            mapped = torch.from_file(str(path), shared=True, size=max(offset, 1), dtype=torch.uint8)
            for t, m in zip(tensors, metas):
                n = t.numel() * t.element_size()
                mapped[m["offset"]:m["offset"] + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            del mapped
            os.fsync(fd)  # a server on another node reads it through a shared filesystem (a no-op on tmpfs)
        except OSError as e:
            path.unlink(missing_ok=True)
            self._raise_if_full(e, f"one request's video and image embeddings ({offset} bytes)")
            raise
        finally:
            os.close(fd)
        return path, metas

    def _raise_if_full(self, e: OSError, what: str) -> None:
        """Raise a full filesystem (``ENOSPC``) as a :class:`GraspConfigError` naming the folder and the setting."""
        import errno

        if e.errno == errno.ENOSPC:
            raise GraspConfigError(f"vLLM engine: no space left in {self.path} for {what} "
                                   f"({_human(shutil.disk_usage(self.path).free)} free); set "
                                   f"model.rollout.vllm.weight_sync_dir to a directory with room") from e

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Release the folder; the last engine of the run on this node removes it. Idempotent."""
        if self._lock_fd is None:
            return
        for p in self.path.glob(f"embeds-rank{self.rank}-*.raw"):
            p.unlink(missing_ok=True)
        os.close(self._lock_fd)
        self._lock_fd = None
        try:
            fd = os.open(self.path / "lock", os.O_RDWR)
        except OSError:
            return
        try:
            if _try_exclusive(fd):
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(fd)


def _human(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
