"""Tests of the sample data generator (:mod:`grasp_lightning.synthetic.sample`): every generated file against ``docs/data-format.md``,
answers against the drawn actions, byte-determinism, and the shipped copy in ``assets/sample``."""

from __future__ import annotations

import collections
import io
import json
import random
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest

from grasp_lightning.data.prompts import INSTRUCTION
from grasp_lightning.data.records import CATEGORIES, CATEGORY_DIFFICULTY, DIFFICULTIES, normalise_category
from grasp_lightning.synthetic import sample_data
from grasp_lightning.synthetic.sample import drawing, questions, writer
from tests.helpers import REPO

pytestmark = pytest.mark.timeout(120)

REAL_CLIP = REPO.parent / "shared/data/real/kitchen_two_person.mp4"  # used when present, else the shipped copy
SOURCES = {"avsbench", "embody3d", "friendsmmc", "social_gesture", "social-iq", "tvqa", "werewolf"}
CLIP_RE = re.compile(r"^(?P<video>.+)_qa(?P<n>\d{4})\.mp4$")
SHARD_RE = re.compile(r"^(?P<source>.+)_part(?P<n>\d{3})\.tar$")
OPEN_CATEGORIES = {"T6", "G5", "J3", "J4"}
ANNOTATION_KEYS = {"id", "video", "source", "category", "difficulty", "format", "question", "options", "answer",
                   "response"}
VIDEO_KEYS = {"type", "path", "fps", "start_seconds", "end_seconds", "src_resolution"}
RESPONSE_RE = re.compile(r"^<think>.*<gaze>.+</gaze>.*<gesture>.+</gesture>.*</think><answer>(?P<answer>.+)</answer>$",
                         re.S)


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh generation with seed 0."""
    root = tmp_path_factory.mktemp("sample")
    writer.generate_sample(root, seed=0, real_clip=REAL_CLIP if REAL_CLIP.is_file() else None)
    return root


def _jsonl(path: Path) -> list:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines and all(line.strip() for line in lines), f"{path}: empty file or blank line"
    return [json.loads(line) for line in lines]


def _tar(path: Path) -> dict[str, bytes | None]:
    """Members in archive order: name -> bytes (``None`` for directories)."""
    with tarfile.open(path) as tar:
        return {m.name: (tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()}


def _shard_index(root: Path) -> dict[str, str]:
    """Clip member path -> shard name, over all train shards."""
    index: dict[str, str] = {}
    for shard in sorted((root / "train" / "videos").glob("*.tar")):
        for name, data in _tar(shard).items():
            if data is not None:
                assert name not in index, f"{name} in both {index.get(name)} and {shard.name}"
                index[name] = shard.name
    return index


def _specs(row: list) -> tuple[dict, str, str, dict | None]:
    """(video spec, user text, target text, meta) of an SFT/RL row; asserts the spec schema."""
    assert isinstance(row, list) and all(isinstance(s, dict) for s in row)
    videos = [s for s in row if s["type"] == "video"]
    users = [s["content"] for s in row if s["type"] == "text" and s["output"] is False]
    targets = [s["content"] for s in row if s["type"] == "text" and s["output"] is True]
    metas = [s for s in row if s["type"] == "meta"]
    assert len(videos) == 1 and len(users) == 1 and len(targets) == 1 and len(metas) <= 1, row
    assert {s["type"] for s in row} <= {"video", "text", "meta"}
    video = videos[0]
    assert set(video) == VIDEO_KEYS
    assert video["fps"] == 2.0 and video["start_seconds"] == 0.0 and 0.0 < video["end_seconds"] <= 6.0
    assert isinstance(video["src_resolution"], list) and len(video["src_resolution"]) == 2
    assert all(isinstance(v, int) and v > 0 for v in video["src_resolution"])
    return video, users[0], targets[0], (metas[0] if metas else None)


def _options_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^[A-D]\) \S", line)]


def _check_options(options: list[str], letter: str) -> str:
    """Exactly 4 options ``A) ..`` .. ``D) ..``; returns the answer's option text."""
    assert [o[:3] for o in options] == ["A) ", "B) ", "C) ", "D) "], options
    assert len(set(options)) == 4 and letter in "ABCD" and len(letter) == 1
    return options["ABCD".index(letter)][3:]


def _conclusion(response: str) -> str:
    return re.search(r"So the answer is (.+?)\.</think>", response).group(1)


# ------------------------------------------------------------------------------------ layout
def test_layout_and_shards(out: Path) -> None:
    for rel in ("README.md", "train/annotations.jsonl", "train/data_sft.jsonl", "train/data_rl.jsonl",
                "test/annotations.jsonl", "test/grasp_bench.tar"):
        assert (out / rel).is_file(), rel
    shards = sorted((out / "train" / "videos").glob("*.tar"))
    sources = {SHARD_RE.match(s.name).group("source") for s in shards}
    assert len(shards) >= 2 and len(sources) >= 2 and sources <= SOURCES
    assert sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) < 3_000_000
    for shard in shards:
        source = SHARD_RE.match(shard.name).group("source")
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                assert m.mtime == writer.TAR_MTIME and m.uid == 0 and m.gid == 0 and (m.isfile() or m.isdir())
                if m.isfile():
                    parts = m.name.split("/")
                    assert parts[:2] == [source, "video"] and len(parts) == 3 and CLIP_RE.match(parts[2]), m.name
    assert any("." in CLIP_RE.match(Path(p).name).group("video") for p in _shard_index(out)), "no dotted video id"
    readme = (out / "README.md").read_text(encoding="utf-8")
    assert writer.REAL_CLIP_ATTRIBUTION in readme
    shared_readme = REAL_CLIP.parent / "README.md"
    if shared_readme.is_file():
        assert shared_readme.read_text(encoding="utf-8") == writer.REAL_CLIP_ATTRIBUTION


# ------------------------------------------------------------------------------------ train files
def test_train_annotations(out: Path) -> None:
    rows = _jsonl(out / "train" / "annotations.jsonl")
    index = _shard_index(out)
    assert len(rows) == 48 and len({r["id"] for r in rows}) == 48
    assert set(index) == {r["video"] for r in rows}, "annotations and shards list different clips"
    open_options = []
    for r in rows:
        assert set(r) == ANNOTATION_KEYS, r["id"]
        assert r["category"] in CATEGORIES and r["difficulty"] == CATEGORY_DIFFICULTY[r["category"]]
        assert r["video"].split("/")[0] == r["source"] and r["id"] + ".mp4" == Path(r["video"]).name
        assert isinstance(r["response"], str) and RESPONSE_RE.match(r["response"])
        if r["format"] == "mcq":
            text = _check_options(r["options"], r["answer"])
            assert _conclusion(r["response"]) == text
        else:
            assert r["format"] == "open_ended" and r["category"] in OPEN_CATEGORIES
            open_options.append(r["options"])
            assert 2 <= r["answer"].count(". ") + 1 <= 4 and r["answer"].endswith(".")
    assert None in open_options and [] in open_options
    letters = collections.Counter(r["answer"] for r in rows if r["format"] == "mcq")
    assert set(letters) == set("ABCD") and max(letters.values()) - min(letters.values()) <= 4, letters
    assert {r["category"] for r in rows} == set(CATEGORIES)


def test_sft_rows(out: Path) -> None:
    rows = _jsonl(out / "train" / "data_sft.jsonl")
    notes = _jsonl(out / "train" / "annotations.jsonl")[: len(rows)]
    assert len(rows) == 24
    assert any(row[0]["type"] != "video" for row in rows), "no row with another spec order"
    for row, note in zip(rows, notes):
        video, user, target, meta = _specs(row)
        assert meta == {"type": "meta", "difficulty": note["difficulty"]}  # the SFT curriculum's key
        assert video["path"] == note["video"] and target == note["response"]
        assert user.startswith(note["question"] + "\n") and "<gaze>" in user and "<answer>" in user
        answer = RESPONSE_RE.match(target).group("answer")
        if note["format"] == "mcq":
            assert _options_in(user) == note["options"] and answer == note["answer"]
            assert user.endswith(INSTRUCTION)
        else:
            assert _options_in(user) == [] and answer == note["answer"]
    assert sum(n["format"] == "open_ended" for n in notes) == 4


def test_rl_rows(out: Path) -> None:
    rows = _jsonl(out / "train" / "data_rl.jsonl")
    notes = _jsonl(out / "train" / "annotations.jsonl")[24:]
    assert len(rows) == 24
    assert any([s["type"] for s in row] != ["video", "text", "text", "meta"] for row in rows)
    for row, note in zip(rows, notes):
        video, user, target, meta = _specs(row)
        assert video["path"] == note["video"] and target == note["answer"] and note["format"] == "mcq"
        _check_options(_options_in(user), target)
        assert _options_in(user) == note["options"]
        assert {"type", "difficulty", "question_text", "gt_events"} <= set(meta) <= {"type", "difficulty", "question_text",
                                                                                    "gt_events", "category"}
        assert meta["difficulty"] == note["difficulty"] and meta["question_text"] == note["question"]
        assert meta["gt_events"], note["id"]
        for ev in meta["gt_events"]:
            assert set(ev) == {"source", "persons"} and isinstance(ev["source"], str) and ev["persons"]
            assert all(isinstance(p, int) and 0 <= p < 4 for p in ev["persons"])
    real = rows[0]
    assert _specs(real)[0]["path"] == "social-iq/video/kitchen.two_person_qa0001.mp4"
    assert _specs(real)[2] == "A" and "Who is gesturing?" in _specs(real)[1]


# ------------------------------------------------------------------------------------ bench
def test_bench(out: Path) -> None:
    members = _tar(out / "test" / "grasp_bench.tar")
    jsons = {n[5:-5]: json.loads(d) for n, d in members.items() if n.startswith("json/")}
    videos = {n[6:-4] for n in members if n.startswith("video/")}
    assert set(members) == {f"json/{s}.json" for s in jsons} | {f"video/{s}.mp4" for s in videos}
    assert set(jsons) == videos and len(jsons) == 32
    per_cat = collections.Counter()
    for stem, item in jsons.items():
        qa = item["qa"]
        assert {"video_name", "clip_file", "clip_offset", "clip_duration", "qa"} == set(item)
        assert item["clip_file"] == stem + ".mp4" and item["video_name"] == qa["video_id"]
        assert CLIP_RE.match(item["clip_file"]).group("video") == item["video_name"]
        assert not qa["category"].startswith("J"), "joint categories are written C1-C4 in the bench"
        cat = normalise_category(qa["category"], stem)
        per_cat[cat] += 1
        assert qa["difficulty"] == CATEGORY_DIFFICULTY[cat] and qa["format"] == "mcq" and qa["dataset"] in SOURCES
        assert _check_options(qa["options"], qa["answer"]) == qa["answer_text"]
        assert re.match(r"^<think>.*<gaze>.+</gaze>.*<gesture>.+</gesture>.*</think>$", qa["reasoning"], re.S)
        assert all(isinstance(i, int) for i in qa["source_event_ids"]) and qa["source_event_ids"]
        start, end = qa["time_range"]
        assert 0.0 <= start < end <= item["clip_duration"]
        for ev in qa.get("events", []):
            assert set(ev) == {"source", "persons"} and all(isinstance(p, int) for p in ev["persons"])
    assert per_cat == {c: 2 for c in CATEGORIES}
    letters = collections.Counter(j["qa"]["answer"] for j in jsons.values())
    assert set(letters) == set("ABCD") and max(letters.values()) - min(letters.values()) <= 4, letters
    assert sum("events" in j["qa"] for j in jsons.values()) >= 4
    assert members["video/kitchen.two_person_qa0002.mp4"] is not None
    notes = _jsonl(out / "test" / "annotations.jsonl")
    assert {n["id"] for n in notes} == set(jsons)
    for n in notes:
        qa = jsons[n["id"]]["qa"]
        assert set(n) == ANNOTATION_KEYS and n["video"] == f"video/{n['id']}.mp4"
        assert (n["category"], n["options"], n["answer"], n["question"]) == (qa["category"], qa["options"], qa["answer"],
                                                                            qa["question"])


# ------------------------------------------------------------------------------------ clips
def test_clips_decode(out: Path) -> None:
    import av

    index = _shard_index(out)
    real = [p for p in index if "kitchen.two_person" in p]
    assert len(real) == 2
    shard = out / "train" / "videos" / index[real[0]]
    if REAL_CLIP.is_file():
        assert _tar(shard)[real[0]] == REAL_CLIP.read_bytes()
    note = next(r for r in _jsonl(out / "train" / "annotations.jsonl") if r["source"] == "werewolf")
    data = _tar(out / "train" / "videos" / index[note["video"]])[note["video"]]
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        codec = stream.codec_context.name
    assert frames[0].shape == (drawing.HEIGHT, drawing.WIDTH, 3)
    assert len(frames) in {40, 50, 60}
    assert codec == ("h264" if "libx264" in av.codecs_available else "mpeg4")


def test_drawing_gaze_ends_inside_target() -> None:
    for seed in range(3):
        for cat, (template, min_n) in questions.TEMPLATES.items():
            n = max(min_n, 3 + seed % 2)
            scene = drawing.make_scene(random.Random(seed), n)
            q = template(random.Random(f"{seed}{cat}"), n, 5.0)
            for a in q.actions:
                frame = drawing.render_frame(scene, [a], a.end - 0.05)
                x, y = scene.point(a.target)
                half = drawing.SQUARE // 2 if a.target != drawing.OBJECT else 3
                box = frame[y - half:y + half, x - half:x + half]
                if a.kind == "gaze":
                    assert (box == drawing.DOT).all(-1).any(), f"{cat}: gaze dot of {a} not inside its target"
                assert not np.array_equal(frame, drawing.render_frame(scene, [], 0.0)), f"{cat}: {a} not drawn"


def test_draw_person_colour_and_label() -> None:
    frame = np.zeros((drawing.HEIGHT, drawing.WIDTH, 3), np.uint8)
    drawing.draw_person(frame, (40, 40), 2)
    assert tuple(frame[40, 40]) == drawing.PERSON_COLOURS[2]
    assert (frame[24:31, 30:36] == 255).all(-1).any(), "no id label above the box"


def _persons(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"Person (\d)", text)]


def _overlap(a: drawing.Action, b: drawing.Action) -> bool:
    return a.start < b.end and b.start < a.end


def _oracle(q: questions.Question) -> str | None:
    """The answer recomputed from the drawn actions, for the categories where that is simple."""
    gazes = [a for a in q.actions if a.kind == "gaze"]
    gestures = [a for a in q.actions if a.kind != "gaze"]
    subject = (_persons(q.text) or [None])[0]
    if q.category == "T1":
        return questions.option_text(next(a.target for a in gazes if a.actor == subject))
    if q.category == "T3":
        return questions.option_text(min((a for a in gazes if a.actor == subject), key=lambda a: a.start).target)
    if q.category == "T4":
        mutual = {a.target for a in gazes if a.actor == subject
                  and any(b.actor == a.target and b.target == subject and _overlap(a, b) for b in gazes)}
        return f"Person {mutual.pop()}" if len(mutual) == 1 else None
    if q.category == "G1":
        return f"Person {gestures[0].actor}" if len({a.actor for a in gestures}) == 1 else None
    if q.category == "G4":
        (top, k), *rest = collections.Counter(a.actor for a in gestures).most_common()
        return f"Person {top}" if not rest or rest[0][1] < k else None
    if q.category == "J1":
        point = next(a for a in gestures if a.actor == subject)
        lookers = {a.actor for a in gazes if a.target == subject and _overlap(a, point)}
        return f"Person {lookers.pop()}" if len(lookers) == 1 else None
    return "skip"


def test_answers_follow_the_drawn_actions() -> None:
    for seed in range(20):
        for cat, (template, min_n) in questions.TEMPLATES.items():
            n = min_n + seed % (5 - min_n)
            q = template(random.Random(f"{seed}:{cat}"), n, 4.0 + seed % 3)
            expected = _oracle(q)
            assert expected in ("skip", q.answer_text), f"{cat} seed {seed}: {q.text} -> {q.answer_text}, drawn {expected}"
            assert q.answer_text in q.pool and len(set(q.pool)) >= 4
            assert all(0 <= p < n for _, persons in q.events for p in persons)
            assert all(0.0 <= a.start < a.end <= 4.0 + seed % 3 for a in q.actions)


# ------------------------------------------------------------------------------------ determinism
def _structure(root: Path) -> dict[str, object]:
    """Every file's comparable content: text files verbatim, tar members (JSON members verbatim)."""
    result: dict[str, object] = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file() and not q.name.startswith(".")):
        rel = str(p.relative_to(root))
        if p.suffix == ".tar":
            result[rel] = [(n, d if n.endswith(".json") else (d is None)) for n, d in _tar(p).items()]
        else:
            result[rel] = p.read_bytes()
    return result


def test_shipped_copy_matches_fresh_generation(out: Path) -> None:
    shipped = writer.ASSETS_DIR
    assert shipped.is_dir(), "grasp_lightning/assets/sample is missing: run python -m grasp_lightning.synthetic.sample_data"
    assert _structure(shipped) == _structure(out)
    assert sum(p.stat().st_size for p in shipped.rglob("*") if p.is_file()) < 3_000_000
    assert writer.load_real_clip() == _tar(out / "train" / "videos" / "social-iq_part000.tar")[
        "social-iq/video/kitchen.two_person_qa0000.mp4"]


def test_cli_seed_changes_content(out: Path, tmp_path: Path) -> None:
    sample_data.main([str(tmp_path), "--seed", "1", "--clips-per-shard", "100"])
    assert len(list((tmp_path / "train" / "videos").glob("*.tar"))) == 4
    assert (tmp_path / "train" / "data_rl.jsonl").read_bytes() != (out / "train" / "data_rl.jsonl").read_bytes()
    assert len(_jsonl(tmp_path / "train" / "data_rl.jsonl")) == 24


# ------------------------------------------------------------------------------------ readers
def test_readers_parse_the_sample(out: Path, tmp_path: Path) -> None:
    formats = pytest.importorskip("grasp_lightning.data.formats")
    shards = pytest.importorskip("grasp_lightning.data.shards")
    sft = formats.read_sft(out / "train" / "data_sft.jsonl")
    rl = formats.read_rl(out / "train" / "data_rl.jsonl")
    train = formats.read_annotations(out / "train" / "annotations.jsonl")
    test = formats.read_annotations(out / "test" / "annotations.jsonl")
    bench = formats.read_bench(out / "test" / "grasp_bench.tar", cache_dir=tmp_path)
    assert (len(sft), len(rl), len(train), len(test), len(bench)) == (24, 24, 48, 32, 32)
    assert not any(r.skipped for r in (sft, rl, train, test, bench))
    assert sum(i.format == "open_ended" for i in sft) == 4
    assert all(i.events and i.answer in "ABCD" and i.difficulty in DIFFICULTIES for i in rl)
    assert collections.Counter(i.category for i in bench) == {c: 2 for c in CATEGORIES}
    assert sum(bool(i.events) for i in bench) >= 4 and all(i.time_range for i in bench)
    by_id = {i.uid: i for i in test}
    assert all(by_id[i.uid].answer == i.answer and by_id[i.uid].category == i.category for i in bench)
    store = shards.ClipStore(out / "train" / "videos", cache_dir=tmp_path)
    assert all(i.clip.path in store for i in [*sft, *rl, *train])
    bench_store = formats.bench_store(out / "test" / "grasp_bench.tar", cache_dir=tmp_path)
    assert all(i.clip.path in bench_store for i in bench)
    video = pytest.importorskip("grasp_lightning.data.video")
    item = next(i for i in rl if "kitchen" in i.clip.path)
    clip = video.decode_clip(store.open(item.clip.path), fps=item.clip.fps, end_seconds=item.clip.end_seconds)
    assert clip.frames.ndim == 4 and len(clip.frames) == 7
    synth = video.decode_clip(store.open(rl[1].clip.path), fps=2.0, max_pixels=None)
    assert synth.frames.shape[1:] == (drawing.HEIGHT, drawing.WIDTH, 3)


def test_encode_mp4_refuses_a_pixel_format_its_encoder_lacks() -> None:
    from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4

    frames = [np.zeros((16, 16, 3), np.uint8)] * 2
    with pytest.raises(ValueError, match=r"encoder mpeg4 has no pixel format 'yuv444p'"):
        encode_mp4(frames, 2.0, Mp4Settings(codec="mpeg4", pix_fmt="yuv444p"))
