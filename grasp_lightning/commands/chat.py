"""``python -m grasp_lightning chat``: ask a model about one clip and read its reasoning.

``python -m grasp_lightning chat --config configs/sgr.yaml --config configs/demo.yaml --clip clip.mp4
--question "Who is Person 0 looking at?"`` prints the model's completion (``<think>``, ``<gaze>``,
``<gesture>``, ``<answer>``); on a terminal its tokens appear as they are generated (transformers'
``TextStreamer``, the ``hf`` engine), otherwise the whole completion is printed at once.
Without ``--question`` (or with ``--interactive true``) it reads questions from stdin, one a line,
until end of input or an empty line, and answers each about the clip it decoded once (piped questions
are echoed as ``> question`` before their answer).

The run's configuration is read as ``predict`` reads it (:func:`grasp_lightning.commands.config.load_run`):
the model (``model.policy.name_or_path``: a Hub id, a model folder or an ``export`` folder; ``--ckpt_path``:
a Lightning checkpoint restored into it), the prompt (``data.prompt``), the video settings
(``data.video``), the token budget (``data.prompt.max_prompt_tokens``), the decoding and the engine
(``model.evaluation``). The clip and question become the item a generic QA row
``{"video": clip, "question": ..., "options": [...]}`` gives (:func:`grasp_lightning.data.qa.parse_qa_row`),
decoded and encoded by the DataModule's own dataset (``GraspDataModule.dataset``) and answered by the
module's evaluation decoding (``GraspModule._answer``): the completion ``predict`` writes for that row.

``--clip`` is an mp4 (any video PyAV decodes), an image (``.jpg``, ``.jpeg``, ``.png``, ``.bmp``, ``.webp``:
the row's ``image``) or a folder of frames (images in file-name order, taken as shot at ``--frames_fps``
frames per second and encoded into a lossless-enough mp4 first). A missing, unreadable or over-budget
clip is one line on stderr naming the file, and exit status 2.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import TextIO

from transformers import TextStreamer

from grasp_lightning.errors import GraspConfigError, GraspDataError

log = logging.getLogger(__name__)

#: File suffixes read as an image (the generic QA row's ``image``); anything else is a video.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
#: Exit status of bad input (a missing, unreadable or over-budget clip), as for a bad option.
BAD_INPUT = 2


class ChatInputError(GraspDataError):
    """The clip cannot be asked about: missing, unreadable, or its prompt is over the budget."""


def add_arguments(parser) -> None:
    """The command's own arguments, beside the run's configuration (``--ckpt_path`` is ``fit``'s)."""
    parser.add_argument("--clip", type=str | None, default=None,
                        help="an mp4, an image or a folder of frames")
    parser.add_argument("--question", type=str | None, default=None,
                        help="the question; without it the questions are read from stdin")
    parser.add_argument("--options", type=list[str] | None, default=None,
                        help='options of --question, e.g. \'["A) Person 0", "B) Person 1"]\'')
    parser.add_argument("--interactive", type=bool, default=False,
                        help="read questions from stdin after --question, until an empty line or end of input")
    parser.add_argument("--frames_fps", type=float, default=2.0,
                        help="a folder of frames: the frames per second they were taken at")
    parser.add_argument("--stream", type=bool | None, default=None,
                        help="print tokens as they come (default: when stdout is a terminal and the engine is hf)")


# ---------------------------------------------------------------------- the clip
def frames_to_mp4(folder: Path, fps: float, out: Path) -> Path:
    """Encode the images of ``folder`` (file-name order) into an mp4 at ``fps`` frames per second.

    Frames are cropped to even height and width (yuv420p). Returns ``out``.

    Raises:
        ChatInputError: no image in the folder, an unreadable one, or frames of different sizes.
    """
    from grasp_lightning.data.qa import decode_image
    from grasp_lightning.synthetic.mp4 import STABLE, encode_mp4

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ChatInputError(str(folder), f"a folder of frames holds no image ({', '.join(IMAGE_SUFFIXES)})")
    frames = []
    for path in files:
        try:
            frame = decode_image(path.read_bytes(), str(path))
        except GraspDataError as err:
            raise ChatInputError(str(path), err.reason) from None
        if frames and frame.shape != frames[0].shape:
            raise ChatInputError(str(path), f"frame of {frame.shape[1]}x{frame.shape[0]} pixels, the first "
                                            f"({files[0].name}) has {frames[0].shape[1]}x{frames[0].shape[0]}")
        frames.append(frame)
    h, w = frames[0].shape[0] // 2 * 2, frames[0].shape[1] // 2 * 2
    if h == 0 or w == 0:
        raise ChatInputError(str(files[0]), "a frame must be at least 2x2 pixels")
    settings = dataclasses.replace(STABLE, crf=12)
    return encode_mp4((f[:h, :w] for f in frames), fps, settings, out=out, size=(h, w))


def clip_row(clip: Path, question: str, options: list[str] | None, tmp: Path, frames_fps: float) -> dict:
    """The generic QA row (``docs/data-format.md``) of ``clip`` and ``question``: ``video`` or ``image`` by
    the file's kind (a folder of frames: the mp4 :func:`frames_to_mp4` writes under ``tmp``).

    Raises:
        ChatInputError: ``clip`` does not exist, or its frames cannot be read.
    """
    if not clip.exists():
        raise ChatInputError(str(clip), "no such file or folder")
    row: dict = {"question": question}
    if options:
        row["options"] = list(options)
    if clip.is_dir():
        row["video"] = str(frames_to_mp4(clip, frames_fps, tmp / "frames.mp4"))
    elif clip.suffix.lower() in IMAGE_SUFFIXES:
        row["image"] = str(clip.resolve())
    else:
        row["video"] = str(clip.resolve())
    return row


class Chat:
    """One clip, decoded once, asked question after question with the run's model and decoding.

    Args:
        run: the loaded run (:func:`~grasp_lightning.commands.config.load_run`).
        clip: the clip, image or folder of frames as given (named in every error).
        frames_fps: frames per second of a folder of frames.
        tmp: a folder for the mp4 of a folder of frames (kept while the chat lasts).

    Raises:
        ChatInputError: a missing or unreadable clip (decoded at once, before the model loads).
    """

    def __init__(self, run, clip: Path, frames_fps: float, tmp: Path) -> None:
        from grasp_lightning.data.qa import LocalFiles

        self.run, self.clip = run, clip
        self.dataset = run.datamodule.dataset([], LocalFiles(), False)  # predict's encoding of its rows
        self.row = clip_row(clip, "?", None, tmp, frames_fps)
        try:  # decode (and check) the clip once, before the model loads
            self.media = self.dataset.decode(self.item("?"))
        except GraspDataError as err:
            raise ChatInputError(str(clip), err.reason) from None
        self.loaded = False

    def item(self, question: str, options: list[str] | None = None):
        """The :class:`~grasp_lightning.data.records.GraspItem` of the clip and ``question``, as ``predict``
        reads the generic QA row (its origin: the clip as given).

        Raises:
            ChatInputError: an empty question or bad options.
        """
        from grasp_lightning.data.qa import parse_qa_row

        row = {**self.row, "question": question}
        if options:
            row["options"] = list(options)
        try:
            return parse_qa_row(row, str(self.clip), Path.cwd(), "chat")
        except GraspDataError as err:
            raise ChatInputError(str(self.clip), err.reason) from None

    def encode(self, question: str, options: list[str] | None = None):
        """The left-padded one-row batch of ``question`` about the decoded clip.

        Raises:
            ChatInputError: the prompt (video tokens included) is over ``data.prompt.max_prompt_tokens``, or
                the question is not a question (empty, bad options).
        """
        from grasp_lightning.data.collate import Sample, collate_samples

        item = self.item(question, options)
        try:
            example = self.dataset.encode_decoded(item, self.media)
        except GraspDataError as err:
            raise ChatInputError(str(self.clip), err.reason) from None
        pad = self.dataset.processor.tokenizer.pad_token_id
        return collate_samples([Sample(index=0, item=item, example=example)], pad_token_id=pad, padding_side="left")

    def load(self) -> None:
        """Load the policy (``model.policy``), restore ``--ckpt_path`` into it, and place it on the device of
        ``trainer.accelerator`` (``cpu``, else the GPU when there is one) in ``trainer.precision``."""
        import torch

        module, cfg = self.run.module, self.run.config
        module.answers_only = True  # as predict: the policy alone, no reference model
        module.configure_model()
        if cfg.get("ckpt_path"):
            from grasp_lightning.commands.export import load_checkpoint_state

            checkpoint = load_checkpoint_state(cfg.ckpt_path)
            module.on_load_checkpoint(checkpoint)
            module.load_state_dict(checkpoint["state_dict"], strict=module.strict_loading)
        accelerator = str(self.run.trainer.get("accelerator") or "auto")
        self.device = torch.device("cuda" if accelerator != "cpu" and torch.cuda.is_available() else "cpu")
        precision = str(self.run.trainer.get("precision") or "32-true")
        if precision in ("bf16-true", "16-true"):
            module.to(torch.bfloat16 if precision.startswith("bf16") else torch.float16)
        self.autocast = ({"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision))
        module.to(self.device)
        self.loaded = True

    def answer(self, question: str, options: list[str] | None = None, *, out: TextIO, stream: bool) -> str:
        """Answer ``question`` about the clip; print the completion to ``out`` (token by token when ``stream``).

        Returns:
            The completion as ``predict`` writes it (``<think>``-opened prompts: the text after that tag).

        Raises:
            ChatInputError: see :meth:`encode`.
        """
        import torch

        batch = self.encode(question, options)
        if not self.loaded:
            self.load()
        module = self.run.module
        batch.to(self.device)
        streamer = None
        opened = _prompt_opens_think(module.tokenizer, batch.inputs["input_ids"])
        if opened:
            out.write("<think>\n")
        if stream:
            streamer = _Streamer(module.tokenizer, out)
        autocast = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
                    else nullcontext())
        with torch.inference_mode(), autocast:
            completions = module._answer(batch, streamer=streamer)
        text = completions.texts[0]
        if not stream:
            out.write(text)
        out.write("\n")
        out.flush()
        return text


class _Streamer(TextStreamer):
    """``TextStreamer`` writing to ``out`` (not stdout) and leaving the final newline to :meth:`Chat.answer`."""

    def __init__(self, tokenizer, out: TextIO) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.out = out

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.out.write(text)
        self.out.flush()


def _prompt_opens_think(tokenizer, input_ids) -> bool:
    from grasp_lightning.engines.decoding import prompt_opens_think

    return bool(prompt_opens_think(tokenizer, input_ids)[0])


# ---------------------------------------------------------------------- the command
def questions(stdin: TextIO, prompt: TextIO | None):
    """Lines of ``stdin`` until end of input or an empty line (``prompt``: where ``> `` is written first)."""
    while True:
        if prompt is not None:
            prompt.write("> ")
            prompt.flush()
        line = stdin.readline()
        if not line.strip():
            return
        yield line.strip()


def main(argv: list[str], stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """``python -m grasp_lightning chat ...`` (arguments after ``chat``; see the module docstring).

    Returns:
        0, or :data:`BAD_INPUT` (2) after one line on ``stderr`` naming the clip and what is wrong.

    Raises:
        GraspConfigError: no ``--clip``; settings the module or DataModule refuses (from ``load_run``).
    """
    from grasp_lightning.commands.config import load_run

    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    run = load_run(argv, arguments=add_arguments, prog="python -m grasp_lightning chat")
    cfg = run.config
    if not cfg.get("clip"):
        raise GraspConfigError("chat needs --clip <an mp4, an image or a folder of frames> (after --config)")
    # streaming needs generate's streamer: the hf engine (a vLLM server answers whole completions)
    stream = cfg.stream if cfg.get("stream") is not None else stdout.isatty() and run.module.eval_engine_name == "hf"
    if cfg.get("question") is not None and not cfg.question.strip():  # "" is a question left blank, not "ask on stdin"
        print(f"error: {cfg.clip}: 'question' is empty (leave --question out to ask on stdin)", file=stderr)
        return BAD_INPUT
    interactive = cfg.interactive or not cfg.get("question")
    with tempfile.TemporaryDirectory(prefix="grasp-chat-") as tmp:
        try:
            chat = Chat(run, Path(cfg.clip), cfg.frames_fps, Path(tmp))
            if cfg.get("question"):
                chat.answer(cfg.question, cfg.get("options"), out=stdout, stream=stream)
        except ChatInputError as err:
            print(f"error: {err}", file=stderr)
            return BAD_INPUT
        if not interactive:
            return 0
        typed = stdin.isatty()
        for question in questions(stdin, stderr if typed else None):
            if not typed:  # piped questions: each answer follows its question, as in a transcript
                stdout.write(f"> {question}\n")
            try:
                chat.answer(question, out=stdout, stream=stream)
            except ChatInputError as err:  # this question's prompt is over the budget: say so, take the next
                print(f"error: {err}", file=stderr)
    return 0
