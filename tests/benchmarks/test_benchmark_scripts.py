"""The speed and learning scripts docs/development.md lists (``benchmarks/*.py``) run, in a small CPU smoke
size, and print the figures they promise as their last line of JSON.

The figures themselves are machine-dependent and are not asserted beyond their sanity (positive
times, equal sampled frames, every injected fault recovered, sharing the prompt saving CPU time at
a prompt-dominated size); token counts are exact (the shared prompt forwarded once per group, naive
rows K times) for both model families the speed scripts compare. benchmarks/results/README.md quotes full-size runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_video_decode_prints_the_speed_of_both_decode_paths(run_script) -> None:
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


def test_grpo_step_prints_both_families_against_trl_with_the_prompt_tokens_each_forwards(run_script) -> None:
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


def test_grpo_step_accumulate_compares_rollout_batches_per_optimizer_step(run_script) -> None:
    out = run_script(["benchmarks/grpo_step.py", *TINY_MODEL, "--k", "4", "--max-new-tokens", "4", "--image-side",
                      "64", "--accumulate", "2"])
    assert out["mode"] == "optimizer_step" and list(out["models"]) == list(FAMILIES)
    for family, result in out["models"].items():
        assert result["optimizer_step_speedup"] > 0 and result["ratio_vs_trl"] > 0, family


def test_scaling_prints_the_slopes_in_k_and_clip_length_for_both_families(tmp_path: Path, run_script) -> None:
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


def test_grpo_learning_prints_the_reward_before_and_after(tmp_path: Path, run_script) -> None:
    out = run_script(["benchmarks/grpo_learning.py", "--sft-steps", "2", "--grpo-steps", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "grpo_learning.json").read_text())
    assert {k: saved[k] for k in out} == out  # the file adds the per-step rewards to the printed summary
    assert len(saved["rewards"]) == 3 and all(0.0 <= r <= 1.35 for r in saved["rewards"])


def test_grpo_learning_compares_every_loss_type_over_the_same_seeds(tmp_path: Path, run_script) -> None:
    from grasp_lightning.grpo.objective import LOSS_TYPES

    out = run_script(["benchmarks/grpo_learning.py", "--loss-types", "all", "--seeds", "0,1", "--steps", "2", "--last",
                      "1", "--prompts", "1", "--k", "2", "--tokens", "4", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "grpo_loss_types.json").read_text())
    assert {k: saved[k] for k in out} == out and (tmp_path / "grpo_loss_types.png").stat().st_size > 0
    assert list(out["loss_types"]) == list(LOSS_TYPES) and out["seeds"] == [0, 1]  # read when the script runs
    for loss_type, runs in saved["rewards"].items():
        assert sorted(runs) == ["0", "1"] and all(len(r) == 2 for r in runs.values()), loss_type
        row = out["loss_types"][loss_type]
        assert row["last_min"] <= row["last_mean"] <= row["last_max"] and row["s_per_step"] > 0
    first = {t: saved["rewards"][t]["0"][0] for t in LOSS_TYPES}  # step 1 samples before any update: same seed,
    assert len(set(first.values())) == 1, first  # same rollouts, whatever the loss


def test_healthy_ranges_summarises_every_grpo_step(tmp_path: Path, run_script) -> None:
    out = run_script(["benchmarks/healthy_ranges.py", "--sft-steps", "2", "--grpo-steps", "3", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "healthy_ranges_tiny.json").read_text())
    assert {k: saved[k] for k in out} == out and len(saved["steps"]) == 3  # the file adds every step's values
    kl = out["summary"]["train/kl"]
    assert out["summary"]["train/clip_ratio"]["max"] == 0.0 and out["summary"]["train/ratio/mean"]["min"] == 1.0
    assert kl["steps"] == 3 and 0.0 <= kl["min"] <= kl["median"] <= kl["max"]


def test_faults_quick_recovers_every_training_fault(run_script) -> None:
    out = run_script(["benchmarks/faults.py", "--quick"], timeout=1200)
    assert out["faults_tried"] >= 8 and out["faults_recovered"] == out["faults_tried"]
    assert out["samples_lost"] == 0 and out["samples_repeated"] == 0


def test_dynamic_sampling_compares_drop_and_refill_from_one_sft_handoff(tmp_path: Path, run_script) -> None:
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


def test_step_limit_prints_vision_forwards_step_time_and_scoring_peak(run_script) -> None:
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



def test_decode_speed_prints_eager_and_compiled_tokens_per_second_with_the_same_tokens(run_script) -> None:
    """``benchmarks/decode_speed.py`` at a smoke size: both tiny families, eager and aot_eager-compiled decode."""
    out = run_script(["benchmarks/decode_speed.py", "--backends", "aot_eager", "--new-tokens", "4", "--repeats", "1",
                      "--k", "2"], timeout=600)
    assert out["k"] == 2 and out["new_tokens"] == 4 and sorted(out["families"]) == ["qwen3_5", "qwen3_vl"]
    for rows in out["families"].values():
        assert set(rows) == {"eager", "aot_eager"}
        assert rows["aot_eager"]["same_tokens_as_eager"] is True and rows["aot_eager"]["tokens"] == rows["eager"]["tokens"]
        assert all(r["tokens_per_s"] > 0 and r["best_s"] > 0 for r in rows.values())


@pytest.mark.parametrize("whole", [False, True], ids=["lora", "language-model"])
def test_sequence_parallel_prints_the_peak_per_rank_at_sp1_and_sp2_with_equal_losses(run_script, whole: bool) -> None:
    """``benchmarks/sequence_parallel.py --smoke``: the tiny Qwen3-VL's GRPO update on 1 process and on 2 gloo ranks
    at two clip lengths; the split run's loss and summed gradient equal the one-rank run's, the ratios are the
    printed peaks', the planner's figures stand beside them, and the top level repeats the longest clip's."""
    out = run_script(["benchmarks/sequence_parallel.py", "--smoke", *(["--whole-lm"] if whole else [])], timeout=600)
    assert out["benchmark"] == "sequence_parallel" and out["mode"] == "smoke"
    assert out["trained"] == ("language model" if whole else "LoRA r16")
    assert out["clip_seconds"] == [2.0, 4.0] and [e["clip_seconds"] for e in out["lengths"]] == [2.0, 4.0]
    first, last = out["lengths"]
    assert first["prompt_tokens"] < last["prompt_tokens"] and first["visual_tokens"] < last["visual_tokens"]
    for entry in out["lengths"]:
        assert entry["prompt_tokens"] % 2 == 1
        assert entry["completion_forward_tokens"] == out["k"] * (out["completion_tokens"] - 1)
        assert len(entry["sp2"]) == 2
        for run in (entry["sp1"], *entry["sp2"]):
            assert set(run) == {"baseline_gib", "peak_gib", "step_gib", "gradient_gib", "step_s", "loss", "grad_probe"}
            assert run["peak_gib"] > run["baseline_gib"] > 0 and run["step_s"] > 0
            assert run["step_gib"] == pytest.approx(run["peak_gib"] - run["baseline_gib"], abs=2e-4)
        assert entry["sp1"]["gradient_gib"] == entry["sp2"][0]["gradient_gib"] > 0  # SP splits no gradient
        assert entry["loss_sp2"] == pytest.approx(entry["loss_sp1"], rel=1e-5, abs=1e-6)
        assert entry["loss_sp2_ranks"][0] == entry["loss_sp2_ranks"][1]  # every rank computes the whole loss
        assert entry["grad_probe_sp2"] == pytest.approx(entry["grad_probe_sp1"], rel=1e-4) and entry["grad_probe_sp1"] > 0
        worst = max(r["step_gib"] for r in entry["sp2"])
        assert entry["step_ratio"] == pytest.approx(worst / entry["sp1"]["step_gib"], rel=0.02)  # rounded GiB
        # the planner's training term for the same shapes: its visual tokens are the measured ones, SP = 2 holds less
        plan = entry["planner_terms"]
        assert plan["sp1"]["visual_tokens"] == plan["sp2"]["visual_tokens"] == entry["visual_tokens"]
        assert entry["planner_gib"] == {"sp1": plan["sp1"]["training_gib"], "sp2": plan["sp2"]["training_gib"]}
        assert 0 < entry["planner_gib"]["sp2"] < entry["planner_gib"]["sp1"]
        assert entry["planner_ratio"] == pytest.approx(entry["planner_gib"]["sp2"] / entry["planner_gib"]["sp1"],
                                                       rel=1e-3)
        assert plan["sp1"]["gradients_gib"] == plan["sp2"]["gradients_gib"] > 0
    assert plan["sp1"]["gradients_gib"] == pytest.approx(last["sp1"]["gradient_gib"], abs=2e-4)  # P_t x 4 B both
    for key in ("step_ratio", "peak_ratio", "planner_gib", "planner_ratio", "loss_sp1", "loss_sp2", "prompt_tokens"):
        assert out[key] == last[key]
    assert out["longest_clip_seconds"] == 4.0 and out["losses_equal"] is True
    assert "marginal_step_ratio" in out and set(out["marginal_mib_per_token"]) == {"sp1", "sp2"}
    assert out["meets_target"] == (out["step_ratio"] <= 0.65)


def test_vision_split_measures_the_whole_clip_against_one_ranks_share_exactly(run_script) -> None:
    """``benchmarks/vision_split.py --smoke``: the tiny Qwen3-VL's vision tower on the whole clip and on the first
    half of its temporal patches; the share's features are the whole clip's rows (a frame split is exact)."""
    out = run_script(["benchmarks/vision_split.py", "--smoke"], timeout=600)
    assert out["benchmark"] == "vision_split" and out["mode"] == "smoke" and out["sequence_parallel"] == 2
    t, h, w = out["grid_thw"]
    assert out["share"]["temporal_patches"] == (t + 1) // 2 and out["patches"] == t * h * w
    assert out["merged_tokens"] == out["patches"] // 4  # 2 x 2 spatial merge
    assert out["exact_max_abs_diff"] == 0.0
    assert out["whole"]["s"] > 0 and out["share"]["s"] > 0 and out["gather_mib"] > 0
    assert out["vision_block_s"] == pytest.approx(out["whole"]["s"] / out["vision_layers"], abs=2e-3)
    assert out["decoder_layer_s"] > 0 and out["real_depth"]["decoder_s"] == pytest.approx(28 * out["decoder_layer_s"], abs=0.1)
