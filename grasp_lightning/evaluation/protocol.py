"""GRASP-Bench evaluation protocols: ours (``grasp``, the default) and the released GRASP evaluation (``released``).

``model.evaluation.protocol`` picks one (``configs/eval_released.yaml``: the released one). Decoding
stays in :class:`~grasp_lightning.module.EvalConfig` for both: greedy and the stop at ``</answer>``
by default, and ``max_new_tokens: null`` takes the protocol's budget (ours 1024, released 2048 with
reasoning); a run whose decoding differs from the released one logs a warning naming the keys.
The released protocol's prompt and frame settings are ``model.evaluation.released`` keys whose defaults are the
released values (``configs/demo.yaml`` shrinks them for the CPU).

- ``grasp``: our recipes' prompts (:mod:`grasp_lightning.data.prompts`), clips sampled at
  ``data.video.fps`` with real timestamps, answers by :func:`grasp_lightning.parsing.extract_answer`,
  MCQ items only.
- ``released``: the evaluation of the GRASP repository (``Social-Reaoning/grasp``,
  ``eval/eval_social_qa.py`` and ``eval/metric_report.py``, commit 805d115), so a score compares
  with the paper's tables:

  * system prompt :data:`RELEASED_SYSTEM_PROMPT` (reasoning mode only) and the user text of
    :func:`compose_prompt`; for Qwen3-VL in reasoning mode ``<think>\\n`` is appended to the
    generation prompt's token ids (for Qwen3.5 the template's ``enable_thinking`` is set instead);
  * ``min(240, N)`` frames spread uniformly over the whole clip
    (:func:`~grasp_lightning.data.video.uniform_indices`), whatever its frame rate;
  * every frame shrunk to the largest grid of 32-pixel patches with at most 256 tokens per 2-frame
    temporal patch, keeping the aspect ratio (:func:`resolve_resolution`, area averaging), and
    passed to the processor with ``do_resize=False``;
  * timestamps: the released code gives the processor ``fps=100`` and frame indices ``i * 50``, so
    frame ``i`` is labelled ``i / 2`` seconds (2 fps) whatever its real time. ``timestamps:
    released`` reproduces that (the scores of the paper); ``timestamps: real`` passes the real
    seconds instead;
  * answers by :func:`extract_answer_released`; an item is correct when that string equals the
    item's answer (open-ended items: the text after ``</think>`` must equal the reference exactly);
  * the report of :func:`released_report`: per category, per group (count-weighted), per
    difficulty and overall (count-weighted over all items).

One deliberate difference: when a template's generation prompt already opens ``<think>`` (Qwen3-VL
*Thinking*), ``<think>\\n`` is not appended a second time (the released code would).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grasp_lightning.data.formats import question_only
from grasp_lightning.data.frames import resolve_resolution
from grasp_lightning.data.prompts import EncodedExample
from grasp_lightning.data.records import DIFFICULTIES, GROUPS, GraspItem
from grasp_lightning.errors import GraspConfigError, TokenBudgetError
from grasp_lightning.evaluation import grasp_score as bench

PROTOCOLS = ("grasp", "released")
#: System turn of the released evaluation in reasoning mode (``eval_social_qa.generate``).
RELEASED_SYSTEM_PROMPT = ("Answer multiple-choice questions with only the option letter (A, B, C, or D) inside "
                          "<answer> tags. Example: <answer>A</answer>")
#: Instruction after the options in reasoning mode (``eval_social_qa.compose_prompt``).
RELEASED_REASONING_INSTRUCTION = ("Think step by step about the gaze and gesture interactions you observe. "
                                  "Use <gaze> and <gesture> tags to describe what you see, then select the "
                                  "best answer wrapped in <answer> tags, e.g. <answer>A</answer>.")
#: Instruction after the options without reasoning.
RELEASED_DIRECT_INSTRUCTION = "Answer with just the letter."
#: Appended after the generation prompt for Qwen3-VL in reasoning mode.
THINK_PREFIX = "<think>\n"
#: The released code's fake frame rate and the rate its frame indices pretend (``MOCK_FPS``, ``VIDEO_FPS``).
MOCK_FPS, RELEASED_VIDEO_FPS = 100, 2
#: Decoding of the released evaluation: reasoning 2048 new tokens, else 64 (MCQ); greedy.
RELEASED_MAX_NEW_TOKENS = {True: 2048, False: 64}
#: The released report's names: groups, and the joint categories as the bench stores them.
RELEASED_GROUP_NAMES = {"gaze": "Gaze", "gesture": "Gesture", "joint": "Joint"}
RELEASED_CATEGORY_NAMES = {"J1": "C1", "J2": "C2", "J3": "C3", "J4": "C4"}


def compose_prompt(question: str, options: Sequence[str], reasoning: bool = True) -> str:
    """The user text of the released evaluation: question, options one per line, instruction.

    An item without options (open-ended) gets its question alone, in both modes.
    """
    if not options:
        return question
    instruction = RELEASED_REASONING_INSTRUCTION if reasoning else RELEASED_DIRECT_INSTRUCTION
    return f"{question}\n" + "\n".join(options) + f"\n{instruction}"


def released_messages(item: GraspItem, reasoning: bool = True) -> list[dict]:
    """Chat messages of the released evaluation: the system turn (reasoning mode), then the user
    turn with the video first and :func:`compose_prompt` of the item's bare question and options."""
    question = question_only(item)
    messages: list[dict] = []
    if reasoning:
        messages.append({"role": "system", "content": [{"type": "text", "text": RELEASED_SYSTEM_PROMPT}]})
    messages.append({"role": "user", "content": [{"type": "video"},
                                                 {"type": "text", "text": compose_prompt(question, item.options,
                                                                                         reasoning)}]})
    return messages


def released_metadata(num_frames: int) -> dict:
    """The video metadata the released evaluation gives the processor: ``fps`` 100 and frame indices
    ``i * 50``, so the processor labels frame ``i`` with ``i / 2`` seconds (a 2 fps clip)."""
    step = MOCK_FPS // RELEASED_VIDEO_FPS
    return {"fps": MOCK_FPS, "frames_indices": [i * step for i in range(num_frames)], "total_num_frames": num_frames}


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, rest)``: the first ``<think>…</think>`` block and what follows it; without
    ``<think>``, what precedes and follows the first ``</think>``; without either, ``("", text)``
    (both stripped). Source: ``extract_reasoning`` of the released evaluation."""
    match = re.search(r"<think>(.*?)</think>", text, re.DOTALL)
    if match:
        return match.group(1).strip(), text[match.end():].strip()
    if "</think>" in text:
        head, tail = text.split("</think>", 1)
        return head.strip(), tail.strip()
    return "", text.strip()


def extract_answer_released(text: str) -> str:
    """The option letter the released evaluation reads from a completion, ``""`` when none.

    In this order, on the text after the last ``</think>`` (stripped):

    1. the first ``<answer>…</answer>`` on one line: its first character, upper-cased, if it is A-D;
    2. the first ``\\boxed{…}``: its first character, likewise;
    3. a leading ``Answer:`` or ``The answer is`` (any case) is removed, then the first of A, B, C, D
       (alphabetical order, not position) written anywhere as ``X)`` or ``X.``;
    4. the first character, upper-cased, if it is A-D (``"because"`` gives ``B``).

    Source: ``extract_answer`` of ``eval/eval_social_qa.py`` (kept quirks: 3 and 4 as written there).
    """
    text = text.strip()
    if "</think>" in text:
        text = text.split("</think>")[-1].strip()
    for pattern in (r"<answer>\s*(.*?)\s*</answer>", r"\\boxed\{\s*([^}]*?)\s*\}"):
        match = re.search(pattern, text)
        if match:
            answer = match.group(1).strip()
            if answer and answer[0].upper() in "ABCD":
                return answer[0].upper()
    text = re.sub(r"^(Answer:\s*|The answer is\s*)", "", text, flags=re.IGNORECASE)
    for letter in "ABCD":
        if f"{letter})" in text or f"{letter}." in text:
            return letter
    if text and text[0].upper() in "ABCD":
        return text[0].upper()
    return ""


def released_report(metrics: dict[str, float]) -> str:
    """The released ``metric_report.py`` printout from :meth:`BenchAccuracy.compute` metrics.

    Per group (Gaze T1-T6, Gesture G1-G6, Joint C1-C4): each category with items as ``c/n = acc``
    and the group's ``Avg`` (count-weighted: correct over items of the group); then easy / medium /
    hard; then ``Overall`` (correct over all items, count-weighted). Accuracies with 3 decimals.
    The released script keys categories by the bench's raw codes, so an item coded ``J1``-``J4``
    would count in Overall but in no group; our reader maps ``C1``-``C4`` to ``J1``-``J4``, which is
    the same for the bench as released (it writes ``C1``-``C4``).
    """
    def line(label: str, n: float, acc: float) -> str:
        correct = round(acc * n)
        return f"  {label}: {correct}/{int(n)} = {correct / n:.3f}"

    out = []
    for group, cats in GROUPS.items():
        out.append(f"\n===== {RELEASED_GROUP_NAMES[group]} =====")
        out += [line(RELEASED_CATEGORY_NAMES.get(c, c), metrics[f"n/{c}"], metrics[f"acc/{c}"])
                for c in cats if metrics[f"n/{c}"]]
        if metrics[f"n/{group}"]:
            out.append(line("Avg", metrics[f"n/{group}"], metrics[f"acc/{group}"]))
    out.append("\n===== By Difficulty =====")
    out += [line(d, metrics[f"n/{d}"], metrics[f"acc/{d}"]) for d in DIFFICULTIES if metrics[f"n/{d}"]]
    if metrics["n/overall"]:
        overall = line("Overall", metrics["n/overall"], metrics["acc/overall"]).strip()
        out.append(f"\n===== {overall} =====")
    return "\n".join(out)


@dataclass(frozen=True)
class ReleasedBenchEncoder:
    """Encodes one GRASP-Bench item as the released evaluation does (picklable: runs in DataLoader workers).

    Attributes:
        reasoning: reasoning mode (the released ``--reasoning``: system prompt, think instruction).
        model_type: ``qwen3_vl`` (append ``<think>\\n`` in reasoning mode) or ``qwen3_5`` (the chat
            template's ``enable_thinking`` is set to ``reasoning``).
        max_frames: at most this many frames, spread uniformly over the clip.
        frame_max_tokens: tokens per 2-frame temporal patch (:func:`resolve_resolution`).
        spatial_patch: pixels per token side (patch size x merge size: 32 for Qwen3-VL).
        timestamps: ``released`` (2 fps labels, :func:`released_metadata`) or ``real`` (true seconds).
    """

    reasoning: bool
    model_type: str
    max_frames: int
    frame_max_tokens: int
    spatial_patch: int
    timestamps: str

    def render_prompt(self, processor, item: GraspItem) -> str:
        """The prompt text through the processor's chat template, generation prompt included (before
        ``<think>\\n``, which is appended as token ids by :meth:`__call__`)."""
        kwargs = {"enable_thinking": self.reasoning} if self.model_type == "qwen3_5" else {}
        return processor.apply_chat_template(released_messages(item, self.reasoning), add_generation_prompt=True,
                                             tokenize=False, **kwargs)

    def appends_think(self, prompt: str) -> bool:
        """Whether ``<think>\\n`` follows the generation prompt: Qwen3-VL in reasoning mode, unless the
        template already opened the think block."""
        from grasp_lightning.parsing import opens_think

        return self.reasoning and self.model_type == "qwen3_vl" and not opens_think(prompt)

    def size_for(self, height: int, width: int) -> tuple[int, int]:
        """Output frame size for a ``height x width`` source (:func:`resolve_resolution`)."""
        return resolve_resolution(height, width, spatial_patch=self.spatial_patch, max_tokens=self.frame_max_tokens)

    def __call__(self, processor, item: GraspItem, data: bytes, *, max_prompt_tokens: int | None = None) -> EncodedExample:
        """Decode the clip, resize, render and encode the prompt (no target).

        Raises:
            ClipDecodeError: the clip cannot be decoded.
            TokenBudgetError: the prompt is longer than ``max_prompt_tokens`` (``None``: no budget,
                as in the released code).
        """
        from grasp_lightning.data.video import decode_uniform, video_metadata

        clip = decode_uniform(data, max_frames=self.max_frames, resize=self.size_for,
                              where=f"{item.origin} ({item.clip.path})")
        metadata = released_metadata(len(clip.indices)) if self.timestamps == "released" else video_metadata(clip)
        prompt = self.render_prompt(processor, item)
        enc = processor(text=[prompt], videos=[clip.frames], video_metadata=[metadata], do_sample_frames=False,
                        do_resize=False, return_tensors="pt")
        ids = enc["input_ids"][0]
        mm_types = enc.get("mm_token_type_ids")
        mm_types = mm_types[0] if mm_types is not None else torch.zeros_like(ids)
        if self.appends_think(prompt):
            think = torch.tensor(processor.tokenizer.encode(THINK_PREFIX, add_special_tokens=False), dtype=ids.dtype)
            ids, mm_types = torch.cat([ids, think]), torch.cat([mm_types, torch.zeros_like(think)])
        if max_prompt_tokens is not None and ids.numel() > max_prompt_tokens:
            raise TokenBudgetError(item.origin, f"prompt has {ids.numel()} tokens (video included), over the budget "
                                                f"of {max_prompt_tokens}")
        return EncodedExample(input_ids=ids, labels=None, mm_token_type_ids=mm_types,
                              pixel_values_videos=enc["pixel_values_videos"], video_grid_thw=enc["video_grid_thw"],
                              prompt_length=int(ids.numel()))


class GraspProtocol:
    """Our protocol: the DataModule's prompts and 2 fps clips, :func:`grasp_lightning.evaluation.grasp_score.score_completion`."""

    name = "grasp"
    max_new_tokens = 1024  # completion budget when model.evaluation.max_new_tokens is None

    def bench_encoder(self, processor) -> None:  # noqa: ARG002 (same interface as ReleasedProtocol)
        """``None``: GRASP-Bench is encoded by the DataModule's own path."""
        return None

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """:func:`grasp_lightning.evaluation.grasp_score.score_completion`."""
        return bench.score_completion(completion, item)

    def report(self, metrics: dict[str, float]) -> str | None:  # noqa: ARG002
        """No extra report (our Table-1 report is ``GraspBench.report``, :mod:`grasp_lightning.evaluation.grasp_bench`)."""
        return None

    def decoding_deviations(self, max_new_tokens: int, do_sample: bool, stop_at_answer: bool) -> list[str]:  # noqa: ARG002
        """Nothing to compare with."""
        return []


class ReleasedProtocol(GraspProtocol):
    """The released GRASP-Bench evaluation (module docstring); settings as in :class:`ReleasedBenchEncoder`,
    with ``frame_spatial_patch=None`` meaning the processor's patch size x merge size (32 for Qwen3-VL
    and Qwen3.5, the released constant).

    Raises:
        GraspConfigError: an unknown ``model_type`` or ``timestamps``, or non-positive sizes.
    """

    name = "released"

    def __init__(self, reasoning: bool = True, model_type: str = "qwen3_vl", max_frames: int = 240,
                 frame_max_tokens: int = 256, frame_spatial_patch: int | None = None,
                 timestamps: str = "released") -> None:
        if model_type not in ("qwen3_vl", "qwen3_5"):
            raise GraspConfigError(f"model.evaluation.released.model_type must be qwen3_vl or qwen3_5, "
                                   f"got {model_type!r}")
        if timestamps not in ("released", "real"):
            raise GraspConfigError(f"model.evaluation.released.timestamps must be released or real, got {timestamps!r}")
        if max_frames < 1 or frame_max_tokens < 1 or (frame_spatial_patch is not None and frame_spatial_patch < 1):
            raise GraspConfigError("model.evaluation.released: max_frames, frame_max_tokens and frame_spatial_patch "
                                   "must be >= 1")
        self.settings = dict(reasoning=reasoning, model_type=model_type, max_frames=max_frames,
                             frame_max_tokens=frame_max_tokens, timestamps=timestamps)
        self.frame_spatial_patch = frame_spatial_patch
        self.max_new_tokens = RELEASED_MAX_NEW_TOKENS[reasoning]

    def bench_encoder(self, processor) -> ReleasedBenchEncoder:
        """The encoder for this processor.

        Raises:
            GraspConfigError: ``frame_spatial_patch`` is not a multiple of the processor's patch x merge
                size (frames would not split into whole tokens).
        """
        video = processor.video_processor
        unit = int(video.patch_size) * int(video.merge_size)
        patch = self.frame_spatial_patch or unit
        if patch % unit:
            raise GraspConfigError(f"model.evaluation.released.frame_spatial_patch={patch} is not a multiple of the "
                                   f"processor's patch_size x merge_size = {unit}")
        return ReleasedBenchEncoder(spatial_patch=patch, **self.settings)

    def score(self, completion: str, item: GraspItem) -> dict[str, Any]:
        """Record of :func:`~grasp_lightning.evaluation.grasp_score.make_record`: MCQ ``predicted`` is
        :func:`extract_answer_released` (``None`` when it is ``""``); open-ended ``predicted`` is the text
        after the reasoning; ``correct`` is ``predicted == item.answer`` as in ``metric_report.py``."""
        if item.options:
            letter = extract_answer_released(completion)
            return bench.make_record(completion, item, target=item.answer, predicted=letter or None,
                                     correct=letter == item.answer)
        rest = split_reasoning(completion)[1]
        return bench.make_record(completion, item, target=item.answer, predicted=rest, correct=rest == item.answer)

    def report(self, metrics: dict[str, float]) -> str:
        """:func:`released_report`."""
        return released_report(metrics)

    def decoding_deviations(self, max_new_tokens: int, do_sample: bool, stop_at_answer: bool) -> list[str]:
        """Where ``model.evaluation``'s decoding differs from the released evaluation's (for a warning)."""
        reasoning = self.settings["reasoning"]
        out = []
        if max_new_tokens != RELEASED_MAX_NEW_TOKENS[reasoning]:
            out.append(f"max_new_tokens={max_new_tokens} (released: {RELEASED_MAX_NEW_TOKENS[reasoning]})")
        if do_sample:
            out.append("do_sample=true (released: greedy)")
        if stop_at_answer != reasoning:
            out.append(f"stop_at_answer={stop_at_answer} (released: {reasoning})")
        return out


def make_protocol(name: str, **settings: Any) -> GraspProtocol:
    """The protocol called ``name`` (``grasp`` or ``released``); ``settings`` go to :class:`ReleasedProtocol`.

    Raises:
        GraspConfigError: an unknown name.
    """
    if name == "grasp":
        return GraspProtocol()
    if name == "released":
        return ReleasedProtocol(**settings)
    raise GraspConfigError(f"model.evaluation.protocol must be one of {PROTOCOLS}, got {name!r}")

