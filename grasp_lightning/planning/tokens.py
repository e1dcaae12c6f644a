"""Tokens of a clip as the Qwen3-VL processor writes them: frames, frame size, groups, timestamps.

Qwen3.5 uses the same processor class and settings (:data:`QWEN3VL_VIDEO_PROCESSOR`), so its clips
have the same tokens; its timestamps are assumed to tokenize as Qwen3's (its pre-tokenizer also
isolates every digit; not checked against its ``tokenizer.json``, which is not on this machine).

:func:`video_tokens` follows a clip through ``GraspDataModule`` (fps, ``max_frames``) and sizes its
frames with the data path's own rule, :func:`grasp_lightning.data.frames.clip_frames` (``max_pixels`` and
the processor's per-frame cap and ``smart_resize`` to multiples of 32 pixels, or the released rule's
``frame_max_tokens``), then adds 2-frame groups, one ``<t seconds>`` timestamp and vision start/end per
group, with the processor's settings read from the model directory (:func:`processor_video_settings`); it
matches the processor's prompt length exactly (``tests/unit/planning/test_estimate.py``) and its visual
tokens for every recipe and overlay (``tests/unit/data/test_frames.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grasp_lightning.errors import GraspConfigError

#: Qwen3-VL's published video processor settings (``video_preprocessor_config.json``, or the
#: ``video_processor`` section of a transformers-5 ``processor_config.json``): ``size`` in pixels over
#: the whole clip, ``max_video_tokens`` the per-frame ceiling of ``cap_pixels_per_frame``. Qwen3.5's are
#: the same: transformers maps ``qwen3_5`` to ``Qwen3VLProcessor`` and ``Qwen3VLVideoProcessor``
#: (``models/auto/processing_auto.py``, ``video_processing_auto.py``), and Qwen/Qwen3.5-9B's
#: ``video_preprocessor_config.json`` holds the same size (4096 to 25,165,824 pixels), patch 16,
#: temporal patch 2 and merge 2, leaving fps (2) and ``max_video_tokens`` (768) at the class defaults.
QWEN3VL_VIDEO_PROCESSOR = {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "max_video_tokens": 768,
                           "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}
#: Frame rate of the video files when a plan does not say (frames/s): it only shifts timestamps.
DEFAULT_SOURCE_FPS = 30.0


def timestamp_tokens(seconds: float) -> int:
    """Tokens of the timestamp ``<{seconds:.1f} seconds>`` the Qwen3-VL processor writes before a group.

    Qwen's byte-level BPE pre-tokenizer splits numbers into single digits and the text sits between
    two special tokens, so it is ``<``, one token per digit, ``.``, `` seconds`` and ``>``:
    ``<0.2 seconds>`` is 6 tokens, ``<12.5 seconds>`` 7, ``<123.5 seconds>`` 8 (checked against
    Qwen3's ``tokenizer.json`` in ``tests/unit/planning/test_estimate.py``).

    Args:
        seconds: the group's timestamp in seconds (>= 0).
    """
    digits = sum(ch.isdigit() for ch in f"{seconds:.1f}")
    return digits + 4


@dataclass(frozen=True)
class VideoTokens:
    """Tokens of one clip as the Qwen3-VL processor lays them out.

    The template's ``<|vision_start|><|video_pad|><|vision_end|>`` becomes, per temporal group,
    ``<t seconds><|vision_start|>`` + the group's ``<|video_pad|>`` tokens + ``<|vision_end|>``
    (transformers >= 5.25 ``Qwen3VLProcessor.get_text_with_replacements`` and ``replace_video_token``;
    the layout of Qwen's own processor, with no start/end pair around the whole clip).

    Attributes:
        frames: frames decoded (``data.video.sample_indices``: fps, ``max_frames``).
        groups: temporal patches (2 frames each, an odd count padded with the last frame).
        frame_size: ``(height, width)`` in pixels after every cap (decode, processor resize or the
            released rule's ``frame_max_tokens``).
        tokens_per_group: visual tokens per group, ``H/16 x W/16 / 4``.
        timestamp_tokens: tokens of all groups' ``<t seconds>`` texts.
    """

    frames: int
    groups: int
    frame_size: tuple[int, int]
    tokens_per_group: int
    timestamp_tokens: int

    @property
    def pixels_per_frame(self) -> int:
        """Pixels of a frame as the vision tower sees it."""
        return self.frame_size[0] * self.frame_size[1]

    @property
    def visual_tokens(self) -> int:
        """``<|video_pad|>`` tokens (one per merged 2 x 2 patch of a 2-frame group)."""
        return self.groups * self.tokens_per_group

    @property
    def text_tokens(self) -> int:
        """Timestamps and the per-group ``<|vision_start|>``/``<|vision_end|>``, minus the template's
        three placeholder tokens (start, pad, end) they replace."""
        return self.timestamp_tokens + 2 * self.groups - 3

    @property
    def total(self) -> int:
        """Tokens the clip adds to a prompt whose template holds one video placeholder."""
        return self.visual_tokens + self.text_tokens


def video_tokens(seconds: float, fps: float, max_frames: int, max_pixels: int, *, frame_max_tokens: int | None = None,
                 frame_size: tuple[int, int] | None = None, sampling: str = "rate",
                 source_fps: float = DEFAULT_SOURCE_FPS, settings: dict | None = None) -> VideoTokens:
    """Tokens of a clip of ``seconds`` decoded as ``GraspDataModule`` does and encoded by the processor.

    1. Frames: ``data.video.frame_indices`` (by ``sampling``, as ``decode_clip`` picks them) of a
       ``round(seconds x source_fps)``-frame clip at ``fps`` (at most ``max_frames``, at least 2); frames are passed with ``do_sample_frames=False``,
       so the processor's own fps/min/max-frame sampling does not apply.
    2. Pixels and visual tokens: :func:`grasp_lightning.data.frames.clip_frames`, the rule ``GraspDataset``
       sizes its frames with (``max_pixels`` at decode time and the processor's resize, or the released
       rule's ``frame_max_tokens`` per 2-frame patch).
    3. Groups: ``ceil(frames / temporal_patch_size)``; each gets ``<t seconds>`` with ``t`` the mean
       of its frames' source indices / ``source_fps`` (the last group padded with the last frame),
       as ``Qwen3VLProcessor._calculate_timestamps`` computes it from ``video_metadata``.

    Args:
        seconds: clip length (s). fps: decode rate (frames/s). max_frames: ``data.video.max_frames``.
        max_pixels: ``data.video.max_pixels`` (pixels per decoded frame).
        frame_max_tokens: ``data.video.frame_max_tokens`` (tokens per 2-frame patch; ``None``: our rule).
        frame_size: the source video's ``(height, width)`` in pixels (default: square frames just large
            enough that the cap binds, :func:`~grasp_lightning.data.frames.default_frame_size`: 448 x 448 for
            the recipes' ``max_pixels``, 512 x 512 for the released rule's 256 tokens).
        sampling: ``data.video.sampling``: ``"rate"`` (by timestamp) or ``"even"`` (the released spread).
        source_fps: the video file's frame rate (frames/s); it only moves timestamps by a frame.
        settings: the video processor's settings (default: Qwen3-VL's published ones).

    Raises:
        GraspConfigError: ``seconds``, ``fps`` or ``source_fps`` not positive.
    """
    if seconds <= 0 or fps <= 0 or source_fps <= 0:
        raise GraspConfigError(f"video seconds, fps and source fps must be > 0, got {seconds} s at {fps} fps "
                               f"from a {source_fps} fps file")
    from grasp_lightning.data.frames import clip_frames, default_frame_size
    from grasp_lightning.data.video import frame_indices

    settings = {**QWEN3VL_VIDEO_PROCESSOR, **(settings or {})}
    total = max(1, round(seconds * source_fps))
    indices = [int(i) for i in frame_indices(total, source_fps, sampling=sampling, fps=fps, max_frames=max_frames)]
    if frame_size is None:
        frame_size = default_frame_size(max_pixels, frame_max_tokens, settings)
    sizing = clip_frames(len(indices), *frame_size, max_pixels=max_pixels, frame_max_tokens=frame_max_tokens,
                         settings=settings)
    t_patch = settings["temporal_patch_size"]
    padded = indices + indices[-1:] * (-len(indices) % t_patch)
    stamps = [(padded[i] + padded[i + t_patch - 1]) / 2 / source_fps for i in range(0, len(padded), t_patch)]
    return VideoTokens(len(indices), sizing.groups, tuple(sizing.size), sizing.tokens_per_group,
                       sum(map(timestamp_tokens, stamps)))


def processor_video_settings(name_or_path: str) -> dict:
    """The video processor settings the planner needs, read from a local model directory.

    Looks in the transformers-5 layout first (the ``video_processor`` section of
    ``processor_config.json``, which ``save_pretrained``, our exports and the stand-ins write), then
    in the older ``video_preprocessor_config.json``; missing keys (or no directory, e.g. a Hub id)
    take Qwen3-VL's published values (:data:`QWEN3VL_VIDEO_PROCESSOR`).

    Returns:
        ``{"size": {"shortest_edge", "longest_edge"}, "max_video_tokens", "patch_size",
        "merge_size", "temporal_patch_size"}`` (pixels per clip, tokens per frame, pixels, patches, frames).

    Raises:
        GraspConfigError: a settings file that is not valid JSON.
    """
    folder = Path(name_or_path)
    for name, section in (("processor_config.json", "video_processor"), ("video_preprocessor_config.json", None)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise GraspConfigError(f"{path}: not valid JSON ({err})") from err
        data = data.get(section) if section else data
        if isinstance(data, dict):
            return {key: data.get(key, default) or default for key, default in QWEN3VL_VIDEO_PROCESSOR.items()}
    return dict(QWEN3VL_VIDEO_PROCESSOR)

