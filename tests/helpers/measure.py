"""A command in a child process, measured: its peak resident memory and the models it loads
(:func:`run_measured`), and the run state a checkpoint holds besides the weights (:func:`run_state_tensors`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.paths import REPO

#: What a CPU process adds to ``plan-memory``'s GPU figure (GiB; measured on the size tier's commands): the
#: interpreter with torch, Lightning, transformers and the tokenizer (about 0.9 GiB), the pages of the bf16 weight
#: file while it is read (up to 1 GiB at the 2B widths), and the allocator's slack.
PROCESS_GIB = 2.5

#: The command line in a child process that records each model it loads (``AutoModelForImageTextToText.from_pretrained``:
#: the policy, a reference and export's base all go through it) to the file ``$GRASP_MODEL_LOADS``, one path a line.
_MEASURED_MAIN = """
import os, sys
from transformers import AutoModelForImageTextToText as Auto
real = Auto.from_pretrained.__func__
def counting(cls, name, *args, **kwargs):
    with open(os.environ["GRASP_MODEL_LOADS"], "a") as f:
        f.write(str(name) + "\\n")
    return real(cls, name, *args, **kwargs)
Auto.from_pretrained = classmethod(counting)
from grasp_lightning.__main__ import main
try:
    code = main(sys.argv[1:])
finally:  # this process's own high-water mark (since exec: not the parent's, as ru_maxrss would carry over)
    with open(os.environ["GRASP_PEAK_RSS"], "w") as f:
        f.write(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
sys.exit(code)
"""


def run_measured(args: list[str], out: Path, timeout: float = 600.0) -> dict:
    """Run ``python -m grasp_lightning ARGS`` in a child process from the repository root and measure it.

    Returns ``{"peak_rss": bytes, "loads": [model paths], "seconds": wall time, "log": the output}``. The peak
    is the child's own resident set at its highest, as the kernel counted it (``VmHWM`` of
    ``/proc/self/status``, read by the child as it ends): the interpreter, the libraries, the models, every
    tensor and the pages of memory-mapped weight files it touched; not its children (none:
    ``num_workers=0``). ``ru_maxrss`` of ``wait4`` would not do: Linux carries the parent's high-water mark
    over into it at ``exec``.

    Raises:
        AssertionError: the command failed or ran past ``timeout`` seconds (the output's tail is shown).
    """
    out.mkdir(parents=True, exist_ok=True)
    loads, log, peak = out / "model_loads.txt", out / "output.log", out / "peak_rss_kib.txt"
    loads.unlink(missing_ok=True)
    env = {**os.environ, "GRASP_MODEL_LOADS": str(loads), "GRASP_PEAK_RSS": str(peak), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURED_MAIN, *args], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
        deadline = start + timeout
        while True:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status = os.waitpid(proc.pid, 0)
                break
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    text = log.read_text()
    assert proc.returncode == 0 and seconds <= timeout, (args[0], proc.returncode, f"{seconds:.0f} s", text[-4000:])
    return {"peak_rss": int(peak.read_text()) * 1024, "loads": loads.read_text().split() if loads.exists() else [],
            "seconds": seconds, "log": text}


def run_state_tensors(checkpoint: dict) -> dict:
    """Every tensor of ``checkpoint`` outside the weights and the optimizer state, by path."""
    import torch

    found: dict = {}

    def walk(x, path: str) -> None:
        if torch.is_tensor(x):
            found[path] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}/{k}")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")

    for key, value in checkpoint.items():
        if key not in ("state_dict", "optimizer_states"):
            walk(value, key)
    return found
