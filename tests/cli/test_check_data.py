"""``python -m grasp_lightning check-data`` on the sample dataset, clean and with injected faults."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from grasp_lightning.commands.check_data import main
from tests.helpers import REPO, SAMPLE, make_tar, qa_row, write_jsonl

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


def test_injected_faults_are_listed_exactly(tiny_model_path, in_repo, tmp_path, capsys):
    """Every fault, counted with each tiny family's processor (the token budget check tokenizes)."""
    root = tmp_path / "data"
    shutil.copytree(SAMPLE, root)
    expected = _inject(root)
    report_path = tmp_path / "report.json"
    rc = main([*CONFIGS, f"--data.source.root={root}", "--files=[train/data_sft.jsonl, train/data_rl.jsonl]",
               f"--model.policy.name_or_path={tiny_model_path}", "--workers=0", "--progress=false",
               f"--report={report_path}"])
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



# ------------------------------------------------------------------ new-user defects
def _report(tmp_path, *args) -> tuple[int, dict]:
    report_path = tmp_path / "report.json"
    rc = main([*CONFIGS, "--workers=0", "--progress=false", f"--report={report_path}", *args])
    return rc, json.loads(report_path.read_text())


def test_misnamed_train_file_is_reported(in_repo, tmp_path):
    rc, report = _report(tmp_path, "--data.source.train_file=train/typo.jsonl", "--decode=false")
    assert rc == 1
    assert [(p["where"], p["reason"]) for p in report["problems"]] == [
        ("grasp_lightning/assets/sample/train/typo.jsonl", "data.source.train_file not a GRASP file (expected data_sft.jsonl, data_rl.jsonl, "
                                       "annotations.jsonl, qa.jsonl or the bench)")]


def test_missing_root_reports_the_training_file(in_repo, tmp_path):
    rc, report = _report(tmp_path, "--data.source.root=/nonexistent", "--decode=false")
    assert rc == 1
    reasons = {p["where"]: p["reason"] for p in report["problems"]}
    assert reasons["/nonexistent/train/data_sft.jsonl"] == "data.source.train_file: no such file"
    assert reasons["/nonexistent/train/videos"] == "videos folder does not exist"


def test_empty_sft_target_is_reported_with_file_and_line(in_repo, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(SAMPLE, root)
    sft = root / "train" / "data_sft.jsonl"
    rows = _rows(sft)
    next(x for x in rows[20] if x["type"] == "text" and x.get("output"))["content"] = ""
    write_jsonl(sft, rows)
    rc, report = _report(tmp_path, f"--data.source.root={root}", "--files=[train/data_sft.jsonl]", "--decode=false")
    assert rc == 1
    assert [(p["where"], p["reason"]) for p in report["problems"]] == [
        (f"{sft}:21", "SFT needs an assistant target (an `output: true` text or `response`), this row's is empty")]


def test_rl_events_and_window_past_the_clip(in_repo, tmp_path):
    """An end past the clip is a problem; an unknown source or an unnamed person only a warning."""
    root = tmp_path / "data"
    shutil.copytree(SAMPLE, root)
    rl = root / "train" / "data_rl.jsonl"
    rows = _rows(rl)[:3]
    next(x for x in rows[0] if x["type"] == "meta")["gt_events"] = [{"source": "telepathy", "persons": [9]}]
    video = next(x for x in rows[1] if x["type"] == "video")
    video["end_seconds"] = 9999
    write_jsonl(rl, rows)
    rc, report = _report(tmp_path, f"--data.source.root={root}", "--files=[train/data_rl.jsonl]")
    assert rc == 1
    assert [(p["where"], p["check"]) for p in report["problems"]] == [(f"{rl}:2", "window")]
    assert report["problems"][0]["reason"].startswith("end_seconds 9999 is beyond the clip's duration of ")
    assert video["path"] in report["problems"][0]["reason"]
    assert [(p["where"], p["reason"]) for p in report["warnings"]] == [
        (f"{rl}:1", "meta.gt_events source(s) 'telepathy' unknown, read as gesture events"),
        (f"{rl}:1", next(w for w in report["warnings"] if "person(s) [9]" in w["reason"])["reason"])]
    assert report["files"]["train/data_rl.jsonl"]["warnings"] == 2


@pytest.mark.parametrize("flag, key", [("--data.video.fps=0", "data.video.fps"), ("--data.video.max_frames=0", "data.video.max_frames"),
                                       ("--data.video.max_pixels=-5", "data.video.max_pixels")])
def test_bad_numbers_stop_check_data_naming_the_key(in_repo, capsys, flag, key):
    assert main([*CONFIGS, flag, "--decode=false"]) == 2
    assert f"check-data: error: {key} must be " in capsys.readouterr().err


@pytest.mark.parametrize("group, kwargs, message", [
    ("video", {"fps": 0}, "data.video.fps must be a number > 0 (frames per second sampled from each clip), got 0"),
    ("video", {"fps": -2.0}, "data.video.fps must be a number > 0 (frames per second sampled from each clip), got -2.0"),
    ("video", {"max_frames": 0}, "data.video.max_frames must be an integer >= 1, got 0"),
    ("prompt", {"max_prompt_tokens": -1}, "data.prompt.max_prompt_tokens must be an integer >= 1 or null, got -1"),
    ("loader", {"batch_size": 0}, "data.loader.batch_size must be an integer >= 1, got 0"),
    ("errors", {"max_skip_fraction": 2}, "data.errors.max_skip_fraction must be a number in [0, 1], got 2"),
])
def test_datamodule_numbers(group, kwargs, message):
    from grasp_lightning.data import datamodule_config as config
    from grasp_lightning.errors import GraspConfigError

    cls = {"video": config.VideoConfig, "prompt": config.PromptConfig, "loader": config.LoaderConfig,
           "errors": config.ErrorConfig}[group]
    with pytest.raises(GraspConfigError) as err:
        cls(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("cls, kwargs, message", [
    ("RolloutConfig", {"max_new_tokens": 0}, "model.rollout.max_new_tokens must be an integer >= 1, got 0"),
    ("RolloutConfig", {"temperature": 0.0}, "model.rollout.temperature must be a number > 0, got 0.0"),
    ("OptimConfig", {"lr": -1.0}, "model.optim.lr must be a number > 0, got -1.0"),
    ("OptimConfig", {"warmup_steps": -3}, "model.optim.warmup_steps must be an integer >= 0, got -3"),
    ("EvalConfig", {"max_new_tokens": 0}, "model.evaluation.max_new_tokens must be an integer >= 1 or null, got 0"),
    ("ReleasedEvalConfig", {"max_frames": -1}, "model.evaluation.released.max_frames must be an integer >= 1, got -1"),
])
def test_module_config_numbers(cls, kwargs, message):
    import grasp_lightning.module as m
    from grasp_lightning.errors import GraspConfigError

    getattr(m, cls)()  # defaults are valid
    with pytest.raises(GraspConfigError) as err:
        getattr(m, cls)(**kwargs)
    assert str(err.value) == message


def test_counts_of_a_bad_file_add_up(in_repo, tmp_path, capsys):
    """Six RL rows: three unreadable (not JSON, no video spec twice) and one readable row with two
    problems (no participants, a missing clip). Before: "6 rows, 5 bad" with sources adding up to 3."""
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (root / "train" / "videos").symlink_to(SAMPLE / "train" / "videos")
    rows = _rows(SAMPLE / "train" / "data_rl.jsonl")[:3]
    next(x for x in rows[1] if x["type"] == "meta")["gt_events"] = []
    next(x for x in rows[1] if x["type"] == "video")["path"] = "social_gesture/video/missing.mp4"
    rl = root / "train" / "data_rl.jsonl"
    write_jsonl(rl, [*rows, "{not json", [], [{"type": "text", "content": "q"}]])
    sources = Counter(next(x for x in r if x["type"] == "video")["path"].split("/")[0] for r in rows)
    rc, report = _report(tmp_path, f"--data.source.root={root}", "--data.source.bench=null", "--files=[train/data_rl.jsonl]",
                         "--decode=false")
    info = report["files"]["train/data_rl.jsonl"]
    assert rc == 1 and len(report["problems"]) == 5  # 3 unreadable + 2 on row 2
    assert (info["rows"], info["unreadable"], info["bad"], info["problems"]) == (6, 3, 4, 5)  # rows 2, 4, 5, 6
    assert info["source"] == {**sources, "unreadable": 3}
    for key in ("source", "category", "difficulty", "format"):
        assert sum(info[key].values()) == 6, (key, info[key])
    assert "train/data_rl.jsonl: 6 rows, 4 bad (3 unreadable), 5 problem(s)" in capsys.readouterr().out


def test_sgr_before_the_sft_export_is_one_error_saying_what_to_do(tmp_path, monkeypatch):
    """configs/sgr.yaml starts from runs/sft/export: before the SFT stage has written it, check-data (a
    real process) stops with one line naming the key, the path and the two commands that write it, and
    plan-memory notes the same words (about 40 traceback lines ending in transformers' "Repo id must be
    in the form 'repo_name' or 'namespace/repo_name'" before)."""
    from grasp_lightning.commands.plan_memory import plan_from_config
    from grasp_lightning.policy import missing_model_message

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning", "check-data", "--config", "configs/sgr.yaml",
                           f"--data.source.root={SAMPLE}", "--workers=0", "--progress=false"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = missing_model_message("runs/sft/export")
    assert f"error: GraspConfigError: {message}\n" in proc.stderr
    assert message.startswith("model.policy.name_or_path: model 'runs/sft/export' is not on this machine")
    assert "run the SFT stage and export it first" in message and "--out runs/sft/export" in message
    assert "Traceback" not in proc.stderr and "Repo id" not in proc.stderr
    monkeypatch.chdir(tmp_path)  # no runs/sft/export here
    plan = plan_from_config([REPO / "configs/sgr.yaml"], video_seconds=4)
    assert any(note.startswith(message) for note in plan.notes), plan.notes


def test_check_data_reports_generic_qa_problems_by_file_and_line(qa_dir, in_repo, tmp_path):
    (tmp_path / "media").symlink_to(qa_dir / "media")
    (tmp_path / "garbage.jpg").write_bytes(b"\xff\xd8 broken")
    rows = [qa_row(), qa_row(image="garbage.jpg"), qa_row(image=None), qa_row(image="media/gone.png"),
            qa_row(image=None, video="media/clip.mp4", end=30.0), qa_row(answer=None),
            qa_row(image=None, video="media/clip.mp4", start=25.0)]
    path = write_jsonl(tmp_path / "qa.jsonl", [{**row, "id": f"row{n}"} for n, row in enumerate(rows)])
    report_path = tmp_path / "report.json"
    rc = main(["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--workers=0", "--progress=false",
               f"--report={report_path}", f"--data.source.root={tmp_path}", "--data.source.train_file=qa.jsonl", "--data.source.bench=null"])
    report = json.loads(report_path.read_text())
    assert rc == 1 and report["files"]["qa.jsonl"]["rows"] == 7 and report["files"]["qa.jsonl"]["bad"] == 6
    reasons = {p["where"].split(" (")[0]: p["reason"] for p in report["problems"]}
    assert set(reasons) == {f"{path}:{n}" for n in (2, 3, 4, 5, 6, 7)}, reasons
    # a start past the clip's end names the start ("empty time window [d, d) s" before)
    assert re.search(r"start_seconds 25 is at or past the end of the clip \(\d+\.\d{3} s\): its window holds no frame",
                     reasons[f"{path}:7"]), reasons[f"{path}:7"]
    assert reasons[f"{path}:6"].startswith("GRPO needs an 'answer'")
    assert reasons[f"{path}:2"].startswith("unreadable image")
    assert "neither 'video' nor 'image'" in reasons[f"{path}:3"]
    assert "media/gone.png not found" in reasons[f"{path}:4"]
    assert reasons[f"{path}:5"].startswith("end_seconds 30 is beyond the clip's duration")
