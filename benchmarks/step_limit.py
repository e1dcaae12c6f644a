"""A GRPO step at the limit (issue 42): the frozen vision tower once per rollout batch, log-probs without the full logits.

    OMP_NUM_THREADS=2 python benchmarks/step_limit.py   # 2B-width stand-in, 30 s clip at 2 fps, K = 8 (~1 h on 2 busy cores)
    python benchmarks/step_limit.py --smoke    # the tiny Qwen3-VL, seconds (tests/benchmarks/test_benchmark_scripts.py)

Two parts, each comparing today's path (*before*: every forward runs the vision tower, scoring takes
the model's ``(B*K, Lc, V)`` logits) with the new one (*after*: ``GRPOTask(compute=ComputeConfig(encode_vision_once=True,
logprob_chunk_size=256))``, the defaults) in the same process:

1. **Step.** A stand-in of Qwen3-VL-2B (:func:`grasp_lightning.synthetic.standin.build_standin`:
   published widths, the real Qwen3 vocabulary of 151,936 logits, random weights) with its depths in
   the published 24 : 28 proportion (``--vision-layers 6 --text-layers 7``), float32 on the CPU, LoRA
   r16 (``configs/lora.yaml``: the reference is the adapter-disabled policy), the vision tower frozen.
   One prompt of the bundled sample pointing at a synthetic ``--clip-seconds`` 30 s clip decoded at
   2 fps (60 frames) of ``--clip-size`` pixels square (160: 750 visual tokens, beside ~430 text and
   timestamp tokens; the published 448 x 448 frames give 5,880 visual tokens, and the larger the
   visual share, the more the tower's repeats cost); K = 8 completions of ``--max-new-tokens``.
   One GRPO step is ``GRPOTask.training_step`` (sampling with the group-shared prefill, rewards,
   reference scoring, the policy's scoring and the loss) plus the backward, timed in process CPU
   seconds (``time.process_time``: steadier than wall time on a shared machine); the two paths
   alternate ``--steps`` times, the medians are reported. Vision forwards per prompt are counted by a
   forward pre-hook on the tower (:class:`grasp_lightning.grpo.vision.VisionForwardCounter`):
   the grids it encodes over the step divided by the prompts. The two paths' losses are printed too
   (they agree to float rounding).
2. **Scoring memory.** The LM head + selective log-softmax + entropy of K = 8 x 1,024 completion
   tokens (``--score-k``, ``--score-tokens``) with the real vocabulary: final hidden states
   ``(K, Lc, 2048)`` and the 2B stand-in's head ``(151,936, 2048)``, both bf16 as the recipes train,
   scored without gradients as the reference and old-policy scoring do
   (``scoring.logps_and_entropy`` on the full logits, against
   ``chunked_logps.chunked_logps_and_entropy``). Each path runs in a fresh subprocess; its peak is
   the process's peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs`` once the
   inputs are built) less its resident memory at that point: every byte torch's CPU allocator held
   at the worst moment of the pass. The same with gradients (forward and backward, as the training
   forward does) at ``--train-score-tokens`` tokens per completion (the full 1,024 would need some
   15 GB for today's path on this machine) gives ``train_scoring_peak_bytes_*``. ``--score-hidden``
   narrows the hidden states (and the head's input width) to make the head's matmul cheap on a busy
   CPU: what both paths hold is ``K x Lc x V`` logits (or one chunk of them) either way; a width of
   2,048 adds ``K x Lc x 2,048 x 2`` B (34 MB at 8 x 1,024) of hidden states to both.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

#: The stand-in's text width and vocabulary (Qwen3-VL-2B: hidden 2,048, 151,936 logits).
HIDDEN, VOCAB = 2048, 151936
FULL = {"clip_seconds": 30.0, "clip_size": 160, "k": 8, "max_new_tokens": 8, "steps": 1, "text_layers": 7,
        "vision_layers": 6, "score_k": 8, "score_tokens": 1024, "train_score_tokens": 128, "chunk": 256,
        "score_hidden": 256}
SMOKE = {"clip_seconds": 4.0, "clip_size": 64, "k": 4, "max_new_tokens": 6, "steps": 1, "text_layers": None,
         "vision_layers": None, "score_k": 2, "score_tokens": 64, "train_score_tokens": 32, "chunk": 32,
         "score_hidden": 64}


def _rss_bytes() -> int:
    """The process's resident memory now (``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> bool:
    """Reset the kernel's peak resident memory of this process (``VmHWM``; ``clear_refs`` value 5, Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    """The process's peak resident memory (``VmHWM`` of ``/proc/self/status``; ``ru_maxrss`` elsewhere)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scoring_peak(path: str, k: int, tokens: int, chunk: int, grad: bool, hidden_size: int = HIDDEN) -> int:
    """Peak bytes one scoring pass adds to this process: ``before`` (full logits) or ``after`` (chunked)."""
    from grasp_lightning.grpo.logprobs import chunked_logps_and_entropy
    from grasp_lightning.grpo.scoring import logps_and_entropy

    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden_size, VOCAB, bias=False, dtype=torch.bfloat16, device="meta").to_empty(device="cpu")
    with torch.no_grad():
        head.weight.normal_(0.0, 0.02, generator=gen)  # no float32 initialisation copy
    head.requires_grad_(False)
    hidden = torch.empty(k, tokens, hidden_size, dtype=torch.bfloat16).normal_(generator=gen).requires_grad_(grad)
    ids = torch.randint(0, VOCAB, (k, tokens), generator=gen)
    _reset_peak()
    base = _rss_bytes()
    with torch.set_grad_enabled(grad):
        if path == "before":
            logp, _ = logps_and_entropy(head(hidden), ids, 1.0)
        else:
            logp, _ = chunked_logps_and_entropy(hidden, head, ids, 1.0, chunk)
        if grad:
            logp.sum().backward()
    return _peak_bytes() - base


def measure_scoring(path: str, k: int, tokens: int, chunk: int, grad: bool, hidden_size: int) -> int:
    """:func:`scoring_peak` in a fresh subprocess (so one path's peak cannot hide the other's)."""
    cmd = [sys.executable, __file__, "--_scoring", path, "--score-k", str(k), "--score-tokens", str(tokens),
           "--chunk", str(chunk), "--score-hidden", str(hidden_size)] + (["--_grad"] if grad else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"])


def build(tmp: Path, sizes: dict) -> tuple[Path, object]:
    """The model directory (the 2B-width stand-in, or the tiny Qwen3-VL for the smoke run) and one RL batch."""
    from gpu_check import build_dataset

    from grasp_lightning.datamodule import GraspDataModule

    if sizes["text_layers"] is None:
        model_dir = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"
    else:
        from grasp_lightning.synthetic.standin import build_standin

        model_dir = build_standin(tmp / "model", "Qwen3-VL-2B-Instruct", text_layers=sizes["text_layers"],
                                  vision_layers=sizes["vision_layers"], dtype="bfloat16")
    build_dataset(tmp / "data", 1, sizes["clip_seconds"], sizes["clip_size"])
    frames = int(round(sizes["clip_seconds"] * 2))
    dm = GraspDataModule(source=SourceConfig(root=str(tmp / "data"), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=frames, max_pixels=sizes["clip_size"] ** 2),
                         prompt=PromptConfig(processor=str(model_dir)),
                         loader=LoaderConfig(data_mode="rl", batch_size=1, num_workers=0))
    dm.setup("fit")
    return model_dir, next(iter(dm.train_dataloader()))


def run_step(module, batch, once: bool, chunk: int | None) -> dict:
    """One GRPO step (training_step + backward) on the given path; CPU s, wall s, vision grids, loss."""
    from grasp_lightning.grpo.vision import VisionForwardCounter

    task = module.task
    task.compute.encode_vision_once, task.compute.logprob_chunk_size = once, chunk
    module.policy.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with VisionForwardCounter(module.policy) as counter:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        task.prepare(module, batch)
        out = task.training_step(module, batch)
        out.loss.backward()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "grids": counter.grids, "loss": float(out.loss.detach())}


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, run both parts, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny Qwen3-VL, short clip, small scoring: seconds")
    for key in FULL:
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(FULL[key]) if FULL[key] is not None else int,
                            default=None)
    parser.add_argument("--_scoring", choices=("before", "after"), help=argparse.SUPPRESS)
    parser.add_argument("--_grad", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    if args._scoring:
        peak = scoring_peak(args._scoring, sizes["score_k"], sizes["score_tokens"], sizes["chunk"], args._grad,
                            sizes["score_hidden"])
        print(json.dumps({"peak_bytes": peak}))
        return

    from grasp_lightning.engines.decoding import RolloutConfig
    from grasp_lightning.module import GraspModule
    from grasp_lightning.policy import LoraConfig, PolicyConfig
    from grasp_lightning.tasks.grpo import GRPOTask, LossConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result: dict = {"mode": "smoke" if args.smoke else "full", **{k: v for k, v in sizes.items()}}
    with tempfile.TemporaryDirectory(prefix="step_limit_") as tmp:
        model_dir, batch = build(Path(tmp), sizes)
        module = GraspModule(GRPOTask(loss=LossConfig(beta=0.05)), policy=PolicyConfig(name_or_path=str(model_dir), dtype="float32",
                                                                      freeze_vision=True),
                             lora=LoraConfig(enabled=True, r=16),
                             rollout=RolloutConfig(num_generations=sizes["k"], max_new_tokens=sizes["max_new_tokens"],
                                                   stop_at_answer=False))
        module.configure_model()
        prompts = int(batch.inputs["input_ids"].shape[0])
        result.update(prompts=prompts, prompt_tokens=int(batch.inputs["input_ids"].shape[1]),
                      parameters=sum(p.numel() for p in module.policy.parameters()))
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for step in range(sizes["steps"]):
            order = ("before", "after") if step % 2 == 0 else ("after", "before")
            for path in order:
                runs[path].append(run_step(module, batch, path == "after", sizes["chunk"] if path == "after" else None))
                print(json.dumps({"step": step, "path": path, **runs[path][-1]}), file=sys.stderr, flush=True)
        del module  # its weights out of the way of the scoring subprocesses
        gc.collect()
    for path, steps in runs.items():
        result[f"vision_forwards_per_prompt_{path}"] = steps[0]["grids"] / prompts
        result[f"step_cpu_s_{path}"] = round(statistics.median(s["cpu_s"] for s in steps), 3)
        result[f"step_wall_s_{path}"] = round(statistics.median(s["wall_s"] for s in steps), 3)
        result[f"loss_{path}"] = steps[0]["loss"]
    result["step_cpu_ratio"] = round(result["step_cpu_s_after"] / result["step_cpu_s_before"], 3)
    for prefix, tokens, grad in (("", sizes["score_tokens"], False), ("train_", sizes["train_score_tokens"], True)):
        for path in ("before", "after"):
            result[f"{prefix}scoring_peak_bytes_{path}"] = measure_scoring(path, sizes["score_k"], tokens,
                                                                           sizes["chunk"], grad, sizes["score_hidden"])
        result[f"{prefix}scoring_peak_ratio"] = round(
            result[f"{prefix}scoring_peak_bytes_after"] / result[f"{prefix}scoring_peak_bytes_before"], 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
