"""Readers of annotations.jsonl, data_sft.jsonl, data_rl.jsonl and GRASP-Bench (``grasp_lightning.data.formats``)."""

from __future__ import annotations

import json
import logging

import pytest

from grasp_lightning.data.formats import (
    ReadResult,
    SkipRecord,
    bench_store,
    options_from_text,
    question_only,
    read_annotations,
    read_bench,
    read_rl,
    read_sft,
)
from grasp_lightning.data.records import SocialEvent
from grasp_lightning.errors import ClipNotFoundError, GraspConfigError, GraspFormatError
from tests.helpers import (
    OPTIONS,
    annotation_row,
    bench_json,
    bench_members,
    make_tar,
    rl_row,
    sft_row,
    write_jsonl,
)

VIDEO = b"\x00\x00\x00 ftypisom-not-decoded-here"


# ------------------------------------------------------------------ annotations.jsonl
def test_annotation_mcq_and_open_ended(tmp_path):
    path = write_jsonl(tmp_path / "annotations.jsonl", [
        annotation_row(),
        "",
        annotation_row(id="j3_1", category="C3", format="open_ended", options=None,
                       answer="Person 0 turns to Person 2.", response="<think>..</think><answer>x</answer>"),
    ])
    result = read_annotations(path)
    assert isinstance(result, ReadResult) and len(result) == 2 and result.skipped == []
    mcq, open_ = result
    assert mcq.uid == "sg_0001" and mcq.origin == f"{path}:1"
    assert mcq.question == "Between 1.5s and 3.5s, whose gaze does Person 3 follow?\n" + "\n".join(OPTIONS)
    assert mcq.question_text == "Between 1.5s and 3.5s, whose gaze does Person 3 follow?"
    assert mcq.options == tuple(OPTIONS) and mcq.answer == "A" and mcq.format == "mcq"
    assert (mcq.category, mcq.difficulty, mcq.source) == ("T5", "hard", "social_gesture")
    assert mcq.clip.path == "social_gesture/video/153_1_001_qa0000.mp4" and mcq.clip.fps == 2.0
    assert open_.origin == f"{path}:3" and open_.category == "J3" and open_.format == "open_ended"
    assert open_.options == () and open_.question == open_.question_text
    assert open_.answer == "Person 0 turns to Person 2." and open_.response.startswith("<think>")


@pytest.mark.parametrize("line, needle", [
    ('{"id": "x", "video": ', "malformed JSON"),
    (annotation_row(category="X9"), "unknown category 'X9'"),
    (annotation_row(answer="E"), "MCQ answer 'E' is not among the option letters ABCD"),
    ({k: v for k, v in annotation_row().items() if k != "question"}, "missing key 'question'"),
    (annotation_row(difficulty="extreme"), "unknown difficulty"),
    ([1, 2], "expected a JSON object"),
])
def test_annotation_errors_name_file_and_line(tmp_path, line, needle):
    path = write_jsonl(tmp_path / "annotations.jsonl", [annotation_row(), line])
    with pytest.raises(GraspFormatError) as err:
        read_annotations(path)
    assert err.value.where == f"{path}:2" and needle in str(err.value)


def test_skip_mode_logs_and_collects_every_bad_line(tmp_path, caplog):
    path = write_jsonl(tmp_path / "annotations.jsonl", [
        "{not json", annotation_row(), annotation_row(category="Q1"), annotation_row(id="2"), annotation_row(answer="Z"),
    ])
    with caplog.at_level(logging.WARNING):
        result = read_annotations(path, on_error="skip")
    assert [i.uid for i in result] == ["sg_0001", "2"]
    assert [s.where for s in result.skipped] == [f"{path}:1", f"{path}:3", f"{path}:5"]
    assert all(isinstance(s, SkipRecord) and s.reason for s in result.skipped)
    assert sum(f"{path}:" in r.getMessage() for r in caplog.records) == 3


def test_bad_on_error_and_missing_file(tmp_path):
    with pytest.raises(GraspConfigError):
        read_annotations(tmp_path / "a.jsonl", on_error="ignore")
    with pytest.raises(GraspFormatError, match="no such file"):
        read_rl(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------ data_rl / data_sft
def test_rl_row(tmp_path):
    path = write_jsonl(tmp_path / "data_rl.jsonl", [rl_row("B")] * 12)
    item = read_rl(path)[11]
    assert item.uid == "data_rl:12" and item.origin == f"{path}:12"
    assert item.answer == "B" and item.response is None and item.format == "mcq"
    assert item.options == tuple(OPTIONS)
    assert item.question.startswith("Who does Person 1 point at?\nA) Person 0") and item.question.endswith("interactions.")
    assert item.question_text == "Who does Person 1 point at?" and item.difficulty == "easy"
    assert item.events == (SocialEvent("gaze", (0, 3), "gaze"), SocialEvent("gesture", (1, 2), "pointing"))
    assert item.participants == {0, 1, 2, 3}
    assert item.clip.path == "social_gesture/video/153_1_001_qa0000.mp4" and item.source == "social_gesture"
    assert (item.clip.fps, item.clip.start_seconds, item.clip.end_seconds) == (2.0, 0.0, 5.5)
    assert item.clip.src_resolution == (360, 640)


def test_rl_row_without_meta_and_dotted_options(tmp_path):
    dotted = ["A. Person 0", "B. Person 1"]
    row = [s for s in rl_row("A", options=dotted) if s["type"] != "meta"]
    item = read_rl(write_jsonl(tmp_path / "data_rl.jsonl", [row]))[0]
    assert item.options == tuple(dotted) and item.answer == "A" and item.events == ()
    # the reader keeps what the row says: no meta, no question_text (question_only gives the bare question)
    assert item.question_text is None and item.difficulty is None
    assert question_only(item) == "Who does Person 1 point at?"


@pytest.mark.parametrize("row, needle", [
    ("[{\"type\": \"video\"", "malformed JSON"),
    ({"type": "video", "path": "x.mp4"}, "expected a JSON list of spec objects"),
    ([s for s in rl_row() if s["type"] != "video"], "exactly one video spec, found 0"),
    ([s for s in rl_row() if not s.get("output")], "missing target"),
    (rl_row("E"), "MCQ answer 'E' is not among the option letters ABCD"),
    (rl_row("A", options=[]), "MCQ item has no options"),
    (rl_row(meta={"type": "meta", "gt_events": [{"source": "gaze"}]}), "bad event"),
    (rl_row(meta={"type": "meta", "category": "Z7"}), "unknown category"),
])
def test_rl_errors_name_file_and_line(tmp_path, row, needle):
    path = write_jsonl(tmp_path / "data_rl.jsonl", [rl_row(), row])
    with pytest.raises(GraspFormatError) as err:
        read_rl(path)
    assert err.value.where == f"{path}:2" and needle in err.value.reason


def test_sft_rows(tmp_path):
    path = write_jsonl(tmp_path / "data_sft.jsonl", [
        sft_row(), sft_row("<think>no tag</think>"), sft_row("<think>..</think><answer>Person 0 waves.</answer>", False),
    ])
    a, b, c = read_sft(path)
    assert a.uid == "data_sft:1" and a.answer == "B" and a.response.endswith("<answer>B</answer>")
    assert a.format == "mcq" and a.source == "werewolf" and a.clip.path == "werewolf/video/ep1.s2_qa0003.mp4"
    assert b.answer == "" and b.response == "<think>no tag</think>"
    assert c.format == "open_ended" and c.options == () and c.answer == ""
    with pytest.raises(GraspFormatError, match=r"data_sft.jsonl:1: MCQ answer 'F'"):
        read_sft(write_jsonl(tmp_path / "data_sft.jsonl", [sft_row("<answer>F</answer>")]))


def test_options_from_text_takes_the_first_lettered_run():
    text = "Q?\nA) Person 0\n\nB) Person 1\nC) No one\nThen answer.\nA) not an option"
    assert options_from_text(text) == ("A) Person 0", "B) Person 1", "C) No one")
    assert options_from_text("No options here.") == ()


# ------------------------------------------------------------------ GRASP-Bench
@pytest.mark.parametrize("prefix", ["", "grasp_bench/"])
def test_bench_tar_joins_by_stem_with_dots(tmp_path, prefix):
    clips = {"a.b_c_qa0001": VIDEO + b"1", "153_1_001_qa0000": VIDEO + b"2"}
    jsons = {"a.b_c_qa0001": bench_json("a.b_c_qa0001", events=[{"source": "gaze", "persons": [3, 0]}]),
             "153_1_001_qa0000": bench_json("153_1_001_qa0000", category="T2", difficulty="easy")}
    tar = make_tar(tmp_path / "grasp_bench.tar", bench_members(clips, prefix, jsons))
    result = read_bench(tar, cache_dir=tmp_path / "cache")
    by_uid = {i.uid: i for i in result}
    assert sorted(by_uid) == ["153_1_001_qa0000", "a.b_c_qa0001"] and result.skipped == []
    dotted = by_uid["a.b_c_qa0001"]
    assert dotted.origin == f"{tar.resolve()}:{prefix}json/a.b_c_qa0001.json"
    assert dotted.clip.path == "video/a.b_c_qa0001.mp4" and dotted.category == "J3"
    assert dotted.events == (SocialEvent("gaze", (3, 0), "gaze"),) and dotted.time_range == (1.5, 3.5)
    assert dotted.answer == "A" and dotted.options == tuple(OPTIONS) and dotted.source == "social_gesture"
    assert dotted.question.endswith("D) No one") and dotted.reasoning == "<think> ... </think>"
    assert by_uid["153_1_001_qa0000"].events == () and by_uid["153_1_001_qa0000"].category == "T2"
    store = bench_store(tar, cache_dir=tmp_path / "cache")
    assert store.open(dotted.clip.path) == clips["a.b_c_qa0001"]


def test_bench_folder(tmp_path):
    root = tmp_path / "bench" / "grasp_bench"
    for name, data in bench_members({"x.y_qa0002": VIDEO}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    result = read_bench(tmp_path / "bench")
    assert [i.uid for i in result] == ["x.y_qa0002"]
    assert result[0].origin == str((root / "json" / "x.y_qa0002.json").resolve())
    assert bench_store(tmp_path / "bench").open(result[0].clip.path) == VIDEO


def test_bench_errors_name_archive_and_member(tmp_path, caplog):
    members = bench_members({"ok_qa0001": VIDEO, "bad_qa0002": VIDEO, "cat_qa0003": VIDEO, "ans_qa0004": VIDEO},
                            jsons={"bad_qa0002": b"{oops", "cat_qa0003": bench_json("cat_qa0003", category="K1"),
                                   "ans_qa0004": bench_json("ans_qa0004", answer="E")})
    members.pop("video/ok_qa0001.mp4")
    members["video/orphan_qa0009.mp4"] = VIDEO
    tar = make_tar(tmp_path / "grasp_bench.tar", members)
    with pytest.raises(GraspFormatError) as err:
        read_bench(tar, cache_dir=tmp_path)
    assert err.value.where == f"{tar.resolve()}:json/ans_qa0004.json" and "not among the option letters" in str(err.value)
    with caplog.at_level(logging.WARNING):
        result = read_bench(tar, on_error="skip", cache_dir=tmp_path)
    assert len(result) == 0
    reasons = {s.where.rsplit(":", 1)[1]: s.reason for s in result.skipped}
    assert sorted(reasons) == ["json/ans_qa0004.json", "json/bad_qa0002.json", "json/cat_qa0003.json",
                               "json/ok_qa0001.json"]
    assert "malformed JSON" in reasons["json/bad_qa0002.json"] and "unknown category" in reasons["json/cat_qa0003.json"]
    assert "no video video/ok_qa0001.mp4" in reasons["json/ok_qa0001.json"]
    assert any("orphan_qa0009" in r.getMessage() for r in caplog.records)
    with pytest.raises(ClipNotFoundError):
        read_bench(make_tar(tmp_path / "b2.tar", {"json/ok_qa0001.json": json.dumps(bench_json("ok_qa0001")).encode()}),
                   cache_dir=tmp_path)


def test_bench_without_layout(tmp_path):
    with pytest.raises(GraspFormatError, match="json/<clip>.json"):
        read_bench(make_tar(tmp_path / "x.tar", {"video/a.mp4": VIDEO}), cache_dir=tmp_path)


# ------------------------------------------------------------------ new-user defects: events and empty targets
def _events_meta(events: list) -> dict:
    return {"type": "meta", "difficulty": "easy", "gt_events": events}


@pytest.mark.parametrize("persons", [[-1], [True], ["x"], [1.5], [None]])
def test_event_persons_must_be_non_negative_ids(tmp_path, persons):
    path = write_jsonl(tmp_path / "data_rl.jsonl", [rl_row(), rl_row(meta=_events_meta([{"source": "gaze",
                                                                                          "persons": persons}]))])
    with pytest.raises(GraspFormatError) as err:
        read_rl(path)
    assert err.value.where == f"{path}:2"
    assert err.value.reason == f"event persons must be non-negative integer ids, got {persons!r}"


def test_unknown_event_source_and_unnamed_person_are_warnings_not_errors(tmp_path):
    from grasp_lightning.data.formats import event_warnings

    path = write_jsonl(tmp_path / "data_rl.jsonl", [
        rl_row(meta=_events_meta([{"source": "telepathy", "persons": [9]}, {"source": "gaze", "persons": ["3", 0.0]}])),
        rl_row(meta=_events_meta([{"source": "gaze", "persons": [0, 2]}, {"source": "Pointing", "persons": [1, 4]}]))])
    bad, good = read_rl(path)
    assert bad.events == (SocialEvent("gesture", (9,), "telepathy"), SocialEvent("gaze", (3, 0), "gaze"))
    assert event_warnings(bad) == [
        "meta.gt_events source(s) 'telepathy' unknown, read as gesture events",
        "meta.gt_events person(s) [3, 9] are not named in the question or options (which name [0, 1, 2, 4])"]
    assert event_warnings(good) == []  # gaze + pointing, every person named in the question or options


def test_event_time_spans_rl_and_bench(tmp_path):
    """``start_seconds``/``end_seconds`` of an event become its span; an event without them keeps ``None``."""
    events = [{"source": "gaze", "persons": [0, 3], "start_seconds": 1, "end_seconds": 2.5},
              {"source": "pointing", "persons": [1, 2]},
              {"source": "gaze", "persons": [1], "start_seconds": None, "end_seconds": None, "extra": 1}]
    item = read_rl(write_jsonl(tmp_path / "data_rl.jsonl", [rl_row(meta=_events_meta(events))]))[0]
    assert item.events == (SocialEvent("gaze", (0, 3), "gaze", span=(1.0, 2.5)),
                           SocialEvent("gesture", (1, 2), "pointing"),
                           SocialEvent("gaze", (1,), "gaze", span=None))  # null counts as not given
    assert item.events[0].span == (1.0, 2.5) and isinstance(item.events[0].span[0], float)
    assert SocialEvent("gaze", (0,), "gaze").span is None  # positional construction unchanged
    clip = "s_qa0001"
    tar = make_tar(tmp_path / "grasp_bench.tar", bench_members({clip: VIDEO}, jsons={clip: bench_json(
        clip, events=[{"source": "gaze", "persons": [3, 0], "start_seconds": 1.5, "end_seconds": 3.5}])}))
    assert read_bench(tar, cache_dir=tmp_path / "cache")[0].events == (SocialEvent("gaze", (3, 0), "gaze", (1.5, 3.5)),)


@pytest.mark.parametrize("times, reason", [
    ({"start_seconds": 2.5, "end_seconds": 1.0}, "event 1: 'end_seconds' 1.0 must be greater than 'start_seconds' 2.5"),
    ({"start_seconds": 2, "end_seconds": 2}, "event 1: 'end_seconds' 2.0 must be greater than 'start_seconds' 2.0"),
    ({"start_seconds": -0.5, "end_seconds": 1}, "event 1: 'start_seconds' -0.5 must be >= 0"),
    ({"start_seconds": 1.0}, "event 1: 'start_seconds' given without 'end_seconds' (give both or neither)"),
    ({"end_seconds": 1.0}, "event 1: 'end_seconds' given without 'start_seconds' (give both or neither)"),
    ({"start_seconds": True, "end_seconds": 2}, "event 1: 'start_seconds' must be a finite number of seconds, got True"),
    ({"start_seconds": 0, "end_seconds": "2s"}, "event 1: 'end_seconds' must be a finite number of seconds, got '2s'"),
    ({"start_seconds": 0, "end_seconds": float("inf")},
     "event 1: 'end_seconds' must be a finite number of seconds, got inf"),
    ({"start_seconds": float("nan"), "end_seconds": 1},
     "event 1: 'start_seconds' must be a finite number of seconds, got nan"),
])
def test_bad_event_time_spans_name_the_row_and_the_event(tmp_path, times, reason):
    events = [{"source": "gaze", "persons": [0]}, {"source": "gaze", "persons": [1], **times}]
    path = write_jsonl(tmp_path / "data_rl.jsonl", [rl_row(), rl_row(meta=_events_meta(events))])
    with pytest.raises(GraspFormatError) as err:
        read_rl(path)
    assert err.value.where == f"{path}:2" and err.value.reason == reason


@pytest.mark.parametrize("target", ["", "   \n"])
def test_sft_empty_target_names_file_and_line(tmp_path, target):
    path = write_jsonl(tmp_path / "data_sft.jsonl", [sft_row(), sft_row(target)])
    with pytest.raises(GraspFormatError) as err:
        read_sft(path)
    assert str(err.value) == (f"{path}:2: SFT needs an assistant target (an `output: true` text or `response`), "
                              "this row's is empty")
    result = read_sft(path, on_error="skip")
    assert len(result) == 1 and result.skipped[0].where == f"{path}:2"
