"""The one mp4 writer of the project: RGB frames (and optionally a mono audio track) -> mp4, with PyAV.

Every generated clip goes through :func:`encode_mp4`: the bundled sample data
(:mod:`grasp_lightning.synthetic.sample`), the synthetic world of ``experiments/world``, the
evaluation-suite fixtures (:mod:`~grasp_lightning.synthetic.suite_fixtures`), the test fixtures
(``tests/helpers/data.py``) and the benchmark clips (``benchmarks/video_decode.py``,
``benchmarks/faults.py``). What differs between them is an :class:`Mp4Settings`:

- :data:`STABLE` (the default): H.264 crf 30, preset medium, no B-frames, a keyframe every 2 s,
  one thread, ``+bitexact`` muxer — the bytes are identical run to run for a given libx264 build
  (the x264 version string inside the stream differs between builds). The shipped sample data and
  suite fixtures are compared against their generators byte for byte, so these settings are frozen.
- ``Mp4Settings()``: the encoder's own defaults (x264: crf 23, preset medium, B-frames, GOP 250),
  the shape of real footage; the benchmarks and test fixtures override a field or two.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterable, overload

import numpy as np


@dataclass(frozen=True)
class Mp4Settings:
    """Encoder settings; ``None`` leaves a setting to the encoder's own default.

    Attributes:
        codec: the PyAV video encoder, e.g. ``"libx264"`` or ``"mpeg4"``.
        fallback: encoder used when ``codec`` is not in ``av.codecs_available`` (``None``: fail).
        crf: x264 constant rate factor (libx264 only; lower is better quality).
        preset: x264 speed preset, e.g. ``"medium"``, ``"veryfast"``, ``"ultrafast"`` (libx264 only).
        qscale: fixed quantiser of the other encoders (e.g. ``mpeg4``; ignored by libx264).
        bframes: maximum consecutive B-frames (the codec option ``bf``; 0 disables them).
        gop_seconds: keyframe interval in seconds (GOP of ``round(gop_seconds * fps)`` frames).
        threads: encoder threads (``None``: FFmpeg's automatic choice).
        bitexact: mux with ``fflags=+bitexact`` (no muxer version string in the file).
        faststart: put the ``moov`` atom before the media data (``movflags=faststart``); else it
            is at the end, as most cameras write it.
        pix_fmt: the encoded pixel format: ``"yuv420p"`` (what cameras and most videos use: colour at
            half resolution in each axis) or ``"yuv444p"`` (full-resolution colour, x264's High 4:4:4
            profile; the mpeg4 encoder has no 4:4:4, and :func:`encode_mp4` refuses a format its encoder lacks).
    """

    codec: str = "libx264"
    fallback: str | None = "mpeg4"
    crf: int | None = None
    preset: str | None = None
    qscale: int | None = None
    bframes: int | None = None
    gop_seconds: float | None = None
    threads: int | None = None
    bitexact: bool = False
    faststart: bool = False
    pix_fmt: str = "yuv420p"

    def codec_options(self, codec: str) -> dict[str, str]:
        """The PyAV stream options of these settings for encoder ``codec`` (string values)."""
        pairs = [("crf", self.crf), ("preset", self.preset)] if codec == "libx264" else [("qscale", self.qscale)]
        pairs.append(("bf", self.bframes))
        return {k: str(v) for k, v in pairs if v is not None}


#: Byte-stable settings of every generated dataset (sample data, suite fixtures, the synthetic world's base).
STABLE = Mp4Settings(crf=30, preset="medium", qscale=6, bframes=0, gop_seconds=2.0, threads=1, bitexact=True)


def _pick_codec(settings: Mp4Settings) -> str:
    """``settings.codec`` when PyAV has it, else ``settings.fallback``.

    Raises:
        ValueError: neither is available.
    """
    import av

    for codec in (settings.codec, settings.fallback):
        if codec is not None and codec in av.codecs_available:
            return codec
    raise ValueError(f"PyAV has no encoder {settings.codec!r}" + (f" nor {settings.fallback!r}"
                                                                  if settings.fallback else ""))


@overload
def encode_mp4(frames: Iterable[np.ndarray], fps: float, settings: Mp4Settings = ..., *, out: None = None,
               audio: np.ndarray | None = None, sample_rate: int = 16000,
               size: tuple[int, int] | None = None) -> bytes: ...


@overload
def encode_mp4(frames: Iterable[np.ndarray], fps: float, settings: Mp4Settings = ..., *, out: str | Path,
               audio: np.ndarray | None = None, sample_rate: int = 16000,
               size: tuple[int, int] | None = None) -> Path: ...


def encode_mp4(frames: Iterable[np.ndarray], fps: float, settings: Mp4Settings = STABLE, *,
               out: str | Path | None = None, audio: np.ndarray | None = None, sample_rate: int = 16000,
               size: tuple[int, int] | None = None) -> bytes | Path:
    """Encode ``(H, W, 3)`` uint8 RGB frames (even H and W) as an mp4 in ``settings.pix_fmt`` (yuv420p by default).

    Args:
        frames: the frames in order; any iterable, consumed once (a generator keeps long or 4K
            clips out of memory).
        fps: frame rate in frames per second (a float is written as a fraction with a
            denominator of at most 1001, e.g. 29.97 -> 30000/1001).
        settings: encoder settings (default :data:`STABLE`).
        out: write the file here and return its path; ``None`` returns the bytes.
        audio: optional mono track, float32 samples in [-1, 1] at ``sample_rate`` Hz, encoded as
            AAC after the video (in 1024-sample frames).
        sample_rate: audio sample rate in Hz.
        size: ``(height, width)`` in pixels; default the first frame's. Needed when ``frames`` is
            empty (the file then has a video stream without a single frame).

    Returns:
        The mp4 bytes, or ``Path(out)`` when ``out`` is given.

    Raises:
        ValueError: no usable encoder (:class:`Mp4Settings` ``codec``/``fallback``), an encoder without
            ``settings.pix_fmt``, or no frames and no ``size``.
    """
    import av

    codec = _pick_codec(settings)
    formats = [f.name for f in av.codec.Codec(codec, "w").video_formats or ()]
    if formats and settings.pix_fmt not in formats:
        raise ValueError(f"encode_mp4: encoder {codec} has no pixel format {settings.pix_fmt!r} (it has {formats})")
    it = iter(frames)
    first = next(it, None)
    if size is None:
        if first is None:
            raise ValueError("encode_mp4: no frames and no size given")
        size = first.shape[:2]
    container_options = {"fflags": "+bitexact"} if settings.bitexact else {}
    if settings.faststart:
        container_options["movflags"] = "faststart"
    target = io.BytesIO() if out is None else str(out)
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(target, "w", format="mp4", container_options=container_options) as container:
        video = container.add_stream(codec, rate=rate, options=settings.codec_options(codec))
        video.height, video.width = size
        video.pix_fmt = settings.pix_fmt
        if settings.gop_seconds is not None:
            video.codec_context.gop_size = int(round(settings.gop_seconds * fps))
        if settings.threads is not None:
            video.codec_context.thread_count = settings.threads
        sound = None
        if audio is not None:
            sound = container.add_stream("aac", rate=sample_rate)
            sound.layout = "mono"
        if first is None:
            container.start_encoding()
        else:
            for frame in itertools.chain([first], it):
                container.mux(video.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(video.encode(None))
        if sound is not None:
            _mux_audio(container, sound, audio, sample_rate)
    return Path(out) if out is not None else target.getvalue()


def _mux_audio(container, sound, audio: np.ndarray, sample_rate: int, chunk: int = 1024) -> None:
    """Encode a mono float32 track into ``sound`` in ``chunk``-sample frames and mux it."""
    import av

    samples = np.asarray(audio, np.float32).reshape(1, -1)
    for start in range(0, samples.shape[1], chunk):
        piece = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + chunk]), format="flt",
                                           layout="mono")
        piece.sample_rate, piece.pts = sample_rate, start
        container.mux(sound.encode(piece))
    container.mux(sound.encode(None))
