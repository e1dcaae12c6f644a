"""The real-shape tier: stand-in models' data and arguments, and the checks both families share."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from tests.helpers.cli import TIMES
from tests.helpers.paths import SAMPLE

#: Per stand-in family: what its generation prompt opens after ``<|im_start|>assistant\n``, and the labelled text
#: its template makes of an SFT response (``<think>...</think><answer>X</answer>``).
TEMPLATE_FORMS = {
    "qwen3_vl": ("", lambda response: response + "<|im_end|>\n"),
    "qwen3_5": ("<think>\n",
                lambda response: response.split("</think>")[0].split("<think>")[-1].strip() + "\n</think>\n\n"
                + response.split("</think>")[-1].lstrip("\n") + "<|im_end|>\n"),
}

#: A sample RL item (``grasp_lightning/assets/sample/train/data_rl.jsonl``, line 1) rendered by the
#: published Qwen3-VL Instruct chat template, written out by hand: ChatML turns, the system turn
#: first, the video placeholder straight before the user text, the generation prompt last.
PUBLISHED_INSTRUCT_PROMPT = (
    "<|im_start|>system\n"
    "You are watching a video of several people, named Person 0, Person 1, and so on. "
    "Answer the multiple-choice question with only the option letter inside <answer> tags.<|im_end|>\n"
    "<|im_start|>user\n"
    "<|vision_start|><|video_pad|><|vision_end|>Who is gesturing?\n"
    "A) Person 0\n"
    "B) Person 1\n"
    "C) Both people\n"
    "D) No one\n"
    "Think step by step about the gaze and gesture interactions, describe them in <gaze> and <gesture> "
    "tags, and give the letter in <answer> tags.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

QUESTION = "Who is looking at Person {p}?\nA) Person 1\nB) Person 2\nC) Person 0\nD) No one\nGive the letter in <answer> tags."

TARGET = "<think><gaze>Person 1</gaze></think><answer>{letter}</answer>"

CLIPS = (("social_gesture/video/154_1_005_qa0000.mp4", 3), ("social_gesture/video/156_1_002_qa0000.mp4", 12))


def _row(clip: str, person: int, output: str, rl: bool) -> list[dict]:
    """A ``data_sft.jsonl`` / ``data_rl.jsonl`` row (``docs/data-format.md``) over the first 2 s of ``clip``."""
    row = [{"type": "video", "path": clip, "fps": 2.0, "start_seconds": 0.0, "end_seconds": 2.0, "src_resolution": [72, 128]},
           {"type": "text", "content": QUESTION.format(p=person), "output": False},
           {"type": "text", "content": output, "output": True}]
    if rl:
        row.append({"type": "meta", "difficulty": "easy", "question_text": QUESTION.format(p=person).split("\n")[0],
                    "gt_events": [{"source": "gaze", "persons": [1, person]}]})
    return row


def write_dataset(root: Path) -> Path:
    """A GRASP-layout dataset over the sample clips: SFT rows answering each prompt with A and with B,
    RL rows whose answer is A, and the sample GRASP-Bench (32 items)."""
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "train" / "videos").symlink_to(SAMPLE / "train" / "videos")
    (root / "test" / "grasp_bench.tar").symlink_to(SAMPLE / "test" / "grasp_bench.tar")
    sft = [_row(c, p, TARGET.format(letter=letter), False) for c, p in CLIPS for letter in "AB"]
    rl = [_row(c, p, "A", True) for c, p in CLIPS]
    (root / "train" / "data_sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    (root / "train" / "data_rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rl))
    return root


def standin_args(model: Path, root: Path, dtype: str = "float32") -> list[str]:
    """Overrides that point a recipe at a stand-in and keep its runs small (see the module docstring)."""
    return [f"--model.policy.name_or_path={model}", f"--model.policy.dtype={dtype}", "--trainer.precision=32-true",
            "--model.policy.gradient_checkpointing=false", f"--data.source.root={root}", "--data.prompt.system_prompt=",
            "--data.video.max_frames=4", "--data.video.max_pixels=8192", "--data.loader.num_workers=0",
            "--trainer.enable_progress_bar=false", "--trainer.max_epochs=-1"]


def scratch(tmp_path_factory, name: str, need_gib: float) -> Path:
    """A fresh directory for ``name`` under pytest's base temporary directory, after checking that its
    file system has ``need_gib`` GiB free (the size of what the caller writes there, measured).

    Raises:
        pytest.fail.Exception: too little free space, naming the directory and both sizes.
    """
    path = tmp_path_factory.mktemp(name)
    free = shutil.disk_usage(path).free / 2**30
    if free < need_gib:
        pytest.fail(f"{path}: {free:.1f} GiB free, {name} needs {need_gib:.1f} GiB (set --basetemp to a larger disk)")
    return path


def first_batch(root: Path, model: Path, train_file: str = "train/data_sft.jsonl", mode: str | None = None, **prompt):
    """The first training batch of ``train_file`` under ``root`` with the processor of ``model`` (``mode``: the
    loader's mode; ``prompt``: more ``data.prompt`` settings)."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(root), train_file=train_file, bench=None),
                         video=VideoConfig(max_frames=4, max_pixels=8192), prompt=PromptConfig(processor=str(model), **prompt),
                         loader=LoaderConfig(data_mode=mode, batch_size=2, num_workers=0))
    dm.setup("fit")
    return dm.processor, next(iter(dm.train_dataloader()))


def labelled_part(processor, batch, row: int) -> tuple[int, str, str]:
    """(first labelled position, decoded prompt before it, decoded labelled tokens) of one SFT row."""
    ids, labels = batch.inputs["input_ids"][row], batch.inputs["labels"][row]
    where = (labels != -100).nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    assert where.tolist() == list(range(first, last + 1))  # one contiguous target, padding unlabelled
    assert labels[first:last + 1].tolist() == ids[first:last + 1].tolist()
    tok = processor.tokenizer
    return first, tok.decode(ids[:first]), tok.decode(ids[first:last + 1])


def check_rendered_prompt_and_labels(family: str, standin: Path) -> None:
    """Through the saved and reloaded processor, with the real vocabulary: the sample item renders as the
    published format (Qwen3-VL Instruct; Qwen3.5 opening ``<think>\\n``), and SFT labels begin at the first
    token after the generation prompt and hold the response as the template writes it."""
    from grasp_lightning.data.formats import read_rl
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, render_texts

    opens, written = TEMPLATE_FORMS[family]
    processor, batch = first_batch(SAMPLE, standin)
    item = read_rl(SAMPLE / "train" / "data_rl.jsonl").items[0]
    assert render_texts(processor, item, None, DEFAULT_SYSTEM_PROMPT)[0] == PUBLISHED_INSTRUCT_PROMPT + opens
    for row, sample_item in enumerate(batch.items):
        first, prompt, target = labelled_part(processor, batch, row)
        assert first == int(batch.prompt_lengths[row])
        assert prompt.startswith("<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n<")
        user = sample_item.question.rstrip()
        assert prompt.endswith("<|vision_end|>" + user + "<|im_end|>\n<|im_start|>assistant\n" + opens), prompt[-300:]
        assert target == written(sample_item.response)
        assert processor.tokenizer.convert_ids_to_tokens(int(batch.inputs["input_ids"][row, first - 1])) == "Ċ"


def check_data_counts_prompt_tokens(family: str, standin: Path, data_root: Path, tmp_path: Path) -> None:
    """``check-data`` with the stand-in's processor (Qwen3 or Qwen3.5 vocabulary): a budget one token below
    the longest RL prompt flags exactly that row, quoting its real token count."""
    from grasp_lightning.commands.check_data import main as check_data_main

    processor, batch = first_batch(data_root, standin, train_file="train/data_rl.jsonl", mode="rl", system_prompt="")
    lengths = [int(n) for n in batch.prompt_lengths]
    assert len(set(lengths)) == 2, lengths
    report = tmp_path / "report.json"
    start = time.perf_counter()
    code = check_data_main(["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", f"--data.source.root={data_root}",
                            f"--model.policy.name_or_path={standin}", "--data.prompt.system_prompt=", "--data.video.max_frames=4",
                            "--data.video.max_pixels=8192", f"--data.prompt.max_prompt_tokens={max(lengths) - 1}",
                            "--files=[train/data_rl.jsonl]", "--workers=0", "--progress=false", f"--report={report}"])
    TIMES[f"check-data, 2 RL rows ({family})"] = time.perf_counter() - start
    problems = json.loads(report.read_text())["problems"]
    assert code == 1 and len(problems) == 1, problems
    line = lengths.index(max(lengths)) + 1
    assert problems[0]["where"].startswith(f"{data_root}/train/data_rl.jsonl:{line}")
    assert problems[0]["reason"].startswith(f"prompt has {max(lengths)} tokens (video included), over the budget of "
                                            f"{max(lengths) - 1}")
