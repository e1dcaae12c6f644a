"""Test-only: several CPU processes over gloo, with a hard timeout so a hang fails instead of blocking.

- :func:`free_port`: a free TCP port on the loopback interface for ``MASTER_PORT``.
- :func:`launch_ranks` / :func:`wait_ranks`: ``python -m grasp_lightning <args>`` once per rank, as
  ``torchrun --nproc_per_node W`` starts it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT`` set; Lightning sees processes created outside it), each writing stdout and stderr to
  its own log; waiting kills every rank once the deadline passes and fails with each rank's log tail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import REPO


def free_port() -> int:
    """A TCP port free on ``127.0.0.1`` now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_log(log: Path, rank: int) -> Path:
    """Where :func:`launch_ranks` writes rank ``rank``'s output: ``<log>.rank<rank>.log``."""
    return log.with_suffix(f".rank{rank}.log")


def launch_ranks(args: list[str], log: Path, world: int = 2, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start ``python -m grasp_lightning <args>`` once per rank from the repository root.

    Args:
        args: the command's arguments (``["fit", "--config", ...]``).
        log: base path of the per-rank logs (:func:`rank_log`).
        world: number of ranks (one node).
        env: extra environment variables for every rank.

    Returns:
        The rank processes, index = rank; pass them to :func:`wait_ranks`.
    """
    port = str(free_port())
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world), "RANK": str(rank),
                    "LOCAL_RANK": str(rank), "NODE_RANK": "0", "OMP_NUM_THREADS": "1", "GRASP_LOG_LEVEL": "WARNING",
                    **(env or {})}
        with open(rank_log(log, rank), "w") as out:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, "-m", "grasp_lightning", *args], cwd=REPO, env=rank_env,
                                          stdout=out, stderr=subprocess.STDOUT))
    return procs


def _tails(log: Path, world: int, chars: int) -> str:
    parts = []
    for rank in range(world):
        path = rank_log(log, rank)
        text = path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
        parts.append(f"---- rank {rank} ({path}) ----\n{text}")
    return "\n".join(parts)


def wait_ranks(procs: list[subprocess.Popen], log: Path, timeout: float, chars: int = 3000) -> float:
    """Wait for every rank; kill them all and fail if any is still running after ``timeout`` seconds
    (a rank that died leaves the others blocked in their next collective) or exited non-zero.

    Returns:
        The seconds waited.

    Raises:
        AssertionError: a timeout or a non-zero exit, with the last ``chars`` characters of every rank's log.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            raise AssertionError(f"{log.name}: still running after {timeout:.0f} s, all ranks killed\n"
                                 + _tails(log, len(procs), chars)) from None
    codes = [p.returncode for p in procs]
    if any(codes):
        raise AssertionError(f"{log.name}: exit codes {codes}\n" + _tails(log, len(procs), chars))
    return time.monotonic() - t0


def spawn_ranks(fn, args: tuple, nprocs: int, timeout: float) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` (``fn(rank, *args)`` in each process) with a
    hard ``timeout`` in seconds: the processes still running then are killed and the call fails.

    Raises:
        AssertionError: a process still ran after ``timeout`` seconds.
        torch.multiprocessing.ProcessRaisedException: a process raised (its traceback in the message).
    """
    import torch.multiprocessing as mp

    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            alive = [p for p in context.processes if p.is_alive()]
            for p in alive:
                p.kill()
            raise AssertionError(f"{len(alive)} of {nprocs} processes still running after {timeout:.0f} s: killed")
