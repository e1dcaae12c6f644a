"""``GraspDataModule``'s settings in setting groups by purpose: ``data.{source,video,prompt,loader,errors}``.

Each setting group is a small dataclass whose ``Attributes:`` jsonargparse reads as the help of its keys
(``--data.video.fps``), checked when it is built: a bad value stops the run at start-up with a
:class:`~grasp_lightning.errors.GraspConfigError` naming its key instead of failing on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, INSTRUCTION
from grasp_lightning.errors import is_count, is_number, require

#: The batch kinds (``data.loader.data_mode``): ``sft`` (prompt + target, right padding) and ``rl`` (prompts only, left padding).
DATA_MODES = ("sft", "rl")
#: What happens to an unusable row or clip.
ON_BAD_ITEM = ("raise", "skip")


@dataclass
class SourceConfig:
    """Where the rows, clips and evaluation items are read from, and how many of them.

    Attributes:
        root: dataset root holding train/ and test/ (the GRASP download layout); the paths below are relative to it.
        train_file: training rows: train/data_sft.jsonl (SFT), train/data_rl.jsonl (GRPO), train/annotations.jsonl,
            or a generic QA file qa.jsonl / qa.<split>.jsonl (video and/or image rows; docs/data-format.md); the
            reader is chosen by the name up to its first dot.
        videos: folder with <source>_partNNN.tar shards and/or extracted clips.
        bench: GRASP-Bench (grasp_bench.tar or an extracted folder); null: no GRASP-Bench validation.
        predict_file: what predict answers: a GRASP-Bench tar or folder, a GRASP file by its name
            (data_sft/data_rl/annotations), or a generic QA JSONL file of any other name (questions.jsonl); null:
            every evaluation suite's items (bench and data.eval_suites), each encoded as for validation.
        train_limit: use only the first N training rows (quick runs); null: all.
        val_limit: use only the first N GRASP-Bench items; null: all.
        predict_limit: answer only the first N items of predict_file (or of each suite); null: all.
    """

    root: str = "grasp_lightning/assets/sample"
    train_file: str = "train/data_sft.jsonl"
    videos: str = "train/videos"
    bench: str | None = "test/grasp_bench.tar"
    predict_file: str | None = None
    train_limit: int | None = None
    val_limit: int | None = None
    predict_limit: int | None = None

    def __post_init__(self) -> None:
        for name in ("train_limit", "val_limit", "predict_limit"):
            value = getattr(self, name)
            require(is_count(value, optional=True), f"data.source.{name}", "an integer >= 1 or null", value)


FRAME_SAMPLING = ("rate", "even")


@dataclass
class VideoConfig:
    """How clips and images are decoded into frames (GRASP: 2 fps, released code: at most 240 frames).

    Attributes:
        fps: frames per second sampled from each clip (GRASP: 2).
        max_frames: cap on frames per clip (released code: 240).
        max_pixels: cap on pixels per decoded frame (height x width); not used with frame_max_tokens.
        max_image_pixels: cap on pixels per image (height x width) of a generic QA row with an image
            (docs/data-format.md), applied by the processor's image resize.
        frame_max_tokens: null (ours): decoded frames are capped at max_pixels. An integer: the released GRASP
            training resolution rule (socialmllm/utils/input_processing.py:154-173; released value 256): each frame is
            shrunk to the largest grid of whole tokens (the processor's patch x merge pixels, 32 for Qwen3-VL) with at
            most this many tokens per 2-frame temporal patch, aspect kept.
        sampling: rate (ours): frames at fps by timestamp, at most max_frames. even: the released GRASP reader
            (socialmllm/utils/input_processing.py:108, 126-151): an even number of frames spread evenly over the clip,
            about its length in seconds times fps, at most max_frames (released: 512).
    """

    fps: float = 2.0
    max_frames: int = 240
    max_pixels: int = 448 * 448
    max_image_pixels: int = 1024 * 1024
    frame_max_tokens: int | None = None
    sampling: str = "rate"

    def __post_init__(self) -> None:
        k = "data.video."
        require(self.sampling in FRAME_SAMPLING, k + "sampling", f"one of {FRAME_SAMPLING}", self.sampling)
        require(is_number(self.fps) and self.fps > 0, k + "fps",
                "a number > 0 (frames per second sampled from each clip)", self.fps)
        for name in ("max_frames", "max_pixels", "max_image_pixels"):
            require(is_count(getattr(self, name)), k + name, "an integer >= 1", getattr(self, name))
        require(is_count(self.frame_max_tokens, optional=True), k + "frame_max_tokens", "an integer >= 1 or null",
                self.frame_max_tokens)


@dataclass
class PromptConfig:
    """How an item becomes the model's input: the processor, the chat turns and the token budgets.

    Attributes:
        processor: the transformers processor to load; the CLI links it to model.policy.name_or_path (not set here).
        trust_remote_code: passed to AutoProcessor; the CLI links it to model.policy.trust_remote_code.
        system_prompt: the system turn of every prompt.
        instruction: appended to every question that carries no instruction of its own (GRASP-Bench and annotation
            items; SFT and RL rows carry theirs); "" appends nothing.
        rows_as_written: true: the training rows' user text is used as written, with no instruction appended even
            where it does not name the <answer> tag (released GRASP: qwen3vl.py:137-145, 263-271 build the turn from
            the row's text only); evaluation items keep the instruction. false (ours): appended where missing.
        max_prompt_tokens: prompt budget in tokens, video included; longer prompts are refused or skipped
            (data.errors.on_bad_item), never truncated; null: no budget.
        max_target_tokens: SFT target budget in tokens; null: no budget.
    """

    processor: str | None = None
    trust_remote_code: bool = False
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    instruction: str = INSTRUCTION
    rows_as_written: bool = False
    max_prompt_tokens: int | None = 16384
    max_target_tokens: int | None = 2048

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_target_tokens"):
            value = getattr(self, name)
            require(is_count(value, optional=True), f"data.prompt.{name}", "an integer >= 1 or null", value)


@dataclass
class LoaderConfig:
    """Batches and their order: sizes, workers, the seeded (and resumable) shuffle, the curriculum.

    Attributes:
        batch_size: training prompts (GRPO) or sequences (SFT) per device and micro-step.
        val_batch_size: evaluation (and predict) items per device and step.
        num_workers: DataLoader worker processes (clips are decoded there).
        seed: base seed of the shuffle (the order is a function of seed and epoch).
        curriculum: SFT easy -> medium -> hard within each epoch: rows visited by difficulty (meta.difficulty of
            data_sft/data_rl rows, difficulty of annotation and generic QA rows), shuffled by seed and epoch inside
            each; every row must carry one (released GRASP SFT trainer, docs/released-recipe.md). false: one seeded
            permutation (the paper's recipe, and GRPO).
        data_mode: sft (prompt + target, right padding) or rl (prompts only, left padding); null (default): the task's
            data_mode. Set it only for the DataModule used on its own; a value that contradicts the task is an error.
    """

    batch_size: int = 1
    val_batch_size: int = 4
    num_workers: int = 2
    seed: int = 0
    curriculum: bool = False
    data_mode: str | None = None

    def __post_init__(self) -> None:
        k = "data.loader."
        for name in ("batch_size", "val_batch_size"):
            require(is_count(getattr(self, name)), k + name, "an integer >= 1", getattr(self, name))
        require(is_number(self.num_workers) and self.num_workers >= 0 and float(self.num_workers).is_integer(),
                k + "num_workers", "an integer >= 0", self.num_workers)
        require(self.data_mode is None or self.data_mode in DATA_MODES, k + "data_mode", "'sft', 'rl' or null (the task's)",
                self.data_mode)


@dataclass
class ErrorConfig:
    """What happens to an unusable row, clip or image.

    Attributes:
        on_bad_item: raise stops at the first unusable row or clip with an error naming it; skip counts, logs and
            writes it to skipped.jsonl in the run directory.
        max_skip_fraction: with skip, stop with an error once more than this fraction of the samples seen so far
            (after at least 20) was skipped.
    """

    on_bad_item: str = "raise"
    max_skip_fraction: float = 0.01

    def __post_init__(self) -> None:
        k = "data.errors."
        require(self.on_bad_item in ON_BAD_ITEM, k + "on_bad_item", "'raise' or 'skip'", self.on_bad_item)
        require(is_number(self.max_skip_fraction) and 0 <= self.max_skip_fraction <= 1, k + "max_skip_fraction",
                "a number in [0, 1]", self.max_skip_fraction)
