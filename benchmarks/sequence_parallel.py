"""Peak memory per rank of a GRPO update's forward and backward with sequence parallelism: SP = 1 against SP = 2.

    OMP_NUM_THREADS=2 python benchmarks/sequence_parallel.py   # 2B-width stand-in, 40 s clip (~6 min; peaks ~9.5 GiB)
    python benchmarks/sequence_parallel.py --smoke              # the tiny Qwen3-VL, seconds (tests/benchmarks/)

The model is a stand-in of Qwen3-VL-2B (:func:`grasp_lightning.synthetic.standin.build_standin`:
the published widths, hidden 2,048, 16 query and 8 key/value heads, the real 151,936-logit
vocabulary with tied embeddings, random weights) with ``--text-layers`` 2 decoder layers and
``--vision-layers`` 2 vision blocks, loaded in float32 on the CPU, the vision tower frozen (the
recipes' ``freeze_vision``), the language model trained whole (embedding and LM head included; ``--lora``:
the rank-16, alpha-32 adapters of ``configs/lora.yaml`` instead, dropout 0 so that no run draws
different masks), no gradient checkpointing. The prompt is one RL item of the bundled sample pointing
at a synthetic ``--clip-seconds`` clip at 2 fps of ``--clip-size`` pixels square (the data module's real processing:
chat template, timestamps, visual tokens); when its length is even one left-padding column is added,
so the split sequence (``ceil(S / 2)`` positions a rank) is padded, as it is for the completion
forward of ``Lc - 1`` positions (``--completion-tokens`` even).

What each rank runs (in a fresh process, so one run's peak cannot hide another's): the vision
features of the clip are encoded once under ``no_grad`` (the rollout's features, reused by the update
as ``compute.encode_vision_once`` does), then the measured step: the group-shared scoring of
``--k`` completions of up to ``--completion-tokens`` tokens
(:func:`grasp_lightning.grpo.scoring.score_completions`, ``share=True``, log-probs by
``--chunk``-token pieces of the LM head), a policy-gradient loss ``-sum(A * logp * mask) / sum(mask)``
with fixed advantages, and its backward. SP = 1 is one process with ``OMP_NUM_THREADS`` threads;
SP = 2 is two gloo processes (``model.sequence_parallel: 2``: :func:`grasp_lightning.sequence_parallel.new_groups`
and :func:`~grasp_lightning.sequence_parallel.install`), one thread each, sharing the machine.

Memory of a rank: the kernel's peak resident memory of its process (``VmHWM``, reset through
``/proc/self/clear_refs`` just before the step, as ``benchmarks/step_limit.py`` does) is
``peak_gib``; its resident memory at that point (interpreter, weights, inputs, vision features) is
``baseline_gib``; ``step_gib = peak_gib - baseline_gib`` is what the step adds: activations kept for
the backward, the attention's exchanged chunks, the logits of one chunk, temporaries and the
parameter gradients (``gradient_gib``, the same on every rank: SP does not split weights or
gradients). ``step_ratio`` = the larger SP = 2 rank's ``step_gib`` / SP = 1's (the figure the
issue's target of 0.65 applies to); ``peak_ratio`` the same for ``peak_gib``. Losses: every SP = 2
rank computes the whole loss from the gathered log-probs; ``loss_sp1`` and ``loss_sp2`` (rank 0's)
agree to float rounding, and ``grad_probe_*`` is the norm of the last decoder layer's parameter
gradients (SP = 2: summed over the group), which agree too.

``planner_gib`` is ``null``: :mod:`grasp_lightning.planning` takes no sequence-parallel degree.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from step_limit import _peak_bytes, _reset_peak, _rss_bytes, build  # noqa: E402 (sibling script)

GIB = 2**30
FULL = {"clip_seconds": 40.0, "clip_size": 320, "text_layers": 2, "vision_layers": 2, "k": 4,
        "completion_tokens": 256, "chunk": 512}
SMOKE = {"clip_seconds": 4.0, "clip_size": 64, "text_layers": None, "vision_layers": None, "k": 2,
         "completion_tokens": 16, "chunk": 8}
#: Advantages of the completions (cycled over the ``K`` rows): a fixed policy-gradient weight per row.
ADVANTAGES = (1.0, -1.0, 0.5, -0.5)


def odd_prompt(inputs: dict, pad_id: int) -> dict[str, torch.Tensor]:
    """The prompt's text and vision inputs, with one left-padding column added when its length is even."""
    from grasp_lightning.grpo.scoring import TEXT_KEYS, VISION_KEYS

    keys = [k for k in TEXT_KEYS if k in inputs] + [k for pair in VISION_KEYS for k in pair if k in inputs]
    prompt = {k: inputs[k] for k in keys}
    if prompt["input_ids"].shape[1] % 2 == 0:
        for key in TEXT_KEYS:
            if key in prompt:
                prompt[key] = torch.nn.functional.pad(prompt[key], (1, 0), value=pad_id if key == "input_ids" else 0)
    return prompt


def completions(k: int, length: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` seeded completions ``(k, length)``: full length, then 3/4, 1/2, 1/4 of it (cycled), padded with ``pad_id``."""
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 500, (k, length), generator=gen)
    lengths = torch.tensor([max(1, length * (4 - i % 4) // 4) for i in range(k)])
    mask = torch.arange(length)[None] < lengths[:, None]
    return ids.masked_fill(~mask, pad_id), mask


def rank_main(args) -> None:
    """One rank of one run: load the model and the inputs, encode the clip, measure the step, print a JSON line."""
    import torch.distributed as dist

    from grasp_lightning.grpo.scoring import score_completions
    from grasp_lightning.grpo.vision import VisionFeatures, reuse_vision, vision_core
    from grasp_lightning.policy import LoraConfig, PolicyConfig, load_policy
    from grasp_lightning.sequence_parallel import install, new_groups, text_model

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args._world > 1:
        dist.init_process_group("gloo", rank=args._rank, world_size=args._world)
    sp = new_groups(args._world)
    saved = torch.load(Path(args._work) / "inputs.pt", weights_only=False)
    torch.manual_seed(0)  # the same LoRA initialisation in every process
    lora = LoraConfig(enabled=True, r=16, alpha=32, dropout=0.0) if args.lora else None
    model = load_policy(PolicyConfig(name_or_path=saved["model_dir"], dtype="float32", freeze_vision=True), lora)
    install(model, sp)
    prompt, ids, mask = saved["prompt"], saved["ids"], saved["mask"]
    k = ids.shape[0]
    advantages = torch.tensor([ADVANTAGES[i % len(ADVANTAGES)] for i in range(k)])
    vision = VisionFeatures.for_model(model)
    with torch.no_grad(), reuse_vision(model, vision):  # the rollout's features: the update reuses them
        core = vision_core(model)
        core.get_video_features(prompt["pixel_values_videos"], prompt["video_grid_thw"])
    gc.collect()
    _reset_peak()
    baseline = _rss_bytes()
    start = time.perf_counter()
    logp, _ = score_completions(model, prompt, ids, mask, k, 1.0, True, args.chunk, vision=vision, sp=sp)
    loss = -(advantages[:, None] * logp * mask).sum() / mask.sum()
    loss.backward()
    seconds = time.perf_counter() - start
    peak = _peak_bytes()
    gradients = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    probe = torch.cat([p.grad.flatten() for p in text_model(model).layers[-1].parameters() if p.grad is not None])
    if args._world > 1:
        dist.all_reduce(probe)  # each rank holds its chunk's part of the gradient
    print(json.dumps({"rank": args._rank, "baseline_gib": baseline / GIB, "peak_gib": peak / GIB,
                      "step_gib": (peak - baseline) / GIB, "gradient_gib": gradients / GIB, "step_s": seconds,
                      "loss": float(loss.detach()), "grad_probe": float(probe.norm()),
                      "trainable_parameters": trainable}), flush=True)
    if args._world > 1:
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on this host for the gloo rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, work: Path, chunk: int, lora: bool, threads: int, timeout: float) -> list[dict]:
    """Launch ``world`` rank processes of this script (``threads`` threads each); their JSON lines, rank order.

    Raises:
        RuntimeError: a rank exited non-zero or ran past ``timeout`` seconds (its output's tail is shown).
    """
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": str(REPO)}
    extra = ["--chunk", str(chunk)] + (["--lora"] if lora else [])
    procs = [subprocess.Popen([sys.executable, __file__, "--_rank", str(r), "--_world", str(world), "--_work", str(work),
                               *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(world)]
    results = []
    for r, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"SP = {world} rank {r} ran past {timeout:.0f} s") from None
        if proc.returncode != 0:
            for p in procs:
                p.kill()
            raise RuntimeError(f"SP = {world} rank {r} exited {proc.returncode}: {err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> dict:
    """Parse the arguments, build the stand-in and the inputs, run SP = 1 then SP = 2, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Qwen3-VL, a short clip: seconds")
    for key, value in FULL.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None)
    parser.add_argument("--lora", action="store_true",
                        help="LoRA r16 alpha 32 (configs/lora.yaml) instead of training the language model whole")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run (SP = 1 or SP = 2) may take")
    parser.add_argument("--_rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._rank is not None:
        rank_main(args)
        return {}
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    if sizes["completion_tokens"] % 2:
        parser.error("--completion-tokens must be even (the completion forward's Lc - 1 positions are then odd)")
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    result: dict = {"benchmark": "sequence_parallel", "mode": "smoke" if args.smoke else "full", **sizes,
                    "dtype": "float32", "trained": "LoRA r16" if args.lora else "language model",
                    "threads_sp1": threads, "threads_per_rank_sp2": max(1, threads // 2)}
    with tempfile.TemporaryDirectory(prefix="sequence_parallel_") as tmp:
        from transformers import AutoConfig, AutoTokenizer

        model_dir, batch = build(Path(tmp), sizes)
        pad_id = AutoTokenizer.from_pretrained(str(model_dir)).pad_token_id
        prompt = odd_prompt(batch.inputs, pad_id)
        result["prompt_left_pad_added"] = int(prompt["input_ids"].shape[1] - batch.inputs["input_ids"].shape[1])
        ids, mask = completions(sizes["k"], sizes["completion_tokens"], pad_id)
        torch.save({"model_dir": str(model_dir), "prompt": prompt, "ids": ids, "mask": mask}, Path(tmp) / "inputs.pt")
        text = AutoConfig.from_pretrained(str(model_dir)).text_config
        grid = prompt["video_grid_thw"]
        result.update(model={"hidden": text.hidden_size, "heads": text.num_attention_heads,
                             "kv_heads": text.num_key_value_heads, "layers": text.num_hidden_layers,
                             "vocab": text.vocab_size},
                      prompt_tokens=int(prompt["input_ids"].shape[1]),
                      visual_tokens=int((grid.prod(-1) // 4).sum()),
                      completion_forward_tokens=int(ids.shape[0] * (ids.shape[1] - 1)),
                      completion_tokens_real=int(mask.sum()))
        del batch
        sp1 = run_ranks(1, Path(tmp), sizes["chunk"], args.lora, threads, args.timeout)
        sp2 = run_ranks(2, Path(tmp), sizes["chunk"], args.lora, max(1, threads // 2), args.timeout)
    worst = max(sp2, key=lambda r: r["step_gib"])
    result.update(
        trainable_parameters=sp1[0]["trainable_parameters"],
        sp1={key: round(value, 4) for key, value in sp1[0].items() if isinstance(value, float)},
        sp2=[{key: round(value, 4) for key, value in r.items() if isinstance(value, float)} for r in sp2],
        step_ratio=round(worst["step_gib"] / sp1[0]["step_gib"], 4),
        peak_ratio=round(max(r["peak_gib"] for r in sp2) / sp1[0]["peak_gib"], 4),
        loss_sp1=sp1[0]["loss"], loss_sp2=sp2[0]["loss"], loss_sp2_ranks=[r["loss"] for r in sp2],
        grad_probe_sp1=sp1[0]["grad_probe"], grad_probe_sp2=sp2[0]["grad_probe"],
        planner_gib=None, target_step_ratio=0.65)
    result["meets_target"] = result["step_ratio"] <= result["target_step_ratio"]
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
