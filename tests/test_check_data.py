"""``python -m grasp_lightning check-data`` on the sample dataset, clean and with injected faults."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from grasp_lightning.check_data import main

from .conftest import REPO, SAMPLE
from .data_fixtures import make_tar, write_jsonl

CONFIGS = ["--config", "configs/sft.yaml", "--config", "configs/demo.yaml"]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for the in-process decoding (fast on a busy 2-core machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rows(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _inject(root: Path) -> set[tuple[str, str]]:
    """Break the copy of the sample data at ``root`` in eight ways; return the expected
    ``(where, check)`` of every problem."""
    sft, rl = root / "train" / "data_sft.jsonl", root / "train" / "data_rl.jsonl"
    videos = root / "train" / "videos"
    s_rows, r_rows = _rows(sft), _rows(rl)
    # SFT row 2: its clip is missing; row 3: its clip is garbage (an extracted file shadows the shard);
    # row 5: the prompt is far over the 2048-token budget of demo.yaml.
    next(x for x in s_rows[1] if x["type"] == "video")["path"] = "werewolf/video/no_such_clip.mp4"
    garbage = next(x for x in s_rows[2] if x["type"] == "video")["path"]
    (videos / garbage).parent.mkdir(parents=True, exist_ok=True)
    (videos / garbage).write_bytes(b"\x00\x00\x00\x18ftypisom but not a video")
    user = next(x for x in s_rows[4] if x["type"] == "text" and not x.get("output"))
    user["content"] += " Person 0 waves." * 1500
    write_jsonl(sft, s_rows)
    # RL row 1: answer E is not an option; row 4: no ground-truth participants; row 6: the clip is a
    # link member of a hostile shard (never indexed); line 25: not JSON.
    next(x for x in r_rows[0] if x["type"] == "text" and x.get("output"))["content"] = "E"
    next(x for x in r_rows[3] if x["type"] == "meta")["gt_events"] = []
    next(x for x in r_rows[5] if x["type"] == "video")["path"] = "social_gesture/video/link.mp4"
    write_jsonl(rl, [*r_rows, "{not json"])
    # A hostile shard (absolute path, '..', symlink, hard link) and a truncated one.
    evil = make_tar(videos / "evil_part000.tar", {"/abs.mp4": b"x", "../escape.mp4": b"x"},
                    symlinks={"social_gesture/video/link.mp4": "/etc/passwd"},
                    hardlinks={"social_gesture/video/hard.mp4": "/etc/shadow"})
    cut = videos / "cut_part000.tar"
    shutil.copy(videos / "werewolf_part000.tar", cut)
    os.truncate(cut, cut.stat().st_size // 2)
    with tarfile.open(evil) as tf:
        evil_names = [m.name for m in tf.getmembers()]
    expected = {(f"{sft}:2", "ClipNotFoundError"), (f"{sft}:3", "ClipDecodeError"), (f"{sft}:5", "TokenBudgetError"),
                (f"{rl}:1", "format"), (f"{rl}:4", "participants"), (f"{rl}:6", "ClipNotFoundError"),
                (f"{rl}:25", "format")}
    expected |= {(f"{evil}:{name}", "archive") for name in evil_names}
    return expected


def test_injected_faults_are_listed_exactly(in_repo, tmp_path, capsys):
    root = tmp_path / "data"
    shutil.copytree(SAMPLE, root)
    expected = _inject(root)
    report_path = tmp_path / "report.json"
    rc = main([*CONFIGS, f"--data.root={root}", "--files=[train/data_sft.jsonl, train/data_rl.jsonl]",
               "--workers=0", "--progress=false", f"--report={report_path}"])
    assert rc == 1
    report = json.loads(report_path.read_text())
    problems = report["problems"]
    cut = [p for p in problems if "cut_part000.tar" in p["where"]]
    assert len(cut) == 1 and "truncated" in cut[0]["reason"]  # the truncated shard, once
    found = {(p["where"].split(" (")[0], p["check"]) for p in problems if p not in cut}
    assert found == expected
    assert len(problems) == len(expected) + 1
    reasons = {p["where"].split(" (")[0]: p["reason"] for p in problems}
    assert "'E' is not among the option letters ABCD" in reasons[f"{root}/train/data_rl.jsonl:1"]
    assert "over the budget of 2048" in reasons[f"{root}/train/data_sft.jsonl:5"]
    assert report["files"]["train/data_rl.jsonl"]["rows"] == 25 and report["files"]["train/data_rl.jsonl"]["bad"] == 4
    assert not (root / "escape.mp4").exists() and not (root.parent / "escape.mp4").exists()
    out = capsys.readouterr().out
    assert f"{root}/train/data_sft.jsonl:5: prompt has" in out and f"{len(problems)} problem(s):" in out


@pytest.mark.slow
def test_clean_sample_passes_with_counts_in_a_subprocess(tmp_path):
    """The real command: all CPU cores, a progress bar, exit status 0, counts per category."""
    report = tmp_path / "r.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning", "check-data", *CONFIGS,
                           "--files=[train/data_rl.jsonl, test/grasp_bench.tar]", f"--report={report}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 problem(s); the data is ready for training." in proc.stdout
    assert "check-data: 100%" in proc.stderr and "56/56" in proc.stderr  # 24 RL rows + 32 bench items
    files = json.loads(report.read_text())["files"]
    assert files["test/grasp_bench.tar"]["category"] == {c: 2 for c in files["test/grasp_bench.tar"]["category"]}
    assert len(files["test/grasp_bench.tar"]["category"]) == 16
    assert files["train/data_rl.jsonl"]["format"] == {"mcq": 24}

