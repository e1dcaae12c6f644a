"""How GRPO step time grows with the group size K and with the clip length: ours against TRL-style rows.

Two sweeps for each model of ``--models`` (default ``qwen3_vl,qwen3_5``: the tiny Qwen3-VL and the
width-reduced hybrid Qwen3.5 stand-in of ``benchmarks/grpo_step.py``, built at the same
``--hidden``/``--layers``; or checkpoint directories), with the same prompts, budget, sampling and
beta for every model; median seconds per step after warm-up:

* **K** in ``--ks`` (default 2, 4, 8, 16) on image prompts: TRL 1.16 ``GRPOTrainer`` (``trl``), ours
  group-shared (``shared``) and ours with K rows per prompt (``naive``).
* **clip length** in ``--seconds`` (default 2 to 30 s at 2 fps) on video prompts at K=``--k``: ours
  shared and naive (TRL has no video path; naive is its row layout).

Per model, each sweep's least-squares slope is reported (seconds per extra completion; seconds per
extra second of video) and the shared slope divided by the naive one, in wall time and in the
process's CPU time (steadier on a shared machine), with the prompt tokens forwarded per step at every
point. A PNG with both sweeps (one line style per model) is written to ``--out-dir`` beside
``scaling.json``; the JSON object is also the last line printed.

    python benchmarks/scaling.py                         # full sweeps, both models (17 min on 2 shared CPU cores)
    python benchmarks/scaling.py --ks 2,4 --seconds 2,6 --steps 1 --warmup 1 --models qwen3_5
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from grpo_step import (  # noqa: I001 (sibling script; benchmarks/ is sys.path[0] when run as a script)
    ImagePrompts,
    VideoPrompts,
    build_models,
    describe_model,
    make_image,
    quiet,
    read_items,
    run_ours,
    run_trl,
    summarise,
)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` on ``xs`` (units of y per unit of x); NaN for fewer than 2 points."""
    return float(np.polyfit(xs, ys, 1)[0]) if len(xs) >= 2 else float("nan")


def plot(path: Path, models: dict[str, dict], ks: list[int], seconds: list[float]) -> None:
    """Two panels: step time vs K (image prompts) and vs clip length (video prompts); a colour per
    variant, a line style per model."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    colours = {"shared": "tab:blue", "naive": "tab:orange", "trl": "tab:green"}
    for style, (model, result) in zip(("-", "--", ":", "-."), models.items()):
        for ax, xs, sweep in ((left, ks, "step_s_vs_k"), (right, seconds, "step_s_vs_seconds")):
            for name, series in result[sweep].items():
                ax.plot(xs, series, style, marker="o", color=colours.get(name), label=f"{model} {name}")
    left.set(xlabel="K (completions per prompt)", ylabel="seconds per GRPO step", title="Group size (image prompts)")
    right.set(xlabel="clip length (s, 2 fps)", ylabel="seconds per GRPO step", title="Clip length (video prompts)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")


def sweeps(name: str, model_dir: Path, args, items, images, ks: list[int], seconds: list[float]) -> dict:
    """One model's K and clip-length sweeps, their slopes (wall and CPU) and per-point detail."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    common = dict(max_new_tokens=args.max_new_tokens, beta=args.beta, steps=args.steps + args.warmup)
    k_sweep: dict[str, list[float]] = {"shared": [], "naive": []} | ({} if args.no_trl else {"trl": []})
    clip_sweep: dict[str, list[float]] = {"shared": [], "naive": []}
    k_cpu: dict[str, list[float]] = {v: [] for v in k_sweep}
    clip_cpu: dict[str, list[float]] = {v: [] for v in clip_sweep}
    detail: dict = {"k": {}, "seconds": {}}
    for k in ks:
        for variant in k_sweep:
            t0 = time.perf_counter()
            if variant == "trl":
                recs = run_trl(model_dir, items, images, k=k, batch=args.prompts, **common)
            else:
                recs = run_ours(model_dir, ImagePrompts(processor, items, images, args.prompts), k=k,
                                share=variant == "shared", **common)
            stats = summarise(recs, args.warmup)
            k_sweep[variant].append(stats["step_s"])
            k_cpu[variant].append(stats["cpu_s"])
            detail["k"].setdefault(variant, []).append({"k": k, "step_s": stats["step_s"], "cpu_s": stats["cpu_s"],
                                                        "spread_s": stats["spread_s"],
                                                        "prompt_tokens": stats["prompt_tokens"]})
            print(f"{name} K={k} {variant}: {stats['step_s']:.3f} s/step ({time.perf_counter() - t0:.0f} s)", flush=True)
    for sec in seconds:
        dataset = VideoPrompts(processor, items, args.prompts, sec, args.frame_side)
        visual = int((dataset[0].inputs["mm_token_type_ids"][0] != 0).sum())
        for variant in clip_sweep:
            t0 = time.perf_counter()
            recs = run_ours(model_dir, dataset, k=args.k, share=variant == "shared", **common)
            stats = summarise(recs, args.warmup)
            clip_sweep[variant].append(stats["step_s"])
            clip_cpu[variant].append(stats["cpu_s"])
            detail["seconds"].setdefault(variant, []).append({"seconds": sec, "visual_tokens": visual,
                                                              "step_s": stats["step_s"], "cpu_s": stats["cpu_s"],
                                                              "spread_s": stats["spread_s"],
                                                              "prompt_tokens": stats["prompt_tokens"]})
            print(f"{name} {sec:g} s clip {variant}: {stats['step_s']:.3f} s/step ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    slopes_k = {v: slope(ks, ys) for v, ys in k_sweep.items()}
    slopes_s = {v: slope(seconds, ys) for v, ys in clip_sweep.items()}
    cpu_slopes_k = {v: slope(ks, ys) for v, ys in k_cpu.items()}
    cpu_slopes_s = {v: slope(seconds, ys) for v, ys in clip_cpu.items()}
    result = {
        "model": describe_model(model_dir),
        "step_s_vs_k": k_sweep, "step_s_vs_seconds": clip_sweep,
        "slope_s_per_completion": slopes_k, "slope_s_per_video_second": slopes_s,
        "k_slope_shared_over_naive": slopes_k["shared"] / slopes_k["naive"],
        "clip_slope_shared_over_naive": slopes_s["shared"] / slopes_s["naive"],
        "cpu_s_vs_k": k_cpu, "cpu_s_vs_seconds": clip_cpu,
        "cpu_slope_s_per_completion": cpu_slopes_k, "cpu_slope_s_per_video_second": cpu_slopes_s,
        "cpu_k_slope_shared_over_naive": cpu_slopes_k["shared"] / cpu_slopes_k["naive"],
        "cpu_clip_slope_shared_over_naive": cpu_slopes_s["shared"] / cpu_slopes_s["naive"],
        "detail": detail,
    }
    if "trl" in slopes_k:
        result["k_slope_shared_over_trl"] = slopes_k["shared"] / slopes_k["trl"]
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="qwen3_vl,qwen3_5",
                   help="comma-separated model families (qwen3_vl, qwen3_5: built at --hidden/--layers) or checkpoint "
                   "directories; each runs both sweeps with the same settings")
    p.add_argument("--ks", default="2,4,8,16")
    p.add_argument("--seconds", default="2,5,10,20,30")
    p.add_argument("--k", type=int, default=8, help="K of the clip-length sweep")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--image-side", type=int, default=256)
    p.add_argument("--frame-side", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-trl", action="store_true", help="skip TRL in the K sweep")
    p.add_argument("--out-dir", default="runs/benchmarks/scaling")
    args = p.parse_args(argv)
    quiet()
    torch.set_num_threads(args.threads)
    ks = [int(x) for x in args.ks.split(",")]
    seconds = [float(x) for x in args.seconds.split(",")]
    items = read_items(args.prompts * (args.steps + args.warmup))
    images = [make_image(i, args.image_side) for i in range(len(items))]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(args.models, Path(tmp), hidden=args.hidden, layers=args.layers,
                              image_side=args.image_side, frame_side=args.frame_side, max_frames=int(max(seconds) * 2))
        results = {name: sweeps(name, model_dir, args, items, images, ks, seconds)
                   for name, model_dir in models.items()}
    png = out_dir / "scaling.png"
    plot(png, results, ks, seconds)
    report = {
        "benchmark": "scaling", "ks": ks, "seconds": seconds, "k_for_clips": args.k, "prompts_per_step": args.prompts,
        "max_new_tokens": args.max_new_tokens, "threads": args.threads, "steps": args.steps, "warmup": args.warmup,
        "sizes": {"hidden": args.hidden, "layers": args.layers, "image_side": args.image_side,
                  "frame_side": args.frame_side},
        "models": results, "plot": str(png),
    }
    (out_dir / "scaling.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
