"""``predict``: the command of docs/predict.md answers the bench, one JSON line per item written as it goes; a
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
import yaml

from grasp_lightning.data.formats import read_bench
from grasp_lightning.errors import GraspConfigError, GraspDataError
from grasp_lightning.parsing import extract_answer
from tests.helpers import REPO, run_cli

pytestmark = pytest.mark.slow
SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"
README_PREDICT = ["predict", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"]
FIELDS = {"id", "item_key", "origin", "video", "image", "question", "completion", "answer", "target", "correct", "participants",
          "category", "prompt_tokens", "completion_tokens", "seconds", "model", "checkpoint", "decoding", "setup"}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_readme_predict_answers_every_bench_item(tmp_path, in_repo) -> None:
    cli = run_cli(README_PREDICT, tmp_path)
    out = tmp_path / "demo" / "predictions.jsonl"  # <save_dir>/<name>: the same file for the next run
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
        budget = cli.model.eval_cfg.max_new_tokens  # configs/demo.yaml's budget
        assert 0 < r["completion_tokens"] <= budget and r["prompt_tokens"] > 100 and r["seconds"] > 0
        assert r["model"] == "grasp_lightning/assets/tiny-qwen3vl" and r["checkpoint"] is None
        assert r["decoding"]["max_new_tokens"] == budget and r["decoding"]["do_sample"] is False
    assert len({r["item_key"] for r in records}) == 32 and len({r["setup"] for r in records}) == 1


def predict_command(tmp_path: Path, output: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "grasp_lightning", *README_PREDICT, "--config", "configs/predict.yaml",
            f"--trainer.callbacks.init_args.output={output}", f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--data.loader.val_batch_size=1", "--model.evaluation.max_new_tokens=24", *extra]


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
    with pytest.raises(GraspConfigError, match="grasp_lightning.callbacks.prediction_writer.PredictionWriter"):
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
             f"--data.source.root={root}", "--data.source.predict_file=train/data_rl.jsonl", "--data.errors.on_bad_item=skip"], tmp_path)
    records = lines(out)
    assert len(records) == 3
    skipped = [r for r in records if "skipped" in r]
    assert len(skipped) == 1 and "missing_qa0000.mp4" in skipped[0]["origin"], skipped
    assert skipped[0]["skipped"].startswith("clip not found") and skipped[0]["id"] == "data_rl:2"
    assert all(r["completion"] is not None for r in records if "skipped" not in r)


def test_predict_on_generic_qa_rows_with_images_and_a_rerun_after_the_end(tmp_path, in_repo) -> None:
    from tests.helpers import make_qa_dataset

    make_qa_dataset(tmp_path / "mine")
    out = tmp_path / "qa_predictions.jsonl"
    args = [*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={out}",
            f"--data.source.root={tmp_path / 'mine'}", "--data.source.predict_file=qa.jsonl", "--data.loader.val_batch_size=3"]
    run_cli(args, tmp_path)
    records = lines(out)
    assert [r["id"] for r in records] == ["qa_0001", "qa_0002", "qa_0003", "qa_0004"]  # 3 + 1 rows, none lost
    assert [(r["image"] is not None, r["video"] is not None) for r in records] == [
        (True, False), (False, True), (True, False), (True, True)]
    assert [r["target"] for r in records] == ["B", "A", "C", "D"] and records[0]["category"] == "gaze"
    before = out.read_text()
    run_cli(args, tmp_path)  # everything answered: the rerun has nothing to do, and says so
    assert out.read_text() == before


# ------------------------------------------------------------------ the docs' commands, run twice
def readme_predict_commands() -> list[list[str]]:
    """The arguments of every ``python -m grasp_lightning predict`` line of docs/predict.md's Quick start."""
    from tests.helpers import blocks, command, section

    text = section("## Quick start", "docs/predict.md")
    found = []
    for block in blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if "grasp_lightning predict" in line:
                found.append(command(line.split("#")[0]))
    return found


def answered(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "already answered" in r.getMessage()]


def test_readme_predict_twice_answers_each_item_once_and_another_model_again(tmp_path, in_repo, caplog) -> None:
    """Before: two runs of the docs' bench command wrote version_0 and version_1, 4 lines each (8 answers
    of 4 items); a second model with configs/predict.yaml wrote nothing. After: one file, 4 lines, then 4
    more for each other model or decoding."""
    bench_cmd = readme_predict_commands()[0]
    assert bench_cmd == README_PREDICT
    args = [*bench_cmd, "--data.source.predict_limit=4"]
    out = tmp_path / "demo" / "predictions.jsonl"
    run_cli(args, tmp_path)
    first = out.read_text()
    assert len(lines(out)) == 4 and not answered(caplog)
    caplog.clear()
    run_cli(args, tmp_path)  # the same command: the same file, nothing answered again
    assert out.read_text() == first
    assert answered(caplog) == ["predict: 4 of 4 items of grasp_bench were already answered by this model and decoding "
                                "(in the prediction file): left out, 0 left to answer"]
    assert sorted(p.name for p in out.parent.rglob("predictions*.jsonl")) == ["predictions.jsonl"]
    caplog.clear()
    qwen35 = "grasp_lightning/assets/tiny-qwen3_5"
    run_cli([*args, f"--model.policy.name_or_path={qwen35}"], tmp_path)  # another model: every item again
    run_cli([*args, "--model.evaluation.max_new_tokens=6"], tmp_path)  # other decoding: every item again
    assert not answered(caplog)
    records = lines(out)
    assert out.read_text().startswith(first) and len(records) == 12
    by_run = [records[:4], records[4:8], records[8:]]
    assert [[r["id"] for r in run] for run in by_run] == [[r["id"] for r in by_run[0]]] * 3
    assert [{r["model"] for r in run} for run in by_run] == [{"grasp_lightning/assets/tiny-qwen3vl"}, {qwen35},
                                                             {"grasp_lightning/assets/tiny-qwen3vl"}]
    budget = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())["model"]["evaluation"]["max_new_tokens"]
    assert [{r["decoding"]["max_new_tokens"] for r in run} for run in by_run] == [{budget}, {budget}, {6}]
    assert len({r["setup"] for r in records}) == 3 and all(len({r["setup"] for r in run}) == 1 for run in by_run)
    assert all(r["completion_tokens"] <= 6 for r in by_run[2])
    caplog.clear()
    run_cli([*args, f"--model.policy.name_or_path={qwen35}"], tmp_path)  # the second model's answers are found
    assert len(lines(out)) == 12 and len(answered(caplog)) == 1


def test_readme_predict_on_your_own_questions_runs_as_written(tmp_path, in_repo, caplog) -> None:
    """The docs' second command (its own file name ``questions.jsonl``: refused before, as the reader
    wanted a name starting with ``qa``), made a CPU run by configs/demo.yaml after the recipe, twice; the
    resume key does not depend on ``data.source.root``: the same file under another root is found again."""
    from tests.helpers import make_qa_dataset

    cmd = readme_predict_commands()[1]
    assert cmd[cmd.index("--data.source.predict_file") + 1] == "questions.jsonl"
    mine = tmp_path / "mine"
    make_qa_dataset(mine, name="questions.jsonl")
    values = {"runs/sgr/export": "grasp_lightning/assets/tiny-qwen3_5", "/data/mine": str(mine)}
    args = [values.get(word, word) for word in cmd]
    args[args.index("configs/sgr.yaml") + 1: args.index("configs/sgr.yaml") + 1] = ["--config", "configs/demo.yaml"]
    out = tmp_path / "answers.jsonl"
    args += [f"--trainer.callbacks.init_args.output={out}"]
    run_cli(args, tmp_path)
    records = lines(out)
    assert [r["id"] for r in records] == ["qa_0001", "qa_0002", "qa_0003", "qa_0004"]
    assert {r["model"] for r in records} == {"grasp_lightning/assets/tiny-qwen3_5"}
    moved = tmp_path / "elsewhere"
    mine.rename(moved)  # another data.source.root (and working directory): the same items, found by their keys
    args[args.index(str(mine))] = str(moved)
    run_cli(args, tmp_path)
    assert len(lines(out)) == 4
    assert answered(caplog) == [f"predict: 4 of 4 items of {moved / 'questions.jsonl'} were already answered by this "
                                f"model and decoding (in the prediction file): left out, 0 left to answer"]


def test_a_checkpoint_is_part_of_the_setup(tmp_path, in_repo, caplog) -> None:
    """``predict --ckpt_path``: the restored checkpoint (known only after the restore, before the loader is
    built) keys the answers: the same model and decoding without it answers again; with it, once."""
    fit = ["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", "--trainer.max_steps=1",
           "--data.source.bench=null", "--data.source.train_limit=2", "--trainer.logger.init_args.name=ck"]
    cli = run_cli(fit, tmp_path)
    (ckpt,) = Path(cli.trainer.log_dir).rglob("last.ckpt")
    out = tmp_path / "p.jsonl"
    args = ["predict", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", "--data.source.predict_limit=2",
            f"--trainer.callbacks=[{{class_path: grasp_lightning.callbacks.prediction_writer.PredictionWriter, init_args: {{output: {out}}}}}]"]
    run_cli(args, tmp_path)
    run_cli([*args, f"--ckpt_path={ckpt}"], tmp_path)
    assert not answered(caplog)
    run_cli([*args, f"--ckpt_path={ckpt}"], tmp_path)
    assert len(answered(caplog)) == 1
    records = lines(out)
    assert [r["checkpoint"] for r in records] == [None, None, str(ckpt), str(ckpt)]
    assert len({r["setup"] for r in records}) == 2


def test_item_key_ignores_folders_and_lines_and_files_signature_sees_new_weights(tmp_path) -> None:
    import dataclasses
    import shutil

    from grasp_lightning.data.records import ClipRef, GraspItem
    from grasp_lightning.predictions import files_signature, item_key

    item = GraspItem(uid="q1", origin="/data/a/questions.jsonl:3", clip=ClipRef("clips/c.mp4", start_seconds=1.0),
                     question="Who waves?\nA) Person 0\nB) Person 1", options=("A) Person 0", "B) Person 1"), answer="A")
    moved = dataclasses.replace(item, origin="/elsewhere/questions.jsonl:9", clip=ClipRef("/elsewhere/clips/c.mp4",
                                                                                           start_seconds=1.0))
    assert item_key(moved) == item_key(item)
    for change in ({"question": "Who nods?\nA) Person 0\nB) Person 1"}, {"answer": "B"}, {"uid": "q2"},
                   {"clip": ClipRef("clips/c.mp4", start_seconds=2.0)}, {"clip": ClipRef("clips/d.mp4", start_seconds=1.0)},
                   {"image": "img.png"}):
        assert item_key(dataclasses.replace(item, **change)) != item_key(item), change
    model = tmp_path / "export"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    before = files_signature(model)
    shutil.copytree(model, tmp_path / "copy")  # copy2 keeps the modification times: the same model
    assert files_signature(tmp_path / "copy") == before
    os.utime(model / "model.safetensors", ns=(1, 1))  # re-exported weights: a new modification time
    assert files_signature(model) != before


def test_a_prompt_setting_answers_again_and_an_old_key_is_named(tmp_path, in_repo, caplog) -> None:
    """Before: after ``--data.video.frame_max_tokens 4`` (prompts of 202 tokens instead of 254) predict said
    "3 of 3 items ... already answered ... 0 left to answer" and wrote nothing. After: the 3 items are answered
    again under a new setup key; the same command then finds them. Lines written under an older key of the same
    model, checkpoint and decoding (a file of a grasp_lightning whose key left such settings out) are kept, and a
    WARNING says why their items are answered again."""
    out = tmp_path / "p.jsonl"
    args = [*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={out}",
            "--data.source.predict_limit=3"]
    run_cli(args, tmp_path)
    first = lines(out)
    assert len(first) == 3 and not answered(caplog)
    run_cli([*args, "--data.video.frame_max_tokens", "4"], tmp_path)
    assert not answered(caplog)
    records = lines(out)
    assert len(records) == 6 and [r["id"] for r in records[3:]] == [r["id"] for r in first]
    assert len({r["setup"] for r in records[:3]}) == len({r["setup"] for r in records[3:]}) == 1
    assert records[0]["setup"] != records[3]["setup"]
    assert [r["prompt_tokens"] for r in first] != [r["prompt_tokens"] for r in records[3:]]
    assert all(r["prompt_tokens"] < f["prompt_tokens"] for r, f in zip(records[3:], first, strict=True))
    run_cli([*args, "--data.video.frame_max_tokens", "4"], tmp_path)
    assert answered(caplog) == ["predict: 3 of 3 items of grasp_bench were already answered by this model and "
                                "decoding (in the prediction file): left out, 0 left to answer"]
    # a file of an older key: the same model, checkpoint and decoding under another setup key
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps({**r, "setup": "0123456789abcdef"}) + "\n" for r in first))
    caplog.clear()
    run_cli([*README_PREDICT, "--config", "configs/predict.yaml", f"--trainer.callbacks.init_args.output={old}",
             "--data.source.predict_limit=3"], tmp_path)
    assert not answered(caplog) and len(lines(old)) == 6
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "another `setup` key" in r.getMessage()]
    assert warned == [f"predict: {old} holds 3 answers of this model, checkpoint and decoding under another `setup` key: "
                      "another prompt, frame, engine or dtype setting (data.video, data.prompt, model.rollout.vllm, ...), "
                      "or a file written before the key covered every such setting (e.g. data.video.frame_max_tokens, "
                      "model.rollout.vllm.dtype). They are kept, not reused: their items are answered again (resume: "
                      "false starts the file afresh)"]
