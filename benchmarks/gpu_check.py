"""GPU check: bf16 DeepSpeed ZeRO-2 SFT and GRPO-SGR steps of a random-initialised Qwen3-VL-2B on one GPU.

    bash benchmarks/gpu_check.sh                 # or: python benchmarks/gpu_check.py [--arch Qwen3-VL-4B-Instruct]

1. Builds the published Qwen3-VL-2B architecture (``grasp_lightning.memory.architecture_config``,
   the shapes of ``assets/qwen3vl-architectures.json``: 2.13B parameters, vocabulary 151,936) with
   random bf16 weights on the GPU, and saves it with a processor: the offline tiny model's tokenizer
   (the real one cannot be downloaded here; its special-token ids are written into the config) and
   Qwen3-VL's real video geometry (16-pixel patches, temporal patch 2, merge 2).
2. Runs ``configs/sft.yaml`` and then ``configs/sgr.yaml`` on it, each in its own process, through
   the training CLI with one GPU: ``GraspDeepSpeedStrategy`` ZeRO-2 (the recipes' bucket settings),
   ``bf16-mixed``, gradient checkpointing, batch 1 and no accumulation. Data: the bundled sample's
   SFT and RL rows, each pointing at a synthetic 448x448 clip of 30 s (``--clip-seconds``; the bundled
   clips are 128x72 and 4-6 s), decoded at 2 fps: about 5,900 video tokens per sample. GRPO samples
   K=8 completions of up to 128 tokens (a random model rarely stops early) and scores them against
   the frozen reference copy.
3. Prints one JSON line: per phase samples/s, tokens/s, seconds per step, peak allocated and
   reserved GiB, and MFU, measured over the steps after ``--warmup``.

MFU = model FLOPs per second / the GPU's dense bf16 peak (989 TFLOP/s for H100/H200 SXM, 312 for
A100; ``--peak-tflops`` for others). Model FLOPs per token (Kaplan et al. 2020; Narayanan et al.
2021): 2 N per forward token and 6 N per trained token, where N counts the language model's
non-embedding weights plus the output head (``d x V``), plus causal attention ``2 L d s`` per
forward token; the frozen vision tower adds ``2 N_vision`` per patch and forward pass. Gradient
checkpointing's recomputation is not counted (model FLOPs, not hardware FLOPs). GRPO counts the
rollout (prompt prefill + generated tokens), the reference's scoring forward and the policy's
training pass, with the prompt counted once per group when the task shares it (``share_prompt``).

Without a CUDA device it stops at once with exit status 2 and a JSON line saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def fail(message: str, status: int = 2) -> None:
    """Print ``{"ok": false, "error": ...}`` as the last line and exit."""
    print(f"gpu_check: {message}", file=sys.stderr)
    print(json.dumps({"ok": False, "error": message}))
    sys.exit(status)


def require_cuda() -> None:
    """Exit with status 2 unless torch sees a CUDA device (checked before anything heavy is imported)."""
    try:
        import torch
    except ImportError as err:  # pragma: no cover - the venv always has torch
        fail(f"torch is not importable: {err}")
    if not torch.cuda.is_available():
        fail("no CUDA device: this check needs one GPU (torch.cuda.is_available() is False; "
             f"torch {torch.__version__}, CUDA build {torch.version.cuda})")


# ---------------------------------------------------------------------------------------- model
def build_model_dir(out: Path, arch: str, seed: int = 0) -> dict:
    """Random bf16 weights of ``arch`` and a processor with its vision geometry, saved to ``out``."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    from grasp_lightning.memory import architecture_config
    from grasp_lightning.policy import load_processor
    from grasp_lightning.tiny import CHAT_TEMPLATE

    tokenizer = load_processor(str(REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl")).tokenizer
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = architecture_config(arch)
    for name, value in ids.items():
        setattr(config, name, value)
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    config.eos_token_id = config.text_config.eos_token_id = eos
    config.pad_token_id = config.text_config.pad_token_id = pad
    patch = config.vision_config.patch_size
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, pad
    model.save_pretrained(out)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=patch, temporal_patch_size=2, merge_size=2,
                                              size={"shortest_edge": 4096, "longest_edge": 16777216}),
        video_processor=Qwen3VLVideoProcessor(patch_size=patch, temporal_patch_size=2, merge_size=2, fps=2,
                                              size={"shortest_edge": 4096, "longest_edge": 25165824}),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    return {"arch": arch, "parameters": n}


def flop_counts(model_dir: Path) -> dict:
    """Parameter counts for the FLOPs model (from the saved config, on the meta device)."""
    import torch
    from transformers import AutoConfig, Qwen3VLForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    text = config.text_config
    embed = model.model.language_model.embed_tokens.weight.numel()
    lm = sum(p.numel() for p in model.model.language_model.parameters()) - embed
    return {"n_text": lm + text.hidden_size * text.vocab_size, "n_vision": sum(p.numel() for p in model.model.visual.parameters()),
            "layers": text.num_hidden_layers, "hidden": text.hidden_size}


def build_dataset(root: Path, rows: int, seconds: float, size: int) -> dict:
    """A GRASP-layout dataset of realistic clip size: the first ``rows`` SFT and RL rows of the bundled
    sample (``grasp_lightning/assets/sample``, whose synthetic clips are only 128x72 pixels and 4-6 s),
    each pointing at an extracted ``size x size`` clip of ``seconds`` seconds at 2 fps."""
    import numpy as np

    from grasp_lightning.data.sample import encode_mp4

    sample = REPO / "grasp_lightning" / "assets" / "sample" / "train"
    (root / "train" / "videos").mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:size, 0:size]
    n_frames = int(round(seconds * 2))
    clips = 0
    for name in ("data_sft.jsonl", "data_rl.jsonl"):
        out_rows = []
        for line in (sample / name).read_text(encoding="utf-8").splitlines()[:rows]:
            specs = json.loads(line)
            for spec in specs:
                if spec.get("type") == "video":
                    spec.update(start_seconds=0.0, end_seconds=float(seconds), src_resolution=[size, size])
                    target = root / "train" / "videos" / spec["path"]
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        frames = [((xx + yy + 9 * t + 40 * clips) % 256).astype(np.uint8)[..., None].repeat(3, -1)
                                  for t in range(n_frames)]
                        target.write_bytes(encode_mp4(frames, fps=2))
                        clips += 1
            out_rows.append(json.dumps(specs))
        (root / "train" / name).write_text("\n".join(out_rows) + "\n", encoding="utf-8")
    return {"clips": clips, "clip_seconds": seconds, "clip_pixels": [size, size]}


# ---------------------------------------------------------------------------------------- one phase
def _throughput_callback(counts: dict, warmup: int):
    import lightning as L
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    class Throughput(L.Callback):
        """Per optimizer step after ``warmup``: seconds, samples, tokens and model FLOPs."""

        def __init__(self) -> None:
            self.steps: list[dict] = []
            self._t0 = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            sync()
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            sync()
            seconds = time.perf_counter() - self._t0
            if batch_idx < warmup:
                return
            n, nv, L_, d = counts["n_text"], counts["n_vision"], counts["layers"], counts["hidden"]
            mask = batch.inputs["attention_mask"]
            lengths = mask.sum(1).float()
            patches = float(batch.inputs["video_grid_thw"].prod(-1).sum()) if "video_grid_thw" in batch.inputs else 0.0
            out = pl_module.last_task_output
            metrics = out.metrics if out is not None else {}
            if "tokens/generated" in metrics:  # GRPO: rollout + reference scoring + training pass
                k = pl_module.rollout_cfg.num_generations
                gen = float(metrics["tokens/generated"])
                prompts = float(lengths.sum())
                shared = bool(metrics.get("rollout/shared_prompt", 0.0))
                prompt_rows = prompts if shared else prompts * k
                seq = float(lengths.mean()) + gen / max(1, len(batch) * k)
                attn = 2 * L_ * d * seq
                fwd_tokens = prompt_rows + gen
                flops = ((2 * n + attn) * (prompts + gen)          # rollout: prefill + decode
                         + (2 * n + attn) * fwd_tokens              # reference forward
                         + 3 * (2 * n + attn) * fwd_tokens          # policy forward + backward
                         + 3 * 2 * nv * patches)                    # vision tower, one forward per pass
                tokens, samples = prompts + gen, float(len(batch) * k)
            else:  # SFT: one forward + backward over the sequence
                flops = float(sum(3 * (2 * n * s + 2 * L_ * d * s * s / 2) for s in lengths.tolist())) \
                    + 2 * nv * patches
                tokens, samples = float(lengths.sum()), float(len(batch))
            self.steps.append({"seconds": seconds, "tokens": tokens, "samples": samples, "flops": flops,
                               "video_tokens_per_sample": patches / 4 / max(1, len(batch))})

    return Throughput()


def run_phase(phase: str, model_dir: Path, data_root: Path, steps: int, warmup: int, smoke_cpu: bool) -> dict:
    """Train ``steps`` micro-batches of ``phase`` (``sft`` or ``sgr``) in this process; return its figures."""
    import torch

    from grasp_lightning.cli import GraspCLI
    from grasp_lightning.data.datamodule import GraspDataModule
    from grasp_lightning.module import GraspModule

    args = ["--config", f"configs/{phase}.yaml",  # its strategy: GraspDeepSpeedStrategy, ZeRO-2, recipe buckets
            f"--trainer.accelerator={'cpu' if smoke_cpu else 'gpu'}", "--trainer.devices=1", "--trainer.num_nodes=1",
            f"--trainer.precision={'32-true' if smoke_cpu else 'bf16-mixed'}",
            f"--trainer.max_steps={steps}", "--trainer.accumulate_grad_batches=1", "--trainer.limit_val_batches=0",
            "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0",
            f"--model.policy.name_or_path={model_dir}", f"--model.policy.dtype={'float32' if smoke_cpu else 'bfloat16'}",
            "--model.policy.attn_implementation=sdpa", f"--data.root={data_root}", f"--data.train_limit={steps}",
            "--data.batch_size=1", "--data.num_workers=2", "--data.bench=null", "--data.on_bad_item=raise"]
    if smoke_cpu:
        args.append("--trainer.strategy.class_path=tests.deepspeed_cpu.CPUDeepSpeedStrategy")
    if phase == "sgr":
        args += ["--model.rollout.num_generations=8", "--model.rollout.max_new_tokens=128"]
    cli = GraspCLI(GraspModule, GraspDataModule, args=args, run=False, auto_configure_optimizers=False,
                   save_config_kwargs={"overwrite": True}, parser_kwargs={"default_env": False})
    callback = _throughput_callback(flop_counts(model_dir), warmup)
    cli.trainer.callbacks.append(callback)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    total = time.perf_counter() - t0
    measured = callback.steps
    seconds = sum(s["seconds"] for s in measured)
    result = {"steps_measured": len(measured), "fit_seconds": round(total, 1),
              "seconds_per_step": round(seconds / max(1, len(measured)), 3),
              "samples_per_s": round(sum(s["samples"] for s in measured) / seconds, 3) if seconds else None,
              "tokens_per_s": round(sum(s["tokens"] for s in measured) / seconds, 1) if seconds else None,
              "model_tflops_per_s": round(sum(s["flops"] for s in measured) / seconds / 1e12, 2) if seconds else None,
              "video_tokens_per_sample": round(sum(s["video_tokens_per_sample"] for s in measured)
                                               / max(1, len(measured)), 1),
              "zero_stage": (cli.trainer.strategy.config or {}).get("zero_optimization", {}).get("stage")}
    if torch.cuda.is_available():
        result["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        result["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
    return result


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="Qwen3-VL-2B-Instruct", help="a bundled Qwen3-VL architecture name")
    parser.add_argument("--sft-steps", type=int, default=10)
    parser.add_argument("--sgr-steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the figures")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU")
    parser.add_argument("--phase", choices=["sft", "sgr"], help=argparse.SUPPRESS)  # internal: one phase
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--data-root", help=argparse.SUPPRESS)
    parser.add_argument("--clip-seconds", type=float, default=30.0, help="length of the synthetic clips")
    parser.add_argument("--clip-size", type=int, default=448, help="width and height of the synthetic clips")
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="development only: tiny shapes on the CPU test strategy, to check the script runs")
    args = parser.parse_args(argv)
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not args.smoke_cpu:
        require_cuda()
    if args.phase:  # child process: one phase, figures to --result
        steps = args.sft_steps if args.phase == "sft" else args.sgr_steps
        result = run_phase(args.phase, Path(args.model_dir), Path(args.data_root), steps, args.warmup, args.smoke_cpu)
        Path(args.result).write_text(json.dumps(result))
        return

    import torch

    t0 = time.perf_counter()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in device), None)
    report: dict = {"ok": True, "device": device, "peak_tflops": peak}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        model_dir = Path(tmp) / "model"
        report.update(build_model_dir(model_dir, args.arch) if not args.smoke_cpu else _smoke_model(model_dir))
        report["data"] = build_dataset(Path(tmp) / "data", max(args.sft_steps, args.sgr_steps),
                                       args.clip_seconds, args.clip_size)
        report["build_seconds"] = round(time.perf_counter() - t0, 1)
        for phase in ("sft", "sgr"):
            result_file = Path(tmp) / f"{phase}.json"
            cmd = [sys.executable, __file__, "--phase", phase, "--model-dir", str(model_dir), "--result", str(result_file),
                   "--data-root", str(Path(tmp) / "data"),
                   "--sft-steps", str(args.sft_steps), "--sgr-steps", str(args.sgr_steps), "--warmup", str(args.warmup)]
            proc = subprocess.run(cmd + (["--smoke-cpu"] if args.smoke_cpu else []), cwd=REPO)
            if proc.returncode != 0 or not result_file.exists():
                report.update(ok=False, error=f"{phase} phase failed with exit status {proc.returncode} (log above)")
                break
            figures = json.loads(result_file.read_text())
            if peak and figures.get("model_tflops_per_s") is not None:
                figures["mfu"] = round(figures["model_tflops_per_s"] / peak, 4)
            report[phase] = figures
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report))
    sys.exit(0 if report["ok"] else 1)


def _smoke_model(out: Path) -> dict:
    """``--smoke-cpu``: a small random Qwen3-VL with the 2B model's vision geometry (16-pixel patches)."""
    from grasp_lightning.tiny import build_tiny_qwen3vl

    build_tiny_qwen3vl(out, patch_size=16, max_video_pixels=448 * 448 * 16)
    return {"arch": "tiny (smoke-cpu)", "parameters": None}


if __name__ == "__main__":
    main()
