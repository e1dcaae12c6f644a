"""How big a clip's frames are when they reach the Qwen3-VL video processor, and how many visual tokens they give.

One rule, :func:`clip_frames`, for both users: ``GraspDataset`` (``grasp_lightning/datamodule.py``) sizes
every decoded clip with it before the processor sees it, and the memory planner
(:func:`grasp_lightning.planning.tokens.video_tokens`) counts a clip's tokens with it, so the two cannot
drift apart (``tests/unit/data/test_frames.py`` checks them equal for every recipe and overlay).

A frame goes through these caps, in order (``data.video``):

- ``frame_max_tokens: null`` (our recipes): decoded at most ``max_pixels`` pixels
  (:func:`~grasp_lightning.data.video.reduced_size`), then resized by the processor
  (``cap_pixels_per_frame``: :func:`processor_frame_size`, ``smart_resize`` to multiples of
  ``patch_size x merge_size`` pixels under the per-clip and per-frame budgets);
- ``frame_max_tokens: N`` (the released GRASP rule): decoded at the source size, shrunk to the largest
  grid of whole tokens with at most ``N`` tokens per 2-frame temporal patch (:func:`resolve_resolution`)
  and passed to the processor unresized (``do_resize=False``).

Frames are grouped by ``temporal_patch_size`` (2; an odd count is padded with the last frame) and each
group gives ``(H / patch) x (W / patch) / merge^2`` ``<|video_pad|>`` tokens. Qwen3.5 uses the same
processor class and settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grasp_lightning.data.video import reduced_size
from grasp_lightning.errors import GraspConfigError

#: The video processor settings :func:`clip_frames` reads: ``size`` (``shortest_edge``/``longest_edge``, pixels
#: per clip), ``max_video_tokens`` (per-frame ceiling), ``patch_size`` (pixels), ``merge_size``,
#: ``temporal_patch_size`` (frames).
SETTING_KEYS = ("size", "max_video_tokens", "patch_size", "merge_size", "temporal_patch_size")


def resolve_resolution(height: int, width: int, *, spatial_patch: int = 32, max_tokens: int = 256) -> tuple[int, int]:
    """``(height, width)`` in pixels the released GRASP code resizes a ``height x width`` frame to.

    Among grids of ``h x w`` patches of ``spatial_patch`` pixels with ``h <= height // spatial_patch``,
    ``w`` either ``floor(h * width / height)`` or one more, ``0 < w <= width // spatial_patch`` and
    ``h * w <= max_tokens``, the one with the most patches (the first found, scanning ``h`` upwards).
    A patch of 32 pixels is one token of Qwen3-VL / Qwen3.5 (16-pixel patches merged 2x2), and one
    token covers 2 frames (temporal patch 2), so a 2-frame temporal patch holds at most
    ``max_tokens`` tokens. Never larger than the frame. Source: ``resolve_resolution`` in
    ``socialmllm/utils/input_processing.py`` of the GRASP repository (training: ``data.video.frame_max_tokens``;
    evaluation: ``model.evaluation.released.frame_max_tokens``).

    Raises:
        GraspConfigError: the frame is smaller than one patch on a side (no grid fits).
    """
    ratio = width / height
    rows, cols = int(height / spatial_patch), int(width / spatial_patch)
    best, best_tokens = None, 0
    for h in range(1, rows + 1):
        for w in (int(h * ratio), int(h * ratio) + 1):
            if 0 < w <= cols and best_tokens < h * w <= max_tokens:
                best, best_tokens = (h, w), h * w
    if best is None:
        raise GraspConfigError(f"a {height}x{width} frame holds no {spatial_patch}-pixel patch grid within "
                               f"{max_tokens} tokens")
    return best[0] * spatial_patch, best[1] * spatial_patch


def processor_frame_size(frames: int, height: int, width: int, settings: dict) -> tuple[int, int]:
    """``(height, width)`` the Qwen3-VL video processor resizes ``frames`` frames of ``height x width`` to.

    As ``Qwen3VLVideoProcessor.resize`` with ``cap_pixels_per_frame=True`` (what ``data/prompts.py``
    passes): each frame may have ``max(min(max_video_tokens x f^2, longest_edge // frames),
    int(1.05 x shortest_edge))`` pixels (``f = patch_size x merge_size`` = 32), then transformers'
    ``smart_resize`` rounds the sides to multiples of ``f`` (down, keeping the aspect ratio, when the
    clip is over its budget; to the nearest multiple otherwise).

    Args:
        frames: frames passed to the processor (>= ``temporal_patch_size``).
        height, width: pixels of the decoded frames.
        settings: the video processor's settings (:data:`SETTING_KEYS`).
    """
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

    factor = settings["patch_size"] * settings["merge_size"]
    size = settings["size"]
    per_frame = max(min(settings["max_video_tokens"] * factor**2, size["longest_edge"] // frames),
                    int(size["shortest_edge"] * 1.05))
    return smart_resize(frames, height, width, temporal_factor=settings["temporal_patch_size"], factor=factor,
                        min_pixels=size["shortest_edge"], max_pixels=per_frame * frames)


def video_processor_settings(video_processor: Any) -> dict:
    """The :data:`SETTING_KEYS` of a loaded transformers video processor (``processor.video_processor``).

    Raises:
        GraspConfigError: the processor lacks one of them (not a Qwen3-VL-style video processor).
    """
    missing = [key for key in SETTING_KEYS if getattr(video_processor, key, None) is None]
    if missing:
        raise GraspConfigError(f"the video processor {type(video_processor).__name__} has no {missing}: GRASP clips "
                               "need a Qwen3-VL-style video processor (patches, merge, temporal patches, pixel budget)")
    size = {key: int(value) for key, value in dict(video_processor.size).items() if value is not None}
    return {"size": size, **{key: int(getattr(video_processor, key)) for key in SETTING_KEYS[1:]}}


def decode_max_pixels(max_pixels: int, frame_max_tokens: int | None) -> int | None:
    """The pixel cap a clip is decoded at: ``max_pixels``, or ``None`` (the source size) under the
    released rule (``frame_max_tokens`` set), which shrinks the frames itself after decoding."""
    return max_pixels if frame_max_tokens is None else None


def default_frame_size(max_pixels: int, frame_max_tokens: int | None, settings: dict) -> tuple[int, int]:
    """Square source frames just large enough that the cap binds: ``isqrt(max_pixels)`` pixels a side
    (448 x 448 for 200,704), or ``isqrt(frame_max_tokens)`` tokens of ``patch_size x merge_size``
    pixels a side under the released rule (512 x 512, 256 tokens per group, for 256 and 32 pixels)."""
    if frame_max_tokens is None:
        side = math.isqrt(max_pixels)
    else:
        side = math.isqrt(frame_max_tokens) * settings["patch_size"] * settings["merge_size"]
    return side, side


@dataclass(frozen=True)
class ClipFrames:
    """The frames of one clip on their way to the video processor (:func:`clip_frames`).

    Attributes:
        frames: frames decoded and passed to the processor.
        decoded: ``(height, width)`` in pixels the clip is decoded at (:func:`decode_max_pixels`).
        passed: ``(height, width)`` the frames are handed to the processor at (``decoded``, or the
            released rule's :func:`resolve_resolution` grid).
        processor_resizes: the processor resizes them (``cap_pixels_per_frame``); ``False`` under the
            released rule (``do_resize=False``).
        size: ``(height, width)`` the vision tower sees (after the processor's resize, if any).
        groups: temporal patches (``ceil(frames / temporal_patch_size)``).
        tokens_per_group: ``<|video_pad|>`` tokens per group: ``(H / patch) x (W / patch) / merge^2``.
    """

    frames: int
    decoded: tuple[int, int]
    passed: tuple[int, int]
    processor_resizes: bool
    size: tuple[int, int]
    groups: int
    tokens_per_group: int

    @property
    def visual_tokens(self) -> int:
        """``<|video_pad|>`` tokens of the clip (``groups x tokens_per_group``)."""
        return self.groups * self.tokens_per_group


def clip_frames(frames: int, height: int, width: int, *, max_pixels: int, frame_max_tokens: int | None,
                settings: dict) -> ClipFrames:
    """The sizes and visual tokens of ``frames`` frames of a ``height x width`` video (rule in the module docstring).

    ``GraspDataset`` calls it with the decoded frames' size (the decode cap is then already applied, and
    :func:`~grasp_lightning.data.video.reduced_size` leaves it as it is); the planner with the source
    video's size.

    Args:
        frames: frames sampled from the clip (``data.video.sample_indices``: fps, ``max_frames``), >= 1.
        height, width: pixels of the source (or already decoded) frames.
        max_pixels: ``data.video.max_pixels`` (pixels per decoded frame; unused under the released rule).
        frame_max_tokens: ``data.video.frame_max_tokens`` (tokens per 2-frame patch) or ``None``.
        settings: the video processor's settings (:func:`video_processor_settings`, or the planner's
            :func:`~grasp_lightning.planning.tokens.processor_video_settings`).

    Raises:
        GraspConfigError: no frames, a frame size below one pixel, or (released rule) a frame smaller
            than one token on a side.
    """
    if frames < 1 or height < 1 or width < 1:
        raise GraspConfigError(f"a clip needs >= 1 frame of >= 1 x 1 pixels, got {frames} of {height} x {width}")
    patch, merge, t_patch = settings["patch_size"], settings["merge_size"], settings["temporal_patch_size"]
    decoded = reduced_size(height, width, decode_max_pixels(max_pixels, frame_max_tokens))
    if frame_max_tokens is None:
        passed = decoded
        size = tuple(processor_frame_size(frames, *decoded, settings))
    else:
        passed = size = resolve_resolution(*decoded, spatial_patch=patch * merge, max_tokens=frame_max_tokens)
    tokens_per_group = (size[0] // patch) * (size[1] // patch) // merge**2
    return ClipFrames(frames=frames, decoded=tuple(decoded), passed=tuple(passed),
                      processor_resizes=frame_max_tokens is None, size=size, groups=-(-frames // t_patch),
                      tokens_per_group=tokens_per_group)
