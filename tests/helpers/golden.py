"""The hand-scored golden GRASP-Bench: 21 completions with their expected extraction and grounding."""

from __future__ import annotations

from grasp_lightning.data.records import ClipRef, GraspItem, SocialEvent
from grasp_lightning.evaluation.grasp_score import score_completion

# (category, difficulty, target, completion, gt participants). Comments: extraction route ->
# predicted letter, correct?, named people, precision |named ∩ gt| / |named|. Every item shows
# Person 0, 1 and 2 (its options) plus its gt; items 0, 3 and 13 have a gt event span (SPANS).
GOLDEN: list[tuple[str, str | None, str, str, tuple[int, ...]]] = [
    ("T1", "easy", "B", "<think>Person 0 looks at Person 2 from 1s to 2s.</think><answer>B</answer>", (0, 2)),  # 0 ok 1
    ("T1", "easy", "A", "<think>Person 1 looks at P3.</think><answer>C</answer>", (1, 2)),  # 1 answer C x {1,3} 1/2
    ("T2", "easy", "C", "<think>Mutual gaze between Person 0 and Person 1.</think>\\boxed{C}", (0, 1, 2, 3)),  # 2 boxed ok 1
    ("T3", "medium", "D", "D because the glance lasts longest.", (0,)),  # 3 leading D ok; names nobody
    ("T4", "medium", "A", "no idea", ()),  # 4 unparseable; no gt
    ("T5", "hard", "B", "<think>P0 follows P1, then Person 2 and Person 3 turn.</think><answer>(B)</answer>", (1,)),  # 5 ok 1/4
    ("T6", "hard", "A", "After watching: A) Person 0 leads the group.", (0, 4)),  # 6 marker A) ok {0} 1
    ("G1", "easy", "C", "<answer>C</answer>", (2,)),  # 7 answer ok; names nobody
    ("G2", "easy", "B", "%%%% garbage ####", ()),  # 8 unparseable; no gt
    ("G3", "medium", "A", "<think>Person 1 points first.</think><answer>B</answer>", (1,)),  # 9 x {1} 1
    ("G4", "medium", "D", "\\boxed{D}", ()),  # 10 boxed ok; no gt
    ("G5", "hard", "C", "B. Person 2 gives the cup.", (2, 3)),  # 11 marker B. x {2} 1
    ("G6", "hard", "A", "A", (0,)),  # 12 leading A ok; names nobody
    ("J1", "medium", "B", "<think>Person 0 looks while Person 1 points, from 2s to 4s.</think><answer>B</answer>",
     (0, 1)),  # 13 ok {0,1} 1
    ("C2", "medium", "C", "", (0, 1)),  # 14 bench spelling C2 = J2; empty: unparseable; names nobody
    ("J3", "hard", "D", "<answer>maybe</answer>", ()),  # 15 unparseable; no gt
    ("J4", "hard", "A", "<think>P2 reacts to P0.</think><answer>A</answer>", (0, 1)),  # 16 ok {0,2} 1/2
    ("T1", "medium", "B", "B) Person 0", (0, 1)),  # 17 marker B) ok {0} 1 (non-canonical difficulty)
    ("G2", None, "A", "<answer>A</answer>", ()),  # 18 ok; no difficulty; no gt
    ("J1", "hard", "C", "<think>Person 3 and Person 4 and Person 5 and Person 6.</think><answer>D</answer>", (3,)),  # 19 x 1/4
    ("T4", "easy", "A", "<answer>A</answer>", ()),  # 20 ok; no gt
]

# gt event spans (seconds): item 0 names (1, 2) exactly -> 1; item 3 names none -> 0; item 13 names
# (2, 4) against (0, 4) -> 2/4.
SPANS: dict[int, tuple[float, float]] = {0: (1.0, 2.0), 3: (0.5, 1.5), 13: (0.0, 4.0)}


def golden_items() -> list[GraspItem]:
    """The golden bench as GraspItems (clip paths are dummies; scoring never opens them)."""
    return [
        GraspItem(uid=f"clip{i:02d}", origin=f"golden:{i}", clip=ClipRef(f"video/clip{i:02d}.mp4"), question="q",
                  options=("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"), answer=target,
                  category=cat, difficulty=diff, events=(SocialEvent("gaze", gt, span=SPANS.get(i)),) if gt else ())
        for i, (cat, diff, target, _, gt) in enumerate(GOLDEN)
    ]


def golden_records() -> list[dict]:
    """The scored records of the hand-scored golden GRASP-Bench (:data:`GOLDEN`)."""
    return [score_completion(row[3], item) for row, item in zip(GOLDEN, golden_items())]
