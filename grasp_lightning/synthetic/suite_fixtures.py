"""Tiny fixtures of MMSI, Online-MMSI, TVQA+ and HumanSense in their real file shapes, with tiny clips.

``python -m grasp_lightning.synthetic.suite_fixtures OUT_DIR`` writes::

    OUT_DIR/werewolf/mmsi_test_{sti,pcr,mpp}.json           MMSI (context on both sides)
    OUT_DIR/werewolf/online_mmsi_test_{sti,pcr,mpp}.json    Online-MMSI (past context only)
    OUT_DIR/werewolf/{MMSI,Online-MMSI}/videos/<clip>.mp4
    OUT_DIR/tvqa_plus/tvqa_plus_val.json + videos/<vid_name>.mp4
    OUT_DIR/humansense/humansense.json + videos/hs_00{0,1}.mp4 (hs_000 has an audio track)

The shipped copy is ``grasp_lightning/assets/eval_suites`` (``configs/eval_suites.yaml``); tests
build their own at run time. Clips are synthetic (players as numbered squares; TVQA+ frames
whose grey level encodes the time, so a test can tell which seconds were decoded); questions are
hand-written, so fixtures test reading and scoring, not a model. The JSON is the same on every
run; mp4 bytes are stable for one encoder build (:data:`grasp_lightning.synthetic.mp4.STABLE`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from grasp_lightning.synthetic.mp4 import STABLE, Mp4Settings, encode_mp4
from grasp_lightning.synthetic.sample.drawing import draw_person

#: Synthetic TVQA+ frame rate (frames per second) and the grey level of the frame shown at second t.
TVQA_FPS = 2.0


def tvqa_level(t: float) -> int:
    """Grey level (0-255) of the TVQA+ fixture frame at ``t`` seconds: 10 + 10 per second."""
    return int(10 + 10 * t)


def werewolf_frames(players: int, speaker: int, seconds: float = 3.0, fps: float = 4.0) -> list[np.ndarray]:
    """Players as numbered squares around a table; the speaker's square blinks white every other frame."""
    frames = []
    w, h = 96, 64
    for i in range(int(seconds * fps)):
        frame = np.full((h, w, 3), 30, np.uint8)
        for p in range(players):
            angle = 2 * math.pi * p / players
            centre = (int(w / 2 + 30 * math.cos(angle)), int(h / 2 + 17 * math.sin(angle)) + 3)
            draw_person(frame, centre, p, size=8)
            if p == speaker and i % 2:
                frame[centre[1] - 1:centre[1] + 2, centre[0] - 1:centre[0] + 2] = 255
        frames.append(frame)
    return frames


def grey_frames(seconds: float, fps: float, level=tvqa_level, size: tuple[int, int] = (48, 64)) -> list[np.ndarray]:
    """Flat frames, frame ``i`` of grey level ``level(i / fps)``."""
    return [np.full((*size, 3), level(i / fps), np.uint8) for i in range(int(round(seconds * fps)))]


#: Settings of the clip with an audio track: the encoder's defaults, one thread, ``+bitexact``
#: (kept as first written: the shipped ``hs_000.mp4`` is compared byte for byte).
AUDIO_CLIP = Mp4Settings(threads=1, bitexact=True)


def encode_av_mp4(frames: list[np.ndarray], fps: float, audio: np.ndarray | None = None,
                  sample_rate: int = 16000) -> bytes:
    """mp4 bytes: H.264 video of ``(H, W, 3)`` uint8 frames (:data:`~grasp_lightning.synthetic.mp4.STABLE`),
    plus an AAC mono track of ``audio`` (float32 samples in [-1, 1] at ``sample_rate``) when given
    (the video then with :data:`AUDIO_CLIP`)."""
    if audio is None:
        return encode_mp4(frames, fps, STABLE)
    return encode_mp4(frames, fps, AUDIO_CLIP, audio=audio, sample_rate=sample_rate)


def tone(seconds: float, hz: float = 440.0, sample_rate: int = 16000) -> np.ndarray:
    """A sine of ``hz`` at amplitude 0.5: ``(seconds * sample_rate,)`` float32."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    return (0.5 * np.sin(2 * math.pi * hz * t)).astype(np.float32)


# ---------------------------------------------------------------------------------------- werewolf
# (dataset, game id, clip, players, transcript [(speaker, text)], points [(task, utterance index, answer, extra)])
_GAMES = [
    ("youtube", "game01", "youtube_game01_clip003", 6,
     [(0, "I think we should vote for P4."), (2, "You have been quiet the whole round."),
      (4, "He is wrong, I am a villager."), (1, "She was defending P4 earlier."), (3, "Let us hear from P5.")],
     [("STI", 1, 4, {}), ("PCR", 2, 0, {"pronoun": "he"}), ("MPP", 0, 4, {"mention": "P4"})]),
    ("ego4d", "game07", "ego4d_game07_clip011", 5,
     [(3, "Can you tell us your role?"), (1, "She is the seer, trust her."), (2, "P0 accused me first."),
      (4, "I agree with P1.")],
     [("STI", 0, 1, {}), ("PCR", 1, 2, {"pronoun": "she"}), ("MPP", 2, 0, {"mention": "P0"})]),
]


def _werewolf_points(online: bool) -> dict[str, list[dict]]:
    """Per task, the items of the GRASP video-LLM form of (Online-)MMSI (shape of its converter)."""
    tasks: dict[str, list[dict]] = {"sti": [], "pcr": [], "mpp": []}
    root = "Online-MMSI/videos" if online else "MMSI/videos"
    for dataset, game, clip, players, transcript, points in _GAMES:
        lines = [f"P{s} {text}" for s, text in transcript]
        for task, idx, answer, extra in points:
            speaker = transcript[idx][0]
            context = lines[max(0, idx - 9):idx + 1] if online else lines[max(0, idx - 5):idx + 6]
            item = {"id": f"{dataset}__{clip}__{task}__w{idx + 1}", "task": task, "clip_name": clip,
                    "video_path": f"{root}/{clip}.mp4", "dataset": dataset, "game_id": game, "speaker": f"P{speaker}",
                    "player_num": players, "utterance": lines[idx], "context": context,
                    "choices": [f"P{i}" for i in range(players)]}
            if task == "STI":
                item["question"] = f"Based on the video, who is P{speaker} talking to?"
            elif task == "PCR":
                item["question"] = (f"In the utterance by P{speaker}, the pronoun '{extra['pronoun']}' refers to "
                                    f"which player?")
            else:
                masked = f"P{speaker} " + transcript[idx][1].replace(extra["mention"], "[MASK]", 1)
                item["utterance_masked"] = masked
                item["question"] = f"In the utterance by P{speaker}: '{masked}', which player does [MASK] refer to?"
            item.update(answer=f"P{answer}", answer_idx=answer)
            tasks[task.lower()].append(item)
    return tasks


# ---------------------------------------------------------------------------------------- TVQA+
TVQA_CLIPS = {"s01e02_seg02_clip_00": 12.0, "s03e10_seg01_clip_07": 8.0}
TVQA_ITEMS = [
    {"answer_idx": "2", "qid": 134094, "ts": [5.5, 9.0], "a1": "Sheldon.", "a0": "Leonard.", "a3": "Howard.",
     "a2": "Penny.", "a4": "Raj.", "q": "Who opens the door after Leonard knocks?", "vid_name": "s01e02_seg02_clip_00",
     "subtitle": [{"start": 4.0, "end": 6.0, "text": "(Leonard:) Penny? Are you home?"},
                  {"start": 10.0, "end": 11.5, "text": "(Sheldon:) We should go."}]},
    {"answer_idx": 0, "qid": 134095, "ts": [0.0, 4.5], "a0": "A pizza box.", "a1": "A laptop.", "a2": "A comic book.",
     "a3": "A coffee mug.", "a4": "A remote control.", "q": "What is Sheldon holding when he sits down?",
     "vid_name": "s01e02_seg02_clip_00"},
    {"answer_idx": "4", "qid": 134096, "ts": "2.5-6.0", "a0": "In the kitchen.", "a1": "In the hallway.",
     "a2": "At the cafeteria.", "a3": "In the car.", "a4": "On the couch.", "q": "Where is Penny sitting?",
     "vid_name": "s03e10_seg01_clip_07", "subtitle": "(Penny:) This couch is so comfortable."},
    {"answer_idx": 1, "qid": 134097, "ts": [1.0, 7.5], "a0": "Because he is tired.", "a1": "Because he lost the game.",
     "a2": "Because Penny left.", "a3": "Because it is late.", "a4": "Because he is hungry.",
     "q": "Why is Raj upset?", "vid_name": "s03e10_seg01_clip_07"},
    {"answer_idx": "3", "qid": 134098, "ts": [8.0, 12.0], "a0": "He runs.", "a1": "He waves.", "a2": "He sits.",
     "a3": "He points at the board.", "a4": "He laughs.", "q": "How does Leonard react to the equation?",
     "vid_name": "s01e02_seg02_clip_00"},
]

# ---------------------------------------------------------------------------------------- HumanSense
_SINGLE = "Multiple-choice question (select one answer choice)"
_MULTI = "Multiple-choice question (select one or more answer choices)"
_NUMBER = "Question and answer (Arabic numerals)"
_JUDGE = "Judgment question (Yes or No)"
HUMANSENSE_ITEMS = [  # (video, question, options, answer, task_type, pattern, asr)
    ("videos/hs_001.mp4", "What gesture does the person on the left make", ["A. Waving", "B. Pointing"], "A",
     "Gesture_Recognition", _SINGLE, ""),
    ("videos/hs_001.mp4", "What is the person in the middle doing",
     ["A. Running", "B. Eating", "C. Standing still", "D. Dancing", "E. Sleeping"], "C", "Action_Recognition",
     _SINGLE, ""),
    ("videos/hs_001.mp4", "Which expressions appear in the video",
     ["A. Smiling", "B. Crying", "C. Frowning", "D. Yawning"], "AC", "Expression_Recognition", _MULTI, ""),
    ("videos/hs_001.mp4", "Which actions does the person on the right perform",
     ["A. Jumping", "B. Clapping", "C. Writing", "D. Swimming"], "B", "Action_Recognition", _MULTI, ""),
    ("videos/hs_001.mp4", "How many people are in the video?", [], "3", "Person_Counting", _NUMBER, ""),
    ("videos/hs_001.mp4", "How many people wear hats?", [], 0, "Person_Counting", _NUMBER, ""),
    ("videos/hs_001.mp4", "Is anyone smiling in the video?", [], "Yes", "Expression_Recognition", _JUDGE, ""),
    ("videos/hs_000.mp4", "Who is talking in the video", ["A. The person on the left", "B. The person on the right"],
     "B", "Talkingperson_Recognition", _SINGLE, "Hi, nice to meet you. How was your trip?"),
    ("videos/hs_000.mp4", "Which response strategy fits the speaker's emotion best",
     ["A. Comfort them", "B. Change the topic", "C. Ignore them"], "A", "Emo_Strategy", _SINGLE,
     "I failed my exam again and I do not know what to do."),
]


def humansense_rows(fps: float = 4.0, seconds: float = 3.0) -> list[dict]:
    """The HumanSense fixture: ``{"video_path", "questions": {...}}`` entries as released."""
    rows = []
    for video, question, options, answer, task, pattern, asr in HUMANSENSE_ITEMS:
        q = {"question": question, "options": options, "answer": answer, "task_type": task,
             "question_pattern": pattern, "full_frame_number": int(seconds * fps), "fps": fps, "asr_en": asr}
        rows.append({"video_path": video, "questions": q})
    return rows


def _dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_fixtures(out: str | Path) -> dict[str, Path]:
    """Write every fixture under ``out``; return name -> annotation path (pattern for (Online-)MMSI)."""
    out = Path(out)
    ww = out / "werewolf"
    for online, prefix, videos in ((False, "mmsi_test", "MMSI/videos"),
                                   (True, "online_mmsi_test", "Online-MMSI/videos")):
        for task, items in _werewolf_points(online).items():
            _dump(ww / f"{prefix}_{task}.json", items)
        for dataset, _, clip, players, transcript, _ in _GAMES:
            (ww / videos).mkdir(parents=True, exist_ok=True)
            (ww / videos / f"{clip}.mp4").write_bytes(encode_av_mp4(werewolf_frames(players, transcript[0][0]), 4.0))
    tv = out / "tvqa_plus"
    _dump(tv / "tvqa_plus_val.json", TVQA_ITEMS)
    (tv / "videos").mkdir(parents=True, exist_ok=True)
    for vid, seconds in TVQA_CLIPS.items():
        (tv / "videos" / f"{vid}.mp4").write_bytes(encode_av_mp4(grey_frames(seconds, TVQA_FPS), TVQA_FPS))
    hs = out / "humansense"
    _dump(hs / "humansense.json", humansense_rows())
    (hs / "videos").mkdir(parents=True, exist_ok=True)
    people = werewolf_frames(3, 1, seconds=3.0, fps=4.0)
    (hs / "videos" / "hs_000.mp4").write_bytes(encode_av_mp4(people, 4.0, audio=tone(3.0)))
    (hs / "videos" / "hs_001.mp4").write_bytes(encode_av_mp4(people, 4.0))
    return {"mmsi": ww / "mmsi_test_*.json", "online_mmsi": ww / "online_mmsi_test_*.json",
            "tvqa_plus": tv / "tvqa_plus_val.json", "humansense": hs / "humansense.json"}


def main(argv: list[str] | None = None) -> None:
    """``python -m grasp_lightning.synthetic.suite_fixtures OUT_DIR``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m grasp_lightning.synthetic.suite_fixtures OUT_DIR")
    for name, path in write_fixtures(args[0]).items():
        sys.stdout.write(f"{name}: {path}\n")


if __name__ == "__main__":
    main()
