"""The speed and learning scripts README documents (``benchmarks/*.py``) run, in a small CPU smoke
size, and print the figures they promise as their last line of JSON.

The figures themselves are machine-dependent and are not asserted beyond their sanity (positive
times, equal sampled frames, every injected fault recovered); README quotes full-size runs.
"""

from __future__ import annotations

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


TINY_GRPO = ["--k", "4", "--prompts", "1", "--max-new-tokens", "8", "--steps", "1", "--warmup", "0", "--hidden", "64",
             "--layers", "1", "--image-side", "64", "--video-seconds", "2", "--frame-side", "32"]


def test_grpo_step_prints_ours_against_trl_with_the_prompt_tokens_each_forwards() -> None:
    out = run_script(["benchmarks/grpo_step.py", *TINY_GRPO])
    assert out["benchmark"] == "grpo_step" and out["k"] == 4
    for variant in ("trl_image", "ours_image", "ours_naive_image", "ours_video"):
        assert out[variant]["step_s"] > 0, variant
    # the shared prompt is forwarded once per group, the naive rows and TRL K times
    assert out["ours_naive_image"]["prompt_tokens_per_group"] == out["trl_image"]["prompt_tokens_per_group"]
    assert out["ours_image"]["prompt_tokens_per_group"] < out["trl_image"]["prompt_tokens_per_group"] / 3
    assert out["ratio_vs_trl"] == pytest.approx(out["ours_image"]["step_s"] / out["trl_image"]["step_s"], rel=0.01)


def test_grpo_step_accumulate_compares_rollout_batches_per_optimizer_step() -> None:
    out = run_script(["benchmarks/grpo_step.py", *TINY_GRPO, "--accumulate", "2"])
    assert out["optimizer_step_speedup"] > 0 and out["ratio_vs_trl"] > 0


def test_scaling_prints_the_slopes_in_k_and_clip_length(tmp_path: Path) -> None:
    out = run_script(["benchmarks/scaling.py", "--ks", "2,4", "--seconds", "2,4", "--steps", "1", "--warmup", "0",
                      "--hidden", "64", "--layers", "1", "--image-side", "64", "--frame-side", "32", "--max-new-tokens",
                      "4", "--prompts", "1", "--k", "2", "--no-trl", "--out-dir", str(tmp_path)])
    assert (tmp_path / "scaling.json").is_file() and (tmp_path / "scaling.png").is_file()
    assert [float(k) for k in out["ks"]] == [2.0, 4.0] and [float(s) for s in out["seconds"]] == [2.0, 4.0]
    for sweep, slopes in (("step_s_vs_k", "slope_s_per_completion"), ("step_s_vs_seconds", "slope_s_per_video_second")):
        for name in ("shared", "naive"):
            y = out[sweep][name]
            assert len(y) == 2 and min(y) > 0, (sweep, name)
            assert out[slopes][name] == pytest.approx((y[1] - y[0]) / 2.0), (sweep, name)  # 2 points: the chord
    # the shared prompt is forwarded once per group, the naive rows K times: fewer tokens at every K
    for shared, naive in zip(out["detail"]["k"]["shared"], out["detail"]["k"]["naive"]):
        assert shared["k"] == naive["k"] and shared["prompt_tokens"] < naive["prompt_tokens"]


def test_grpo_learning_prints_the_reward_before_and_after(tmp_path: Path) -> None:
    out = run_script(["benchmarks/grpo_learning.py", "--sft-steps", "2", "--grpo-steps", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "grpo_learning.json").read_text())
    assert {k: saved[k] for k in out} == out  # the file adds the per-step rewards to the printed summary
    assert len(saved["rewards"]) == 3 and all(0.0 <= r <= 1.35 for r in saved["rewards"])


def test_faults_quick_recovers_every_training_fault() -> None:
    out = run_script(["benchmarks/faults.py", "--quick"], timeout=1200)
    assert out["faults_tried"] >= 8 and out["faults_recovered"] == out["faults_tried"]
    assert out["samples_lost"] == 0 and out["samples_repeated"] == 0


def test_world_runs_sft_grpo_and_sgr_end_to_end(tmp_path: Path) -> None:
    out = run_script(["benchmarks/world.py", "--seed", "0", "--train", "16", "--bench", "8", "--sft-steps", "2",
                      "--rl-steps", "1", "--val-every", "1", "--rl-val-every", "1", "--handoff-acc", "0",
                      "--threads", "1", "--work", str(tmp_path / "work"), "--results", str(tmp_path / "results")],
                     timeout=1200)
    assert out["world"] == {"train": 16, "bench": 8, "seconds": out["world"]["seconds"]}
    for stage in ("sft_handoff", "sft", "grpo", "sgr"):
        assert stage in out, stage
    assert (tmp_path / "results" / "world_seed0.json").is_file() and (tmp_path / "results" / "world_seed0.png").is_file()
