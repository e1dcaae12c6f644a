"""Fixtures shared by ``tests/`` and ``experiments/`` (pytest finds them here; neither imports the other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent


def _run_script(args: list[str], timeout: float = 900) -> dict:
    """Run ``python <script> ...`` from the repository root; its last stdout line parsed as JSON.

    Raises:
        AssertionError: the script exited non-zero or printed no line starting with ``{`` (with the
            tails of its stdout and stderr).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{args} printed no JSON line:\n{proc.stdout[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def run_script():
    """``run_script(args, timeout=900) -> dict``: a benchmark or experiment script run as its docs say
    (``python <script> ...`` from the repository root), its last JSON line returned."""
    return _run_script
