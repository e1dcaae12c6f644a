"""benchmarks/gpu_check.py: the CPU smoke run end to end, and the GPU run's sizes and model.

The smoke run is the GPU check's own code path (stand-in built by ``grasp_lightning.generators.standin``, both
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

REPO = Path(__file__).resolve().parents[1]


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
               "trainer.max_steps", "data.train_limit", "trainer.callbacks", "model.rollout.num_generations",
               "model.rollout.max_new_tokens"}
    assert differ <= allowed, differ - allowed
    assert gpu["trainer.strategy.class_path"] == "grasp_lightning.strategies.GraspDeepSpeedStrategy"
    assert "trainer.precision" not in gpu and "model.policy.dtype" not in gpu  # the recipe's bf16-mixed, bf16
    assert gpu["trainer.callbacks"][0]["class_path"] == "benchmarks.gpu_check.Throughput"


def test_gpu_mode_builds_the_published_depth(monkeypatch, tmp_path) -> None:
    """The GPU run stands in for the full 2B model (28 text layers, 24 vision blocks), real vocabulary."""
    import grasp_lightning.generators.standin as standin

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
