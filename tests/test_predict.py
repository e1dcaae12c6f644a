"""``predict``: the README's command answers the bench, one JSON line per item written as it goes; a
killed run keeps its lines and the same command finishes it; bad settings and bad items are named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grasp_lightning.data.formats import read_bench
from grasp_lightning.errors import GraspConfigError, GraspDataError
from grasp_lightning.parsing import extract_answer
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow
SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"
README_PREDICT = ["predict", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"]
FIELDS = {"id", "origin", "video", "image", "question", "completion", "answer", "target", "correct", "participants", "category",
          "prompt_tokens", "completion_tokens", "seconds"}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_readme_predict_answers_every_bench_item(tmp_path, in_repo) -> None:
    cli = run_cli(README_PREDICT, tmp_path)
    out = Path(cli.trainer.log_dir) / "predictions.jsonl"
    records = lines(out)
    bench = read_bench(SAMPLE / "test" / "grasp_bench.tar")
    assert [r["id"] for r in records] == [item.uid for item in bench]  # every item once, in bench order
    assert all(set(r) == FIELDS for r in records)
    by_id = {item.uid: item for item in bench}
    for r in records:
        item = by_id[r["id"]]
        assert r["target"] == item.answer and r["category"] == item.category and r["video"] == item.clip.path and r["image"] is None
        assert r["answer"] == extract_answer(r["completion"])  # the bench's ABCD letters
        assert r["correct"] == (r["answer"] == item.answer)
        assert 0 < r["completion_tokens"] <= cli.model.eval_cfg.max_new_tokens  # configs/demo.yaml's budget
        assert r["prompt_tokens"] > 100 and r["seconds"] > 0


def predict_command(tmp_path: Path, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grasp_lightning", *README_PREDICT, "--config", "configs/predict.yaml",
            f"--trainer.callbacks.init_args.output={output}", f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--data.val_batch_size=1", "--model.evaluation.max_new_tokens=24", *extra]


def test_a_killed_predict_keeps_its_lines_and_the_same_command_finishes_it(tmp_path, in_repo) -> None:
    whole, resumed = tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run(predict_command(tmp_path, whole), check=True, env=env, capture_output=True, timeout=300)
    reference = {r["id"]: r["completion"] for r in lines(whole)}
    assert len(reference) == 32
    proc = subprocess.Popen(predict_command(tmp_path, resumed, "--model.evaluation.max_new_tokens=24"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (not resumed.exists() or resumed.read_text().count("\n") < 3):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = resumed.read_text()
    n_kept = kept.count("\n")
    assert 3 <= n_kept < 32, f"the kill came after {n_kept} lines"
    subprocess.run(predict_command(tmp_path, resumed), check=True, env=env, capture_output=True, timeout=300)
    final = lines(resumed)
    assert resumed.read_text().startswith(kept[: kept.rfind("\n") + 1])  # the lines written before the kill stay
    assert sorted(r["id"] for r in final) == sorted(reference)  # each item once: none lost, none repeated
    assert {r["id"]: r["completion"] for r in final} == reference  # greedy: the same answers as one run


def test_predict_without_a_writer_and_a_corrupt_output_are_named(tmp_path, in_repo) -> None:
    cfg = tmp_path / "no_writer.yaml"
    cfg.write_text("trainer:\n  callbacks: []\n")
    with pytest.raises(GraspConfigError, match="callbacks.predictions.PredictionWriter"):
        run_cli([*README_PREDICT, "--config", str(cfg)], tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\nnot json\n')
    with pytest.raises(GraspDataError, match=rf"{bad}:2: not a JSON line of predictions"):
        run_cli([*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={bad}"],
                tmp_path)


def test_predict_file_with_a_missing_clip_writes_the_skip(tmp_path, in_repo) -> None:
    rows = [json.loads(line) for line in (SAMPLE / "train" / "data_rl.jsonl").read_text().splitlines()[:3]]
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    os.symlink(SAMPLE / "train" / "videos", root / "train" / "videos")
    rows[1][0]["path"] = "social_gesture/video/missing_qa0000.mp4"
    (root / "train" / "data_rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "p.jsonl"
    run_cli([*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={out}",
             f"--data.root={root}", "--data.predict_file=train/data_rl.jsonl", "--data.on_bad_item=skip"], tmp_path)
    records = lines(out)
    assert len(records) == 3
    skipped = [r for r in records if "skipped" in r]
    assert len(skipped) == 1 and "missing_qa0000.mp4" in skipped[0]["origin"], skipped
    assert skipped[0]["skipped"].startswith("clip not found") and skipped[0]["id"] == "data_rl:2"
    assert all(r["completion"] is not None for r in records if "skipped" not in r)


def test_predict_on_generic_qa_rows_with_images_and_a_rerun_after_the_end(tmp_path, in_repo) -> None:
    from tests.data_fixtures import make_qa_dataset

    make_qa_dataset(tmp_path / "mine")
    out = tmp_path / "qa_predictions.jsonl"
    args = [*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={out}",
            f"--data.root={tmp_path / 'mine'}", "--data.predict_file=qa.jsonl", "--data.val_batch_size=3"]
    run_cli(args, tmp_path)
    records = lines(out)
    assert [r["id"] for r in records] == ["qa_0001", "qa_0002", "qa_0003", "qa_0004"]  # 3 + 1 rows, none lost
    assert [(r["image"] is not None, r["video"] is not None) for r in records] == [
        (True, False), (False, True), (True, False), (True, True)]
    assert [r["target"] for r in records] == ["B", "A", "C", "D"] and records[0]["category"] == "gaze"
    before = out.read_text()
    run_cli(args, tmp_path)  # everything answered: the rerun has nothing to do, and says so
    assert out.read_text() == before
