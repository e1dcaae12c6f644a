"""The vision tower under sequence parallelism: every rank encodes the whole clip, or each rank its share of frames?

    OMP_NUM_THREADS=2 python benchmarks/vision_split.py   # 2B-width vision tower, 40 s clip at 320 px (~2 min)
    python benchmarks/vision_split.py --smoke              # the tiny Qwen3-VL (tests/benchmarks/)

With ``model.sequence_parallel: N`` every rank of a group runs the (frozen) vision tower on the whole
clip (:mod:`grasp_lightning.sequence_parallel`). The alternative splits the clip's temporal patches
over the ranks and all-gathers the features. This script measures both on a stand-in of the Qwen3-VL-2B
vision tower (:func:`grasp_lightning.synthetic.standin.build_standin`: the published widths, hidden
1,024, patch 16, spatial merge 2, output width 2,048, ``--vision-layers`` of its 24 blocks, random weights,
float32, no gradient: the recipes freeze the tower and GRPO encodes a clip once per window):

* ``whole``: the tower over the whole clip: seconds and the peak resident memory above the pre-call
  level (``VmHWM``, reset through ``/proc/self/clear_refs``, as ``benchmarks/step_limit.py``);
* ``share``: the same over the first ``ceil(T / N)`` temporal patches, what a rank of a frame split runs;
* ``exact_max_abs_diff``: the share's merged and DeepStack features against the same rows of the whole
  clip's (the tower attends within a temporal patch, so a split by temporal patches is exact);
* ``gather_mib``: the features a frame split all-gathers to every rank (merged + DeepStack, float32);
* ``decoder_layer_s``: one decoder layer's forward and backward over the prompt's ``S`` positions (the
  stand-in's language model, trained whole, timed and divided by its layers), beside ``vision_block_s``
  (the whole clip's tower time per block), so ``real_depth`` compares the published depths (24 vision
  blocks, 28 decoder layers for the 2B) under the same conditions.

Times are the best of ``--repeats`` runs.

Prints one JSON line. The per-rank training step of the same stand-in and clip is
``benchmarks/sequence_parallel.py``'s; docs/scaling.md compares the two.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import torch  # noqa: E402

FULL = {"clip_seconds": 40.0, "clip_size": 320, "text_layers": 2, "vision_layers": 4}
SMOKE = {"clip_seconds": 4.0, "clip_size": 64, "text_layers": None, "vision_layers": None}


def _encode(visual, pixels: torch.Tensor, grid: torch.Tensor) -> tuple[float, int, torch.Tensor, list[torch.Tensor]]:
    """Seconds, peak bytes above the pre-call resident memory, merged features and DeepStack features."""
    from step_limit import _peak_bytes, _reset_peak, _rss_bytes

    _reset_peak()
    base = _rss_bytes()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = visual(pixels, grid_thw=grid)
    seconds = time.perf_counter() - t0
    return seconds, _peak_bytes() - base, out.pooler_output, list(out.deepstack_features or [])


def _decoder_layer_seconds(model, length: int, repeats: int) -> float:
    """Best seconds of the language model's forward and backward over ``length`` positions, per decoder layer."""
    text = model.model.language_model
    embeds = torch.randn(1, length, text.config.hidden_size, generator=torch.Generator().manual_seed(0))
    best = math.inf
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        text(inputs_embeds=embeds.requires_grad_(True)).last_hidden_state.square().mean().backward()
        best = min(best, time.perf_counter() - t0)
    return best / len(text.layers)


def run(sizes: dict, sp: int, repeats: int = 1) -> dict:
    """Build the stand-in and one clip, encode the whole clip and one rank's share of it; the figures."""
    from step_limit import build
    from transformers import AutoModelForImageTextToText

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, batch = build(Path(tmp), {**sizes, "clip_seconds": sizes["clip_seconds"]})
        model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    visual = model.model.visual
    pixels, grid = batch.inputs["pixel_values_videos"], batch.inputs["video_grid_thw"]
    if grid.shape[0] != 1:
        raise ValueError(f"one clip expected, got grids {grid.tolist()}")
    t, h, w = (int(v) for v in grid[0])
    share = math.ceil(t / sp)
    rows = share * h * w
    _encode(visual, pixels[:h * w], torch.tensor([[1, h, w]]))  # warm-up: one temporal patch
    whole_s, whole_peak, merged, deep = _encode(visual, pixels, grid)
    part_s, part_peak, merged_part, deep_part = _encode(visual, pixels[:rows], torch.tensor([[share, h, w]]))
    for _ in range(repeats - 1):
        whole_s = min(whole_s, _encode(visual, pixels, grid)[0])
        part_s = min(part_s, _encode(visual, pixels[:rows], torch.tensor([[share, h, w]]))[0])
    layer_s = _decoder_layer_seconds(model, int(batch.inputs["input_ids"].shape[1]), repeats)
    merge = visual.spatial_merge_size ** 2
    kept = rows // merge
    diff = max(float((a[:kept] - b).abs().max()) for a, b in zip([merged, *deep], [merged_part, *deep_part]))
    gather = sum(x.numel() * 4 for x in [merged, *deep])
    gib = 1024 ** 3
    return {"benchmark": "vision_split", "mode": sizes["mode"], "sequence_parallel": sp,
            "clip_seconds": sizes["clip_seconds"], "clip_size": sizes["clip_size"],
            "vision_layers": len(visual.blocks), "hidden": visual.config.hidden_size, "grid_thw": [t, h, w],
            "patches": int(pixels.shape[0]), "merged_tokens": int(merged.shape[0]), "deepstack_layers": len(deep),
            "whole": {"s": round(whole_s, 3), "peak_above_gib": round(whole_peak / gib, 4)},
            "share": {"temporal_patches": share, "s": round(part_s, 3), "peak_above_gib": round(part_peak / gib, 4)},
            "time_ratio": round(part_s / whole_s, 4), "peak_ratio": round(part_peak / max(whole_peak, 1), 4),
            "exact_max_abs_diff": diff, "gather_mib": round(gather / 1024 ** 2, 2),
            "prompt_tokens": int(batch.inputs["input_ids"].shape[1]),
            "vision_block_s": round(whole_s / len(visual.blocks), 3), "decoder_layer_s": round(layer_s, 3),
            "real_depth": {"vision_blocks": 24, "decoder_layers": 28,
                           "vision_s": round(24 * whole_s / len(visual.blocks), 1), "decoder_s": round(28 * layer_s, 1)},
            "repeats": repeats, "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Qwen3-VL, a short clip: seconds")
    parser.add_argument("--clip-seconds", type=float, default=None)
    parser.add_argument("--clip-size", type=int, default=None)
    parser.add_argument("--vision-layers", type=int, default=None)
    parser.add_argument("--sequence-parallel", type=int, default=2, help="ranks N a frame split would use")
    parser.add_argument("--repeats", type=int, default=None, help="runs per timing, the best kept (2; smoke 1)")
    args = parser.parse_args(argv)
    sizes = dict(SMOKE if args.smoke else FULL, mode="smoke" if args.smoke else "full")
    for key in ("clip_seconds", "clip_size", "vision_layers"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    repeats = args.repeats or (1 if args.smoke else 2)
    print(json.dumps(run(sizes, args.sequence_parallel, repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
