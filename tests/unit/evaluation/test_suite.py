"""Evaluation suites beyond GRASP-Bench: hand-scored golden scorers, readers on the fixtures, audio,
GRASP-Bench as a suite. The ``validate`` that reports GRASP-Bench, MMSI, Online-MMSI, TVQA+ and HumanSense
together is in tests/cli/test_eval_suites.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from grasp_lightning.errors import ClipDecodeError, GraspFormatError
from grasp_lightning.evaluation import MMSI, CategoryAccuracy, GraspBench, HumanSense, OnlineMMSI, TVQAPlus
from grasp_lightning.evaluation.audio import decode_audio, processor_accepts_audio
from grasp_lightning.evaluation.humansense import multi_score, pattern_of
from grasp_lightning.evaluation.suite_report import read_sections
from grasp_lightning.evaluation.tvqa import parse_ts
from grasp_lightning.synthetic import suite_fixtures as fixtures
from tests.helpers import REPO, SAMPLE

ASSETS = REPO / "grasp_lightning" / "assets" / "eval_suites"
NO_AUDIO = "they need audio and the model's processor takes no audio input"


def _bench(cls, tmp_path: Path, rows: list[dict], **kwargs):
    path = tmp_path / f"{cls.__name__.lower()}.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    bench = cls(str(path), **kwargs)
    bench.load(audio_unavailable=NO_AUDIO)
    return bench


def _mmsi_row(task: str, answer: int = 4, players: int = 6, **extra) -> dict:
    row = {"id": f"yt__clip__{task}__w{answer}", "task": task, "clip_name": "clip", "video_path": "MMSI/videos/clip.mp4",
           "dataset": "youtube", "speaker": "P2", "player_num": players, "utterance": "P2 You vote for P4.",
           "context": ["P0 Hello.", "P2 You vote for P4."], "choices": [f"P{i}" for i in range(players)],
           "question": "Based on the video, who is P2 talking to?", "answer": f"P{answer}", "answer_idx": answer}
    if task == "MPP":
        row["utterance_masked"] = "P2 You vote for [MASK]."
    row.update(extra)
    return row


# ------------------------------------------------------------------------------------ MMSI
MMSI_GOLDEN = [  # completion -> (predicted player, score) for an item whose answer is P4 (option E) of P0..P5
    ("<answer>E</answer>", "P4", 1.0),  # letter inside the block
    ("<answer>P4</answer>", "P4", 1.0),  # player label inside the block
    ("<answer>(p4)</answer>", "P4", 1.0),  # label, any case, in brackets
    ("<answer>Player 4</answer>", "P4", 1.0),
    ("<think>P2 looks at P4.</think><answer>B</answer>", "P1", 0.0),  # letter B -> P1; names in the reasoning ignored
    ("E) P4", "P4", 1.0),  # option marker without tags
    ("<answer>P9</answer>", "P9", 0.0),  # parsed, not among the choices: wrong, not unparseable
    ("no idea", None, 0.0),  # unparseable
]


@pytest.mark.parametrize("completion,predicted,score", MMSI_GOLDEN)
def test_mmsi_scorer_golden(tmp_path, completion, predicted, score):
    bench = _bench(MMSI, tmp_path, [_mmsi_row("STI")])
    record = bench.score(completion, bench.items[0])
    assert (record["target"], record["predicted"], record["score"], record["correct"]) == ("P4", predicted, score,
                                                                                            score == 1.0)


def test_mmsi_reader_prompt_and_errors(tmp_path):
    bench = _bench(OnlineMMSI, tmp_path, [_mmsi_row("MPP", answer=0, players=5)])
    item = bench.items[0]
    assert (item.uid, item.category, item.answer, item.source) == ("yt__clip__MPP__w0", "MPP", "A", "youtube")
    assert item.options == ("A) P0", "B) P1", "C) P2", "D) P3", "E) P4")
    assert "P2 You vote for [MASK]." in item.question and "P2 You vote for P4." not in item.question  # masked everywhere
    assert "Conversation so far:" in item.question and item.question.rstrip().endswith("<answer>A</answer>.")
    assert item.clip.path == "MMSI/videos/clip.mp4" and bench.video_root() == tmp_path
    for bad, message in ((_mmsi_row("STI", answer=7), "not among the choices"),
                         (_mmsi_row("STI", answer_idx=2), "disagree"),
                         (_mmsi_row("XYZ"), "unknown task"),
                         ({**_mmsi_row("MPP"), "utterance_masked": None}, "utterance_masked")):
        with pytest.raises(GraspFormatError, match=rf"onlinemmsi.json:\[0\].*{message}"):
            _bench(OnlineMMSI, tmp_path, [bad])


def test_task_accuracy_mean_overall_and_ranks_merge(tmp_path):
    bench = _bench(MMSI, tmp_path, [_mmsi_row("STI", id=f"s{i}") for i in range(3)] + [_mmsi_row("PCR", id="p")]
                   + [_mmsi_row("MPP", id="m")])
    answers = ["<answer>E</answer>", "<answer>A</answer>", "<answer>B</answer>", "<answer>P4</answer>", "??"]
    records = [bench.score(text, item) for text, item in zip(answers, bench.items)]
    single = bench.metric()
    single.update(records)
    got = bench.compute(single)
    # STI 1/3, PCR 1/1, MPP 0/1 (unparseable): mean (1/3 + 1 + 0) / 3, pooled 2/5, unparseable 1/5
    assert got["acc/STI"] == pytest.approx(1 / 3) and got["acc/PCR"] == 1.0 and got["acc/MPP"] == 0.0
    assert got["acc/mean"] == pytest.approx(4 / 9) and got["acc/overall"] == pytest.approx(0.4)
    assert got["n/overall"] == 5 and got["unparseable_rate"] == pytest.approx(0.2)
    assert got["not_evaluated/overall"] == 0.0
    # two "ranks", the second padded with a repeated row marked valid=False: merged = one process
    rank0, rank1 = bench.metric(), bench.metric()
    rank0.update(records[:3])
    rank1.update(records[3:] + records[:1], valid=torch.tensor([True, True, False]))
    rank0.merge_state(rank1)
    assert rank0.compute() == single.compute()
    with pytest.raises(Exception, match="not one of"):
        CategoryAccuracy(["STI"]).update([{**records[0], "category": "XX"}])
    table = bench.markdown(got)
    assert re.search(r"^\| STI \| Speaking target identification \| 33\.3 \| 3 \| 0 \|$", table, re.M)
    assert re.search(r"\*\*Mean over categories\*\* \| 44\.4 \|", table) and re.search(r"\*\*Overall\*\* \| 40\.0 \| 5 \|", table)


# ------------------------------------------------------------------------------------ TVQA+
def _tvqa_rows() -> list[dict]:
    return [dict(r) for r in fixtures.TVQA_ITEMS]


TVQA_GOLDEN = [  # item 0 (answer_idx "2" -> C)
    ("<answer>C</answer>", "C", 1.0),
    ("\\boxed{C}", "C", 1.0),
    ("The answer is E. Raj.", "E", 0.0),  # option marker E.
    ("<answer>c</answer>", None, 0.0),  # lower case is not a letter answer
    ("<answer>F</answer>", None, 0.0),  # only A-E count
]


@pytest.mark.parametrize("completion,predicted,score", TVQA_GOLDEN)
def test_tvqa_scorer_golden(tmp_path, completion, predicted, score):
    bench = _bench(TVQAPlus, tmp_path, _tvqa_rows())
    record = bench.score(completion, bench.items[0])
    assert (record["target"], record["predicted"], record["score"]) == ("C", predicted, score)


def test_tvqa_reader_answer_idx_ts_and_subtitles(tmp_path):
    bench = _bench(TVQAPlus, tmp_path, _tvqa_rows())
    assert [i.answer for i in bench.items] == ["C", "A", "E", "B", "D"]  # "2", 0, "4", 1, "3"
    assert [i.category for i in bench.items] == ["who", "what", "where", "why", "how"]
    assert [(i.clip.start_seconds, i.clip.end_seconds) for i in bench.items][:3] == [(5.5, 9.0), (0.0, 4.5), (2.5, 6.0)]
    assert bench.items[0].clip.path == "videos/s01e02_seg02_clip_00.mp4"
    assert "Penny? Are you home?" in bench.items[0].question and "We should go." not in bench.items[0].question
    assert parse_ts("36.78-46.42", "x") == (36.78, 46.42)
    for bad in ([5, 3], "abc", [1], None):
        with pytest.raises(GraspFormatError, match="'ts'"):
            parse_ts(bad, "x")


def test_tvqa_decodes_only_the_ts_window(processor, monkeypatch):
    """Through the DataModule's dataset: the frames handed to the processor are those of ``ts`` only."""
    import grasp_lightning.datamodule as dm
    from grasp_lightning.data.datamodule_config import ErrorConfig, PromptConfig, VideoConfig
    from grasp_lightning.datamodule import GraspDataset

    bench = TVQAPlus(str(ASSETS / "tvqa_plus" / "tvqa_plus_val.json"))
    bench.load()
    seen, real = [], dm.decode_clip

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(dm, "decode_clip", spy)
    dataset = GraspDataset(bench.items, bench.store(), processor, VideoConfig(fps=2.0, max_frames=16, max_pixels=4096),
                           PromptConfig(system_prompt=bench.system_prompt, max_prompt_tokens=None, max_target_tokens=None),
                           ErrorConfig(), with_target=False)
    for index, frames in ((0, 7), (4, 8)):  # ts [5.5, 9.0] and [8.0, 12.0] at 2 fps
        assert dataset[index].example is not None
        item, clip = bench.items[index], seen[-1]
        assert clip.timestamps[0] == pytest.approx(item.clip.start_seconds)
        assert clip.timestamps[-1] < item.clip.end_seconds and len(clip.timestamps) == frames
        levels = clip.frames[:, 10, 10, 0].astype(float)  # grey level 10 + 10 t of the fixture clip
        assert np.allclose(levels, [fixtures.tvqa_level(t) for t in clip.timestamps], atol=4)


# ------------------------------------------------------------------------------------ HumanSense
HS_GOLDEN = [  # (item index in fixtures.HUMANSENSE_ITEMS, completion, predicted, score)
    (0, "<answer>A</answer>", "A", 1.0),  # single choice, 2 options, answer A
    (0, "<answer>A. Waving</answer>", "A", 1.0),
    (0, "B", "B", 0.0),
    (1, "<answer>C</answer>", "C", 1.0),  # 5 options, answer C
    (1, "<answer>E</answer>", "E", 0.0),
    (2, "<answer>A, C</answer>", "AC", 1.0),  # multiple answers, target AC: exact set
    (2, "<answer>AC</answer>", "AC", 1.0),
    (2, "<answer>C and A</answer>", "AC", 1.0),
    (2, "A, C", "AC", 1.0),  # a bare list of letters
    (2, "<answer>A</answer>", "A", 0.5),  # strict subset
    (2, "<answer>A, B</answer>", "AB", 0.0),  # a wrong letter
    (2, "<answer>ABCD</answer>", "ABCD", 0.0),
    (2, "I think A", None, 0.0),  # no block and not a bare list
    (3, "<answer>B</answer>", "B", 1.0),  # multiple-answer item with one answer
    (4, "<answer>3</answer>", "3", 1.0),  # number, target 3
    (4, "<answer>three</answer>", "3", 1.0),
    (4, "<answer>There are 4 people</answer>", "4", 0.0),
    (4, "3 people", "3", 1.0),
    (4, "I count 3", None, 0.0),
    (5, "<answer>0</answer>", "0", 1.0),  # target given as the integer 0
    (6, "<answer>Yes.</answer>", "yes", 1.0),  # yes/no, target Yes
    (6, "<answer>I think yes</answer>", "yes", 1.0),
    (6, "No, nobody smiles.", "no", 0.0),
    (6, "maybe", None, 0.0),
]


@pytest.fixture(scope="module")
def humansense_items(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hs")
    (tmp / "humansense.json").write_text(json.dumps(fixtures.humansense_rows()), encoding="utf-8")
    bench = HumanSense(str(tmp / "humansense.json"))
    bench.load(audio_unavailable=None)  # all 9 items, to score each
    return bench


@pytest.mark.parametrize("index,completion,predicted,score", HS_GOLDEN)
def test_humansense_scorer_golden(humansense_items, index, completion, predicted, score):
    record = humansense_items.score(completion, humansense_items.items[index])
    assert (record["predicted"], record["score"]) == (predicted, score)


def test_humansense_patterns_targets_and_partial_credit(humansense_items):
    items = humansense_items.items
    assert [i.format for i in items] == ["mcq", "mcq", "mcq_multi", "mcq_multi", "number", "number", "yes_no", "mcq",
                                         "mcq"]
    assert [i.answer for i in items[:7]] == ["A", "C", "AC", "B", "3", "0", "yes"]
    assert pattern_of("Multiple-choice question (select one answer choice)", "x") == "mcq"
    assert pattern_of("Multiple-choice question (select one or more answer choices)", "x") == "mcq_multi"
    assert pattern_of("Question and answer (Arabic numerals)", "x") == "number"
    assert pattern_of("Judgment question (Yes or No)", "x") == "yes_no"
    with pytest.raises(GraspFormatError, match="question_pattern"):
        pattern_of("Essay", "x")
    assert (multi_score("AC", "AC"), multi_score("C", "AC"), multi_score("ACD", "AC"), multi_score(None, "AC")) == \
        (1.0, 0.5, 0.0, 0.0)
    metric = humansense_items.metric()
    texts = {2: "<answer>A</answer>", 3: "<answer>B</answer>", 6: "<answer>no</answer>", 4: "<answer>3</answer>"}
    metric.update([humansense_items.score(t, items[i]) for i, t in texts.items()])
    got = metric.compute()
    # Expression_Recognition: 0.5 (subset) + 0 (no) over 2; Action_Recognition 1/1; Person_Counting 1/1
    assert got["acc/Expression_Recognition"] == 0.25 and got["acc/Action_Recognition"] == 1.0
    assert got["acc/mean"] == pytest.approx(0.75) and got["acc/overall"] == pytest.approx(2.5 / 4)


def test_humansense_audio_items_are_not_evaluated_never_wrong(tmp_path):
    path = tmp_path / "hs.json"
    path.write_text(json.dumps(fixtures.humansense_rows()), encoding="utf-8")
    bench = HumanSense(str(path))
    bench.load(audio_unavailable=NO_AUDIO)
    assert len(bench.items) == 7 and bench.not_evaluated == {"Talkingperson_Recognition": 1, "Emo_Strategy": 1}
    metric = bench.metric()
    metric.update([bench.score("<answer>A</answer>", item) for item in bench.items])
    got = bench.compute(metric)
    assert got["n/overall"] == 7 and got["not_evaluated/overall"] == 2 and got["not_evaluated/Emo_Strategy"] == 1
    assert math.isnan(got["acc/Emo_Strategy"]) and got["n/Emo_Strategy"] == 0  # not counted as wrong
    assert "Not evaluated: 2 items (they need audio" in bench.markdown(got)
    with_asr = HumanSense(str(path), asr=True)  # the transcript stands in for the audio (HumanSense's ASR setting)
    with_asr.load(audio_unavailable=NO_AUDIO)
    assert len(with_asr.items) == 9 and "ASR" in with_asr.items[7].question
    audio_only = HumanSense(str(path))
    rows = fixtures.humansense_rows()
    rows[0]["video_path"] = "audio/a.wav"
    path.write_text(json.dumps(rows), encoding="utf-8")
    audio_only.load(audio_unavailable=NO_AUDIO)
    assert audio_only.not_evaluated["Gesture_Recognition"] == 1


def test_decode_audio_of_a_generated_mp4_and_processor_check(processor):
    data = fixtures.encode_av_mp4(fixtures.grey_frames(1.0, 4.0), 4.0, audio=fixtures.tone(1.0, hz=440.0))
    samples = decode_audio(data, sample_rate=16000)
    assert samples.dtype == np.float32 and abs(len(samples) - 16000) <= 1100  # AAC adds at most a frame
    spectrum = np.abs(np.fft.rfft(samples[2000:14000]))
    assert np.argmax(spectrum) * 16000 / 12000 == pytest.approx(440.0, abs=2)
    assert 0.4 < np.abs(samples[2000:14000]).max() < 0.6
    assert len(decode_audio(data, start_seconds=0.25, end_seconds=0.75)) == 8000
    with pytest.raises(ClipDecodeError, match="no audio stream"):
        decode_audio(fixtures.encode_av_mp4(fixtures.grey_frames(1.0, 4.0), 4.0))
    assert processor_accepts_audio(processor) is False

    class OmniLike:
        feature_extractor = object()

    assert processor_accepts_audio(OmniLike()) is True


# ------------------------------------------------------------------------------------ fixtures, GRASP plugin
def test_shipped_fixtures_match_the_generator_and_read(tmp_path):
    made = fixtures.write_fixtures(tmp_path)
    for name in sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json")):
        assert json.loads((ASSETS / name).read_text()) == json.loads((tmp_path / name).read_text()), name
    assert sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file()) < 300_000
    counts = {}
    for cls, key in ((MMSI, "mmsi"), (OnlineMMSI, "online_mmsi"), (TVQAPlus, "tvqa_plus"), (HumanSense, "humansense")):
        bench = cls(str(made[key]))
        bench.load(audio_unavailable=NO_AUDIO)
        counts[key] = (len(bench.items), sum(bench.not_evaluated.values()), bench.categories[:3])
        assert bench.store().open(bench.items[0].clip.path)[4:8] == b"ftyp"
    assert counts == {"mmsi": (6, 0, ["STI", "PCR", "MPP"]), "online_mmsi": (6, 0, ["STI", "PCR", "MPP"]),
                      "tvqa_plus": (5, 0, ["what", "who", "where"]),
                      "humansense": (7, 2, ["Action_Recognition", "Emo_Strategy", "Expression_Recognition"])}


def test_grasp_bench_suite_reuses_bench_and_reports(tmp_path):
    from grasp_lightning.evaluation.grasp_score import score_completion
    from grasp_lightning.evaluation.protocol import make_protocol, released_report
    from grasp_lightning.evaluation.reports import markdown_table

    bench = GraspBench(str(SAMPLE / "test" / "grasp_bench.tar"))
    bench.load()
    assert len(bench.items) == 32 and bench.top_level
    item = bench.items[0]
    text = f"<think>Person 0 looks.</think><answer>{item.answer}</answer>"
    assert bench.score(text, item) == score_completion(text, item)
    metric = bench.metric()
    metric.update_from_records([bench.score(text, item)])
    metrics = bench.compute(metric)
    assert metrics["acc/overall"] == 1.0
    assert bench.markdown(metrics) == markdown_table(metric.compute())
    assert bench.log_values(metrics)["val/acc/overall"] == 1.0
    assert bench.log_values(metrics)[f"val_category/{item.category}"] == 1.0
    report = bench.report(metrics, ["record"], label="mine")
    assert report.top_level and report.section == {"metrics": metrics, "items": ["record"]}
    assert report.files == {"table.md": markdown_table(metrics, label="mine") + "\n"}
    assert report.texts == {"bench/table": markdown_table(metrics, label="mine")}
    assert list(bench.figures(metrics, tmp_path)) == ["bench/category_accuracy"] and (tmp_path / "categories.png").is_file()
    assert bench.summary(metrics) is None and bench.encoder(None) is None
    released = make_protocol("released")
    bench.use_protocol(released)  # what the DataModule hands over from model.evaluation.protocol
    assert bench.score("<answer>Z</answer>", item) == released.score("<answer>Z</answer>", item)
    assert bench.summary(metrics) == released_report(metrics)
    assert bench.report(metrics, []).files["report_released.txt"] == released_report(metrics).strip("\n") + "\n"
    other = GraspBench(str(SAMPLE / "test" / "grasp_bench.tar"), name="grasp_copy")
    assert not other.top_level and other.log_values(metrics)["val/grasp_copy/acc/overall"] == 1.0
    assert other.report(metrics, []).section["table"] == "table_grasp_copy.md"


def test_read_sections_reads_the_suites_key_and_no_other(tmp_path):
    """The other suites' sections are read from "suites" only: a "benchmarks" key is not a section."""
    mmsi = {"title": "MMSI", "metrics": {"acc/overall": None, "n/overall": 0.0}, "items": [], "table": "t.md"}
    other, new = tmp_path / "other.json", tmp_path / "new.json"
    other.write_text(json.dumps({"meta": {}, "metrics": {"acc/overall": 0.5}, "items": [], "benchmarks": {"mmsi": mmsi}}))
    new.write_text(json.dumps({"meta": {}, "suites": {"mmsi": mmsi}}))
    sections = read_sections(new)
    assert sections["mmsi"]["title"] == "MMSI" and math.isnan(sections["mmsi"]["metrics"]["acc/overall"])
    assert list(read_sections(other)) == ["grasp_bench"] and list(sections) == ["mmsi"]
