"""Tests of grasp_lightning.evaluation.grasp_score: a hand-scored golden bench over 2 simulated and 2 real DDP ranks."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from grasp_lightning.data.records import CATEGORIES, ClipRef, GraspItem, SocialEvent
from grasp_lightning.errors import GraspDataError
from grasp_lightning.evaluation.grasp_score import BenchAccuracy, score_completion
from tests.helpers import GOLDEN, free_port, golden_items, golden_records, spawn_ranks

N = len(GOLDEN)  # 21: odd, so a 2-rank DistributedSampler pads rank 1 with one repeated item

# Hand-computed expectations (correct / items).
# Categories: T1 {0 ok, 1 x, 17 ok} 2/3; T2 1/1; T3 1/1; T4 {4 x, 20 ok} 1/2; T5 1/1; T6 1/1;
# G1 1/1; G2 {8 x, 18 ok} 1/2; G3 0/1; G4 1/1; G5 0/1; G6 1/1; J1 {13 ok, 19 x} 1/2; J2 0/1; J3 0/1; J4 1/1.
CAT_COUNTS = {
    "T1": (2, 3), "T2": (1, 1), "T3": (1, 1), "T4": (1, 2), "T5": (1, 1), "T6": (1, 1),
    "G1": (1, 1), "G2": (1, 2), "G3": (0, 1), "G4": (1, 1), "G5": (0, 1), "G6": (1, 1),
    "J1": (1, 2), "J2": (0, 1), "J3": (0, 1), "J4": (1, 1),
}
EXPECTED: dict[str, float] = {f"acc/{c}": k / n for c, (k, n) in CAT_COUNTS.items()}
EXPECTED.update({f"n/{c}": float(n) for c, (_, n) in CAT_COUNTS.items()})
EXPECTED.update({
    # gaze: (2+1+1+1+1+1) / (3+1+1+2+1+1) = 7/9; macro (2/3+1+1+1/2+1+1)/6 = (31/6)/6 = 31/36
    "acc/gaze": 7 / 9, "acc_macro/gaze": 31 / 36, "n/gaze": 9.0,
    # gesture: (1+1+0+1+0+1) / (1+2+1+1+1+1) = 4/7; macro (1+1/2+0+1+0+1)/6 = 7/12
    "acc/gesture": 4 / 7, "acc_macro/gesture": 7 / 12, "n/gesture": 7.0,
    # joint: (1+0+0+1) / (2+1+1+1) = 2/5; macro (1/2+0+0+1)/4 = 3/8
    "acc/joint": 2 / 5, "acc_macro/joint": 3 / 8, "n/joint": 5.0,
    # easy {0 ok,1 x,2 ok,7 ok,8 x,20 ok} 4/6; medium {3 ok,4 x,9 x,10 ok,13 ok,14 x,17 ok} 4/7;
    # hard {5 ok,6 ok,11 x,12 ok,15 x,16 ok,19 x} 4/7; item 18 has no difficulty.
    "acc/easy": 4 / 6, "acc/medium": 4 / 7, "acc/hard": 4 / 7,
    "n/easy": 6.0, "n/medium": 7.0, "n/hard": 7.0,
    # overall (7+4+2)/21 = 13/21; macro (31/6 + 7/2 + 3/2)/16 = (61/6)/16 = 61/96
    "acc/overall": 13 / 21, "acc_macro/overall": 61 / 96, "n/overall": 21.0,
    # unparseable: items 4, 8, 14, 15 -> 4/21
    "unparseable_rate": 4 / 21,
    # grounding-eligible (gt non-empty): 0,1,2,3,5,6,7,9,11,12,13,14,16,17,19 = 15 items; of these
    # 3,7,12,14 name nobody -> 11 naming items with precisions 1,1/2,1,1/4,1,1,1,1,1/2,1,1/4 (sum 8.5)
    "grounding/precision": 8.5 / 11, "grounding/named_rate": 11 / 15, "grounding/n": 11.0,
    # of the 11 naming items only item 5 ({0,1,2,3}) covers all it shows ({0,1,2} ∪ gt {1}) -> 1/11
    "grounding/enumeration_rate": 1 / 11,
    # items 0, 3, 13 with spans: (1 + 0 + 0.5) / 3
    "grounding/temporal_iou": 1.5 / 3,
})
_MACRO = {k for k in EXPECTED if k.startswith("acc_macro/")}


def rank_batches(rank: int, world: int = 2, batch_size: int = 4) -> list[tuple[list[dict], torch.Tensor]]:
    """Batches of one rank as a DistributedSampler (no shuffle, padding) and a DataLoader would give.

    Rank r's i-th sample sits at position r + world * i of the padded global order; positions >= N
    repeat items from the start and are marked invalid.
    """
    records = golden_records()
    indices = list(DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=False))
    valid = [rank + world * i < N for i in range(len(indices))]
    return [([records[j] for j in indices[s:s + batch_size]], torch.tensor(valid[s:s + batch_size]))
            for s in range(0, len(indices), batch_size)]


def assert_expected(metrics: dict[str, float]) -> None:
    assert set(EXPECTED) <= set(metrics)
    for key, value in EXPECTED.items():
        if key in _MACRO:  # a mean of float ratios: equal up to summation order
            assert metrics[key] == pytest.approx(value, abs=1e-12), key
        else:  # count ratios: the same IEEE division as the hand value, so exactly equal
            assert metrics[key] == value, key


def test_score_completion_records() -> None:
    records = golden_records()
    assert [r["predicted"] for r in records] == [
        "B", "C", "C", "D", None, "B", "A", "C", None, "B", "D", "B", "A", "B", None, None, "A", "B", "A", "D", "A"]
    r1 = records[1]
    assert r1 == {"uid": "clip01", "category": "T1", "difficulty": "easy", "target": "A", "predicted": "C",
                  "correct": False, "participants_named": [1, 3], "participants_gt": [1, 2], "precision": 0.5,
                  "participants_visible": [0, 1, 2], "temporal_iou": None, "completion": GOLDEN[1][3]}
    assert [(n, r["temporal_iou"]) for n, r in enumerate(records) if r["temporal_iou"] is not None] == [
        (0, 1.0), (3, 0.0), (13, 0.5)]
    assert records[19]["participants_visible"] == [0, 1, 2, 3]  # options {0,1,2} ∪ gt {3}
    assert records[14]["category"] == "J2"  # C2 is the bench's spelling of J2
    assert records[3]["precision"] is None and records[4]["precision"] is None
    json.dumps(records)  # JSON-ready


def test_golden_two_simulated_ranks_with_padding() -> None:
    ranks = [BenchAccuracy(), BenchAccuracy()]
    sizes = []
    for rank, metric in enumerate(ranks):
        batches = rank_batches(rank)
        sizes.append([len(b) for b, _ in batches])
        for records, valid in batches:
            metric.update_from_records(records, valid)
    assert sizes == [[4, 4, 3], [4, 4, 3]]  # uneven last batch; rank 1's last row is padding
    assert rank_batches(1)[-1][1].tolist() == [True, True, False]
    merged = copy.deepcopy(ranks[0])  # what DDP sync does: sum every state over ranks
    merged.merge_state(ranks[1])
    assert_expected(merged.compute())
    # Rank 0 alone: its own items only (indices 0, 2, ..., 20).
    assert ranks[0].compute()["n/overall"] == 11.0
    assert ranks[1].compute()["n/overall"] == 10.0  # padding not counted


def test_single_process_equals_merged_and_valid_none() -> None:
    metric = BenchAccuracy()
    metric.update_from_records(golden_records())
    assert_expected(metric.compute())


def test_padding_would_change_result() -> None:
    metric = BenchAccuracy()
    records = golden_records()
    metric.update_from_records(records + records[:1], torch.tensor([True] * N + [False]))
    assert metric.compute()["n/T1"] == 3.0
    metric.update_from_records(records[:1], torch.tensor([True]))
    assert metric.compute()["n/T1"] == 4.0


def test_empty_categories_are_nan_and_keys_stable() -> None:
    metric = BenchAccuracy()
    metric.update(["A"], ["A"], ["T1"], ["easy"], [None], [frozenset()], None)
    out = metric.compute()
    assert out["acc/T1"] == 1.0 and math.isnan(out["acc/G1"]) and out["n/G1"] == 0.0
    assert math.isnan(out["acc/gesture"]) and math.isnan(out["acc_macro/joint"])
    assert out["acc_macro/gaze"] == 1.0 and out["acc_macro/overall"] == 1.0
    assert math.isnan(out["grounding/precision"]) and math.isnan(out["grounding/named_rate"])
    assert math.isnan(out["grounding/enumeration_rate"]) and math.isnan(out["grounding/temporal_iou"])
    empty = BenchAccuracy()
    with pytest.warns(UserWarning):
        keys = set(empty.compute())
    assert keys == set(out)
    assert {f"acc/{c}" for c in CATEGORIES} <= keys


def _shown_item(uid: str, gt: tuple[int, ...], span: tuple[float, float] | None = None) -> GraspItem:
    """A T1 item whose question and options show Person 0, 1 and 2 (and 3 through the question)."""
    return GraspItem(uid=uid, origin=f"hand:{uid}", clip=ClipRef(f"video/{uid}.mp4"),
                     question="Whom does Person 3 look at?\nA) Person 0\nB) Person 1\nC) Person 2\nD) No one",
                     options=("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"), answer="A", category="T1",
                     difficulty="easy", events=(SocialEvent("gaze", gt, span=span),))


def test_enumeration_rate_and_temporal_iou_by_hand() -> None:
    """3 naming items, one enumerating -> 1/3; temporal IoU: the mean over the 2 items with spans."""
    items = [_shown_item("a", (3, 0), (1.0, 3.0)), _shown_item("b", (3, 1), (0.0, 2.0)), _shown_item("c", (3, 2)),
             _shown_item("d", (3, 0))]
    texts = [
        "<think>Person 3 looks at Person 0 from 1s to 3s.</think><answer>A</answer>",  # {0,3}; exact span: 1
        # {0,1,2,3}: everyone shown -> enumerates; (0,1) vs (0,2) IoU 1/2, (5,6) 0 -> 1/2 / max(1, 2) = 1/4
        "<think>P0, P1, P2 and P3 from 0s to 1s, from 5s to 6s.</think><answer>B</answer>",
        "<think>Person 3 looks at Person 2.</think><answer>C</answer>",  # {2,3}; no span in gt
        "<answer>A</answer>",  # names nobody: not in the rate's denominator
    ]
    records = [score_completion(t, it) for t, it in zip(texts, items)]
    assert [r["participants_visible"] for r in records] == [[0, 1, 2, 3]] * 4
    assert [r["temporal_iou"] for r in records] == [1.0, 0.25, None, None]
    metric = BenchAccuracy()
    metric.update_from_records(records)
    out = metric.compute()
    assert (out["grounding/n"], out["grounding/enumeration_rate"], out["grounding/temporal_iou"]) == (3.0, 1 / 3, 0.625)
    # a results.json written before these keys existed: counted in neither metric, the rest unchanged
    old = [{k: v for k, v in r.items() if k not in ("participants_visible", "temporal_iou")} for r in records]
    before = BenchAccuracy()
    before.update_from_records(old)
    legacy = before.compute()
    assert math.isnan(legacy["grounding/enumeration_rate"]) and math.isnan(legacy["grounding/temporal_iou"])
    assert legacy["grounding/precision"] == out["grounding/precision"] and set(legacy) == set(out)


def test_the_new_grounding_keys_are_logged_like_precision() -> None:
    """``val/grounding/enumeration_rate`` and ``val/grounding/temporal_iou`` beside ``val/grounding/precision``;
    a NaN (undefined) value is left out, as for every logged key."""
    from grasp_lightning.evaluation.grasp_bench import GraspBench

    metric = BenchAccuracy()
    metric.update_from_records(golden_records())
    logged = GraspBench("unused/grasp_bench.tar").log_values(metric.compute())
    assert (logged["val/grounding/precision"], logged["val/grounding/enumeration_rate"],
            logged["val/grounding/temporal_iou"]) == (8.5 / 11, 1 / 11, 0.5)
    other = GraspBench("unused/grasp_bench.tar", name="copy")
    assert other.log_values(metric.compute())["val/copy/grounding/temporal_iou"] == 0.5
    without_spans = BenchAccuracy()
    without_spans.update(["A"], ["A"], ["T1"], ["easy"], [frozenset({0, 1})], [frozenset({0})], None, None,
                         [frozenset({0, 1})], [None])
    logged = GraspBench("unused/grasp_bench.tar").log_values(without_spans.compute())
    assert logged["val/grounding/enumeration_rate"] == 1.0 and "val/grounding/temporal_iou" not in logged


def test_enumeration_needs_two_people_shown() -> None:
    """An item showing one person cannot be enumerated: naming that one person is just right."""
    metric = BenchAccuracy()
    metric.update(["A"], ["A"], ["T1"], ["easy"], [frozenset({0})], [frozenset({0})], None, None,
                  [frozenset({0})], [None])
    assert metric.compute()["grounding/enumeration_rate"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"targets": ["A", "B"]}, ValueError),
        ({"valid": torch.tensor([True, False])}, ValueError),
        ({"categories": ["X9"]}, GraspDataError),
        ({"difficulties": ["trivial"]}, GraspDataError),
        ({"targets": ["Person 0 looks at Person 1."]}, GraspDataError),
    ],
)
def test_update_rejects_bad_input(kwargs: dict, error: type[Exception]) -> None:
    args = {"predictions": ["A"], "targets": ["A"], "categories": ["T1"], "difficulties": ["easy"],
            "named": [frozenset({0})], "gt": [frozenset({0})], "valid": None}
    args.update(kwargs)
    with pytest.raises(error):
        BenchAccuracy().update(**args)


def test_score_completion_rejects_open_ended() -> None:
    item = golden_items()[0].replace(answer="Person 0 looks at Person 2 first.", format="open_ended")
    with pytest.raises(GraspDataError, match="golden:0"):
        score_completion("<answer>A</answer>", item)


def test_caller_verdicts_count_open_ended_items() -> None:
    """A protocol that scores open-ended items (the released one) passes its own verdicts: counted as
    given, no letter check; without verdicts a non-letter target is still refused."""
    from grasp_lightning.evaluation.grasp_score import make_record

    item = golden_items()[0].replace(answer="Person 0 looks at Person 2 first.", format="open_ended", options=())
    records = [make_record("<think>P0</think>Person 0 looks at Person 2 first.", item, target=item.answer,
                           predicted="Person 0 looks at Person 2 first.", correct=True),
               make_record("no", item, target=item.answer, predicted="no", correct=False)]
    metric = BenchAccuracy()
    metric.update_from_records(records)
    out = metric.compute()
    cat = records[0]["category"]
    assert (out[f"n/{cat}"], out[f"acc/{cat}"], out["acc/overall"], out["unparseable_rate"]) == (2.0, 0.5, 0.5, 0.0)
    with pytest.raises(GraspDataError, match="batch row 0"):
        BenchAccuracy().update(["A"], [item.answer], [cat], [None], [None], [frozenset()])


def _ddp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One DDP rank: score its shard of the golden bench, compute (syncs over gloo), save the dict."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        metric = BenchAccuracy()
        for records, valid in rank_batches(rank, world):
            metric.update_from_records(records, valid)
        result = metric.compute()
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_golden_real_ddp_gloo(tmp_path: Path) -> None:
    spawn_ranks(_ddp_worker, (2, free_port(), str(tmp_path)), nprocs=2, timeout=120)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    assert_expected(results[0])
