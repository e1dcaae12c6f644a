"""benchmarks/gpu_check.py: the CPU smoke run end to end, and the GPU run's sizes and model.

The smoke run is the GPU check's own code path (stand-in built by ``grasp_lightning.synthetic.standin``, both
recipes through ``python -m grasp_lightning fit``, the ZeRO-2 engine) with tiny sizes; the GPU
run itself needs a CUDA device and is not run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check
from grasp_lightning.grpo.config import ComputeConfig
from tests.helpers import REPO


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.mark.parametrize("phase", ["sft", "sgr"])
def test_gpu_and_smoke_configs_differ_in_sizes_device_and_strategy_only(phase: str, tmp_path) -> None:
    args = (tmp_path / "model", tmp_path / "data", tmp_path / "r.json")
    gpu = _leaves(gpu_check.phase_overrides(phase, "gpu", gpu_check.SIZES["gpu"], *args))
    cpu = _leaves(gpu_check.phase_overrides(phase, "smoke-cpu", gpu_check.SIZES["smoke-cpu"], *args))
    differ = {k for k in gpu.keys() | cpu.keys() if gpu.get(k) != cpu.get(k)}
    allowed = {"trainer.accelerator", "trainer.strategy.class_path", "trainer.precision", "model.policy.dtype",
               "trainer.max_steps", "data.source.train_limit", "trainer.callbacks", "model.rollout.num_generations",
               "model.rollout.max_new_tokens"}
    assert differ <= allowed, differ - allowed
    assert gpu["trainer.strategy.class_path"] == "grasp_lightning.strategies.GraspDeepSpeedStrategy"
    assert "trainer.precision" not in gpu and "model.policy.dtype" not in gpu  # the recipe's bf16-mixed, bf16
    assert gpu["trainer.callbacks"][0]["class_path"] == "benchmarks.gpu_check.Throughput"


def test_gpu_mode_builds_the_published_depth(monkeypatch, tmp_path) -> None:
    """The GPU run stands in for the full 2B model (28 text layers, 24 vision blocks), real vocabulary."""
    import grasp_lightning.synthetic.standin as standin

    calls = []

    def fake_build(out, like, *, text_layers, vision_layers, dtype):
        calls.append((like, text_layers, vision_layers, dtype))
        Path(out).mkdir(parents=True)
        (Path(out) / "STANDIN.json").write_text(json.dumps({"parameters": 1}))

    monkeypatch.setattr(standin, "build_standin", fake_build)
    sizes = gpu_check.SIZES["gpu"]
    facts = gpu_check.build_model_dir(tmp_path / "m", "Qwen3-VL-2B-Instruct", sizes["text_layers"],
                                      sizes["vision_layers"])
    assert calls == [("Qwen3-VL-2B-Instruct", 28, 24, "bfloat16")]
    assert (facts["text_layers"], facts["vision_layers"]) == (28, 24)


def test_gpu_mode_without_cuda_stops_at_once() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and "no CUDA device" in report["error"]


@pytest.mark.slow
def test_smoke_cpu_end_to_end() -> None:
    """``python benchmarks/gpu_check.py --smoke-cpu``: SFT and SGR steps through the user's CLI on a
    2B-width stand-in (1 + 1 layers, real vocabulary) under the CPU ZeRO-2 engine; one JSON line."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke-cpu"], cwd=REPO, capture_output=True,
                          text=True, timeout=540, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n[gpu_check --smoke-cpu] {wall:.0f} s: {json.dumps(report)}")
    assert report["ok"] is True and report["mode"] == "smoke-cpu" and report["device"] == "cpu"
    assert (report["like"], report["text_layers"], report["vision_layers"]) == ("Qwen3-VL-2B-Instruct", 1, 1)
    assert report["parameters"] > 350_000_000  # 2B widths: the 151,936 x 2,048 embedding alone is 311 M
    sizes = gpu_check.SIZES["smoke-cpu"]
    for phase, samples_per_step in (("sft", 1), ("sgr", sizes["num_generations"])):
        figures = report[phase]
        assert figures["steps_measured"] == sizes[f"{phase}_steps"] - sizes["warmup"] == 1
        assert figures["seconds_per_step"] > 0 and figures["samples_per_s"] > 0 and figures["tokens_per_s"] > 0
        assert figures["samples_per_s"] * figures["seconds_per_step"] == pytest.approx(samples_per_step, rel=0.05)
        assert figures["model_tflops_per_s"] > 0
        assert (figures["strategy"], figures["zero_stage"], figures["reduce_bucket_size"]) == (
            "CPUDeepSpeedStrategy", 2, 200_000_000)  # the recipes' ZeRO-2 settings
        assert figures["gradient_checkpointing"] is True
        # 2 s at 2 fps, 448 x 448: 4 frames, 2 groups of 196 merged patches
        assert figures["video_tokens_per_sample"] == 392
        assert figures["planned_peak_gib"] > 0 and figures["peak_rss_gib"] > 0


def test_split_arms_set_only_the_three_changes(tmp_path) -> None:
    """Every ``--split`` arm is the recipe plus ``encode_vision_once`` / ``logprob_chunk_size`` /
    ``compile_decode``: today's path has all three off, each change arm turns on exactly one, ``all`` all three;
    the keys are real ``GRPOTask`` compute (``ComputeConfig``) and ``RolloutConfig`` arguments."""
    import inspect

    from grasp_lightning.engines.decoding import RolloutConfig

    task_args, rollout_args = set(inspect.signature(ComputeConfig).parameters), set(inspect.signature(RolloutConfig).parameters)
    on = {"vision_once": ("compute", "encode_vision_once", True), "chunked_logps": ("compute", "logprob_chunk_size", 256),
          "compiled_decode": ("rollout", "compile_decode", True)}
    today = gpu_check.ARMS["today"]
    assert today == {"compute": {"encode_vision_once": False, "logprob_chunk_size": None},
                     "rollout": {"compile_decode": False}}
    for name, arm in gpu_check.ARMS.items():
        assert set(arm["compute"]) <= task_args and set(arm["rollout"]) <= rollout_args
        changed = {(part, key) for part in arm for key in arm[part] if arm[part][key] != today[part][key]}
        expected = {on[name][:2]} if name in on else ({v[:2] for v in on.values()} if name == "all" else set())
        assert changed == expected, name
    args = (tmp_path / "model", tmp_path / "data", tmp_path / "r.json")
    for mode, backend in (("gpu", None), ("smoke-cpu", "aot_eager")):
        cfg = gpu_check.phase_overrides("sgr", mode, gpu_check.SIZES[mode], *args, arm=gpu_check.ARMS["all"])
        assert cfg["model"]["task"] == {"init_args": {"compute": {"encode_vision_once": True, "logprob_chunk_size": 256}}}
        assert cfg["model"]["rollout"]["compile_decode"] is True
        assert cfg["model"]["rollout"].get("compile_backend") == backend  # GPU: the default, inductor
    plain = gpu_check.phase_overrides("sgr", "gpu", gpu_check.SIZES["gpu"], *args)
    assert "task" not in plain["model"] and "compile_decode" not in plain["model"]["rollout"]


def test_split_models_are_the_2b_and_qwen3_5_stand_ins() -> None:
    from grasp_lightning.synthetic.standin import architectures

    arch = architectures()
    (like2b, t2b, v2b), (like9b, t9b, v9b) = gpu_check.SPLIT_MODELS["gpu"]
    assert (like2b, t2b, v2b) == ("Qwen3-VL-2B-Instruct", None, None)  # published depth
    assert like9b == "Qwen3.5-9B" and t9b % 4 == 0 and t9b < arch[like9b]["text"]["num_hidden_layers"]
    assert [m[0] for m in gpu_check.SPLIT_MODELS["smoke-cpu"]] == ["tiny-qwen3vl", "tiny-qwen3_5"]


def test_fla_check_without_a_gpu_says_why() -> None:
    import importlib.util

    import torch

    result = gpu_check.fla_initial_state_check()
    if importlib.util.find_spec("fla") is None:
        assert result == {"installed": False}
    elif not torch.cuda.is_available():
        assert result["installed"] is True and result["ran"] is False and "CUDA" in result["why"]
    else:
        assert result["initial_state_grad"] in ("returned", "none", "zero")


@pytest.mark.slow
def test_smoke_cpu_split_runs_the_arms_on_both_tiny_families() -> None:
    """``gpu_check.py --smoke-cpu --split --arms today,all``: SGR steps of today's path and of all three
    changes on the tiny Qwen3-VL and Qwen3.5, each through ``python -m grasp_lightning fit``; the split sums
    to no more than the step (data wait aside)."""
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke-cpu", "--split", "--arms", "today,all"],
                          cwd=REPO, capture_output=True, text=True, timeout=400,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-6000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is True and report["split"] is True and report["skipped"] == []
    assert list(report["models"]) == ["tiny-qwen3vl", "tiny-qwen3_5"]
    assert "installed" in report["models"]["tiny-qwen3_5"]["flash_linear_attention"]
    for model in report["models"].values():
        assert list(model["arms"]) == ["today", "all"]
        for figures in model["arms"].values():
            split = figures["split_s"]
            assert set(split) == {"generation_s", "reference_s", "scoring_s", "rewards_s", "update_s", "data_s"}
            assert split["generation_s"] > 0 and split["scoring_s"] > 0 and split["update_s"] > 0
            assert sum(split.values()) - split["data_s"] <= figures["seconds_per_step"] * 1.01
            assert figures["generated_tokens_per_s"] > 0 and figures["steps_measured"] == 1
