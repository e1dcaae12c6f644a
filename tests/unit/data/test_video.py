"""Frame sampling and decoding (``grasp_lightning.data.video``)."""

from __future__ import annotations

import re
from dataclasses import fields

import numpy as np
import pytest

from grasp_lightning.data import video
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.data.video import DecodedClip, decode_clip, reduced_size, sample_indices, video_metadata
from grasp_lightning.errors import ClipDecodeError, ClipNotFoundError
from tests.helpers import REAL_CLIP, SAMPLE, level_to_index, make_mp4, make_tar


@pytest.fixture(scope="module")
def ten_frames() -> bytes:
    """10 frames at 5 fps (2.0 s), 32x32, frame i painted grey level frame_level(i)."""
    return make_mp4(10, fps=5)


def test_known_real_clip_at_2fps():
    clip = decode_clip(REAL_CLIP)  # 101 frames at 30 fps, 3.37 s, 640x360
    assert isinstance(clip, DecodedClip) and (clip.total_frames, clip.source_fps) == (101, 30.0)
    assert clip.frames.shape == (7, 360, 640, 3) and clip.frames.dtype == np.uint8
    assert clip.indices.tolist() == [0, 15, 30, 45, 60, 75, 90] and clip.indices.dtype == np.int64
    assert clip.timestamps.dtype == np.float64
    assert clip.timestamps[0] == 0.0 and clip.timestamps[-1] == pytest.approx(3.0)
    np.testing.assert_allclose(clip.timestamps, np.arange(7) * 0.5)
    from_bytes = decode_clip(REAL_CLIP.read_bytes(), where="kitchen")
    np.testing.assert_array_equal(from_bytes.frames, clip.frames)


def test_real_clip_window_subsample_and_pixel_cap():
    assert decode_clip(REAL_CLIP, start_seconds=1.0, end_seconds=2.0).indices.tolist() == [30, 45]
    dense = decode_clip(REAL_CLIP, fps=30.0, max_frames=10, max_pixels=None)
    assert dense.indices.tolist() == [0, 11, 22, 33, 44, 56, 67, 78, 89, 100]
    small = decode_clip(REAL_CLIP, max_pixels=160 * 90)
    assert small.frames.shape == (7, 90, 160, 3)
    assert reduced_size(360, 640, 100 * 100) == (74, 132) and reduced_size(360, 640, None) == (360, 640)


def test_decodes_exactly_the_sampled_frames(ten_frames):
    clip = decode_clip(ten_frames, where="ten")
    assert clip.indices.tolist() == [0, 3, 5, 8]  # t = 0, 0.5, 1.0, 1.5 s at 5 fps, ties round up
    np.testing.assert_allclose(clip.timestamps, [0.0, 0.6, 1.0, 1.6])
    decoded = [level_to_index(float(f.mean()), 10) for f in clip.frames]
    assert decoded == clip.indices.tolist()


def test_min_frames_and_sample_indices_rule():
    assert sample_indices(10, 5.0, end_seconds=0.3).tolist() == [0, 1]  # 1 sample < min_frames=2
    assert sample_indices(300, 29.97, fps=2.0)[:3].tolist() == [0, 15, 30]
    assert len(sample_indices(300 * 30, 30.0)) == 240  # 300 s at 2 fps capped at 240
    with pytest.raises(ClipDecodeError, match=r"^c.mp4: empty time window \[1.000, 0.500\) s in a 2.000 s clip$"):
        sample_indices(10, 5.0, start_seconds=1.0, end_seconds=0.5, where="c.mp4")
    # a start past the clip's end names the start (it read "empty time window [2.000, 2.000) s" before)
    for start in (2.0, 5.0):
        with pytest.raises(ClipDecodeError) as raised:
            sample_indices(10, 5.0, start_seconds=start, where="c.mp4")
        assert str(raised.value) == (f"c.mp4: start_seconds {start:g} is at or past the end of the clip (2.000 s): "
                                     "its window holds no frame")
    with pytest.raises(ClipDecodeError, match="fewer than min_frames=4"):
        sample_indices(3, 5.0, min_frames=4, where="c.mp4")


def test_video_metadata_matches_transformers(ten_frames):
    from transformers.video_utils import VideoMetadata

    clip = decode_clip(ten_frames)
    meta = video_metadata(clip)
    assert set(meta) == {f.name for f in fields(VideoMetadata)}
    assert meta["frames_indices"] == [0, 3, 5, 8] and meta["fps"] == 5.0 and meta["total_num_frames"] == 10
    np.testing.assert_allclose(VideoMetadata(**meta).timestamps, clip.timestamps)


def test_processor_prompt_has_real_seconds():
    """Qwen3VLProcessor with a byte-level tokenizer: the prompt's time marks are the real seconds."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = Qwen2Tokenizer(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, merges=[])
    tok.add_special_tokens({"additional_special_tokens": [
        "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
        "<|video_pad|>"]})
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=4, merge_size=2), tokenizer=tok,
                                 video_processor=Qwen3VLVideoProcessor(patch_size=4, merge_size=2))
    clip = decode_clip(REAL_CLIP, max_pixels=32 * 32)  # 7 frames: 0, 0.5, ..., 3.0 s
    out = processor(text=["<|vision_start|><|video_pad|><|vision_end|>Q"], videos=[clip.frames],
                    video_metadata=[video_metadata(clip)], do_sample_frames=False, cap_pixels_per_frame=True,
                    return_tensors="pt")
    marks = re.findall(r"<([\d.]+) seconds>", tok.decode(out["input_ids"][0]))
    assert marks == ["0.2", "1.2", "2.2", "3.0"]  # pairs (0,0.5) (1,1.5) (2,2.5) (3,3 padded)
    assert out["video_grid_thw"][0, 0].item() == 4


@pytest.mark.parametrize("make, needle", [
    (lambda b: b"", "empty video (0 bytes)"),
    (lambda b: b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 4, "cannot open video"),
    (lambda b: b[: len(b) // 2], "cannot open video"),  # moov at the end: truncation loses it
    (lambda b: make_mp4(0), "no video stream"),
])
def test_bad_videos_raise_with_clip_name(ten_frames, make, needle):
    with pytest.raises(ClipDecodeError) as err:
        decode_clip(make(ten_frames), where="tvqa/video/bad_qa0001.mp4")
    assert err.value.where == "tvqa/video/bad_qa0001.mp4" and needle in err.value.reason


def test_truncated_and_corrupt_faststart_mp4():
    data = make_mp4(30, fps=5, width=64, height=64, faststart=True, noise=True)
    with pytest.raises(ClipDecodeError, match="truncated") as err:
        decode_clip(data[: len(data) // 2], where="x.mp4")  # decord reads every packet when opening
    assert err.value.where == "x.mp4"
    mid = (data.find(b"mdat") + len(data)) // 2
    corrupt = data[:mid] + bytes(len(data) - mid)  # container intact, second half of the stream zeroed
    with pytest.raises(ClipDecodeError, match="corrupt or truncated video") as err:
        decode_clip(corrupt, fps=5.0, where="y.mp4")  # fails in get_batch
    assert err.value.where == "y.mp4"


def test_missing_path(tmp_path):
    with pytest.raises(ClipNotFoundError):
        decode_clip(tmp_path / "none.mp4")


def test_store_to_frames_with_dotted_name(tmp_path, ten_frames):
    name = "friendsmmc/video/s01.e02.x_qa0001.mp4"
    make_tar(tmp_path / "v" / "friendsmmc_part000.tar", {name: ten_frames})
    clip = decode_clip(ClipStore(tmp_path / "v").open(name), where=name)
    assert clip.frames.shape == (4, 32, 32, 3)
    assert not any(type(v).__name__ == "VideoReader" for v in vars(video).values())


def test_sizes_decord_cannot_scale_to_fall_back_to_resizing_after_decoding():
    """decord's scaler rejects some sizes (width 48 for a 16:9 source); the frames still come back
    at the requested size, close to the decoder-scaled frames of a neighbouring size."""

    from grasp_lightning.data.video import decode_clip

    data = open(SAMPLE / "train/videos/social-iq_part000.tar", "rb").read()
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("kitchen.two_person_qa0000.mp4"))
        clip_bytes = tar.extractfile(member).read()
    odd = decode_clip(clip_bytes, max_pixels=48 * 28)       # 26 x 48: decord refuses, fallback resizes
    near = decode_clip(clip_bytes, max_pixels=46 * 26)      # 24 x 46: decord scales itself
    assert odd.frames.shape == (7, 26, 48, 3) and near.frames.shape == (7, 24, 46, 3)
    assert abs(float(odd.frames.mean()) - float(near.frames.mean())) < 3.0
    assert odd.indices.tolist() == near.indices.tolist()


def test_even_spread_is_the_released_reader():
    # distribute_frames (socialmllm/utils/input_processing.py:126-151): about 2 per second, even, at least 2, at
    # most 512; the rate approaches 2 from below, so a 5.5 s clip gives round(5.49.. ) * 2 = 10 and 5.0 s gives 10
    assert [video.even_frame_count(d) for d in (5.5, 5.0, 0.4, 3.0, 300.0, 1000.0)] == [10, 10, 2, 6, 512, 512]
    assert video.even_frame_count(7.0, fps=1.0) == 6  # 7 s at a rate just below 1: round(3.4999..) * 2
    # the indices: np.linspace(round(start * fps), round(end * fps) - 1, T) truncated (:103-109)
    assert video.even_indices(110, 20.0, start_seconds=0.0, end_seconds=5.5).tolist() == [
        0, 12, 24, 36, 48, 60, 72, 84, 96, 109]
    assert video.even_indices(50, 10.0, start_seconds=1.0, end_seconds=3.0).tolist() == [10, 16, 22, 29]
    ours = sample_indices(110, 20.0, end_seconds=5.5)  # ours: 2 fps by timestamp, 11 frames 10 apart
    assert ours.tolist() == list(range(0, 110, 10))


def test_decode_clip_even_sampling(ten_frames):
    # 10 frames at 5 fps (2 s): even gives round(1.999..) * 2 = 4 frames over 0..9
    clip = decode_clip(ten_frames, sampling="even", max_pixels=None)
    assert clip.indices.tolist() == [0, 3, 6, 9] and clip.timestamps.tolist() == [0.0, 0.6, 1.2, 1.8]
