"""Writing the sample data: rows, annotations, bench json, tar shards, README; :func:`generate_sample`.

The output follows ``docs/data-format.md`` file by file (train annotations, SFT and RL rows, tar
shards, GRASP-Bench tar with 2 items per category). Synthetic clips are drawn by :mod:`.drawing`
from the questions of :mod:`.questions`; one real clip (``kitchen_two_person.mp4``, attribution in
:data:`REAL_CLIP_ATTRIBUTION`) is copied byte for byte into the train shards and the bench.

Given the seed, the JSON files, the tar layout (member order, mtimes, owners) and, with the same
libx264 build, the mp4 bytes are identical run to run (:data:`grasp_lightning.synthetic.mp4.STABLE`).
"""

from __future__ import annotations

import io
import json
import logging
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from grasp_lightning.data.prompts import INSTRUCTION
from grasp_lightning.data.records import CATEGORIES, CATEGORY_DIFFICULTY
from grasp_lightning.errors import GraspDataError
from grasp_lightning.synthetic.mp4 import encode_mp4
from grasp_lightning.synthetic.sample.drawing import FPS, HEIGHT, WIDTH, make_scene, render_clip
from grasp_lightning.synthetic.sample.entries import Clip, Entry, make_entry, user_text
from grasp_lightning.synthetic.sample.questions import OPEN_ENDED_CATEGORIES, TEMPLATES, Question, real_questions

log = logging.getLogger(__name__)

ROW_FPS = 2.0  #: frame rate written into the row video specs (frames per second the loader decodes)
SOURCES = ("social_gesture", "werewolf", "embody3d")  #: sources of the synthetic clips
REAL_SOURCE, REAL_VIDEO_ID, REAL_RESOLUTION = "social-iq", "kitchen.two_person", (360, 640)
ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "sample"  #: the shipped copy
TAR_MTIME = 1735689600  #: fixed member mtime (2025-01-01 UTC) for byte-stable tars
REAL_CLIP_ATTRIBUTION = """\
# Real two-person clip

`kitchen_two_person.mp4`: 101 consecutive frames (3.37 s at 30 fps, 640x360, H.264) of two people
at a kitchen counter: the person on the left (Person 0, grey t-shirt) talks and gestures with open
hands; the person on the right (Person 1, blue shirt) looks down at an avocado he is handling.
The camera slowly pans. No person ID boxes are drawn in.

Source: the demo frames `data/demo/frames/00002575.jpg` … `00002675.jpg` of the public repository
ejcgt/attention-target-detection (MIT License, Copyright (c) 2021 ejcgt), which come from the
VideoAttentionTarget dataset (Chong et al., "Detecting Attended Visual Targets in Video", CVPR 2020).
The same repository gives per-frame head boxes, in 1920x1080 pixels (x1, y1, x2, y2):
Person 0 around (553, 71, 752, 275), Person 1 around (1093, 33, 1347, 299).
Frames were resized to 640x360 and encoded with libx264 (crf 23). Keep this attribution wherever
the clip is copied.
"""


# ---------------------------------------------------------------------------------------- plans
#: (category, format) of the SFT rows; the real clip adds one T1 row (24 in all).
SFT_PLAN = ([(c, "mcq") for c in CATEGORIES] + [(c, "open_ended") for c in OPEN_ENDED_CATEGORIES]
            + [("T4", "mcq"), ("G2", "mcq"), ("J1", "mcq")])
#: categories of the RL rows (all MCQ); the real clip adds one G1 row (24 in all).
RL_PLAN = list(CATEGORIES) + ["T2", "T3", "T5", "G3", "G4", "J2", "G6"]


def balanced_positions(rng: random.Random) -> Iterator[int]:
    """Answer positions 0-3, each block of four a random permutation, so answer letters are balanced."""
    while True:
        block = [0, 1, 2, 3]
        rng.shuffle(block)
        yield from block


def _video_id(source: str, k: int) -> str:
    """The ``k``-th synthetic video id of a source (werewolf ids contain a dot)."""
    return {"social_gesture": f"{150 + k}_1_{k % 5 + 1:03d}", "werewolf": f"game{k:02d}.round{k % 3 + 1}",
            "embody3d": f"sess_{k:02d}_cam1"}[source]


class _Builder:
    """Makes synthetic clips two questions per video, cycling through :data:`SOURCES`."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.videos = 0
        self.per_source = {s: 0 for s in SOURCES}

    def _new_video(self) -> tuple[str, str]:
        source = SOURCES[self.videos % len(SOURCES)]
        self.videos += 1
        k = self.per_source[source]
        self.per_source[source] += 1
        return source, _video_id(source, k)

    def clips(self, categories: Sequence[str]) -> list[tuple[Clip, Question]]:
        """Render one clip per category, two consecutive categories sharing a video and its scene."""
        out = []
        for i in range(0, len(categories), 2):
            pair = categories[i:i + 2]
            source, video_id = self._new_video()
            rng = random.Random(f"{self.seed}:scene:{video_id}")
            n = rng.choice(range(max(TEMPLATES[c][1] for c in pair), 5))
            scene = make_scene(rng, n)
            for j, cat in enumerate(pair):
                qrng = random.Random(f"{self.seed}:{video_id}:{j}")
                duration = qrng.choice([4.0, 5.0, 6.0])
                q = TEMPLATES[cat][0](qrng, n, duration)
                data = encode_mp4(render_clip(scene, q.actions, duration), FPS)
                out.append((Clip(source, video_id, j, duration, (HEIGHT, WIDTH), data, n), q))
        return out


def load_real_clip(path: str | Path | None = None) -> bytes:
    """Bytes of the real kitchen clip: from ``path``, else from the shipped sample's social-iq shard.

    Raises:
        GraspDataError: the file or the shipped shard member is missing.
    """
    if path is not None:
        if not Path(path).is_file():
            raise GraspDataError(str(path), "real clip not found")
        return Path(path).read_bytes()
    shard = ASSETS_DIR / "train" / "videos" / f"{REAL_SOURCE}_part000.tar"
    member = f"{REAL_SOURCE}/video/{REAL_VIDEO_ID}_qa0000.mp4"
    try:
        with tarfile.open(shard) as tar:
            return tar.extractfile(member).read()
    except (OSError, KeyError, AttributeError, tarfile.TarError) as err:
        raise GraspDataError(f"{shard}:{member}", f"shipped real clip unreadable ({err}); pass --real-clip PATH") from err


def clip_duration(data: bytes) -> float:
    """Duration in seconds of an mp4 (its container duration), floored to 0.01 s."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        seconds = float(stream.duration * stream.time_base) if stream.duration else container.duration / 1e6
    return int(seconds * 100) / 100


# ---------------------------------------------------------------------------------------- rows
def video_spec(clip: Clip) -> dict:
    """The row's video spec: path under the extracted videos root, 2 fps, whole clip, ``[H, W]``."""
    return {"type": "video", "path": clip.train_path, "fps": ROW_FPS, "start_seconds": 0.0,
            "end_seconds": clip.duration, "src_resolution": list(clip.resolution)}


def event_json(event: tuple) -> dict:
    """An event of ``meta.gt_events`` / ``qa.events``: ``(source, persons)`` gives ``{"source", "persons"}``;
    ``(source, persons, (start, end))`` adds the event's time span as ``start_seconds`` / ``end_seconds``
    (seconds from the clip start, read into :attr:`grasp_lightning.data.records.SocialEvent.span`)."""
    out = {"source": event[0], "persons": list(event[1])}
    if len(event) > 2 and event[2] is not None:
        out["start_seconds"], out["end_seconds"] = float(event[2][0]), float(event[2][1])
    return out


def _maybe_shuffle(rng: random.Random, specs: list[dict]) -> list[dict]:
    """Rotate the spec order in about one row in five (the format allows any order)."""
    return specs[1:] + specs[:1] if rng.random() < 0.2 else specs


def sft_row(rng: random.Random, e: Entry, instruction: str = INSTRUCTION) -> list[dict]:
    """A data_sft.jsonl row: video spec, user text (ending with ``instruction``), assistant reasoning + answer,
    and a meta spec with the category's difficulty (what the SFT curriculum orders by, ``data.loader.curriculum``)."""
    meta = {"type": "meta", "difficulty": CATEGORY_DIFFICULTY[e.question.category]}
    return _maybe_shuffle(rng, [video_spec(e.clip), {"type": "text", "content": user_text(e, instruction), "output": False},
                                {"type": "text", "content": e.response, "output": True}, meta])


def rl_row(rng: random.Random, e: Entry, k: int, instruction: str = INSTRUCTION) -> list[dict]:
    """A data_rl.jsonl row: video spec, user text (ending with ``instruction``), target letter, meta with
    ground-truth events."""
    meta = {"type": "meta", "difficulty": CATEGORY_DIFFICULTY[e.question.category], "question_text": e.question.text,
            "gt_events": [event_json(ev) for ev in e.question.events]}
    if k % 3 == 2:
        meta["category"] = e.question.category  # an extra key: readers must ignore unknown keys
    return _maybe_shuffle(rng, [video_spec(e.clip), {"type": "text", "content": user_text(e, instruction),
                                                      "output": False},
                                {"type": "text", "content": e.letter, "output": True}, meta])


def _bench_category(category: str) -> str:
    """The bench writes ``C1``..``C4`` for the joint categories."""
    return "C" + category[1] if category[0] == "J" else category


def annotation(e: Entry, k: int, bench: bool = False) -> dict:
    """An annotations.jsonl line; open-ended options alternate between ``null`` and ``[]`` (both occur)."""
    options: list[str] | None = list(e.options) if e.fmt == "mcq" else ([] if k % 2 else None)
    return {"id": e.clip.name[:-4], "video": f"video/{e.clip.name}" if bench else e.clip.train_path,
            "source": e.clip.source, "category": _bench_category(e.question.category) if bench else e.question.category,
            "difficulty": CATEGORY_DIFFICULTY[e.question.category], "format": e.fmt, "question": e.question.text,
            "options": options, "answer": e.answer, "response": None if bench else e.response}


def bench_json(e: Entry, k: int, events_every: int = 4) -> dict:
    """A GRASP-Bench ``json/<clip>.json``; every ``events_every``-th item also carries its ``events``."""
    q = e.question
    qa = {"category": _bench_category(q.category), "difficulty": CATEGORY_DIFFICULTY[q.category], "format": e.fmt,
          "dataset": e.clip.source, "video_id": e.clip.video_id, "question": q.text, "options": list(e.options),
          "answer": e.letter, "answer_text": q.answer_text, "reasoning": e.reasoning,
          "source_event_ids": [2000 + 10 * k + j for j in range(len(q.events))], "time_range": list(q.time_range)}
    if k % events_every == 0:
        qa["events"] = [event_json(ev) for ev in q.events]
    return {"video_name": e.clip.video_id, "clip_file": e.clip.name, "clip_offset": round(e.clip.index * 6.5, 1),
            "clip_duration": e.clip.duration, "qa": qa}


# --------------------------------------------------------------------------------------- writing
def _json(obj: object) -> str:
    """Compact, key-order-preserving JSON (UTF-8 text kept as is)."""
    return json.dumps(obj, ensure_ascii=False)


def write_jsonl(path: Path, rows: Sequence[object]) -> None:
    """Write one JSON value per line, ``\\n``-terminated."""
    path.write_text("".join(_json(r) + "\n" for r in rows), encoding="utf-8")


def _tar_info(name: str, size: int = 0, directory: bool = False) -> tarfile.TarInfo:
    """A member header with fixed mtime, owner and mode, so archives are byte-stable."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = size, TAR_MTIME, 0, 0, "", ""
    info.type, info.mode = (tarfile.DIRTYPE, 0o755) if directory else (tarfile.REGTYPE, 0o644)
    return info


def write_tar(path: Path, members: Sequence[tuple[str, bytes]], dirs: Sequence[str] = ()) -> None:
    """Write a ustar archive: directory entries ``dirs`` first, then ``(name, bytes)`` members in order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for d in dirs:
            tar.addfile(_tar_info(d.rstrip("/") + "/", directory=True))
        for name, data in members:
            tar.addfile(_tar_info(name, len(data)), io.BytesIO(data))


def write_shards(videos_dir: Path, clips: Sequence[Clip], clips_per_shard: int) -> list[Path]:
    """Write ``<source>_partNNN.tar`` shards (clips sorted by path, ``clips_per_shard`` each); remove stale ones."""
    videos_dir.mkdir(parents=True, exist_ok=True)
    for stale in videos_dir.glob("*_part[0-9][0-9][0-9].tar"):
        stale.unlink()
    paths = []
    for source in sorted({c.source for c in clips}):
        group = sorted((c for c in clips if c.source == source), key=lambda c: c.train_path)
        for part, i in enumerate(range(0, len(group), clips_per_shard)):
            path = videos_dir / f"{source}_part{part:03d}.tar"
            write_tar(path, [(c.train_path, c.data) for c in group[i:i + clips_per_shard]],
                      dirs=(f"{source}/", f"{source}/video/"))
            paths.append(path)
    return paths


def write_bench(path: Path, entries: Sequence[Entry], events_every: int = 4) -> None:
    """Write ``grasp_bench.tar``: per clip (sorted by name) ``json/<clip>.json`` then ``video/<clip>.mp4``
    (``events_every``: see :func:`bench_json`; 1 gives every item its events)."""
    members: list[tuple[str, bytes]] = []
    for k, e in sorted(enumerate(entries), key=lambda ke: ke[1].clip.name):
        stem = e.clip.name[:-4]
        text = json.dumps(bench_json(e, k, events_every), ensure_ascii=False, indent=2) + "\n"
        members.append((f"json/{stem}.json", text.encode()))
        members.append((f"video/{e.clip.name}", e.clip.data))
    write_tar(path, members)


@dataclass(frozen=True)
class SampleSummary:
    """What :func:`generate_sample` wrote.

    Attributes:
        out_dir: the output root.
        files: every written file, relative to ``out_dir``, sorted.
        n_sft: SFT rows; n_rl: RL rows; n_bench: bench items.
        bench: bench clip names per canonical category (``T1``..``J4``).
    """

    out_dir: Path
    files: tuple[str, ...]
    n_sft: int
    n_rl: int
    n_bench: int
    bench: dict[str, tuple[str, ...]]


def _readme(seed: int, sft: Sequence[Entry], rl: Sequence[Entry], bench: Sequence[Entry], shards: Sequence[Path]) -> str:
    """The sample's README.md: what it is, how it was made, the real clip's attribution (verbatim)."""
    per_cat = "\n".join(f"| {c} | {CATEGORY_DIFFICULTY[c]} | " + ", ".join(f"`{e.clip.name}`" for e in bench
                                                                         if e.question.category == c) + " |"
                        for c in CATEGORIES)
    shard_list = "\n".join(f"  - `{p.name}`" for p in shards)
    return f"""# GRASP-format sample data (seed {seed})

A small dataset in the exact file layout of GRASP (`interlive/GRASP`; schemas in
`docs/data-format.md`), made by `python -m grasp_lightning.synthetic.sample_data OUT_DIR --seed {seed}`
(module `grasp_lightning/synthetic/sample_data.py`). It exists so that readers, training and GRASP-Bench
evaluation can run offline; it is not GRASP data.

- `train/data_sft.jsonl`: {len(sft)} SFT rows (MCQ, and open-ended rows for {", ".join(OPEN_ENDED_CATEGORIES)}).
- `train/data_rl.jsonl`: {len(rl)} RL rows (MCQ, target letter, `meta` with `gt_events`); a few rows
  list their specs in another order, a few carry an extra `meta` key.
- `train/annotations.jsonl`: all {len(sft) + len(rl)} training QA (SFT first, then RL); open-ended
  options are written as `null` or `[]` (both occur).
- `train/videos/`: {len(shards)} shards, each extracting to `<source>/video/<video_id>_qa<NNNN>.mp4`
  (`werewolf` and `social-iq` video ids contain dots):
{shard_list}
- `test/grasp_bench.tar`: {len(bench)} items, 2 per category, `json/<clip>.json` + `video/<clip>.mp4`;
  joint categories are written `C1`-`C4`; every fourth item carries `qa.events`.
- `test/annotations.jsonl`: the bench QA, one per line (`video` is `video/<clip>.mp4`).

Synthetic clips: {WIDTH}x{HEIGHT} pixels, 4-6 s at {FPS:g} fps, H.264 (libx264, yuv420p). Each person is
a coloured square inside an id box with its number (Person 0 red, 1 green, 2 blue, 3 yellow); the
grey square at the bottom is "an object". A gaze is a line in the gazer's colour whose white dot
travels to the target and stays inside the target square; pointing is a short white bar, reaching a
long one, showing an orange object held above the person, giving an orange object travelling to the
receiver. Questions, options, answers, reasoning and events are derived from the drawn actions.
The JSON and tar structure are byte-identical for a given seed; the mp4 bytes are identical for a
given libx264 build.

## Bench items per category

| category | difficulty | clips |
|---|---|---|
{per_cat}

## Real clip

`social-iq/video/{REAL_VIDEO_ID}_qa0000.mp4` (SFT, T1), `..._qa0001.mp4` (RL, G1) and
`video/{REAL_VIDEO_ID}_qa0002.mp4` (bench, T1) are byte copies of the clip described below. Its
attribution, copied verbatim from the clip's own README:

{REAL_CLIP_ATTRIBUTION}"""


def _real_clip(data: bytes, index: int) -> Clip:
    return Clip(REAL_SOURCE, REAL_VIDEO_ID, index, clip_duration(data), REAL_RESOLUTION, data, 2)


def generate_sample(out_dir: str | Path, seed: int = 0, real_clip: str | Path | None = None,
                    clips_per_shard: int = 8) -> SampleSummary:
    """Generate the GRASP-format sample dataset under ``out_dir`` (deterministic for a given ``seed``).

    Args:
        out_dir: output root; ``train/`` and ``test/`` are created, existing files overwritten.
        seed: seed of every random choice (layouts, events, options, clip durations).
        real_clip: path of ``kitchen_two_person.mp4``; ``None`` takes it from the shipped sample.
        clips_per_shard: clips per train tar shard.

    Returns:
        A :class:`SampleSummary` of what was written.

    Raises:
        GraspDataError: the real clip cannot be found.
    """
    out = Path(out_dir)
    real = load_real_clip(real_clip)
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "test").mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}:entries")
    builder = _Builder(seed)
    real_q = real_questions()
    pos = balanced_positions(random.Random(f"{seed}:positions"))
    sft = [make_entry(rng, real_q["T1"], _real_clip(real, 0), "mcq")]
    sft += [make_entry(rng, q, c, fmt, position=next(pos))
            for (c, q), (_, fmt) in zip(builder.clips([p[0] for p in SFT_PLAN]), SFT_PLAN)]
    rl = [make_entry(rng, real_q["G1"], _real_clip(real, 1), "mcq")]
    rl += [make_entry(rng, q, c, "mcq", position=next(pos)) for c, q in builder.clips(RL_PLAN)]
    bench_cats = [c for c in CATEGORIES for _ in range(2)]
    bench_cats.remove("T1")
    bench = [make_entry(rng, real_q["T1"], _real_clip(real, 2), "mcq")]
    bench += [make_entry(rng, q, c, "mcq", short=k % 2 == 1, position=next(pos))
              for k, (c, q) in enumerate(builder.clips(bench_cats))]
    bench.sort(key=lambda e: CATEGORIES.index(e.question.category))
    write_jsonl(out / "train" / "data_sft.jsonl", [sft_row(rng, e) for e in sft])
    write_jsonl(out / "train" / "data_rl.jsonl", [rl_row(rng, e, k) for k, e in enumerate(rl)])
    write_jsonl(out / "train" / "annotations.jsonl", [annotation(e, k) for k, e in enumerate(sft + rl)])
    shards = write_shards(out / "train" / "videos", [e.clip for e in sft + rl], clips_per_shard)
    write_jsonl(out / "test" / "annotations.jsonl", [annotation(e, k, bench=True) for k, e in enumerate(bench)])
    write_bench(out / "test" / "grasp_bench.tar", bench)
    (out / "README.md").write_text(_readme(seed, sft, rl, bench, shards), encoding="utf-8")
    files = tuple(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
    per_cat = {c: tuple(e.clip.name for e in bench if e.question.category == c) for c in CATEGORIES}
    log.info("wrote GRASP sample to %s: %d SFT rows, %d RL rows, %d shards, %d bench items",
             out, len(sft), len(rl), len(shards), len(bench))
    return SampleSummary(out, files, len(sft), len(rl), len(bench), per_cat)

