"""Evaluation suites through the CLI on the tiny model and the sample data: one ``validate`` reporting
GRASP-Bench, MMSI, Online-MMSI, TVQA+ and HumanSense together (configs/eval_suites.yaml), ``validate`` with
the released protocol (configs/eval_released.yaml) against its prompts written out by hand, and a GRPO fit
on a generic QA file validated on it as a suite."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch

from grasp_lightning.evaluation.suite_report import read_sections
from tests.helpers import PromptRecorder, event_tags, first_bench_item, released_reference, run_cli, scalars


def test_validate_reports_grasp_bench_and_four_other_suites(in_repo, tmp_path, capsys):
    cli = run_cli(["validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--config",
                   "configs/eval_suites.yaml", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
                   "--data.source.val_limit=4", "--trainer.limit_val_batches=1", "--model.evaluation.max_new_tokens=4"],
                  tmp_path)
    out = capsys.readouterr().out
    assert re.search(r"^\| T1 \| Gaze target identification \|", out, re.M)  # GRASP-Bench, Table 1 layout
    for title in ("### MMSI", "### Online-MMSI", "### TVQA+", "### HumanSense"):
        assert title in out, title
    assert "Not evaluated: 2 items (they need audio" in out
    latest = Path(cli.trainer.log_dir) / "bench" / "latest"
    sections = read_sections(latest / "results.json")
    assert list(sections) == ["grasp_bench", "mmsi", "online_mmsi", "tvqa_plus", "humansense"]
    raw = json.loads((latest / "results.json").read_text())
    assert list(raw["suites"]) == ["mmsi", "online_mmsi", "tvqa_plus", "humansense"] and "benchmarks" not in raw
    assert sections["grasp_bench"]["metrics"]["n/overall"] == 4
    sizes = {name: (s["metrics"]["n/overall"], len(s["items"])) for name, s in sections.items() if name != "grasp_bench"}
    assert sizes == {"mmsi": (6, 6), "online_mmsi": (6, 6), "tvqa_plus": (5, 5), "humansense": (7, 7)}
    assert sections["humansense"]["metrics"]["not_evaluated/overall"] == 2
    assert {r["pattern"] for r in sections["humansense"]["items"]} == {"mcq", "mcq_multi", "number", "yes_no"}
    for name in ("mmsi", "online_mmsi", "tvqa_plus", "humansense"):
        assert (latest / f"table_{name}.md").read_text().startswith("### ")
    assert (latest / "table.md").is_file()
    logged = scalars(cli.trainer.log_dir)
    assert {"val/acc/overall", "val/mmsi/acc/overall", "val/online_mmsi/acc/mean", "val/tvqa_plus/acc/overall",
            "val/humansense/acc/overall"} <= set(logged)


def test_validate_with_the_released_protocol_runs_on_the_tiny_model(in_repo, tmp_path, processor, caplog):
    """``validate --config configs/sgr.yaml --config configs/demo.yaml --config configs/eval_released.yaml``
    (two items and 8 new tokens to keep it fast): its prompts are the released ones, with demo.yaml's
    8 frames (the released script with ``--max_frames 8``)."""
    with caplog.at_level(logging.INFO, logger="grasp_lightning.module"):
        cli = run_cli(["validate", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--config",
                       "configs/eval_released.yaml", "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false",
                       "--data.source.val_limit=2", "--model.evaluation.max_new_tokens=8",
                       "--trainer.callbacks+=tests.helpers.PromptRecorder"], tmp_path)
    module = cli.model
    assert module.eval_cfg.protocol == "released" and module.eval_cfg.released.max_frames == 8
    recorder = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PromptRecorder))
    item, clip = first_bench_item()
    assert recorder.uids == [item.uid, "158_1_004_qa0001"]
    ids, _, n = released_reference(processor, clip, 64, 128, max_frames=8)
    assert n == 8 and torch.equal(recorder.prompts[0], ids)
    results = json.load(open(f"{cli.trainer.log_dir}/bench/latest/results.json"))
    assert results["metrics"]["n/overall"] == 2 and results["meta"]["decoding"]["protocol"] == "released"
    assert results["meta"]["decoding"]["max_new_tokens"] == 8
    report = open(f"{cli.trainer.log_dir}/bench/latest/report_released.txt").read()
    bench = module.suites.by_name("grasp_bench")  # scored by the protocol the DataModule handed over
    assert bench.protocol is module.eval_protocol
    assert report.strip() == bench.summary(module.suites.results["grasp_bench"]).strip() and "===== Overall: " in report
    assert "===== Overall: " in caplog.text and "max_new_tokens=8 (released: 2048)" in caplog.text


# last in the file: one_intra_op_thread is a module fixture, so its one thread holds from here to the module's end
@pytest.mark.usefixtures("one_intra_op_thread")
def test_grpo_fit_and_validation_on_a_generic_qa_file(qa_dir, in_repo, tmp_path, capsys):
    suite = json.dumps([{"class_path": "grasp_lightning.evaluation.QASuite",
                         "init_args": {"path": str(qa_dir / "qa.jsonl"), "name": "my_qa"}}])
    cli = run_cli(["fit", "--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", "--data.loader.num_workers=0",
                   "--trainer.enable_progress_bar=false", f"--data.source.root={qa_dir}", "--data.source.train_file=qa.jsonl",
                   "--data.source.bench=null", f"--data.eval_suites={suite}", "--data.video.max_image_pixels=2048",
                   "--data.loader.batch_size=4", "--trainer.max_epochs=2", "--trainer.max_steps=2", "--model.rollout.num_generations=2", "--model.rollout.max_new_tokens=8",
                   "--model.evaluation.max_new_tokens=4", "--trainer.limit_val_batches=1"], tmp_path)
    series = scalars(cli.trainer.log_dir)
    assert len(series["train/loss"]) == 2 and series["train/rollout/shared_prompt"][0][1] == 1.0
    assert all(v == v for _, v in series["train/loss"])  # finite
    assert {"val/my_qa/acc/gaze", "val/my_qa/acc/gesture", "val/my_qa/acc/overall"} <= set(series)
    rows = [json.loads(line) for line in open(f"{cli.trainer.log_dir}/rollouts.jsonl")]
    assert rows and "participants_named" in rows[0]  # data.loader.batch_size=4: each step's batch mixes all four rows
    table = (Path(cli.trainer.log_dir) / "bench" / "latest" / "table_my_qa.md").read_text()
    assert table.startswith("### Generic QA") and "| gaze |" in table and "| gesture |" in table
    # the chart docs/evaluation.md promises for every suite: a table and no chart before
    chart = Path(cli.trainer.log_dir) / "bench" / "latest" / "categories_my_qa.png"
    assert chart.read_bytes().startswith(b"\x89PNG")
    assert "bench/my_qa/category_accuracy" in event_tags(cli.trainer.log_dir)["images"]
