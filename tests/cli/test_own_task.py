"""The docs' own-task examples, run as written: the reward file and its `fit` command, the Task class and its
`fit` command (docs/own-task.md), and the generic QA rows and suite (docs/data.md)."""

from __future__ import annotations

import json
import re

import pytest

from grasp_lightning.data.records import ClipRef, GraspItem
from grasp_lightning.grpo.rewards import compute_rewards
from tests.helpers import REPO, blocks, command, run_cli, scalars, section

OWN_TASK = "docs/own-task.md"
DATA = "docs/data.md"


def test_readme_reward_example_scores_and_trains(tmp_path, monkeypatch) -> None:
    text = section("### A reward of your own", OWN_TASK)
    (code,) = blocks(text, "python")
    (tmp_path / "my_rewards.py").write_text(code)
    for name in ("configs", "grasp_lightning"):  # the page's command runs from the repository root
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    item = GraspItem(uid="x", origin="t:1", clip=ClipRef("c.mp4"), question="q", answer="B")
    short, long = "<think>" + "word " * 60 + "</think><answer>B</answer>", "<think>" + "word " * 61 + "</think><answer>B</answer>"
    out = compute_rewards([short, long, "<think>x</think><answer>A</answer>"], [item] * 3, ["my_rewards.py:brief_and_right"])
    assert out[:, 0].tolist() == [1.0, 0.5, 0.0]
    (fit,) = blocks(text, "bash")
    args = command(fit)
    assert args[0] == "fit" and "my_rewards.py:brief_and_right]" in " ".join(args)
    cli = run_cli([*args, "--trainer.max_steps=1", "--data.source.bench=null", "--data.loader.num_workers=0",
                   "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8"], tmp_path)
    series = scalars(cli.trainer.log_dir)
    assert len(series["train/rewards/brief_and_right/mean"]) == 1  # the term is logged under its function's name
    assert cli.model.task.reward_labels[-1] == "brief_and_right"


def test_readme_qa_rows_and_suite_read_as_documented(tmp_path) -> None:
    import json

    import yaml

    from grasp_lightning.data.qa import read_qa
    from grasp_lightning.plugins import load_object
    from tests.helpers import make_image, make_mp4

    text = section("### Your own data", DATA)
    (rows,) = blocks(text, "json")
    (tmp_path / "clips").mkdir()
    (tmp_path / "images").mkdir()
    (tmp_path / "clips" / "kitchen.mp4").write_bytes(make_mp4(n_frames=16, fps=2))
    (tmp_path / "images" / "meeting.jpg").write_bytes(make_image(fmt="JPEG"))
    (tmp_path / "qa.val.jsonl").write_text(rows)
    items = read_qa(tmp_path / "qa.val.jsonl")
    first, second = items
    assert [json.loads(line)["id"] for line in rows.splitlines()] == [first.uid, second.uid]
    assert first.media == ("video",) and first.clip.start_seconds == 0.0 and first.clip.end_seconds == 6.0
    assert first.options == ("A) Person 1", "B) Person 2", "C) No one") and first.participants == {0, 1}
    assert second.media == ("image",) and second.answer == "B" and second.response.endswith("<answer>B</answer>")
    (suite_yaml,) = blocks(text, "yaml")
    (spec,) = yaml.safe_load(suite_yaml)["data"]["eval_suites"]
    suite = load_object(spec["class_path"])(**{**spec["init_args"], "path": str(tmp_path / "qa.val.jsonl")})
    suite.load()
    assert suite.name == "mine" and [item.uid for item in suite.items] == [first.uid, second.uid]


def test_docs_task_example_trains_through_the_cli(tmp_path, monkeypatch) -> None:
    """The Task of docs/own-task.md, written to ``my_tasks.py`` and named by ``--model.task``: one SFT step whose
    loss is the label-smoothed cross-entropy of the response tokens, and whose metric is logged under train/."""
    text = section("### A Task of your own", OWN_TASK)
    (code,) = blocks(text, "python")
    (tmp_path / "my_tasks.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for name in ("configs", "grasp_lightning"):
        (tmp_path / name).symlink_to(REPO / name)
    import importlib

    import torch
    import torch.nn.functional as F

    from grasp_lightning.data.prompts import IGNORE_INDEX

    my_tasks = importlib.import_module("my_tasks")
    # the loss against torch's own label-smoothed cross-entropy written out by hand: (1 - e) * nll + e * mean(-logp)
    logits = torch.randn(1, 4, 5)
    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 3, 1]])

    class Policy(torch.nn.Module):
        def forward(self, **_):
            return type("Out", (), {"logits": logits})()

    ctx = type("Ctx", (), {"policy": Policy()})()
    batch = type("B", (), {"inputs": {"input_ids": torch.zeros(1, 4, dtype=torch.long), "labels": labels}})()
    out = my_tasks.SmoothedSFT(label_smoothing=0.2).training_step(ctx, batch)
    logp = F.log_softmax(logits[0, 1:3], -1)  # positions predicting tokens 2 and 3
    expected = (0.8 * -logp[[0, 1], [3, 1]] + 0.2 * -logp.mean(-1)).mean()
    assert torch.allclose(out.loss, expected)
    (fit,) = blocks(text, "bash")
    args = command(fit)
    assert args[0] == "fit" and "my_tasks.SmoothedSFT" in args
    cli = run_cli([*args, "--trainer.max_steps=1", "--data.source.bench=null", "--data.loader.num_workers=0"], tmp_path)
    assert type(cli.model.task).__name__ == "SmoothedSFT" and cli.model.task.label_smoothing == 0.2
    series = scalars(cli.trainer.log_dir)
    assert [value for _, value in series["train/label_smoothing"]] == [pytest.approx(0.2)]
    assert len(series["train/loss"]) == 1


def test_docs_item_example_reads_a_column_of_the_row(tmp_path) -> None:
    """docs/own-task.md "The item a reward receives": its reward reads ``item.extra["weight"]``, a column of a
    generic QA row that the format does not know, kept on the item by the reader."""
    from grasp_lightning.data.qa import read_qa
    from tests.helpers import make_image

    text = section("### The item a reward receives", OWN_TASK)
    (code,) = blocks(text, "python")
    (tmp_path / "weighted.py").write_text(code)
    (tmp_path / "img.png").write_bytes(make_image())
    rows = [{"id": "a", "image": "img.png", "question": "Who?", "options": ["Person 0", "Person 1"], "answer": "B",
             "weight": 0.5},
            {"id": "b", "image": "img.png", "question": "Who?", "options": ["Person 0", "Person 1"], "answer": "A"}]
    (tmp_path / "qa.train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = read_qa(tmp_path / "qa.train.jsonl").items
    assert [item.extra for item in items] == [{"weight": 0.5}, {}]
    right = ["<think>x</think><answer>B</answer>", "<think>x</think><answer>A</answer>"]
    out = compute_rewards(right + ["<think>x</think><answer>A</answer>"], [*items, items[0]],
                          [f"{tmp_path / 'weighted.py'}:weighted_accuracy"])
    assert out[:, 0].tolist() == [0.5, 1.0, 0.0]  # the row's weight; no column: 1.0; a wrong answer: 0


def _with_demo(args: list[str]) -> list[str]:
    """``args`` with ``--config configs/demo.yaml`` after its last ``--config FILE`` (the page's CPU note)."""
    last = max(n for n, word in enumerate(args) if word == "--config")
    return [*args[:last + 2], "--config", "configs/demo.yaml", *args[last + 2:]]


def test_docs_own_task_path_runs_as_written(tmp_path, monkeypatch) -> None:
    """docs/own-task.md "Quick start", command by command, on the tiny model (``configs/demo.yaml`` after the
    last ``--config``, as the page says) and a tiny generic QA set: check-data, LoRA SFT, export, GRPO with
    the page's reward, export, validate on a QASuite, predict. Each step starts from the previous step's files."""
    from grasp_lightning.__main__ import main as dispatch
    from tests.helpers import make_qa_dataset

    for name in ("configs", "grasp_lightning"):
        (tmp_path / name).symlink_to(REPO / name)
    make_qa_dataset(tmp_path / "mine", name="qa.train.jsonl")
    make_qa_dataset(tmp_path / "mine", name="qa.val.jsonl")
    (reward_code,) = blocks(section("### A reward of your own", OWN_TASK), "python")
    (tmp_path / "my_rewards.py").write_text(reward_code)
    monkeypatch.chdir(tmp_path)
    (path,) = blocks(section("## Quick start", OWN_TASK), "bash")
    path = "\n".join(line for line in path.splitlines() if not line.startswith("#"))
    steps = [command(block) for block in re.split(r"\n(?=python -m grasp_lightning)", path.strip())
             if "grasp_lightning" in block]
    assert [step[0] for step in steps] == ["check-data", "fit", "export", "fit", "export", "validate", "predict"]
    short = {"check-data": ["--progress=false", "--workers=1"],
             "fit": ["--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--data.loader.num_workers=0",
                     "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8",
                     "--trainer.enable_progress_bar=false"],
             "validate": ["--data.loader.num_workers=0", "--model.evaluation.max_new_tokens=8",
                          "--trainer.enable_progress_bar=false"],
             "predict": ["--data.loader.num_workers=0", "--model.evaluation.max_new_tokens=8",
                         "--trainer.enable_progress_bar=false"],
             "export": []}
    for step in steps:
        args = step if step[0] == "export" else _with_demo(step)
        assert dispatch([*args, *short[step[0]]]) == 0, step
    assert (tmp_path / "runs/own_sft/export/config.json").is_file()
    assert (tmp_path / "runs/own_sgr/export/config.json").is_file()
    series = scalars(tmp_path / "runs/own_sgr/version_0")
    assert len(series["train/rewards/brief_and_right/mean"]) == 1  # the page's reward ran in GRPO
    results = list((tmp_path / "runs/own_val").rglob("results.json"))
    assert results, "validate wrote no results.json"
    data = json.loads(results[0].read_text())
    assert "mine" in json.dumps(data)
    predictions = [json.loads(line) for line in (tmp_path / "runs/predict/predictions.jsonl").read_text().splitlines()]
    assert sorted(p["id"] if "id" in p else p.get("uid") for p in predictions) == ["qa_0001", "qa_0002", "qa_0003",
                                                                                   "qa_0004"]


def test_docs_multi_gpu_lora_example_plans_and_trains(tmp_path, capsys) -> None:
    """docs/scaling.md "LoRA on several GPUs": its plan-memory command fits (exit 0, DDP on 4 GPUs, LoRA), and
    its fit runs as written on two CPU processes (DDP over gloo) with the tiny model: ``configs/demo.yaml`` after
    the last ``--config``, the sample data and the tiny model instead of the paths, 2 devices instead of 4, batch 1
    (accumulate 8 as written: 8 micro-batches per rank of the 24 sample rows)."""
    import os
    import subprocess
    import sys

    from grasp_lightning.commands import plan_memory

    (block,) = blocks(section("### LoRA on several GPUs", "docs/scaling.md"), "bash")
    plan, fit = (command(text) for text in re.split(r"\n(?=python -m grasp_lightning)", block.strip()))
    assert plan[0] == "plan-memory" and fit[0] == "fit"
    assert plan_memory.main([str(REPO / w) if w.startswith("configs/") else w for w in plan[1:]]) == 0
    out = capsys.readouterr().out
    assert "LoRA r=16" in out and "DDP on 4 GPU(s)" in out and "fits: yes" in out
    args = [*_with_demo(fit), "--trainer.devices=2", "--data.source.root=grasp_lightning/assets/sample",
            "--model.policy.name_or_path=grasp_lightning/assets/tiny-qwen3vl", "--data.source.bench=null",
            "--data.loader.num_workers=0", "--data.loader.batch_size=1", "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false", "--model.rollout.num_generations=2",
            "--model.rollout.max_new_tokens=8", f"--trainer.logger.init_args.save_dir={tmp_path}",
            f"--trainer.default_root_dir={tmp_path}"]
    assert args[args.index("--trainer.strategy") + 1] == "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "grasp_lightning", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in proc.stdout + proc.stderr
    (log_dir,) = (tmp_path / "demo").glob("version_*")
    assert len(scalars(log_dir)["train/loss"]) == 1
