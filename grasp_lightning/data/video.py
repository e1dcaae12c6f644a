"""Decode the frames of a clip sampled at a fixed rate (GRASP: 2 fps, at most 240 frames), with decord.

Sampling rule (:func:`sample_indices`), for a clip of ``N`` frames at ``src_fps``:

- window ``[start, end)`` in seconds: ``start`` defaults to 0, ``end`` to ``N / src_fps``
  (both clamped to the clip);
- target times ``t_k = start + k / fps`` for ``k = 0, 1, ...`` while ``t_k < end``;
- frame index ``i_k = min(floor(t_k * src_fps + 0.5), N - 1)`` (nearest frame, ties up), duplicates
  dropped;
- more than ``max_frames``: keep ``max_frames`` of them at uniformly spaced positions (first and
  last kept); fewer than ``min_frames``: ``min_frames`` indices spread uniformly over the frames
  of the window instead.

The returned timestamps are the real times of the decoded frames, ``i_k / src_fps`` seconds from the
clip start: exactly what Qwen3-VL's processor computes from :func:`video_metadata`, so the prompt's
``<t seconds>`` marks are the real seconds. ``T`` may be odd: Qwen3-VL's processor pads to a multiple
of its temporal patch size (2) by repeating the last frame, and averages the timestamps in the same
padded way, so nothing is dropped here.

Only the sampled frames are decoded (``VideoReader.get_batch``); a ``VideoReader`` is created per
call, in the calling process (a DataLoader worker), never kept at module level.
"""

from __future__ import annotations

import io
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grasp_lightning.errors import ClipDecodeError, ClipNotFoundError

#: Pixel cap per decoded frame: about 256 visual tokens per 2 frames for Qwen3-VL (32x32 pixels
#: per token after the 2x2 merge), the released GRASP setting (``docs/data-format.md``).
DEFAULT_MAX_PIXELS = 256 * 32 * 32
_DECODE_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, AssertionError, ValueError, OSError, IndexError)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodedClip:
    """Frames sampled from one clip.

    Attributes:
        frames: ``(T, H, W, 3)`` uint8 RGB.
        timestamps: ``(T,)`` float64, seconds from the clip start (``indices / source_fps``).
        indices: ``(T,)`` int64 source frame indices, strictly increasing.
        source_fps: average frame rate of the file (frames per second).
        total_frames: number of frames of the file as the container reports it.
    """

    frames: np.ndarray
    timestamps: np.ndarray
    indices: np.ndarray
    source_fps: float
    total_frames: int

    @property
    def duration(self) -> float:
        """Clip length in seconds (``total_frames / source_fps``)."""
        return self.total_frames / self.source_fps


def sample_indices(total_frames: int, source_fps: float, *, fps: float = 2.0, start_seconds: float | None = None,
                   end_seconds: float | None = None, max_frames: int = 240, min_frames: int = 2,
                   where: str = "<clip>") -> np.ndarray:
    """Return the ``(T,)`` int64 source frame indices to decode (rule in the module docstring).

    Raises:
        ClipDecodeError: the window starts at or past the clip's end (the message names ``start_seconds``),
            is empty or holds fewer than ``min_frames`` frames.
    """
    if total_frames <= 0 or not source_fps > 0 or not math.isfinite(source_fps):
        raise ClipDecodeError(where, f"no frames ({total_frames} frames at {source_fps} fps)")
    duration = total_frames / source_fps
    if start_seconds is not None and start_seconds >= duration:
        raise ClipDecodeError(where, f"start_seconds {start_seconds:g} is at or past the end of the clip "
                                     f"({duration:.3f} s): its window holds no frame")
    start = min(max(0.0, start_seconds or 0.0), duration)
    end = duration if end_seconds is None else min(end_seconds, duration)
    if end <= start:
        raise ClipDecodeError(where, f"empty time window [{start:.3f}, {end:.3f}) s in a {duration:.3f} s clip")
    n = max(1, math.ceil((end - start) * fps - 1e-9))
    times = start + np.arange(n, dtype=np.float64) / fps
    idx = np.unique(np.minimum(np.floor(times * source_fps + 0.5 + 1e-6), total_frames - 1).astype(np.int64))
    if len(idx) > max_frames:
        idx = idx[np.floor(np.linspace(0, len(idx) - 1, max_frames) + 0.5).astype(np.int64)]
    if len(idx) < min_frames:
        lo = min(int(math.floor(start * source_fps + 0.5)), total_frames - 1)
        hi = max(lo, min(math.ceil(end * source_fps - 1e-6) - 1, total_frames - 1))
        idx = np.unique(np.floor(np.linspace(lo, hi, min_frames) + 0.5).astype(np.int64))
        if len(idx) < min_frames:
            raise ClipDecodeError(where, f"only {len(idx)} frame(s) in [{start:.3f}, {end:.3f}) s, "
                                         f"fewer than min_frames={min_frames}")
    return idx


def even_frame_count(duration: float, *, fps: float = 2.0, max_frames: int = 512, min_frames: int = 2,
                     multiple: int = 2) -> int:
    """Frames the released GRASP reader takes from a clip of ``duration`` seconds (``data.video.sampling: even``).

    ``distribute_frames`` of ``socialmllm/utils/input_processing.py:126-151`` (github.com/Social-Reaoning/grasp at
    805d115) for one clip: 30 bisection steps on a rate in ``(0, fps)``; at each rate ``r`` the count is
    ``max(min_frames, round(duration * r / multiple) * multiple)`` (Python's ``round``: halves to even), and the
    last count within ``max_frames`` is kept. Released values: ``fps`` 2 (``--video_max_fps 2``, ``train_sgr.sh:35``),
    ``max_frames`` 512, ``min_frames`` 2, ``multiple`` 2 (``reasoning/arguments.py:24-27``). For a 5.5 s clip: 10.

    Raises:
        ValueError: ``min_frames`` is not a multiple of ``multiple``, or no rate gives at most ``max_frames``.
    """
    if min_frames % multiple:
        raise ValueError(f"even_frame_count: min_frames={min_frames} is not a multiple of {multiple}")
    low, high, count = 0.0, float(fps), None
    for _ in range(30):
        rate = (low + high) / 2
        frames = max(min_frames, round(duration * rate / multiple) * multiple)
        if frames <= max_frames:
            low, count = rate, frames
        else:
            high = rate
    if count is None:
        raise ValueError(f"even_frame_count: no rate gives at most max_frames={max_frames} for {duration} s")
    return count


def even_indices(total_frames: int, source_fps: float, *, fps: float = 2.0, start_seconds: float | None = None,
                 end_seconds: float | None = None, max_frames: int = 512, min_frames: int = 2,
                 where: str = "<clip>") -> np.ndarray:
    """``(T,)`` source frame indices spread evenly over the clip, as the released GRASP reader reads a row's video.

    ``T`` is :func:`even_frame_count` of ``end - start`` seconds; the indices are
    ``np.linspace(round(start * src_fps), round(end * src_fps) - 1, T)`` truncated to integers
    (``socialmllm/utils/input_processing.py:103-109``), the first and last frame of the window included.
    ``start`` defaults to 0 and ``end`` to the clip's length; indices past the last frame are clamped to it
    (the released reader would fail on them).

    Raises:
        ClipDecodeError: the window holds no frame.
    """
    if total_frames <= 0 or not source_fps > 0 or not math.isfinite(source_fps):
        raise ClipDecodeError(where, f"no frames ({total_frames} frames at {source_fps} fps)")
    start = max(0.0, start_seconds or 0.0)
    end = total_frames / source_fps if end_seconds is None else end_seconds
    first, stop = int(round(start * source_fps)), int(round(end * source_fps))
    if stop <= first:
        raise ClipDecodeError(where, f"empty time window [{start:.3f}, {end:.3f}) s")
    count = even_frame_count(end - start, fps=fps, max_frames=max_frames, min_frames=min_frames)
    return np.minimum(np.linspace(first, stop - 1, count, dtype=int), total_frames - 1).astype(np.int64)


def frame_indices(total_frames: int, source_fps: float, *, sampling: str = "rate", **kwargs) -> np.ndarray:
    """``(T,)`` source frame indices of a clip by ``data.video.sampling``: the one choice that :func:`decode_clip`
    and the memory planner (:func:`grasp_lightning.planning.tokens.video_tokens`) both make.

    Args:
        total_frames, source_fps: the video's frame count and rate (frames/s).
        sampling: ``"rate"``: :func:`sample_indices`; ``"even"``: :func:`even_indices`.
        kwargs: ``fps``, ``start_seconds``, ``end_seconds``, ``max_frames``, ``min_frames``, ``where``.

    Raises:
        ValueError: ``sampling`` is neither ``"rate"`` nor ``"even"``.
        ClipDecodeError: the window holds no frame.
    """
    if sampling not in ("rate", "even"):
        raise ValueError(f"data.video.sampling must be 'rate' or 'even', got {sampling!r}")
    return (even_indices if sampling == "even" else sample_indices)(total_frames, source_fps, **kwargs)


def reduced_size(height: int, width: int, max_pixels: int | None) -> tuple[int, int]:
    """``(height, width)`` in pixels to decode at: unchanged if ``height * width <= max_pixels``, else
    scaled down keeping the aspect ratio, each side rounded down to an even number (at least 2)."""
    if max_pixels is None or height * width <= max_pixels:
        return height, width
    scale = math.sqrt(max_pixels / (height * width))
    return max(2, int(height * scale) // 2 * 2), max(2, int(width * scale) // 2 * 2)


def _resize(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``(T, H, W, 3)`` uint8 frames to ``size = (height, width)`` pixels (bilinear, antialiased)."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def _check_source(data: str | Path | bytes, where: str | None) -> str:
    """The clip's name for errors; raises for a missing file or empty bytes before any decoding.

    Raises:
        ClipNotFoundError: ``data`` is a path that does not exist.
        ClipDecodeError: ``data`` is empty bytes.
    """
    if isinstance(data, (str, Path)):
        where = where or str(data)
        if not Path(data).is_file():
            raise ClipNotFoundError(where, "no such video file")
        return where
    where = where or f"<{len(data)} bytes>"
    if len(data) == 0:
        raise ClipDecodeError(where, "empty video (0 bytes)")
    return where


def decode_clip(data: bytes | str | Path, *, fps: float = 2.0, start_seconds: float | None = None,
                end_seconds: float | None = None, max_frames: int = 240, min_frames: int = 2,
                max_pixels: int | None = DEFAULT_MAX_PIXELS, num_threads: int = 1,
                where: str | None = None, sampling: str = "rate") -> DecodedClip:
    """Decode the frames of one clip sampled at ``fps`` frames per second.

    Args:
        data: the mp4 bytes (e.g. from :meth:`ClipStore.open`) or a file path.
        fps: sampling rate in frames per second.
        start_seconds, end_seconds: window in seconds from the clip start (default: whole clip).
        max_frames, min_frames: bounds on ``T``.
        max_pixels: cap on ``H * W`` per frame; larger videos are resized inside the decoder
            (aspect kept, even sides). ``None``: native size.
        num_threads: decoder threads (decord; 0 = one per core). Keep 1 inside DataLoader workers.
        where: the clip's name for error messages (default: the path, or the byte count).
        sampling: ``"rate"``: :func:`sample_indices` (the module docstring's rule); ``"even"``: the released GRASP
            reader's even spread, :func:`even_indices` (``fps`` is then its highest rate, ``max_frames`` its cap).

    Returns:
        A :class:`DecodedClip` with ``frames`` ``(T, H, W, 3)`` uint8.

    Raises:
        ClipNotFoundError: ``data`` is a path that does not exist.
        ClipDecodeError: empty (0 bytes, 0 frames, no video stream), corrupt or truncated video.
    """
    where = _check_source(data, where)
    size = (-1, -1)  # decord: native size
    if max_pixels is not None:
        height, width = _probe_size(data, where)
        if height * width > max_pixels:
            size = reduced_size(height, width, max_pixels)
    import decord  # lazy; the reader below is made per call, in the calling process


    try:
        src = str(data) if isinstance(data, (str, Path)) else io.BytesIO(data)
        reader = decord.VideoReader(src, ctx=decord.cpu(0), height=size[0], width=size[1], num_threads=num_threads)
        total, src_fps = len(reader), float(reader.get_avg_fps())
    except (decord.DECORDError, *_DECODE_ERRORS) as e:
        raise ClipDecodeError(where, f"cannot open video (corrupt, truncated or not a video): {_short(e)}") from e
    indices = frame_indices(total, src_fps, sampling=sampling, fps=fps, start_seconds=start_seconds,
                            end_seconds=end_seconds, max_frames=max_frames, min_frames=min_frames, where=where)
    try:
        batch = reader.get_batch(indices.tolist())
    except (decord.DECORDError, *_DECODE_ERRORS) as e:
        if size == (-1, -1):
            raise ClipDecodeError(where, f"corrupt or truncated video: {_short(e)}") from e
        # decord's in-decoder scaler rejects some output sizes (e.g. widths 24, 48, 72 for 16:9
        # sources) with a size-mismatch error: decode at the native size and resize afterwards.
        log.debug("%s: decord cannot scale to %s (%s); resizing after decoding", where, size, _short(e))
        try:
            fresh = str(data) if isinstance(data, (str, Path)) else io.BytesIO(data)
            native = decord.VideoReader(fresh, ctx=decord.cpu(0), num_threads=num_threads)
            batch = native.get_batch(indices.tolist())
        except (decord.DECORDError, *_DECODE_ERRORS) as e2:
            raise ClipDecodeError(where, f"corrupt or truncated video: {_short(e2)}") from e2
        batch = _resize(batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch), size)
    frames = np.ascontiguousarray(batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch), dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[0] != len(indices) or frames.shape[-1] != 3:
        raise ClipDecodeError(where, f"decoder returned frames of shape {frames.shape} for {len(indices)} indices")
    return DecodedClip(frames=frames, timestamps=indices / src_fps, indices=indices,
                       source_fps=src_fps, total_frames=total)


def _probe_size(data: bytes | str | Path, where: str) -> tuple[int, int]:
    """``(height, width)`` of the first video stream, read from the container header with PyAV."""
    import av

    try:
        with av.open(str(data) if isinstance(data, (str, Path)) else io.BytesIO(data)) as container:
            if not container.streams.video:
                raise ClipDecodeError(where, "no video stream (empty video)")
            ctx = container.streams.video[0].codec_context
            height, width = int(ctx.height), int(ctx.width)
    except av.FFmpegError as e:
        raise ClipDecodeError(where, f"cannot open video: {_short(e)}") from e
    if height <= 0 or width <= 0:
        raise ClipDecodeError(where, f"video stream has no frame size ({width}x{height})")
    return height, width


def _short(e: BaseException) -> str:
    """The last line of a decoder message, without decord's ``[time] file.cc:line:`` prefix."""
    lines = str(e).strip().splitlines()
    text = re.sub(r"^(?:\[[\d:]+\] \S+:\d+: )+", "", lines[-1]) if lines else ""
    return (text or type(e).__name__)[:300]


def video_metadata(clip: DecodedClip) -> dict:
    """Metadata for ``Qwen3VLProcessor(videos=[clip.frames], video_metadata=[...], do_sample_frames=False)``.

    Keys are exactly the fields of ``transformers.video_utils.VideoMetadata``. The processor writes
    ``<t seconds>`` before each temporal patch with ``t = frames_indices[i] / fps`` averaged over the
    (last-frame padded) pairs of frames, so these are the real seconds of the sampled frames.
    ``width``/``height`` are those of the decoded frames (pixels).
    """
    return {
        "total_num_frames": int(clip.total_frames),
        "fps": float(clip.source_fps),
        "frames_indices": [int(i) for i in clip.indices],
        "duration": float(clip.duration),
        "width": int(clip.frames.shape[2]),
        "height": int(clip.frames.shape[1]),
        "video_backend": "decord",
    }


def uniform_indices(total_frames: int, max_frames: int = 240) -> np.ndarray:
    """``(T,)`` int64 frame indices spread uniformly over the whole clip, ``T = min(max_frames, N)``.

    ``np.linspace(0, N - 1, T)`` truncated to integers: first and last frame included, strictly
    increasing (consecutive positions are at least one frame apart since ``T <= N``), independent of
    the frame rate. Source: the released GRASP evaluation (``eval/eval_social_qa.py``, ``load_video``).

    Raises:
        ClipDecodeError: ``total_frames`` < 1 or ``max_frames`` < 1.
    """
    if total_frames < 1 or max_frames < 1:
        raise ClipDecodeError("<clip>", f"cannot spread {max_frames} frame(s) over a clip of {total_frames} frames")
    return np.linspace(0, total_frames - 1, min(max_frames, total_frames)).astype(np.int64)


def resize_area(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize ``(T, H, W, 3)`` uint8 frames to ``size = (height, width)`` pixels by area averaging.

    Pillow's ``BOX`` filter (each output pixel is the mean of the input area it covers), the same
    rule as OpenCV's ``INTER_AREA`` that the released GRASP evaluation uses when shrinking; values
    may differ from OpenCV's by rounding. Unchanged frames are returned as they are.
    """
    from PIL import Image

    height, width = size
    if frames.shape[1:3] == (height, width):
        return frames
    out = np.empty((frames.shape[0], height, width, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        out[i] = np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.BOX))
    return out


def decode_uniform(data: bytes | str | Path, *, max_frames: int = 240, resize=None, num_threads: int = 1,
                   where: str | None = None, chunk: int = 32) -> DecodedClip:
    """Decode ``min(max_frames, N)`` frames spread uniformly over the whole clip (:func:`uniform_indices`).

    Args:
        data: the mp4 bytes or a file path.
        max_frames: at most this many frames (released GRASP evaluation: 240).
        resize: optional ``(height, width) -> (height, width)`` giving the output size for the native
            size; frames are decoded at the native size and shrunk with :func:`resize_area`, ``chunk``
            frames at a time (so 240 full-resolution frames are never held at once).
        num_threads: decoder threads (decord).
        where: the clip's name for error messages.
        chunk: frames decoded per call.

    Returns:
        A :class:`DecodedClip`; ``timestamps`` are the real ``indices / source_fps`` seconds.

    Raises:
        ClipNotFoundError: ``data`` is a path that does not exist.
        ClipDecodeError: empty, corrupt or truncated video.
    """
    import decord

    where = _check_source(data, where)
    try:
        src = str(data) if isinstance(data, (str, Path)) else io.BytesIO(data)
        reader = decord.VideoReader(src, ctx=decord.cpu(0), num_threads=num_threads)
        total, src_fps = len(reader), float(reader.get_avg_fps())
    except (decord.DECORDError, *_DECODE_ERRORS) as e:
        raise ClipDecodeError(where, f"cannot open video (corrupt, truncated or not a video): {_short(e)}") from e
    if total < 1:
        raise ClipDecodeError(where, "no frames")
    indices = uniform_indices(total, max_frames)
    try:
        parts = []
        for start in range(0, len(indices), chunk):
            batch = reader.get_batch(indices[start:start + chunk].tolist())
            part = np.ascontiguousarray(batch.asnumpy() if hasattr(batch, "asnumpy") else np.asarray(batch),
                                        dtype=np.uint8)
            parts.append(resize_area(part, resize(part.shape[1], part.shape[2])) if resize is not None else part)
    except (decord.DECORDError, *_DECODE_ERRORS) as e:
        raise ClipDecodeError(where, f"corrupt or truncated video: {_short(e)}") from e
    frames = np.concatenate(parts)
    if frames.ndim != 4 or frames.shape[0] != len(indices) or frames.shape[-1] != 3:
        raise ClipDecodeError(where, f"decoder returned frames of shape {frames.shape} for {len(indices)} indices")
    return DecodedClip(frames=frames, timestamps=indices / src_fps, indices=indices, source_fps=src_fps,
                       total_frames=total)
