"""The speed and learning scripts docs/development.md lists (``benchmarks/*.py``) run, in a small CPU smoke
size, and print the figures they promise as their last line of JSON.

The figures themselves are machine-dependent and are not asserted beyond their sanity (positive
times, equal sampled frames, every injected fault recovered, sharing the prompt saving CPU time at
a prompt-dominated size); token counts are exact (the shared prompt forwarded once per group, naive
rows K times) for both model families the speed scripts compare. benchmarks/results/README.md quotes full-size runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def run_script(args: list[str], timeout: float = 900) -> dict:
    """Run ``python benchmarks/<script> ...`` from the repository root; its last stdout line as JSON."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{args} printed no JSON line:\n{proc.stdout[-3000:]}"
    return json.loads(lines[-1])


def test_video_decode_prints_the_speed_of_both_decode_paths() -> None:
    out = run_script(["benchmarks/video_decode.py", "--clips", "3", "--seconds", "2", "--repeats", "1"])
    assert out["clips"] == 3 and out["fps"] == 2.0
    assert out["ours_clips_per_s"] > 0 and out["baseline_clips_per_s"] > 0
    assert out["ratio_vs_baseline"] == pytest.approx(out["ours_clips_per_s"] / out["baseline_clips_per_s"], rel=0.01)


#: Both model families the benchmarks compare (``--models`` default): the tiny Qwen3-VL and the hybrid Qwen3.5.
FAMILIES = ("qwen3_vl", "qwen3_5")
#: Smoke sizes shared by both families: 4 layers (the Qwen3.5 stand-in: 3 linear + 1 full attention).
TINY_MODEL = ["--hidden", "64", "--layers", "4", "--frame-side", "32", "--prompts", "1", "--steps", "1", "--warmup", "0"]
#: Generation passes that forward the prompt in a GRPO step with one rollout per optimizer step:
#: the generation prefill, the reference model's scoring and the policy's.
PROMPT_PASSES = 3


def assert_prompt_shared_once(shared: float, naive: float, k: int, prompt_len: int | None = None) -> None:
    """Per group, naive rows forward the prompt ``PROMPT_PASSES * K`` times, the shared prompt
    ``PROMPT_PASSES`` times less the last token the generation prefill leaves to ``generate``."""
    assert naive == k * (shared + 1), (shared, naive, k)
    if prompt_len is not None:
        assert shared == PROMPT_PASSES * prompt_len - 1 and naive == PROMPT_PASSES * k * prompt_len, (shared, naive)


def test_grpo_step_prints_both_families_against_trl_with_the_prompt_tokens_each_forwards() -> None:
    # 144 visual tokens and K=8 (a 304-token prompt): the prompt dominates, so sharing it must pay off
    out = run_script(["benchmarks/grpo_step.py", *TINY_MODEL, "--k", "8", "--max-new-tokens", "4", "--image-side",
                      "192", "--video-seconds", "2"])
    assert out["benchmark"] == "grpo_step" and out["k"] == 8 and list(out["models"]) == list(FAMILIES)
    for family, result in out["models"].items():
        assert result["model"]["model_type"] == family and result["model"]["layers"] == 4, family
        for variant in ("trl_image", "ours_image", "ours_naive_image", "ours_video"):
            assert result[variant]["step_s"] > 0 and result[variant]["cpu_s"] > 0, (family, variant)
        shared, naive, trl = (result[v]["prompt_tokens_per_group"] for v in ("ours_image", "ours_naive_image",
                                                                               "trl_image"))
        assert result["image_visual_tokens"] == 144, family
        assert_prompt_shared_once(shared, naive, 8, result["image_prompt_tokens"])
        assert trl == naive, family  # TRL's rows are the naive layout
        assert result["prompt_tokens_naive_over_shared"] == pytest.approx(naive / shared)
        assert result["speedup_vs_naive"] == pytest.approx(result["ours_naive_image"]["step_s"]
                                                           / result["ours_image"]["step_s"])
        assert result["ratio_vs_trl"] == pytest.approx(result["ours_image"]["step_s"] / result["trl_image"]["step_s"])
        # CPU seconds (the process's own, steadier than wall time on a shared machine): sharing wins
        assert result["speedup_vs_naive_cpu"] > 1, (family, result["speedup_vs_naive_cpu"])
    layers = {f: out["models"][f]["model"]["layer_types"] for f in FAMILIES}
    assert layers["qwen3_vl"] == ["full_attention"] * 4
    assert layers["qwen3_5"] == ["linear_attention"] * 3 + ["full_attention"]


def test_grpo_step_accumulate_compares_rollout_batches_per_optimizer_step() -> None:
    out = run_script(["benchmarks/grpo_step.py", *TINY_MODEL, "--k", "4", "--max-new-tokens", "4", "--image-side",
                      "64", "--accumulate", "2"])
    assert out["mode"] == "optimizer_step" and list(out["models"]) == list(FAMILIES)
    for family, result in out["models"].items():
        assert result["optimizer_step_speedup"] > 0 and result["ratio_vs_trl"] > 0, family


def test_scaling_prints_the_slopes_in_k_and_clip_length_for_both_families(tmp_path: Path) -> None:
    out = run_script(["benchmarks/scaling.py", *TINY_MODEL, "--ks", "2,4", "--seconds", "2,4", "--image-side", "64",
                      "--max-new-tokens", "4", "--k", "2", "--no-trl", "--out-dir", str(tmp_path)])
    assert (tmp_path / "scaling.json").is_file() and (tmp_path / "scaling.png").is_file()
    assert [float(k) for k in out["ks"]] == [2.0, 4.0] and [float(s) for s in out["seconds"]] == [2.0, 4.0]
    assert list(out["models"]) == list(FAMILIES)
    for family, result in out["models"].items():
        assert result["model"]["model_type"] == family, family
        for sweep, slopes in (("step_s_vs_k", "slope_s_per_completion"),
                              ("step_s_vs_seconds", "slope_s_per_video_second")):
            for name in ("shared", "naive"):
                y = result[sweep][name]
                assert len(y) == 2 and min(y) > 0, (family, sweep, name)
                assert result[slopes][name] == pytest.approx((y[1] - y[0]) / 2.0), (family, sweep, name)  # the chord
        # one prompt per step: the shared prompt is forwarded once per group, the naive rows K times
        for shared, naive in zip(result["detail"]["k"]["shared"], result["detail"]["k"]["naive"], strict=True):
            assert shared["k"] == naive["k"], family
            assert_prompt_shared_once(shared["prompt_tokens"], naive["prompt_tokens"], naive["k"])
        for shared, naive in zip(result["detail"]["seconds"]["shared"], result["detail"]["seconds"]["naive"],
                                 strict=True):
            assert shared["visual_tokens"] == naive["visual_tokens"], family
            assert_prompt_shared_once(shared["prompt_tokens"], naive["prompt_tokens"], 2)


def test_grpo_learning_prints_the_reward_before_and_after(tmp_path: Path) -> None:
    out = run_script(["benchmarks/grpo_learning.py", "--sft-steps", "2", "--grpo-steps", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "grpo_learning.json").read_text())
    assert {k: saved[k] for k in out} == out  # the file adds the per-step rewards to the printed summary
    assert len(saved["rewards"]) == 3 and all(0.0 <= r <= 1.35 for r in saved["rewards"])


def test_faults_quick_recovers_every_training_fault() -> None:
    out = run_script(["benchmarks/faults.py", "--quick"], timeout=1200)
    assert out["faults_tried"] >= 8 and out["faults_recovered"] == out["faults_tried"]
    assert out["samples_lost"] == 0 and out["samples_repeated"] == 0


def test_world_runs_every_stage_and_prints_the_summary_over_seeds(tmp_path: Path) -> None:
    """Base-world SFT on two seeds, the shortcut-world RL comparison (GRPO, SGR, SGR + temporal) on one; the
    summary's keys hold the per-seed values (a smoke size: the figures themselves are in benchmarks/results/)."""
    out = run_script(["benchmarks/world.py", "--seeds", "0", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14", "--bench", "7",
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
    from grasp_lightning.generators import world

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
    again = run_script(["benchmarks/world.py", "--seeds", "0", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14",
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
    kept = run_script(["benchmarks/world.py", "--seeds", "1", "--rl-seeds", "--skip-sft", "--work", str(tmp_path / "work"),
                       "--results", str(tmp_path / "results")], timeout=300)
    assert {f: f.stat().st_mtime for f in logs} == written  # a seed whose RL is not rerun keeps the earlier figures
    assert kept["per_seed"]["1"]["shortcut"] == again["per_seed"]["1"]["shortcut"]
    # the kept SFT's threads (1), not this call's default (2); the RL comparison records its own
    assert kept["per_seed"]["1"]["threads"] == 1 and kept["per_seed"]["1"]["shortcut"]["threads"] == 1
    assert kept["per_seed"]["1"]["shortcut_curves_png"] == again["per_seed"]["1"]["shortcut_curves_png"]
    assert kept["summary"]["sgr_minus_grpo_acc_min"] == summary["sgr_minus_grpo_acc_min"]
    two = run_script(["benchmarks/world.py", "--seeds", "1", "--rl-seeds", "1", "--train", "14", "--rl-train", "14",
                      "--bench", "7", "--rl-bench", "14", "--sft-steps", "2", "--rl-sft-steps", "2", "--rl-steps", "1",
                      "--val-every", "1", "--rl-val-every", "1", "--handoff-acc", "0", "--handoff-by", "prior", "--threads", "1",
                      "--arms", "grpo", "sgr_modal", "--skip-sft", "--reuse-sft", "--reuse-rl",
                      "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")], timeout=300)
    assert {f: f.stat().st_mtime for f in logs} == written
    arms = {k for k in two["per_seed"]["1"]["shortcut"] if k in ("grpo", "sgr", "sgr_temporal", "sgr_modal")}
    assert arms == {"grpo", "sgr_modal"}  # only the arms asked for; a gap needs both its arms
    assert two["summary"]["sgr_modal_minus_grpo_acc_min"] == modal_gap and "sgr_minus_grpo_acc_min" not in two["summary"]
    assert "temporal_minus_sgr_T3_acc" not in two["summary"]
    alone = _world_bench().markdown({"per_seed": {"1": {"seed": 1, "shortcut": two["per_seed"]["1"]["shortcut"]}}})
    assert alone.startswith("| seed | stage") and "SFT accuracy at 10 min" not in alone  # no empty SFT table
    assert alone.count("\n| 1 | + GRPO") == 2  # the two arms run
    bench, work = _world_bench(), tmp_path / "work" / "seed1_shortcut"
    # --handoff-by prior: of the checkpoints at --handoff-acc (0 here: both), the first whose J3 answers follow the
    # point most often
    rates = {k: bench.following_rate(work / "runs" / "sft" / "version_0", k, 1, options) for k in (1, 2)}
    assert set(rates.values()) <= {0.0, 0.5, 1.0}  # 2 bench J3 items
    assert rl["sft_handoff"]["step"] == min(k for k, v in rates.items() if v == max(rates.values()))
    assert rl["sft_handoff"]["handoff_by"] == "prior"
    args = argparse.Namespace(seed=1, train=14, bench=7, sft_steps=2, val_every=1, handoff_acc=0.0, threads=1,
                              reuse_sft=True, work=tmp_path / "work")
    with pytest.raises(ValueError, match="needs a world with J3"):
        bench.sft_handoff(args, by_prior=True)  # the base world (seed 1's SFT above) has no J3
    # --reuse-rl reuses an arm only from the hand-off it started from
    step = rl["sft_handoff"]["step"]
    assert json.loads((work / "grpo.done.json").read_text())["from_sft_step"] == step
    assert bench.finished_run("grpo", work, 1, step)[0] == work / "runs" / "grpo" / "version_0"
    assert bench.finished_run("grpo", work, 1, 3 - step) is None


def test_world_arms_need_the_grpo_baseline(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        _world_bench().main(["--arms", "sgr", "sgr_modal"])
    assert done.value.code == 2 and "--arms sgr sgr_modal: grpo is the baseline" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        _world_bench().main(["--arms", "grpo", "ppo"])
    assert done.value.code == 2 and "invalid choice: 'ppo'" in capsys.readouterr().err


def test_dynamic_sampling_compares_drop_and_refill_from_one_sft_handoff(tmp_path: Path) -> None:
    """Two SFT steps leave the policy unable to answer, so every group is degenerate: ``refill`` draws further
    windows of 16 prompts (48 RL clips: two more at the first step), ``drop`` never does; both processes exit
    (a refill run's data workers once kept it from exiting)."""
    out = run_script(["benchmarks/dynamic_sampling.py", "--seed", "0", "--train", "48", "--bench", "8",
                      "--sft-steps", "2", "--rl-steps", "2", "--val-every", "1", "--rl-val-every", "1",
                      "--handoff-acc", "0", "--threads", "1", "--window", "2", "--work", str(tmp_path / "work"),
                      "--results", str(tmp_path / "results")], timeout=1200)
    drop, refill = out["arms"]["drop"], out["arms"]["refill"]
    assert drop["steps"] == refill["steps"] == 2
    assert drop["groups_tried_per_step"] == 16.0 and drop["completions"] == 2 * 16 * 8
    assert refill["groups_tried_per_step"] > 16.0  # windows drawn from the stream
    assert refill["completions"] == round(refill["groups_tried_per_step"] * 2 * 8)
    assert 0.0 <= drop["kept_fraction"] <= 1.0 and 0.0 <= refill["kept_fraction"] <= 1.0
    assert [step for step, _ in drop["bench_acc"]] == [1, 2]
    cmp = out["comparison"]
    assert cmp["targets (drop's final values)"]["reward_tried"] == drop["reward_tried_last"]
    assert cmp["drop"]["steps_to_target_reward"] in (1, 2)  # drop reaches its own final value by its end
    assert isinstance(cmp["refill_fewer_steps_to_reward"], bool)
    saved = json.loads((tmp_path / "results" / "dynamic_sampling_seed0.json").read_text())
    assert saved["arms"] == out["arms"] and (tmp_path / "results" / "dynamic_sampling_seed0.png").is_file()


def _world_bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("world_bench", REPO / "benchmarks" / "world.py")
    world_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(world_bench)
    return world_bench


def test_world_counts_the_j3_completions_that_state_the_prior(tmp_path: Path) -> None:
    """``J3_stating_prior``: the share of a validation's J3 completions with a ``<gesture>`` block naming the point
    (other categories and "points at" outside a gesture block do not count); no results file or no J3: ``None``."""
    world_bench = _world_bench()
    stating = "<gesture>Person 2 points at Person 0.</gesture><gaze>Person 3 looks at Person 0.</gaze><answer>A</answer>"
    reading = "<gaze>Person 3 looks at Person 1.</gaze><answer>B</answer>"
    assert world_bench.states_prior(stating) and not world_bench.states_prior(reading)
    assert not world_bench.states_prior("<gaze>Person 3 points at Person 0.</gaze>")
    items = [{"category": "J3", "completion": stating}, {"category": "J3", "completion": reading},
             {"category": "J3", "completion": "<gaze>Person 2 points at Person 0.</gaze>"},
             {"category": "G1", "completion": stating}]
    (tmp_path / "bench" / "step_20").mkdir(parents=True)
    (tmp_path / "bench" / "step_20" / "results.json").write_text(json.dumps({"items": items}))
    assert world_bench.prior_rate(tmp_path, 20) == round(1 / 3, 4)
    assert world_bench.prior_rate(tmp_path, 40) is None
    (tmp_path / "bench" / "step_20" / "results.json").write_text(json.dumps({"items": items[3:]}))
    assert world_bench.prior_rate(tmp_path, 20) is None


def test_world_counts_the_j3_answers_that_follow_the_point(tmp_path: Path) -> None:
    """``J3_following_point``: the share of J3 bench answers that pick the pointed-at target, each item rebuilt
    from its uid; a uid of another world is an error naming it."""
    from grasp_lightning.generators import world

    world_bench = _world_bench()
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
    assert len(items) == 5 and world_bench.following_rate(tmp_path, 40, 4, options) == 0.75
    assert world_bench.following_rate(tmp_path, 60, 4, options) is None
    with pytest.raises(ValueError, match="'world4_b00005_qa0000' is not a bench clip of world seed 5"):
        world_bench.following_rate(tmp_path, 40, 5, options)


def test_world_labels_a_commit_dirty_only_for_changed_code_not_for_its_own_results(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    world_bench = _world_bench()
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "benchmarks" / "results" / "world.json").write_text("{}\n")
    (repo / "code.py").write_text("x = 1\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "init"]):
        subprocess.run(git + cmd, cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()
    monkeypatch.setattr(world_bench, "ROOT", repo)
    assert world_bench.measured()["commit"] == head
    (repo / "benchmarks" / "results" / "world.json").write_text('{"seed": 0}\n')  # the first seed's JSON
    (repo / "scratch.txt").write_text("untracked\n")
    assert world_bench.measured()["commit"] == head
    (repo / "code.py").write_text("x = 2\n")
    assert world_bench.measured()["commit"] == f"{head}-dirty"
    monkeypatch.setattr(world_bench, "ROOT", tmp_path / "not_a_repo")
    (tmp_path / "not_a_repo").mkdir()
    assert world_bench.measured()["commit"] is None


def test_step_limit_prints_vision_forwards_step_time_and_scoring_peak() -> None:
    """``benchmarks/step_limit.py --smoke``: the tiny Qwen3-VL's step on both paths, the real-vocabulary scoring peak."""
    out = run_script(["benchmarks/step_limit.py", "--smoke"], timeout=600)
    assert out["mode"] == "smoke" and out["prompts"] == 1
    # before: the sampling prefill, the reference's scoring and the training forward each encode the clip
    assert out["vision_forwards_per_prompt_before"] == 3.0 and out["vision_forwards_per_prompt_after"] == 1.0
    assert out["step_cpu_s_before"] > 0 and out["step_cpu_s_after"] > 0
    assert out["step_cpu_ratio"] == pytest.approx(out["step_cpu_s_after"] / out["step_cpu_s_before"], abs=1e-3)
    assert out["loss_after"] == pytest.approx(out["loss_before"], abs=1e-5)
    # full logits: at least K x Lc x V bf16 logits are held; chunked: far less
    k, lc = out["score_k"], out["score_tokens"]
    assert out["scoring_peak_bytes_before"] >= k * lc * 151936 * 2
    assert 0 < out["scoring_peak_bytes_after"] < out["scoring_peak_bytes_before"]
    assert out["scoring_peak_ratio"] == pytest.approx(
        out["scoring_peak_bytes_after"] / out["scoring_peak_bytes_before"], abs=1e-4)
