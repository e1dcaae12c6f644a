"""Tests of :mod:`experiments.world.world`: every file read back by the GRASP readers, every answer
re-derived from the drawn actions by an independent solver and, for gazes, from the decoded pixels."""

from __future__ import annotations

import collections
import random
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from experiments.world import world
from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.data.formats import bench_store, read_annotations, read_bench, read_rl, read_sft
from grasp_lightning.data.prompts import user_text
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.data.video import decode_clip
from grasp_lightning.parsing import extract_participants
from grasp_lightning.synthetic.sample.drawing import OBJECT, Action
from grasp_lightning.synthetic.sample.questions import participants

pytestmark = pytest.mark.timeout(120)

N_TRAIN, N_RL, N_BENCH = 10, 10, 15
FULL = world.WorldOptions(shortcut=0.7, temporal=True)  #: both options: categories T1 T4 T6 G1 G2 J3 T3
TARGET_RE = re.compile(r"^<(gaze|gesture)>(?P<sentence>[^<]+)</\1><answer>(?P<letter>[A-D])</answer>$")
CONFIGS = Path(__file__).resolve().parent / "configs"  #: the experiment's recipes
#: The repository's tiny Qwen3-VL: its processor encodes the world's bench items.
TINY = Path(__file__).resolve().parents[2] / "grasp_lightning" / "assets" / "tiny-qwen3vl"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("world")
    world.generate_world(root, seed=3, n_train=N_TRAIN, n_bench=N_BENCH, n_rl=N_RL, clips_per_shard=8)
    return root


def _person(text: str) -> int:
    m = re.search(r"Person (\d)", text)
    assert m, text
    return int(m.group(1))


def solve(category: str, question: str, actions: tuple[Action, ...]) -> str:
    """The answer text implied by the drawn actions (written independently of the generator)."""
    gazes = {(a.actor, a.target) for a in actions if a.kind == "gaze"}
    gestures = [a for a in actions if a.kind != "gaze"]
    if category == "T1":
        a = _person(question)
        (target,) = [t for s, t in gazes if s == a]
        return "An object" if target == OBJECT else f"Person {target}"
    if category == "T4":
        a = _person(question)
        partners = [x for s, x in gazes if s == a and (x, a) in gazes]
        assert len(partners) <= 1
        return f"Person {partners[0]}" if partners else "No one"
    if category == "T6":
        counts = collections.Counter(t for _, t in gazes if t != OBJECT)
        (focus,) = [p for p, n in counts.items() if n >= 2]
        return f"Person {focus}"
    if category == "G1":
        (pointer,) = {g.actor for g in gestures}
        return f"Person {pointer}"
    if category == "G2":
        (kind,) = [g.kind for g in gestures if g.actor == _person(question)]
        return kind.capitalize()
    if category == "J3":  # "When Person p points at x, who or what does Person g look at?": g's gaze, not x
        g = int(re.search(r"does Person (\d) look at", question).group(1))
        (target,) = [t for s, t in gazes if s == g]
        return "An object" if target == OBJECT else f"Person {target}"
    if category == "T3":  # "Between w0s and w1s, who or what does Person a look at?": the gaze covering the window
        w0, w1 = map(float, re.match(r"Between (\d+\.\d)s and (\d+\.\d)s", question).groups())
        a = int(re.search(r"does Person (\d) look at", question).group(1))
        (target,) = [x.target for x in actions if x.kind == "gaze" and x.actor == a and x.start <= w0 and w1 <= x.end]
        return "An object" if target == OBJECT else f"Person {target}"
    raise AssertionError(f"unexpected category {category}")


def _entries(split: str, n: int):
    return [world.make_world_entry(3, split, k) for k in range(n)]


def test_files_follow_the_grasp_schemas(out: Path) -> None:
    sft = read_sft(out / "train" / "data_sft.jsonl")
    rl = read_rl(out / "train" / "data_rl.jsonl")
    ann = read_annotations(out / "train" / "annotations.jsonl")
    bench = read_bench(out / "test" / "grasp_bench.tar")
    test_ann = read_annotations(out / "test" / "annotations.jsonl")
    assert (len(sft), len(rl), len(ann), len(bench), len(test_ann)) == (N_TRAIN, N_RL, N_TRAIN + N_RL, N_BENCH, N_BENCH)
    assert not (sft.skipped or rl.skipped or ann.skipped or bench.skipped)
    assert sorted(p.name for p in (out / "train" / "videos").glob("*.tar")) == [
        "social_gesture_part000.tar", "social_gesture_part001.tar", "social_gesture_part002.tar"]
    store = ClipStore(out / "train" / "videos")
    for item in list(sft) + list(rl):
        assert item.format == "mcq" and len(item.options) == 4 and item.answer in "ABCD"
        assert item.clip.fps == 2.0 and item.clip.end_seconds == world.DURATION
        assert item.clip.src_resolution == (world.HEIGHT, world.WIDTH)
        assert item.clip.path in store
    for item in rl:
        assert item.events and item.participants and item.difficulty in ("easy", "medium", "hard")
    for item in bench:
        assert item.category in world.CATEGORIES and item.events and item.participants
    clip = decode_clip(bench_store(out / "test" / "grasp_bench.tar").open(bench[0].clip.path), fps=2.0)
    assert clip.frames.shape == (4, world.HEIGHT, world.WIDTH, 3)
    assert np.allclose(clip.timestamps, [0.0, 0.5, 1.0, 1.5])


def test_answers_follow_from_the_drawn_actions(out: Path) -> None:
    files = {"t": read_sft(out / "train" / "data_sft.jsonl"), "r": read_rl(out / "train" / "data_rl.jsonl"),
             "b": read_bench(out / "test" / "grasp_bench.tar")}
    counts = {"t": N_TRAIN, "r": N_RL, "b": N_BENCH}
    for split, items in files.items():
        by_clip = {Path(i.clip.path).name: i for i in items}
        for e in _entries(split, counts[split]):
            item = by_clip[e.clip.name]
            q = e.question
            answer = solve(q.category, q.text, q.actions)
            assert f"{item.answer}) {answer}" in item.options, (e.clip.name, item.options, answer)
            assert q.text in item.question
            gt = {p for ev in q.events for p in ev[1]}
            assert {p for ev in item.events for p in ev.persons} == (gt if split != "t" else set())
            m = TARGET_RE.match(e.response)
            assert m and m.group("letter") == e.letter, e.response
            assert set(extract_participants(m.group("sentence"))) == gt, (e.response, q.events)
            if split == "t":
                assert item.response == e.response


def test_categories_and_letters_are_balanced() -> None:
    entries = _entries("b", 40)
    assert collections.Counter(e.question.category for e in entries) == {c: 8 for c in world.CATEGORIES}
    letters = collections.Counter(e.letter for e in entries)
    assert set(letters) == set("ABCD") and max(letters.values()) <= 16


def _tip(src: tuple[int, int], dst: tuple[int, int], offset: float = 2.0, short: float = world.DOT_SHORT) -> np.ndarray:
    """Where a finished gaze's dot sits: ``offset`` pixels to the right of the target's centre and ``short``
    pixels before it along the gaze (draw_gaze)."""
    d = np.array(dst, float) - np.array(src, float)
    u = d / np.hypot(*d)
    return np.array(dst, float) - u * short + np.array([-u[1], u[0]]) * offset


def test_gaze_dots_end_inside_the_targets_square(out: Path) -> None:
    """From the second decoded frame on (t = 0.5 s) every gaze's white dot lies inside its target's square,
    never in transit, and the square of a person who is neither looked at nor gesturing holds no white. The
    dot's middle is the gazer's colour where no later gaze is drawn over it (one ending in or leaving that square)."""
    store = bench_store(out / "test" / "grasp_bench.tar")
    checked = cores = 0
    for k in range(N_BENCH):
        e, scene = world.make_world_item(3, "b", k)
        frames = decode_clip(store.open(f"video/{e.clip.name}"), fps=2.0).frames
        for i in range(1, len(frames)):
            light = frames[i].astype(float) @ np.array([0.299, 0.587, 0.114]) > 225  # white; yellow is about 196
            for a in e.question.actions:
                if a.kind == "gaze":
                    dst = scene.point(a.target)
                    x, y = np.round(_tip(scene.point(a.actor), dst)).astype(int)
                    assert max(abs(x - dst[0]), abs(y - dst[1])) <= world.SQUARE // 2 - 2, (e.clip.name, a)
                    r = world.DOT // 2
                    assert light[y - r:y + r + 1, x - r:x + r + 1].any(), (e.clip.name, i, a, "no white dot at the target")
                    checked += 1
            gazes = [a for a in e.question.actions if a.kind == "gaze"]
            for j, a in enumerate(gazes):  # a dot no later gaze draws over: none ends in or leaves that square
                if any(g.target == a.target or g.actor == a.target for g in gazes[j + 1:]):
                    continue
                x, y = np.round(_tip(scene.point(a.actor), scene.point(a.target))).astype(int)
                core = frames[i][y - 1:y + 1, x - 1:x + 1].reshape(-1, 3).astype(float).mean(0)
                assert np.abs(core - world.PERSON_COLOURS[a.actor]).max() < 40, (e.clip.name, i, a, core, "core")
                cores += 1
            busy = {a.target for a in e.question.actions if a.kind == "gaze"} | {
                a.actor for a in e.question.actions if a.kind != "gaze"}
            h = world.SQUARE // 2 - 1
            for pid, (x, y) in enumerate(scene.centres):
                if pid not in busy:
                    assert not light[y - h:y + h + 1, x - h:x + h + 1].any(), (e.clip.name, i, pid, "white, idle square")
    assert checked >= N_BENCH and cores >= N_BENCH


def test_generation_is_deterministic(tmp_path: Path) -> None:
    for name in ("a", "b"):
        world.main([str(tmp_path / name), "--seed", "1", "--train", "3", "--rl", "2", "--bench", "5"])
    for rel in ("train/data_sft.jsonl", "train/data_rl.jsonl", "train/annotations.jsonl", "test/annotations.jsonl"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    assert (tmp_path / "a" / "test" / "grasp_bench.tar").read_bytes() == \
        (tmp_path / "b" / "test" / "grasp_bench.tar").read_bytes()
    other = world.make_world_entry(2, "b", 0)
    assert other.clip.data != world.make_world_entry(1, "b", 0).clip.data


@pytest.mark.parametrize("name", ["sft.yaml", "grpo.yaml", "sgr.yaml"])
def test_world_recipes_carry_the_colour_key(name: str) -> None:
    config = yaml.safe_load((CONFIGS / name).read_text())
    assert config["data"]["prompt"]["system_prompt"] == world.SYSTEM_PROMPT
    assert config["data"]["prompt"]["instruction"] == world.INSTRUCTION
    assert all(f"Person {i} is {c}" in world.SYSTEM_PROMPT for i, c in enumerate(world.COLOUR_NAMES))
    assert config["data"]["video"]["max_pixels"] == world.WIDTH * world.HEIGHT
    assert config["model"]["policy"]["freeze_vision"] is False


def test_every_prompt_ends_with_the_world_instruction(out: Path) -> None:
    """Train rows carry the world's short instruction; bench items get it from ``data.prompt.instruction``
    (the generic GRASP instruction would double the prompt of a model trained from scratch)."""
    for item in list(read_sft(out / "train" / "data_sft.jsonl")) + list(read_rl(out / "train" / "data_rl.jsonl")):
        assert item.question.endswith(world.INSTRUCTION) and user_text(item, "") == item.question
        assert user_text(item) == item.question  # a row's own instruction is never doubled
    bench = read_bench(out / "test" / "grasp_bench.tar")
    for item in bench:
        assert world.INSTRUCTION not in item.question
        assert user_text(item, world.INSTRUCTION) == f"{item.question.rstrip()}\n{world.INSTRUCTION}"
        assert user_text(item, "") == item.question.rstrip()


def test_world_tokenizer_knows_the_worlds_words(tmp_path: Path) -> None:
    """The world model's tokenizer is trained on the world's prompts too: its user turns take about a
    quarter fewer tokens than with the generic tiny tokenizer (measured: 270 vs 363 for these five)."""
    from transformers import AutoTokenizer

    from grasp_lightning.synthetic.sample.entries import user_text as user_text_of
    from grasp_lightning.synthetic.tiny import build_tokenizer

    world.build_world_model(tmp_path / "m", seed=0)
    ours, generic = AutoTokenizer.from_pretrained(tmp_path / "m"), build_tokenizer(seed=0)
    texts = [user_text_of(world.make_world_entry(0, "b", k), world.INSTRUCTION) for k in range(5)]
    n_ours = sum(len(ours(t).input_ids) for t in texts)
    n_generic = sum(len(generic(t).input_ids) for t in texts)
    assert n_ours < 0.8 * n_generic, (n_ours, n_generic)
    assert all(ours.decode(ours(t).input_ids) == t for t in texts)


def test_the_object_has_a_token_of_its_own() -> None:
    """The object's pixels lie in one 16x16-pixel token (the tiny model's patch 8 and merge 2), which no gaze
    line between two persons crosses; a gaze or an arm aimed at it has a direction of its own from every
    corner (at least 14 degrees from the direction to any other corner), and its centre is 16 pixels from every
    segment between two corners. (At (32, 18) it straddled four tokens; at (40, 24) it lay on a diagonal.)"""
    from grasp_lightning.synthetic.sample.drawing import OBJECT_COLOUR

    ox, oy = world.OBJECT_CENTRE
    scene = world.make_world_scene(random.Random(0))  # persons sit at the four corners in every scene
    frame = world.render_world_frame(scene, [], 1.0)
    ys, xs = np.nonzero((frame == OBJECT_COLOUR).all(-1))
    assert len(xs) == world.OBJECT_SIZE ** 2
    cells = {(x // world.CELL, y // world.CELL) for x, y in zip(xs, ys)}
    assert cells == {(ox // world.CELL, oy // world.CELL)}, f"the object straddles tokens {sorted(cells)}"
    for actor in range(4):  # all 12 corner-to-corner gazes, drawn: none reaches the object's token
        for target in set(range(4)) - {actor}:
            drawn = world.render_world_frame(scene, [Action("gaze", actor, target, 0.0, world.DURATION)], 1.0)
            ys, xs = np.nonzero((drawn != frame).any(-1))
            assert not cells & {(x // world.CELL, y // world.CELL) for x, y in zip(xs, ys)}, (actor, target)

    def angle(src: tuple[int, int], dst: tuple[int, int]) -> float:
        return float(np.degrees(np.arctan2(dst[1] - src[1], dst[0] - src[0])))

    gaps = []
    for c in world.CORNERS:
        to_object = angle(c, (ox, oy))
        gaps += [abs((to_object - angle(c, o) + 180) % 360 - 180) for o in world.CORNERS if o != c]
    assert min(gaps) >= 14.0, sorted(gaps)[:3]
    distances = []
    for i, (x0, y0) in enumerate(world.CORNERS):
        for x1, y1 in world.CORNERS[i + 1:]:
            d = np.array([x1 - x0, y1 - y0], float)
            t = np.clip(np.dot([ox - x0, oy - y0], d) / np.dot(d, d), 0.0, 1.0)
            distances.append(float(np.hypot(ox - (x0 + t * d[0]), oy - (y0 + t * d[1]))))
    assert min(distances) >= 16.0, sorted(distances)[:3]


def test_gestures_differ_in_shape_and_place() -> None:
    """G2's four gestures are told apart by the pixels: a given object sits inside the receiver's square
    from the second frame on, a shown object outside every square; a reaching arm covers at least three
    times the white pixels of a pointing arm."""
    seen, white = set(), {"pointing": [], "reaching": []}
    for k in [k for k in range(360) if world.WorldOptions().category("t", k) == "G2"]:  # the G2 clips
        e, scene = world.make_world_item(3, "t", k)
        (g,) = e.question.actions
        frames = world.render_world_clip(scene, e.question.actions)
        h = world.SQUARE // 2
        inside = [lambda x, y, c=c: abs(x - c[0]) <= h and abs(y - c[1]) <= h for c in scene.centres]
        for frame in frames[1:]:
            ys, xs = np.nonzero((frame == world.HELD_COLOUR).all(-1))
            if g.kind in ("showing", "giving"):
                assert len(xs), (e.clip.name, "no object")
                where = {i for x, y in zip(xs, ys) for i, f in enumerate(inside) if f(x, y)}
                assert where == ({g.target} if g.kind == "giving" else set()), (e.clip.name, g.kind, where)
            else:
                assert not len(xs)
        if g.kind in white:
            white[g.kind].append(int((frames[-1] >= 240).all(-1).sum()))  # the arm (HAND); no gaze here
        seen.add(g.kind)
    assert seen == {"pointing", "reaching", "showing", "giving"}
    assert min(white["pointing"]) >= 9 and min(white["reaching"]) >= 3 * max(white["pointing"]), white


def test_datamodule_appends_the_configured_instruction_to_bench_prompts(out: Path) -> None:
    """``data.prompt.instruction`` reaches the encoded bench prompts (and the GRASP instruction does not)."""
    from grasp_lightning.data.prompts import INSTRUCTION
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(out)),
                         video=VideoConfig(max_frames=4, max_pixels=world.WIDTH * world.HEIGHT),
                         prompt=PromptConfig(processor=str(TINY), system_prompt=world.SYSTEM_PROMPT, instruction=world.INSTRUCTION),
                         loader=LoaderConfig(data_mode="rl", val_batch_size=2, num_workers=0))
    dm.setup("validate")
    loader = dm.val_dataloader()
    batch = next(iter(loader[0] if isinstance(loader, list) else loader))
    text = dm.processor.tokenizer.decode(batch.inputs["input_ids"][0], skip_special_tokens=False)
    assert text.count(world.INSTRUCTION) == 1 and INSTRUCTION not in text
    assert world.SYSTEM_PROMPT in text


# ------------------------------------------------------------------ the shortcut and temporal options
@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("world_full")
    world.generate_world(root, seed=5, n_train=14, n_bench=14, n_rl=14, options=FULL, clips_per_shard=20)
    return root


def test_options_add_j3_and_t3_and_every_file_reads_back(full: Path) -> None:
    assert FULL.categories == ("T1", "T4", "T6", "G1", "G2", "J3", "T3")
    files = {"t": read_sft(full / "train" / "data_sft.jsonl"), "r": read_rl(full / "train" / "data_rl.jsonl"),
             "b": read_bench(full / "test" / "grasp_bench.tar")}
    assert collections.Counter(i.category for i in files["b"]) == {c: 2 for c in FULL.categories}
    store, bench = ClipStore(full / "train" / "videos"), bench_store(full / "test" / "grasp_bench.tar")
    for split, items in files.items():
        by_clip = {Path(i.clip.path).name: i for i in items}
        for k in range(14):
            e = world.make_world_entry(5, split, k, FULL)
            item, q = by_clip[e.clip.name], e.question
            assert f"{item.answer}) {solve(q.category, q.text, q.actions)}" in item.options, (e.clip.name, item.options)
            assert set(extract_participants(TARGET_RE.match(e.response).group("sentence"))) == {
                p for ev in q.events for p in ev[1]}
            if split == "t":
                continue
            # the T3 gaze carries its own time span; the other events last the whole clip and carry none
            spans = [ev.span for ev in item.events]
            assert spans == ([q.events[0][2]] if q.category == "T3" else [None] * len(q.events)), (e.clip.name, spans)
    t3 = [i for i in files["b"] if i.category == "T3"]
    frames = decode_clip(bench.open(t3[0].clip.path), fps=2.0)
    assert frames.frames.shape[0] == 8 and np.allclose(frames.timestamps, np.arange(8) / 2.0)
    assert all(it.clip.path in store for it in list(files["t"]) + list(files["r"]))
    readme = (full / "README.md").read_text()
    assert "--shortcut 0.7 --shortcut-bench 0 --temporal" in readme


def test_shortcut_prior_accuracy_is_as_configured_on_both_splits() -> None:
    """The prior "the gaze follows the point" (read from the question text) is right in about 70 % of the
    training J3 clips, never in the bench's (the shortcut-breaking split), and in half of them with
    ``shortcut_bench=0.5``; the answer always follows the drawn gaze, never the text."""
    def j3(split: str, n: int, options: world.WorldOptions) -> list:
        out = []
        for k in range(n):
            rng = random.Random(f"world:9:{split}:{k}")
            out.append(world._question("J3", rng, False, options.follow(split)).question)
        return out

    train, bench = j3("t", 600, FULL), j3("b", 300, FULL)
    prior_train = sum(world.shortcut_prior(q) == q.answer_text for q in train) / len(train)
    prior_bench = sum(world.shortcut_prior(q) == q.answer_text for q in bench) / len(bench)
    assert abs(prior_train - 0.7) < 0.06, prior_train  # 600 draws: 3 standard deviations are 0.056
    assert prior_bench == 0.0
    half = j3("b", 400, world.WorldOptions(shortcut=0.7, shortcut_bench=0.5))
    assert abs(sum(world.shortcut_prior(q) == q.answer_text for q in half) / len(half) - 0.5) < 0.08
    for q in train + bench:
        assert q.answer_text == solve("J3", q.text, q.actions)
        pointing = [a for a in q.actions if a.kind == "pointing"]
        assert len(pointing) == 1 and world.shortcut_prior(q) == ("An object" if pointing[0].target == OBJECT
                                                                  else f"Person {pointing[0].target}")
        (gaze,) = [a for a in q.actions if a.kind == "gaze"]  # the event is the gaze alone: naming the
        assert q.events == (("gaze", participants(gaze.actor, gaze.target)),)  # pointed-at target costs precision
    entries = [world.make_world_entry(9, "b", k, FULL) for k in range(5, 5 + 7 * 6, 7)]  # the bench's J3 clips
    assert {e.question.category for e in entries} == {"J3"} and world.prior_accuracy(entries) == 0.0
    assert world.prior_accuracy([world.make_world_entry(9, "b", 0, FULL)]) is None  # no J3 entry


def test_shortcut_reasoning_states_the_prior_exactly_where_it_holds_and_costs_grounding(tmp_path: Path) -> None:
    """``shortcut_reasoning``: a training J3 target states the point and copies its target into the gaze
    sentence exactly where the gaze follows the point (about 70 % of the clips), and is the gaze sentence
    alone elsewhere and in every bench item; the clips and questions are those of the world without the
    option. The Social Grounding Reward scores a target stating the prior (1 + R) * P = 2 * 2/3 (1 for the
    object: P = 1/2, the pointer is not in the gaze event) against 2 for the gaze sentence alone."""
    from grasp_lightning.grpo.rewards import social_grounding

    options = world.WorldOptions(shortcut=0.7, temporal=True, shortcut_reasoning=True)
    stated = []
    for split, n in (("t", 700), ("b", 70)):
        for k in (k for k in range(n) if options.category(split, k) == "J3"):
            e, plain = world.make_world_entry(3, split, k, options), world.make_world_entry(3, split, k, FULL)
            assert e.question == plain.question and e.clip.data == plain.clip.data and e.letter == plain.letter
            holds = world.shortcut_prior(e.question) == e.question.answer_text
            (point,) = [a for a in e.question.actions if a.kind == "pointing"]
            (gaze,) = [a for a in e.question.actions if a.kind == "gaze"]
            if split == "t" and holds:
                assert e.response == (f"<gesture>Person {point.actor} points at {world.person_name(point.target)}."
                                      f"</gesture>{plain.response}"), e.response
            else:
                assert e.response == plain.response and "<gesture>" not in e.response
            assert plain.response.startswith(f"<gaze>Person {gaze.actor} looks at {world.person_name(gaze.target)}.")
            stated.append((split, "<gesture>" in e.response))
    train = [s for split, s in stated if split == "t"]
    assert len(train) == 108 and abs(sum(train) / len(train) - 0.7) < 0.13, sum(train)  # 3 sd of 108 draws: 0.13
    assert not any(s for split, s in stated if split == "b")
    assert options.flags() == " --shortcut 0.7 --shortcut-bench 0 --shortcut-reasoning --temporal"
    with pytest.raises(ValueError, match="shortcut_reasoning needs shortcut"):
        world.WorldOptions(shortcut_reasoning=True)
    # the RL rows' ground truth is the gaze alone: stating the prior costs precision
    world.generate_world(tmp_path, seed=3, n_train=0, n_bench=1, n_rl=40, options=options, clips_per_shard=50)
    rewards = collections.Counter()
    for item in read_rl(tmp_path / "train" / "data_rl.jsonl"):
        k = int(re.search(r"_r(\d+)", item.clip.path).group(1))
        e = world.make_world_entry(3, "r", k, options)
        if e.question.category != "J3":
            continue
        (gaze,) = [a for a in e.question.actions if a.kind == "gaze"]
        want = (1.0 if gaze.target == OBJECT else 4 / 3) if "<gesture>" in e.response else 2.0
        assert social_grounding(e.response, item) == pytest.approx(want), (e.response, item.events)
        rewards[want] += 1
    assert rewards[2.0] and (rewards[4 / 3] or rewards[1.0]), rewards


def test_shortcut_prior_refuses_other_questions() -> None:
    with pytest.raises(ValueError, match="not a world J3 question: T1"):
        world.shortcut_prior(world.make_world_entry(0, "b", 0).question)


def test_t3_clips_show_each_gaze_during_its_span_and_the_target_states_it() -> None:
    """A T3 clip is 8 frames (4 s); the gazer's dot (white, its colour at the middle) is in the first target's square before the switch and
    in the second's after it (from the first frame of each gaze on); the asked window lies inside the span the
    SFT target states (``from 2.0s to 4.0s``), which is the ground-truth event's span."""
    span_re = re.compile(r"from (\d\.\d)s to (\d\.\d)s")
    seen_switch = set()
    for k in range(6, 6 + 7 * 12, 7):
        e, scene = world.make_world_item(4, "b", k, FULL)
        q = e.question
        assert q.category == "T3" and e.clip.duration == world.TEMPORAL_DURATION
        frames = world.render_world_clip(scene, q.actions, world.TEMPORAL_DURATION, None)
        assert len(frames) == 8
        first, second = q.actions
        assert first.end == second.start and second.end == world.TEMPORAL_DURATION
        seen_switch.add(first.end)
        for i, frame in enumerate(frames):
            light = frame.astype(float) @ np.array([0.299, 0.587, 0.114]) > 225
            gaze = first if i / world.FPS < first.end else second
            x, y = np.round(_tip(scene.point(gaze.actor), scene.point(gaze.target))).astype(int)
            r = world.DOT // 2
            assert light[y - r:y + r + 1, x - r:x + r + 1].any(), (e.clip.name, i, gaze)
            assert (frame[y - 1:y + 1, x - 1:x + 1] == world.PERSON_COLOURS[gaze.actor]).all(), (e.clip.name, i, gaze)
        (lo, hi) = map(float, span_re.search(e.response).groups())
        assert q.events[0][2] == (lo, hi) and lo <= q.time_range[0] < q.time_range[1] <= hi
        assert q.time_range[1] - q.time_range[0] == 1.0
    assert seen_switch == set(world.TEMPORAL_SWITCH)


def test_world_options_are_checked() -> None:
    with pytest.raises(ValueError, match="shortcut must be a share in"):
        world.WorldOptions(shortcut=1.5)
    with pytest.raises(ValueError, match=r"train_mix \('T1', 'J3'\).*unknown: \['J3'\]"):
        world.WorldOptions(train_mix=("T1", "J3"))
    assert world.WorldOptions().train_cycle == world.TRAIN_MIX
    assert FULL.train_cycle == world.TRAIN_MIX + ("J3", "J3", "T3", "T3")
    counts = collections.Counter(world.WorldOptions().category("t", k) for k in range(900))
    assert counts == {"T4": 300, "T1": 200, "G2": 200, "T6": 100, "G1": 100}
    mix = world.WorldOptions(train_mix=("T4", "T4", "T1"))
    assert [mix.category("t", k) for k in range(4)] == ["T4", "T4", "T1", "T4"]
    assert [mix.category("b", k) for k in range(6)] == list(world.CATEGORIES) + ["T1"]  # the bench stays balanced
    with pytest.raises(SystemExit):
        world.main(["/tmp/unused", "--shortcut", "2"])


def test_decoded_gaze_lines_keep_their_gazers_colour() -> None:
    """The clips are 4:4:4 (:data:`world.PIX_FMT`): outside the person squares, a decoded gaze line's pixels
    are within a few levels of the gazer's colour (with 4:2:0 they were 30 levels off on average: the colour
    that says *who* looks was smeared into the background and the neighbouring line of a mutual gaze)."""
    from dataclasses import replace

    from grasp_lightning.synthetic.mp4 import encode_mp4
    from grasp_lightning.synthetic.sample.drawing import PERSON_COLOURS

    def line_error(pix_fmt: str) -> float:
        errors = []
        for k in [k for k in range(30) if world.WorldOptions().category("t", k) == "T4"]:
            e, scene = world.make_world_item(3, "t", k)
            drawn = world.render_world_clip(scene, e.question.actions)
            data = encode_mp4(drawn, world.FPS, replace(world.MP4, pix_fmt=pix_fmt))
            if pix_fmt == world.PIX_FMT:
                assert data == e.clip.data  # the world's own bytes
            decoded = decode_clip(data, fps=world.FPS).frames
            for frame, got in zip(drawn[1:], decoded[1:]):
                line = np.zeros(frame.shape[:2], bool)
                for colour in PERSON_COLOURS:
                    line |= (frame == colour).all(-1)
                h = world.SQUARE // 2 + 1
                for x, y in scene.centres:
                    line[max(y - h, 0):y + h + 1, max(x - h, 0):x + h + 1] = False
                assert line.sum() > 20, (e.clip.name, "no gaze line outside the squares")
                errors.append(np.abs(got[line].astype(int) - frame[line].astype(int)).mean())
        return float(np.mean(errors))

    assert world.PIX_FMT == "yuv444p"
    assert line_error("yuv444p") < 4.0
    assert line_error("yuv420p") > 20.0

