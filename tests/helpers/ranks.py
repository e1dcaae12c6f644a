"""Several CPU processes over gloo with a hard timeout (:func:`free_port`, :func:`launch_ranks`,
:func:`wait_ranks`, :func:`spawn_ranks`, :func:`spawn_two_ranks`), so a hang fails instead of blocking."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.paths import REPO


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


MP_TIMEOUT = 120  # seconds: a rank that skipped a collective would hang the other one


def spawn_two_ranks(fn, *args) -> None:
    """Run ``fn(rank, port, *args)`` on 2 gloo processes; fail (not hang) after MP_TIMEOUT seconds."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, rank, port, args)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(MP_TIMEOUT)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} rank(s) still running after {MP_TIMEOUT} s: a collective was skipped"
    assert [p.exitcode for p in procs] == [0, 0]


def _entry(fn, rank: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
