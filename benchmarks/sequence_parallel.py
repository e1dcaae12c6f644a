"""Peak memory per rank of a GRPO update's forward and backward against clip length: SP = 1 against SP = 2.

    OMP_NUM_THREADS=2 python benchmarks/sequence_parallel.py              # LoRA r16, 16 s and 40 s clips (~7 min; peaks ~9 GiB)
    OMP_NUM_THREADS=2 python benchmarks/sequence_parallel.py --whole-lm --clip-seconds 40   # the LM trained whole (~5 min; ~12.5 GiB)
    python benchmarks/sequence_parallel.py --smoke                         # the tiny Qwen3-VL, 2 s and 4 s clips (tests/benchmarks/)

The model is a stand-in of Qwen3-VL-2B (:func:`grasp_lightning.synthetic.standin.build_standin`:
the published widths, hidden 2,048, 16 query and 8 key/value heads, the real 151,936-logit
vocabulary with tied embeddings, random weights) with ``--text-layers`` 4 decoder layers (the published
model has 28) and ``--vision-layers`` 2 vision blocks, loaded in float32 on the CPU, the vision tower frozen
(the recipes' ``freeze_vision``). Trained: the rank-16, alpha-32 LoRA adapters of ``configs/lora.yaml``
(dropout 0 so that no run draws different masks; the embedding and LM head frozen, as a ZeRO-2 run on 8 GPUs
keeps a rank's share of their gradients small); ``--whole-lm``: the language model whole, embedding and LM head
included (their 151,936 x 2,048 gradient, unpartitioned here, is on every rank). No gradient checkpointing.
For each ``--clip-seconds`` length (several in one invocation, shortest first; the longest is the headline) the
prompt is one RL item of the bundled sample pointing at a synthetic clip of that length at 2 fps of
``--clip-size`` pixels square (the data module's real processing: chat template, timestamps, visual tokens);
when its length is even one left-padding column is added, so the split sequence (``ceil(S / 2)`` positions a
rank) is padded, as it is for the completion forward of ``Lc - 1`` positions (``--completion-tokens`` even).

What each rank runs (in a fresh process, so one run's peak cannot hide another's): the vision
features of the clip are encoded once under ``no_grad`` (the rollout's features, reused by the update
as ``compute.encode_vision_once`` does), then the measured step: the group-shared scoring of
``--k`` completions of up to ``--completion-tokens`` tokens
(:func:`grasp_lightning.grpo.scoring.score_completions`, ``share=True``, log-probs by
``--chunk``-token pieces of the LM head: 256, the recipes' ``compute.logprob_chunk_size``), a policy-gradient
loss ``-sum(A * logp * mask) / sum(mask)`` with fixed advantages, and its backward. SP = 1 is one process with
``OMP_NUM_THREADS`` threads; SP = 2 is two gloo processes (``model.sequence_parallel: 2``:
:func:`grasp_lightning.sequence_parallel.new_groups` and :func:`~grasp_lightning.sequence_parallel.install`),
one thread each, sharing the machine.

The rank processes run with ``MALLOC_MMAP_THRESHOLD_=65536`` (:data:`MMAP_THRESHOLD`): glibc then maps every
block above 64 KiB (every tensor that matters) and unmaps it when freed, so the resident memory follows
the live tensors, as a GPU caching allocator's ``max_memory_allocated`` does. With glibc's default (a
threshold that grows once a mapped block is freed), freed tensors stay in the heap and the resident
memory keeps the fragments: a 4-layer decoder at 4,001 tokens measured 3.44 GiB at SP = 1 and 2.11 GiB
a rank at SP = 2 (0.61) that way, 2.31 and 1.16 GiB (0.50) with the fixed threshold, whose live
tensors saved for the backward are 0.45 of SP = 1's.

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

The planner's figure beside each measurement (:func:`planner_terms`): ``planner_gib`` is
:func:`grasp_lightning.planning.estimate.plan_memory`'s per-GPU training term (activations + one chunk's
logits) for the same shapes at ``sequence_parallel`` 1 and 2, ``planner_ratio`` their ratio, ``planner_terms``
its parts and the trainable parameters' float32 gradients (``P_t x 4 B``, to set beside ``gradient_gib``). The
planner models a GPU run's 16-bit activations (:mod:`grasp_lightning.planning.layers`), so against this float32
run its activation bytes are expected near half the measured ones; its ratio is what to compare.

Prints one JSON line: ``lengths``, one entry per clip length (its tokens, ``sp1``, ``sp2`` per rank, the ratios,
losses and the planner's figures), and at the top level the longest clip's ``step_ratio``, ``peak_ratio``,
``planner_gib``, ``planner_ratio``, losses, ``losses_equal`` and ``meets_target``; with two or more lengths
``marginal_step_ratio``, the SP = 2 rank's step growth from the shortest to the longest clip over SP = 1's
(the per-token part's ratio), and ``marginal_mib_per_token``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: glibc's ``MALLOC_MMAP_THRESHOLD_`` for the rank processes, bytes (see the module docstring).
MMAP_THRESHOLD = 65536
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from step_limit import _peak_bytes, _reset_peak, _rss_bytes  # noqa: E402 (sibling script)

GIB = 2**30
FULL = {"clip_seconds": [16.0, 40.0], "clip_size": 320, "text_layers": 4, "vision_layers": 2, "k": 4,
        "completion_tokens": 256, "chunk": 256}
SMOKE = {"clip_seconds": [2.0, 4.0], "clip_size": 64, "text_layers": None, "vision_layers": None, "k": 2,
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
           "PYTHONPATH": str(REPO), "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
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


def length_inputs(tmp: Path, model_dir: Path, sizes: dict, seconds: float) -> dict:
    """One RL batch of the bundled sample with a synthetic ``seconds`` clip (the data module's real processing)."""
    from gpu_check import build_dataset

    from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
    from grasp_lightning.datamodule import GraspDataModule

    build_dataset(tmp / "data", 1, seconds, sizes["clip_size"])
    dm = GraspDataModule(source=SourceConfig(root=str(tmp / "data"), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=int(round(seconds * 2)), max_pixels=sizes["clip_size"] ** 2),
                         prompt=PromptConfig(processor=str(model_dir)),
                         loader=LoaderConfig(data_mode="rl", batch_size=1, num_workers=0))
    dm.setup("fit")
    return next(iter(dm.train_dataloader())).inputs


def planner_terms(model_dir: Path, sizes: dict, seconds: float, prompt_tokens: int, lora: bool, sp: int) -> dict:
    """The memory planner's per-GPU training terms for the measured shapes, in GiB.

    :func:`grasp_lightning.planning.estimate.plan_memory` of a GRPO run of the stand-in in ``model_dir``:
    one prompt of the ``seconds`` clip (``prompt_tokens`` tokens: ``text_tokens`` is set so that the plan's
    prompt is the measured one), ``K`` completions of ``completion_tokens``, group-shared scoring by
    ``chunk``-token pieces, float32 weights without ZeRO, the vision tower frozen, no gradient checkpointing,
    SDPA attention, LoRA r16 (dropout 0) or the language model trained, over ``sp`` ranks of one SP group.

    Returns:
        ``activations`` + ``logits`` (the planner's training term; the frozen tower's transient is not part of
        the measured step), ``gradients`` (``P_t x 4 B``; one process, no DDP copy), the plan's visual tokens.
    """
    from transformers import AutoConfig

    from grasp_lightning.planning.estimate import plan_memory
    from grasp_lightning.planning.spec import RunSpec
    from grasp_lightning.policy import LoraConfig

    size = sizes["clip_size"]
    spec = RunSpec(model=str(model_dir), task="GRPO", needs_reference=False, samples_rollouts=True, shares_prompt=True,
                   devices=sp, num_nodes=1, zero_stage=0, offload_optimizer=False, reduce_bucket_size=0,
                   overlap_comm=False, precision="32-true", dtype="float32", freeze_vision=True,
                   lora=LoraConfig(enabled=lora, r=16, alpha=32, dropout=0.0), separate_reference=False,
                   gradient_checkpointing=False, attn_implementation="sdpa", micro_batch_size=1,
                   num_generations=sizes["k"], max_new_tokens=sizes["completion_tokens"], fps=2.0,
                   max_frames=int(round(seconds * 2)), max_pixels=size**2, max_target_tokens=None,
                   max_prompt_tokens=None, video_seconds=seconds, frame_size=(size, size), source_fps=2.0,
                   text_tokens=0, logprob_chunk_size=sizes["chunk"], sequence_parallel=sp)
    config = AutoConfig.from_pretrained(str(model_dir))
    bare = plan_memory(spec, config)
    plan = plan_memory(replace(spec, text_tokens=prompt_tokens - bare.prompt_tokens), config)
    return {"activations_gib": plan.activations / GIB, "logits_gib": plan.logits / GIB,
            "training_gib": (plan.activations + plan.logits) / GIB,
            "gradients_gib": 4 * plan.params_trainable / GIB, "visual_tokens": plan.visual_tokens}


def measure_length(tmp: Path, model_dir: Path, sizes: dict, seconds: float, lora: bool, threads: int,
                   timeout: float) -> dict:
    """SP = 1 then SP = 2 (fresh processes) on one clip length, with the planner's figures: one entry of ``lengths``."""
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(str(model_dir)).pad_token_id
    inputs = length_inputs(tmp, model_dir, sizes, seconds)
    prompt = odd_prompt(inputs, pad_id)
    ids, mask = completions(sizes["k"], sizes["completion_tokens"], pad_id)
    torch.save({"model_dir": str(model_dir), "prompt": prompt, "ids": ids, "mask": mask}, tmp / "inputs.pt")
    grid = prompt["video_grid_thw"]
    prompt_tokens = int(prompt["input_ids"].shape[1])
    entry: dict = {"clip_seconds": seconds, "prompt_tokens": prompt_tokens,
                   "prompt_left_pad_added": prompt_tokens - int(inputs["input_ids"].shape[1]),
                   "visual_tokens": int((grid.prod(-1) // 4).sum()),
                   "completion_forward_tokens": int(ids.shape[0] * (ids.shape[1] - 1)),
                   "completion_tokens_real": int(mask.sum())}
    del inputs
    sp1 = run_ranks(1, tmp, sizes["chunk"], lora, threads, timeout)
    print(json.dumps({"clip_seconds": seconds, "sp1": sp1}), file=sys.stderr, flush=True)  # progress, on stderr
    sp2 = run_ranks(2, tmp, sizes["chunk"], lora, max(1, threads // 2), timeout)
    worst = max(sp2, key=lambda r: r["step_gib"])
    plans = {n: planner_terms(model_dir, sizes, seconds, prompt_tokens, lora, n) for n in (1, 2)}
    entry.update(
        trainable_parameters=sp1[0]["trainable_parameters"],
        sp1={key: round(value, 4) for key, value in sp1[0].items() if isinstance(value, float)},
        sp2=[{key: round(value, 4) for key, value in r.items() if isinstance(value, float)} for r in sp2],
        step_ratio=round(worst["step_gib"] / sp1[0]["step_gib"], 4),
        peak_ratio=round(max(r["peak_gib"] for r in sp2) / sp1[0]["peak_gib"], 4),
        loss_sp1=sp1[0]["loss"], loss_sp2=sp2[0]["loss"], loss_sp2_ranks=[r["loss"] for r in sp2],
        grad_probe_sp1=sp1[0]["grad_probe"], grad_probe_sp2=sp2[0]["grad_probe"],
        planner_gib={"sp1": round(plans[1]["training_gib"], 6), "sp2": round(plans[2]["training_gib"], 6)},
        planner_ratio=round(plans[2]["training_gib"] / plans[1]["training_gib"], 4),
        planner_terms={f"sp{n}": {k: round(v, 6) if isinstance(v, float) else v for k, v in plan.items()}
                       for n, plan in plans.items()})
    return entry


def main(argv: list[str] | None = None) -> dict:
    """Parse the arguments, build the stand-in, measure every clip length (SP = 1, then SP = 2), print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Qwen3-VL, short clips: seconds")
    parser.add_argument("--clip-seconds", type=float, nargs="+", default=None,
                        help="clip lengths to measure, each at SP = 1 and SP = 2 (the last is the headline)")
    for key, value in FULL.items():
        if key != "clip_seconds":
            parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None)
    parser.add_argument("--whole-lm", action="store_true",
                        help="train the language model whole (embedding and LM head included) instead of LoRA r16")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run (SP = 1 or SP = 2) may take")
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)  # rank processes only
    parser.add_argument("--_rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--_work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._rank is not None:
        rank_main(args)
        return {}
    sizes = dict(SMOKE if args.smoke else FULL)
    sizes.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    lengths = sorted(set(sizes.pop("clip_seconds")))
    if sizes["completion_tokens"] % 2:
        parser.error("--completion-tokens must be even (the completion forward's Lc - 1 positions are then odd)")
    if lengths[0] <= 0:
        parser.error(f"--clip-seconds must be positive, got {lengths[0]}")
    lora = not args.whole_lm
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    result: dict = {"benchmark": "sequence_parallel", "mode": "smoke" if args.smoke else "full",
                    "clip_seconds": lengths, **sizes, "dtype": "float32",
                    "trained": "LoRA r16" if lora else "language model",
                    "threads_sp1": threads, "threads_per_rank_sp2": max(1, threads // 2)}
    entries = []
    with tempfile.TemporaryDirectory(prefix="sequence_parallel_") as tmp:
        from transformers import AutoConfig

        model_dir = standin(Path(tmp), sizes)
        text = AutoConfig.from_pretrained(str(model_dir)).text_config
        result["model"] = {"hidden": text.hidden_size, "heads": text.num_attention_heads,
                           "kv_heads": text.num_key_value_heads, "layers": text.num_hidden_layers,
                           "vocab": text.vocab_size}
        for i, seconds in enumerate(lengths):
            work = Path(tmp) / f"clip{i}"
            work.mkdir()
            entries.append(measure_length(work, model_dir, sizes, seconds, lora, threads, args.timeout))
    last = entries[-1]
    result.update(
        lengths=entries, longest_clip_seconds=last["clip_seconds"], prompt_tokens=last["prompt_tokens"],
        step_ratio=last["step_ratio"], peak_ratio=last["peak_ratio"], planner_gib=last["planner_gib"],
        planner_ratio=last["planner_ratio"], loss_sp1=last["loss_sp1"], loss_sp2=last["loss_sp2"],
        losses_equal=math.isclose(last["loss_sp1"], last["loss_sp2"], rel_tol=1e-5, abs_tol=1e-6),
        target_step_ratio=0.65)
    result["meets_target"] = result["step_ratio"] <= result["target_step_ratio"]
    if len(entries) > 1:  # what the extra tokens cost: the per-token part's ratio
        first = entries[0]
        grown1 = last["sp1"]["step_gib"] - first["sp1"]["step_gib"]
        grown2 = max(r["step_gib"] for r in last["sp2"]) - max(r["step_gib"] for r in first["sp2"])
        tokens = last["prompt_tokens"] - first["prompt_tokens"]
        result.update(marginal_step_ratio=round(grown2 / grown1, 4) if grown1 > 0 else None,
                      marginal_mib_per_token={"sp1": round(grown1 * 1024 / tokens, 4),
                                              "sp2": round(grown2 * 1024 / tokens, 4)})
    print(json.dumps(result))
    return result


def standin(tmp: Path, sizes: dict) -> Path:
    """The model directory: the 2B-width stand-in (bf16 on disk, loaded in float32), or the tiny Qwen3-VL (smoke)."""
    if sizes["text_layers"] is None:
        return REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"
    from grasp_lightning.synthetic.standin import build_standin

    return build_standin(tmp / "model", "Qwen3-VL-2B-Instruct", text_layers=sizes["text_layers"],
                         vision_layers=sizes["vision_layers"], dtype="bfloat16")


if __name__ == "__main__":
    main()
