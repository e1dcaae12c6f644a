"""Tests of :mod:`experiments.world.run`, the synthetic world's end-to-end run: every stage in a small CPU smoke
size (``python experiments/world/run.py`` from the repository root, as its README says), the summary over seeds,
reusing finished runs, and the measures read back from the bench results."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from experiments.world import run, world

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_world_runs_every_stage_and_prints_the_summary_over_seeds(tmp_path: Path, run_script) -> None:
    """Base-world SFT on two seeds, the shortcut-world RL comparison (GRPO, SGR, SGR + temporal) on one; the
    summary's keys hold the per-seed values (a smoke size: the figures themselves are the experiment README's)."""
    out = run_script(["experiments/world/run.py", "--seeds", "0", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14", "--bench", "7",
                      "--rl-bench", "14", "--sft-steps", "2", "--rl-sft-steps", "2", "--rl-steps", "1",
                      "--val-every", "1", "--rl-val-every", "1", "--handoff-acc", "0", "--handoff-by", "prior", "--threads", "1",
                      "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")], timeout=1500)
    per_seed, summary = out["per_seed"], out["summary"]
    assert sorted(per_seed) == ["0", "1"] and summary["seeds"] == [0, 1]
    assert "shortcut" not in per_seed["0"] and set(per_seed["1"]["shortcut"]) >= {"grpo", "sgr", "sgr_temporal", "sgr_modal",
                                                                                   "sft_handoff", "prior_acc"}
    sft_accs = [per_seed[s]["sft"]["within_10_min"]["acc"] for s in ("0", "1")]
    assert summary["sft_acc_min"] == min(sft_accs) and summary["sft_acc"]["max"] == max(
        per_seed[s]["sft"]["acc"] for s in ("0", "1"))
    assert set(per_seed["0"]["sft"]["categories"]) == {"T1", "T4", "T6", "G1", "G2"}
    rl = per_seed["1"]["shortcut"]
    assert set(rl["sgr"]["categories"]) == {"T1", "T4", "T6", "G1", "G2", "J3", "T3"}
    assert rl["prior_acc"]["bench"] == 0.0 and 0.0 <= rl["prior_acc"]["train"] <= 1.0  # 2 training J3 clips
    options = world.WorldOptions(shortcut=0.7, temporal=True, shortcut_reasoning=True)  # the script's default
    j3 = [world.make_world_entry(1, "t", k, options) for k in range(14) if options.category("t", k) == "J3"]
    assert len(j3) == 2 and rl["prior_acc"]["train_targets_stating_it"] == sum("<gesture>" in e.response for e in j3) / 2
    assert rl["prior_acc"]["train_targets_stating_it"] == rl["prior_acc"]["train"]  # stated exactly where it holds
    gap = round(rl["sgr"]["categories"]["J3"] - rl["grpo"]["categories"]["J3"], 4)
    assert summary["sgr_minus_grpo_acc_min"] == gap == summary["sgr_minus_grpo_acc"]["max"]
    modal_gap = round(rl["sgr_modal"]["categories"]["J3"] - rl["grpo"]["categories"]["J3"], 4)
    assert summary["sgr_modal_minus_grpo_acc_min"] == modal_gap
    for arm in ("grpo", "sgr", "sgr_temporal", "sgr_modal"):
        assert rl[arm]["step"] == 1 and rl[arm]["from_sft_step"] == rl["sft_handoff"]["step"]
        assert rl[arm]["temporal_iou"] is None or 0.0 <= rl[arm]["temporal_iou"] <= 1.0
        for key in ("J3_following_point", "J3_stating_prior"):  # 2 bench J3 items
            assert rl[arm][key] in (0.0, 0.5, 1.0) and summary[f"{arm}_{key}"]["min"] == rl[arm][key]
    from PIL import Image

    for seed, width in ((0, 600), (1, 2000)):  # 100 dpi: seed 0 has the SFT panel alone, seed 1 the RL panels too
        assert (tmp_path / "results" / f"world_seed{seed}.json").is_file()
        assert Image.open(tmp_path / "results" / f"world_seed{seed}.png").size == (width, 400)
    assert json.loads((tmp_path / "results" / "world.json").read_text()) == out
    table = (tmp_path / "results" / "world.md").read_text()
    assert table.count("\n| 0 | ") == 1 and "+ GRPO + SGR + temporal" in table and "+ GRPO + SGR by modality" in table
    logs = sorted((tmp_path / "work").rglob("*.log"))
    written = {f: f.stat().st_mtime for f in logs}
    again = run_script(["experiments/world/run.py", "--seeds", "0", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14",
                        "--bench", "7", "--rl-bench", "14", "--sft-steps", "2", "--rl-sft-steps", "2", "--rl-steps", "1",
                        "--val-every", "1", "--rl-val-every", "1", "--handoff-acc", "0", "--handoff-by", "prior", "--threads", "1",
                        "--skip-sft", "--reuse-sft", "--reuse-rl", "--work", str(tmp_path / "work"),
                        "--results", str(tmp_path / "results")], timeout=600)
    assert {f: f.stat().st_mtime for f in logs} == written  # nothing was trained again
    for seed in ("0", "1"):  # --skip-sft keeps the SFT figures and curves found in --results
        assert again["per_seed"][seed]["sft"] == per_seed[seed]["sft"]
        assert again["per_seed"][seed]["curves_png"] == per_seed[seed]["curves_png"]
    assert again["per_seed"]["1"]["shortcut_curves_png"].endswith("world_seed1_shortcut.png")
    assert (tmp_path / "results" / "world_seed1_shortcut.png").is_file()
    assert again["summary"]["sft_acc_min"] == summary["sft_acc_min"]
    for arm in ("grpo", "sgr", "sgr_temporal", "sgr_modal"):
        first, second = rl[arm], again["per_seed"]["1"]["shortcut"][arm]
        assert second == first  # the times fit() recorded
    assert again["summary"]["sgr_minus_grpo_acc_min"] == summary["sgr_minus_grpo_acc_min"]
    assert set(rl["measured"]) == {"commit", "cpu"} and set(per_seed["0"]["sft"]["measured"]) == {"commit", "cpu"}
    kept = run_script(["experiments/world/run.py", "--seeds", "1", "--rl-seeds", "--skip-sft", "--work", str(tmp_path / "work"),
                       "--results", str(tmp_path / "results")], timeout=300)
    assert {f: f.stat().st_mtime for f in logs} == written  # a seed whose RL is not rerun keeps the earlier figures
    assert kept["per_seed"]["1"]["shortcut"] == again["per_seed"]["1"]["shortcut"]
    # the kept SFT's threads (1), not this call's default (2); the RL comparison records its own
    assert kept["per_seed"]["1"]["threads"] == 1 and kept["per_seed"]["1"]["shortcut"]["threads"] == 1
    assert kept["per_seed"]["1"]["shortcut_curves_png"] == again["per_seed"]["1"]["shortcut_curves_png"]
    assert kept["summary"]["sgr_minus_grpo_acc_min"] == summary["sgr_minus_grpo_acc_min"]
    two = run_script(["experiments/world/run.py", "--seeds", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14",
                      "--bench", "7", "--rl-bench", "14", "--sft-steps", "2", "--rl-sft-steps", "2", "--rl-steps", "1",
                      "--val-every", "1", "--rl-val-every", "1", "--handoff-acc", "0", "--handoff-by", "prior", "--threads", "1",
                      "--arms", "grpo", "sgr_modal", "--skip-sft", "--reuse-sft", "--reuse-rl",
                      "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")], timeout=300)
    assert {f: f.stat().st_mtime for f in logs} == written
    arms = {k for k in two["per_seed"]["1"]["shortcut"] if k in ("grpo", "sgr", "sgr_temporal", "sgr_modal")}
    assert arms == {"grpo", "sgr_modal"}  # only the arms asked for; a gap needs both its arms
    assert two["summary"]["sgr_modal_minus_grpo_acc_min"] == modal_gap and "sgr_minus_grpo_acc_min" not in two["summary"]
    assert "temporal_minus_sgr_T3_acc" not in two["summary"]
    alone = run.markdown({"per_seed": {"1": {"seed": 1, "shortcut": two["per_seed"]["1"]["shortcut"]}}})
    assert alone.startswith("| seed | stage") and "SFT accuracy at 10 min" not in alone  # no empty SFT table
    assert alone.count("\n| 1 | + GRPO") == 2  # the two arms run
    work = tmp_path / "work" / "seed1_shortcut"
    # --handoff-by prior: of the checkpoints at --handoff-acc (0 here: both), the first whose J3 answers follow the
    # point most often
    rates = {k: run.following_rate(work / "runs" / "sft" / "version_0", k, 1, options) for k in (1, 2)}
    assert set(rates.values()) <= {0.0, 0.5, 1.0}  # 2 bench J3 items
    assert rl["sft_handoff"]["step"] == min(k for k, v in rates.items() if v == max(rates.values()))
    assert rl["sft_handoff"]["handoff_by"] == "prior"
    args = argparse.Namespace(seed=1, train=14, bench=7, sft_steps=2, val_every=1, handoff_acc=0.0, threads=1,
                              reuse_sft=True, work=tmp_path / "work")
    with pytest.raises(ValueError, match="needs a world with J3"):
        run.sft_handoff(args, by_prior=True)  # the base world (seed 1's SFT above) has no J3
    # --reuse-rl reuses an arm only from the hand-off it started from
    step = rl["sft_handoff"]["step"]
    assert json.loads((work / "grpo.done.json").read_text())["from_sft_step"] == step
    assert run.finished_run("grpo", work, 1, step)[0] == work / "runs" / "grpo" / "version_0"
    assert run.finished_run("grpo", work, 1, 3 - step) is None


def test_world_arms_need_the_grpo_baseline(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        run.main(["--arms", "sgr", "sgr_modal"])
    assert done.value.code == 2 and "--arms sgr sgr_modal: grpo is the baseline" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        run.main(["--arms", "grpo", "ppo"])
    assert done.value.code == 2 and "invalid choice: 'ppo'" in capsys.readouterr().err


def test_world_counts_the_j3_completions_that_state_the_prior(tmp_path: Path) -> None:
    """``J3_stating_prior``: the share of a validation's J3 completions with a ``<gesture>`` block naming the point
    (other categories and "points at" outside a gesture block do not count); no results file or no J3: ``None``."""
    stating = "<gesture>Person 2 points at Person 0.</gesture><gaze>Person 3 looks at Person 0.</gaze><answer>A</answer>"
    reading = "<gaze>Person 3 looks at Person 1.</gaze><answer>B</answer>"
    assert run.states_prior(stating) and not run.states_prior(reading)
    assert not run.states_prior("<gaze>Person 3 points at Person 0.</gaze>")
    items = [{"category": "J3", "completion": stating}, {"category": "J3", "completion": reading},
             {"category": "J3", "completion": "<gaze>Person 2 points at Person 0.</gaze>"},
             {"category": "G1", "completion": stating}]
    (tmp_path / "bench" / "step_20").mkdir(parents=True)
    (tmp_path / "bench" / "step_20" / "results.json").write_text(json.dumps({"items": items}))
    assert run.prior_rate(tmp_path, 20) == round(1 / 3, 4)
    assert run.prior_rate(tmp_path, 40) is None
    (tmp_path / "bench" / "step_20" / "results.json").write_text(json.dumps({"items": items[3:]}))
    assert run.prior_rate(tmp_path, 20) is None


def test_world_counts_the_j3_answers_that_follow_the_point(tmp_path: Path) -> None:
    """``J3_following_point``: the share of J3 bench answers that pick the pointed-at target, each item rebuilt
    from its uid; a uid of another world is an error naming it."""
    options = world.WorldOptions(shortcut=0.7, temporal=True, shortcut_reasoning=True)
    items = []
    for n, k in enumerate(k for k in range(28) if options.category("b", k) == "J3"):
        e = world.make_world_entry(4, "b", k, options)
        (pointed,) = [a.target for a in e.question.actions if a.kind == "pointing"]
        text = "An object" if pointed == world.OBJECT else f"Person {pointed}"
        (letter,) = [o[0] for o in e.options if o[3:] == text]
        assert letter != e.letter  # the shortcut-breaking split: the point is never the answer
        items.append({"uid": f"world4_b{k:05d}_qa0000", "category": "J3", "predicted": letter if n < 3 else e.letter})
    items.append({"uid": "world4_b00000_qa0000", "category": "T1", "predicted": "A"})
    (tmp_path / "bench" / "step_40").mkdir(parents=True)
    (tmp_path / "bench" / "step_40" / "results.json").write_text(json.dumps({"items": items}))
    assert len(items) == 5 and run.following_rate(tmp_path, 40, 4, options) == 0.75
    assert run.following_rate(tmp_path, 60, 4, options) is None
    with pytest.raises(ValueError, match="'world4_b00005_qa0000' is not a bench clip of world seed 5"):
        run.following_rate(tmp_path, 40, 5, options)


def test_world_labels_a_commit_dirty_only_for_changed_code_not_for_its_own_results(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    repo = tmp_path / "repo"
    (repo / "experiments" / "world" / "results").mkdir(parents=True)
    (repo / "experiments" / "world" / "results" / "world.json").write_text("{}\n")
    (repo / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(git + cmd, cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()
    monkeypatch.setattr(run, "ROOT", repo)
    assert run.measured()["commit"] == head
    (repo / "experiments" / "world" / "results" / "world.json").write_text('{"seed": 0}\n')  # the first seed's JSON
    (repo / "scratch.txt").write_text("untracked\n")
    assert run.measured()["commit"] == head
    (repo / "code.py").write_text("x = 2\n")
    assert run.measured()["commit"] == f"{head}-dirty"
    monkeypatch.setattr(run, "ROOT", tmp_path / "not_a_repo")
    (tmp_path / "not_a_repo").mkdir()
    assert run.measured()["commit"] is None
