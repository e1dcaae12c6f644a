"""Clips per second: our path (ClipStore.open + decode_clip at 2 fps) against a whole-clip decode.

The baseline decodes every frame of the clip (decord ``get_batch(range(N))``), then keeps the frames
at 2 fps: what qwen-vl-utils-style loaders do. Both read the same bytes out of the same tar shard
and use the same decoder thread count, so the difference is the decoding strategy alone.

    python benchmarks/video_decode.py                 # 16 generated clips, 10 s at 30 fps, 320x240
    python benchmarks/video_decode.py --shard x.tar   # the .mp4 members of your own shard

Prints a summary, then as the last line a JSON object with ``ours_clips_per_s``,
``baseline_clips_per_s``, ``ratio_vs_baseline`` (ours / baseline), ``clips`` and ``fps``.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from grasp_lightning.data.shards import ClipStore
from grasp_lightning.data.video import decode_clip, sample_indices
from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4


def make_clip(seconds: float, fps: int, width: int, height: int, seed: int) -> bytes:
    """An H.264 mp4 (libx264 defaults but ``preset=veryfast``: GOP 250, B-frames) of a moving gradient
    with noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    grad = (((xx + yy) // 2) % 256).astype(np.uint8)[..., None].repeat(3, axis=2)
    noise = [rng.integers(0, 8, (height, width, 3), dtype=np.uint8) for _ in range(7)]
    frames = (grad + np.uint8(3 * i % 256) + noise[i % len(noise)] for i in range(int(seconds * fps)))  # uint8: wraps
    with tempfile.TemporaryDirectory() as tmp:
        return encode_mp4(frames, fps, Mp4Settings(preset="veryfast", fallback=None), out=Path(tmp) / "c.mp4").read_bytes()


def build_shard(folder: Path, clips: int, seconds: float, src_fps: int, width: int, height: int) -> Path:
    """Write ``clips`` generated clips into ``folder/bench_part000.tar``."""
    import tarfile

    shard = folder / "bench_part000.tar"
    with tarfile.open(shard, "w") as tf:
        for k in range(clips):
            data = make_clip(seconds, src_fps, width, height, seed=k)
            info = tarfile.TarInfo(f"bench/video/clip{k:03d}_qa{k:04d}.mp4")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return shard


def baseline(data: bytes, fps: float, threads: int) -> np.ndarray:
    """Decode every frame, then subsample to ``fps`` with the same indices as ours."""
    import decord

    reader = decord.VideoReader(io.BytesIO(data), ctx=decord.cpu(0), num_threads=threads)
    frames = reader.get_batch(list(range(len(reader)))).asnumpy()
    return frames[sample_indices(len(reader), reader.get_avg_fps(), fps=fps)]


def timed(fns: dict, members: list[str], repeats: int) -> dict[str, float]:
    """Best clips per second of each function over ``repeats`` passes, passes interleaved so that a
    change in machine load hits both alike (one warm-up clip each first)."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn(members[0])
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for m in members:
                fn(m)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: len(members) / t for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shard", type=Path, help="an existing uncompressed tar of .mp4 clips")
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--src-fps", type=int, default=30)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--fps", type=float, default=2.0, help="sampling rate, frames per second")
    parser.add_argument("--threads", type=int, default=1, help="decoder threads, both paths")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        shard = args.shard or build_shard(Path(tmp), args.clips, args.seconds, args.src_fps, args.width, args.height)
        made = time.perf_counter() - t0
        store = ClipStore(shard, cache_dir=tmp)
        members = [m for m in store.members if m.endswith(".mp4")][: args.clips]

        def ours_fn(m):
            return decode_clip(store.open(m), fps=args.fps, num_threads=args.threads, where=m)

        def base_fn(m):
            return baseline(store.open(m), args.fps, args.threads)

        first = members[0]
        same = np.array_equal(ours_fn(first).frames, base_fn(first))
        rates = timed({"ours": ours_fn, "baseline": base_fn}, members, args.repeats)
        ours, base = rates["ours"], rates["baseline"]
        probe = ours_fn(first)
        mb = sum(len(store.open(m)) for m in members) / len(members) / 1e6

    print(f"shard: {shard if args.shard else f'generated in {made:.1f} s'}; {len(members)} clips, "
          f"{probe.total_frames} frames at {probe.source_fps:g} fps, {probe.frames.shape[2]}x{probe.frames.shape[1]}, "
          f"{mb:.2f} MB per clip")
    print(f"sampling at {args.fps:g} fps -> {len(probe.indices)} frames per clip; decoder threads {args.threads}; "
          f"same frames as baseline: {same}")
    print(f"ours (ClipStore.open + decode_clip, get_batch of sampled frames): {ours:8.2f} clips/s")
    print(f"baseline (decode every frame, then subsample):                   {base:8.2f} clips/s")
    print(f"ratio ours / baseline: {ours / base:.2f}x")
    print(json.dumps({"ours_clips_per_s": round(ours, 3), "baseline_clips_per_s": round(base, 3),
                      "ratio_vs_baseline": round(ours / base, 3), "clips": len(members), "fps": args.fps}))


if __name__ == "__main__":
    main()
