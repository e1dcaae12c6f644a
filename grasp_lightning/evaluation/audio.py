"""Audio for evaluation suites: decode a clip's audio track with PyAV, and tell whether a processor takes audio.

Source: PyAV's ``AudioResampler`` (any codec FFmpeg decodes, resampled to mono float32); Hugging
Face processors expose an audio front end as ``feature_extractor`` (Qwen2.5-Omni, Qwen2-Audio,
Whisper-style) or ``audio_processor``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from grasp_lightning.errors import ClipDecodeError, ClipNotFoundError

AUDIO_SUFFIXES = (".wav", ".mp3", ".flac", ".m4a", ".aac", ".ogg", ".opus")


def processor_accepts_audio(processor) -> bool:
    """True when ``processor`` has an audio front end (``feature_extractor`` or ``audio_processor``).

    ``Qwen3VLProcessor`` (image, video, tokenizer) has none, so audio items are not evaluated with it.
    """
    names = processor.get_attributes() if hasattr(processor, "get_attributes") else []
    present = any(getattr(processor, n, None) is not None for n in ("feature_extractor", "audio_processor"))
    return present or any(n in ("feature_extractor", "audio_processor") for n in names)


def decode_audio(data: bytes | str | Path, *, sample_rate: int = 16000, start_seconds: float | None = None,
                 end_seconds: float | None = None, where: str | None = None) -> np.ndarray:
    """Decode the first audio stream of a file to mono float32 samples at ``sample_rate``.

    Args:
        data: the file's bytes (mp4 with an audio track, wav, mp3, ...) or a path.
        sample_rate: output rate in samples per second (16 kHz for Whisper-style feature extractors).
        start_seconds, end_seconds: window in seconds from the stream start (default: all of it).
        where: the file's name for error messages.

    Returns:
        ``(N,)`` float32 in [-1, 1], ``N ≈ (end - start) * sample_rate``.

    Raises:
        ClipNotFoundError: ``data`` is a path that does not exist.
        ClipDecodeError: no audio stream, or a corrupt file.
    """
    import av

    if isinstance(data, (str, Path)):
        where = where or str(data)
        if not Path(data).is_file():
            raise ClipNotFoundError(where, "no such audio/video file")
        source = str(data)
    else:
        where = where or f"<{len(data)} bytes>"
        source = io.BytesIO(data)
    chunks: list[np.ndarray] = []
    try:
        with av.open(source) as container:
            if not container.streams.audio:
                raise ClipDecodeError(where, "no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as e:
        raise ClipDecodeError(where, f"cannot decode audio: {e}") from e
    samples = np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)
    lo = int(round((start_seconds or 0.0) * sample_rate))
    hi = len(samples) if end_seconds is None else int(round(end_seconds * sample_rate))
    return samples[max(0, lo):max(0, hi)]


def audio_unavailable_reason(processor) -> str | None:
    """Why items that need audio cannot be evaluated with ``processor``, or ``None`` when they can.

    The GRASP prompt and collate path (``grasp_lightning.data.prompts``/``collate``) passes video
    only, so today every audio item is reported as not evaluated; the reason says which side lacks
    audio. :func:`decode_audio` is what an audio-aware encoder would use.
    """
    if not processor_accepts_audio(processor):
        return "they need audio and the model's processor takes no audio input"
    return "they need audio; the processor takes audio but the prompt/collate path passes video only"
