"""Builders of tiny GRASP data: mp4 clips (PyAV), tar shards, JSONL rows, bench items, QA datasets.

Rows follow ``docs/data-format.md`` exactly. Each synthetic frame ``i`` is a flat grey of level
:func:`frame_level` so a test can tell which source frame was decoded.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4


def frame_level(i: int) -> int:
    """Grey level (0-255) painted into synthetic frame ``i``."""
    return 16 + (20 * i) % 220


def level_to_index(level: float, n_frames: int) -> int:
    """The frame index whose grey level is nearest ``level`` (inverse of :func:`frame_level`)."""
    return int(np.argmin([abs(frame_level(i) - level) for i in range(n_frames)]))


def make_mp4(n_frames: int = 10, fps: int = 5, width: int = 32, height: int = 32, codec: str = "libx264",
             faststart: bool = False, noise: bool = False) -> bytes:
    """Encode ``n_frames`` flat grey frames (random ones if ``noise``) at ``fps`` into mp4 bytes (moov at
    the end unless ``faststart``); libx264 runs with preset ultrafast, crf 10."""
    x264 = {"preset": "ultrafast", "crf": 10} if codec == "libx264" else {}
    settings = Mp4Settings(codec=codec, fallback=None, faststart=faststart, **x264)

    def frames():
        for i in range(n_frames):
            if noise:
                yield np.random.default_rng(i).integers(0, 256, (height, width, 3), dtype=np.uint8)
            else:
                yield np.full((height, width, 3), frame_level(i), np.uint8)

    with tempfile.TemporaryDirectory() as tmp:
        return encode_mp4(frames(), fps, settings, out=Path(tmp) / "clip.mp4", size=(height, width)).read_bytes()


def make_tar(path: Path, members: dict[str, bytes], *, symlinks: dict[str, str] | None = None,
             hardlinks: dict[str, str] | None = None, fifos: tuple[str, ...] = ()) -> Path:
    """Write an uncompressed tar holding ``members`` (names written verbatim, even ``../x`` or ``/x``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            tf.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks or {}), (tarfile.LNKTYPE, hardlinks or {})):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tf.addfile(info)
        for name in fifos:
            info = tarfile.TarInfo(name)
            info.type = tarfile.FIFOTYPE
            tf.addfile(info)
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """One JSON value per line; a ``str`` row is written verbatim (for malformed lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


OPTIONS = ["A) Person 0", "B) Person 2", "C) Person 4", "D) No one"]


def annotation_row(**over: Any) -> dict:
    """An MCQ line of ``annotations.jsonl``."""
    row = {"id": "sg_0001", "video": "social_gesture/video/153_1_001_qa0000.mp4", "source": "social_gesture",
           "category": "T5", "difficulty": "hard", "format": "mcq",
           "question": "Between 1.5s and 3.5s, whose gaze does Person 3 follow?", "options": list(OPTIONS),
           "answer": "A", "response": None}
    row.update(over)
    return row


def rl_row(answer: str = "B", *, video: str = "social_gesture/video/153_1_001_qa0000.mp4",
           meta: dict | None = None, options: list[str] | None = None) -> list[dict]:
    """A ``data_rl.jsonl`` line: specs in a deliberately non-canonical order."""
    question = "Who does Person 1 point at?"
    user = "\n".join([question, *(OPTIONS if options is None else options),
                      "Think step by step about the gaze and gesture interactions."])
    meta = meta if meta is not None else {
        "type": "meta", "difficulty": "easy", "question_text": question, "extra_key": 1,
        "gt_events": [{"source": "gaze", "persons": [0, 3]}, {"source": "pointing", "persons": [1, 2]}]}
    return [
        {"type": "text", "content": answer, "output": True},
        meta,
        {"type": "video", "path": video, "fps": 2.0, "start_seconds": 0.0, "end_seconds": 5.5,
         "src_resolution": [360, 640]},
        {"type": "text", "content": user, "output": False},
    ]


def sft_row(response: str = "<think> <gaze>P0 looks at P2</gaze> </think><answer>B</answer>",
            with_options: bool = True) -> list[dict]:
    """A ``data_sft.jsonl`` line: video, user text, assistant target."""
    user = "Describe how Person 0 responds to the gesture." + ("\n" + "\n".join(OPTIONS) if with_options else "")
    return [{"type": "video", "path": "werewolf/video/ep1.s2_qa0003.mp4", "fps": 2.0},
            {"type": "text", "content": user, "output": False},
            {"type": "text", "content": response, "output": True}]


def bench_json(clip: str, **qa_over: Any) -> dict:
    """A GRASP-Bench ``json/<clip>.json`` object."""
    video_name = clip.rsplit("_qa", 1)[0]
    qa = {"category": "C3", "difficulty": "hard", "format": "mcq", "dataset": "social_gesture",
          "video_id": video_name, "question": "Between 1.5s and 3.5s, whose gaze does Person 3 follow?",
          "options": list(OPTIONS), "answer": "A", "answer_text": "Person 0", "reasoning": "<think> ... </think>",
          "source_event_ids": [2000], "time_range": [1.5, 3.5]}
    qa.update(qa_over)
    return {"video_name": video_name, "clip_file": f"{clip}.mp4", "clip_offset": 5.5, "clip_duration": 5.5, "qa": qa}


def bench_members(clips: dict[str, bytes], prefix: str = "", jsons: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Tar members of a bench: ``<prefix>json/<clip>.json`` and ``<prefix>video/<clip>.mp4``."""
    members: dict[str, bytes] = {}
    for clip, video in clips.items():
        obj = (jsons or {}).get(clip, bench_json(clip))
        members[f"{prefix}json/{clip}.json"] = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        members[f"{prefix}video/{clip}.mp4"] = video
    return members


def make_image(height: int = 40, width: int = 56, seed: int = 0, fmt: str = "PNG") -> bytes:
    """A random RGB image of ``height`` × ``width`` pixels, encoded as ``fmt`` (PIL)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


QA_ANSWER = "<think> <gaze>Person 0 looks at Person 1</gaze> </think><answer>B</answer>"


def qa_row(**over: Any) -> dict:
    """A generic QA line (``docs/data-format.md``): an image, an MCQ, an SFT response and participants."""
    row = {"id": "qa_0001", "image": "media/img0.png", "question": "Whom does Person 0 look at?",
           "options": ["Person 0", "Person 1", "Person 2", "No one"], "answer": "B", "response": QA_ANSWER,
           "participants": [0, 1], "category": "gaze"}
    row.update(over)
    return row


def make_qa_dataset(folder: Path, *, name: str = "qa.jsonl", rows: list[Any] | None = None) -> Path:
    """A generic QA file under ``folder`` with its media: ``media/img0.png``, ``media/img1.png`` (different
    sizes) and ``media/clip.mp4`` (8 noisy frames at 4 fps, 32 × 32); default rows alternate image,
    video, image and image + video, two categories. Returns the JSONL path."""
    media = folder / "media"
    media.mkdir(parents=True, exist_ok=True)
    (media / "img0.png").write_bytes(make_image(40, 56, seed=0))
    (media / "img1.png").write_bytes(make_image(48, 32, seed=1))
    (media / "clip.mp4").write_bytes(make_mp4(n_frames=8, fps=4, noise=True))
    if rows is None:
        rows = [qa_row(),
                qa_row(id="qa_0002", image=None, video="media/clip.mp4", answer="A", category="gesture",
                       response=QA_ANSWER.replace(">B<", ">A<"), end=1.5),
                qa_row(id="qa_0003", image="media/img1.png", answer="C", response=QA_ANSWER.replace(">B<", ">C<")),
                qa_row(id="qa_0004", video="media/clip.mp4", answer="D", category="gesture",
                       response=QA_ANSWER.replace(">B<", ">D<"))]
    return write_jsonl(folder / name, rows)
