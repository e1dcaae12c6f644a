"""``chat``: one clip, a question (or many from stdin), the answer ``predict`` gives for the same row; a missing,
unreadable or over-budget clip is one line naming the file (docs/chat.md)."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from grasp_lightning.commands.chat import BAD_INPUT, Chat, main
from grasp_lightning.commands.config import load_run
from tests.helpers import REPO, SAMPLE, run_cli

pytestmark = pytest.mark.slow
RECIPE = ["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml"]
SHORT = ["--model.evaluation.max_new_tokens=24"]
QUESTION = "Who is Person 0 looking at?"
MEMBER = "werewolf/video/game00.round1_qa0000.mp4"  # a clip of the bundled sample data


@pytest.fixture
def clip(tmp_path) -> Path:
    """The sample clip, extracted from its shard (as docs/chat.md's first command does)."""
    with tarfile.open(SAMPLE / "train" / "videos" / "werewolf_part000.tar") as tar:
        data = tar.extractfile(MEMBER).read()
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    return path


class Terminal(io.StringIO):
    """A stdout that says it is a terminal (chat streams its tokens there)."""

    def isatty(self) -> bool:
        return True


def chat(args: list[str], stdin: str = "", stdout: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = stdout or io.StringIO(), io.StringIO()
    status = main([*RECIPE, *args], stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_chat_answers_the_sample_clip_as_predict_answers_its_row(tmp_path, clip, in_repo) -> None:
    """The clip and question as a generic QA row through ``predict``: the same prompt tokens and the same
    greedy completion; on a terminal the streamed tokens print the same text."""
    (tmp_path / "qa.jsonl").write_text(json.dumps({"video": "clip.mp4", "question": QUESTION}) + "\n")
    out = tmp_path / "predictions.jsonl"
    run_cli(["predict", *RECIPE, "--config", "configs/predict.yaml", f"--data.source.root={tmp_path}",
             "--data.source.predict_file=qa.jsonl", f"--trainer.callbacks.init_args.output={out}", *SHORT], tmp_path)
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]

    status, printed, err = chat([f"--clip={clip}", f"--question={QUESTION}", *SHORT])
    assert status == 0 and err == ""
    assert printed == record["completion"] + "\n" and record["completion_tokens"] == 24
    status, streamed, _ = chat([f"--clip={clip}", f"--question={QUESTION}", *SHORT], stdout=Terminal())
    assert status == 0 and streamed == printed

    session = Chat(load_run([*RECIPE, *SHORT]), clip, 2.0, tmp_path)
    batch = session.encode(QUESTION)
    assert int(batch.prompt_lengths[0]) == record["prompt_tokens"] > 100  # video tokens included
    assert batch.inputs["video_grid_thw"].tolist() == [[4, 6, 10]]  # 8 frames (4 pairs) of 6x10 patches


def test_interactive_chat_answers_each_piped_question_about_the_clip(tmp_path, clip, in_repo) -> None:
    """No --question: questions from stdin until an empty line, each echoed then answered as alone."""
    asked = ["Who is Person 0 looking at?", "Which person points at Person 2?"]
    status, printed, err = chat([f"--clip={clip}", *SHORT], stdin="\n".join(asked) + "\n\nnot asked\n")
    assert status == 0 and err == ""
    alone = [chat([f"--clip={clip}", f"--question={q}", *SHORT])[1] for q in asked]
    assert printed == "".join(f"> {q}\n{answer}" for q, answer in zip(asked, alone))
    assert "not asked" not in printed


def test_chat_takes_an_image_and_a_folder_of_frames(tmp_path, clip, in_repo) -> None:
    """An image is the row's ``image``; a folder of frames is encoded into an mp4 at --frames_fps."""
    import av
    from PIL import Image

    frames = tmp_path / "frames"
    frames.mkdir()
    with av.open(str(clip)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            frame.to_image().save(frames / f"{i:04d}.png")
    n = len(list(frames.iterdir()))
    Image.open(frames / "0000.png").save(tmp_path / "still.jpg")
    for given, grid in ((tmp_path / "still.jpg", "image_grid_thw"), (frames, "video_grid_thw")):
        session = Chat(load_run([*RECIPE, *SHORT]), given, 2.0, tmp_path)
        assert grid in session.encode(QUESTION).inputs
        status, printed, err = chat([f"--clip={given}", f"--question={QUESTION}", *SHORT])
        assert status == 0 and err == "" and printed.endswith("\n")
    session = Chat(load_run([*RECIPE, *SHORT]), frames, 2.0, tmp_path)
    assert session.media.frames.shape[0] == min(8, n)  # data.video.max_frames of configs/demo.yaml


@pytest.mark.parametrize("case", ["missing", "unreadable", "over budget", "empty folder"])
def test_a_bad_clip_is_one_line_naming_the_file(case, tmp_path, clip, in_repo) -> None:
    given, extra, reason = {
        "missing": (tmp_path / "nowhere.mp4", [], "no such file or folder"),
        "unreadable": (tmp_path / "notes.mp4", [], "cannot open video"),
        "over budget": (clip, ["--data.prompt.max_prompt_tokens=64"], "over the budget of 64"),
        "empty folder": (tmp_path / "empty", [], "holds no image"),
    }[case]
    if case == "unreadable":
        given.write_text("a text file renamed .mp4\n")
    if case == "empty folder":
        given.mkdir()
    status, printed, err = chat([f"--clip={given}", f"--question={QUESTION}", *extra])
    assert status == BAD_INPUT == 2 and printed == ""
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {given}: ") and reason in err


def test_an_empty_question_is_refused_not_taken_for_stdin(clip, in_repo) -> None:
    """``--question ""`` is a question left blank: one line, status 2 (it used to read questions from stdin)."""
    status, printed, err = chat([f"--clip={clip}", "--question="], stdin="Who is Person 0 looking at?\n")
    assert status == BAD_INPUT == 2 and printed == ""
    assert err == f"error: {clip}: 'question' is empty (leave --question out to ask on stdin)\n"


def doc_commands() -> list[str]:
    """The shell commands of docs/chat.md's Quick start."""
    text = (REPO / "docs" / "chat.md").read_text(encoding="utf-8")
    quick = text.split("## Quick start")[1].split("\n## ")[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_docs_commands_run(tmp_path) -> None:
    """docs/chat.md's Quick start, command by command in a shell from the checkout (clip.mp4 under tmp_path), the
    piped one with two questions: each exits 0 and prints an answer; a missing clip is its one line, status 2."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    commands = doc_commands()
    assert len(commands) == 3 and commands[0].startswith("tar ")
    outputs = []
    for command in commands:
        command = command.replace("clip.mp4", shlex.quote(str(tmp_path / "clip.mp4")))
        command = command.replace("python -m", f"{shlex.quote(sys.executable)} -m")
        proc = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs.append(proc.stdout)
    assert (tmp_path / "clip.mp4").stat().st_size > 1000
    assert outputs[1].endswith("\n") and outputs[2].count("\n> ") + outputs[2].startswith("> ") == 2
    missing = [sys.executable, "-m", "grasp_lightning", "chat", *RECIPE, "--clip", "nowhere.mp4", "--question", "hi"]
    proc = subprocess.run(missing, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "error: nowhere.mp4: no such file or folder\n" in proc.stderr
    assert "Traceback" not in proc.stderr


def own_model_commands() -> list[str]:
    """The shell commands of docs/chat.md's second block (your own model: an export folder, a checkpoint)."""
    text = (REPO / "docs" / "chat.md").read_text(encoding="utf-8")
    block = re.findall(r"```bash\n(.*?)```", text.split("## Looking deeper")[0], re.S)[1]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_the_docs_own_model_commands_answer_with_the_checkpoint_and_its_export(tmp_path, clip, in_repo) -> None:
    """A checkpoint whose language model's final norm is zeroed (every logit 0: the first token not suppressed
    wins) answers otherwise than the tiny model; ``--ckpt_path`` gives the answer of its ``export`` folder.
    docs/chat.md's commands, run on configs/demo.yaml's CPU settings with tmp paths for runs/sgr."""
    import torch
    from transformers import AutoModelForImageTextToText

    from grasp_lightning.commands.export import main as export
    from tests.helpers import TINY

    model = AutoModelForImageTextToText.from_pretrained(TINY, dtype=torch.float32)
    state = {f"policy.{k}": v.clone() for k, v in model.state_dict().items()}
    (norm,) = [k for k in state if k.endswith("language_model.norm.weight")]
    state[norm].zero_()
    torch.save({"state_dict": state, "global_step": 3}, tmp_path / "last.ckpt")
    export([*RECIPE, "--ckpt_path", str(tmp_path / "last.ckpt"), "--out", str(tmp_path / "export")])

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    answers = []
    for command in own_model_commands():
        for doc, mine in (("runs/sgr/export", tmp_path / "export"), ("runs/sgr/version_0/checkpoints/last.ckpt",
                                                                    tmp_path / "last.ckpt"), ("my.mp4", clip)):
            command = command.replace(doc, shlex.quote(str(mine)))
        command = command.replace("--config configs/sgr.yaml", "--config configs/sgr.yaml --config configs/demo.yaml "
                                  "--model.evaluation.max_new_tokens=12")
        command = command.replace("python -m", f"{shlex.quote(sys.executable)} -m")
        proc = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                              input="Who is Person 1 talking to?\n")
        assert proc.returncode == 0, proc.stderr[-2000:]
        answers.append(proc.stdout)
    exported, restored = answers
    assert restored == "> Who is Person 1 talking to?\n" + exported  # stdin: the question echoed, then the answer
    tiny = chat([f"--clip={clip}", "--question=Who is Person 1 talking to?", "--model.evaluation.max_new_tokens=12"])[1]
    assert exported != tiny and exported.strip()
