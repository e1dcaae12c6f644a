"""``GraspDataModule``: GRASP rows and GRASP-Bench, clips streamed from tar shards at 2 fps.

Train rows come from ``data_sft.jsonl`` (SFT: prompt + target), ``data_rl.jsonl`` (GRPO: prompt,
answer letter and ground-truth events) or ``annotations.jsonl``; validation and test use
GRASP-Bench. Clips are read out of the tar shards by :class:`~grasp_lightning.data.shards.ClipStore`
and decoded inside the DataLoader workers. Order is deterministic by seed and epoch, split across
ranks, and resumable: the state dict records the epoch and the samples this rank consumed, and a
resumed run continues with the next unseen sample.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset

from grasp_lightning.data.collate import Batch, Sample, collate_samples
from grasp_lightning.data.datamodule_config import (
    DATA_MODES,
    ErrorConfig,
    LoaderConfig,
    PromptConfig,
    SourceConfig,
    VideoConfig,
)
from grasp_lightning.data.formats import SkipRecord, bench_store, read_bench
from grasp_lightning.data.frames import ClipFrames, clip_frames, decode_max_pixels, video_processor_settings
from grasp_lightning.data.prompts import encode_example
from grasp_lightning.data.qa import decode_image, open_media, read_qa, store_for
from grasp_lightning.data.readers import reader_for
from grasp_lightning.data.records import DIFFICULTIES, GraspItem
from grasp_lightning.data.sampler import ResumableBatchSampler, ResumableSampler
from grasp_lightning.data.shards import ClipStore
from grasp_lightning.data.video import decode_clip, resize_area, video_metadata
from grasp_lightning.data.windows import WindowCollate, WindowLoader, resume_position
from grasp_lightning.errors import GraspConfigError, GraspDataError
from grasp_lightning.evaluation.base import EvalSuite
from grasp_lightning.predictions import item_key

log = logging.getLogger(__name__)

# Lightning warns that a mid-epoch resume is unreliable for dataloaders without their own
# state_dict. This DataModule restores the position itself (state_dict below), so the warning
# does not apply here.
warnings.filterwarnings("ignore", message=r".*resuming from a checkpoint that ended before the epoch ended.*")


@dataclasses.dataclass
class DecodedMedia:
    """An item's media as :meth:`GraspDataset.decode` returns them.

    Attributes:
        frames: ``(T, H, W, 3)`` uint8 frames of the clip, ``None`` without one.
        metadata: the processor's video metadata (real timestamps), ``None`` without a clip.
        resize_frames: the processor resizes the frames (``False``: the released rule sized them).
        image: ``(H, W, 3)`` uint8 RGB image, ``None`` without one.
    """

    frames: np.ndarray | None = None
    metadata: dict | None = None
    resize_frames: bool = True
    image: np.ndarray | None = None


class GraspDataset(Dataset):
    """Map-style dataset: index → decoded clip → encoded :class:`Sample`.

    Args:
        items: the records.
        store: where clips are read from (opened lazily per worker process).
        processor: the transformers processor.
        video: how clips and images are decoded (``data.video``: ``fps``, ``max_frames``, ``max_pixels``,
            ``max_image_pixels``, ``frame_max_tokens``, ``sampling``). With ``frame_max_tokens`` set, frames are
            decoded at their source size, then shrunk (area averaging) to the largest grid of whole tokens
            (processor patch × merge pixels) holding at most that many tokens per 2-frame temporal patch, aspect
            kept (:func:`~grasp_lightning.data.frames.resolve_resolution`), and passed unresized
            (:meth:`frame_sizing`).
        prompt: the chat turns and budgets as this dataset uses them (``data.prompt``: ``system_prompt``,
            ``instruction`` appended to questions that carry none, see
            :func:`~grasp_lightning.data.prompts.user_text`; ``max_prompt_tokens``, refused, never truncated;
            ``max_target_tokens``).
        errors: ``data.errors``: ``on_bad_item: skip`` turns a :class:`GraspDataError` (or any failure to decode
            or encode one item) into a counted skip instead of raising.
        with_target: encode the SFT target (``item.response``) after the prompt.

    Attribute ``encoder``: when set (``(processor, item, clip_bytes, max_prompt_tokens=) -> EncodedExample``,
    e.g. :class:`~grasp_lightning.evaluation.protocol.ReleasedBenchEncoder`), it decodes and encodes prompt-only
    items instead of the fps/prompt settings above (an evaluation protocol's own frames and prompts).
    """

    encoder = None

    def __init__(self, items: list[GraspItem], store: ClipStore, processor, video: VideoConfig, prompt: PromptConfig,
                 errors: ErrorConfig, *, with_target: bool) -> None:
        self.items = items
        self.store = store
        self.processor = processor
        self.video = video
        self.prompt = prompt
        self.skip_bad = errors.on_bad_item == "skip"
        self.with_target = with_target

    def __len__(self) -> int:
        return len(self.items)

    def encode(self, item: GraspItem):
        """Decode the item's clip and/or image and encode prompt (and target)."""
        target = None
        if self.with_target:
            if not item.response:
                raise GraspDataError(item.origin, "SFT needs an assistant target (an `output: true` text or "
                                                  "`response`), this row has none")
            target = item.response
        if self.encoder is not None and target is None and item.image is None and item.clip is not None:
            data = open_media(self.store, item.clip.path, item.origin)
            return self.encoder(self.processor, item, data, max_prompt_tokens=self.prompt.max_prompt_tokens)
        return self.encode_decoded(item, self.decode(item), target)

    def decode(self, item: GraspItem) -> DecodedMedia:
        """The item's image and clip, decoded as :meth:`encode` takes them: the clip at ``fps`` within
        ``max_frames`` and ``max_pixels`` (or the released rule's size), the image as ``(H, W, 3)`` uint8.

        Raises:
            ClipNotFoundError, ClipDecodeError: a missing or unreadable clip or image (naming the item's
                origin and the file).
        """
        media = DecodedMedia()
        if item.image is not None:  # generic QA rows (grasp_lightning/data/qa.py)
            media.image = decode_image(open_media(self.store, item.image, item.origin), f"{item.origin} ({item.image})")
        if item.clip is not None:
            data = open_media(self.store, item.clip.path, item.origin)
            video = self.video
            clip = decode_clip(data, fps=video.fps, start_seconds=item.clip.start_seconds,
                               end_seconds=item.clip.end_seconds, max_frames=video.max_frames,
                               max_pixels=decode_max_pixels(video.max_pixels, video.frame_max_tokens),
                               where=f"{item.origin} ({item.clip.path})", sampling=video.sampling)
            frames, media.metadata = clip.frames, video_metadata(clip)
            sizing = self.frame_sizing(*frames.shape[:3])
            media.frames = resize_area(frames, sizing.passed)  # unchanged unless the released rule shrinks them
            media.resize_frames = sizing.processor_resizes
        return media

    def encode_decoded(self, item: GraspItem, media: DecodedMedia, target: str | None = None):
        """Encode ``item``'s prompt (and ``target``) around media :meth:`decode` returned (of this item, or of
        another item with the same clip and image: ``chat`` asks several questions about one decoded clip).

        Raises:
            TokenBudgetError: the prompt or target is over its budget.
        """
        prompt = self.prompt
        return encode_example(self.processor, item, media.frames, media.metadata, target=target,
                              system_prompt=prompt.system_prompt, max_prompt_tokens=prompt.max_prompt_tokens,
                              max_target_tokens=prompt.max_target_tokens, instruction=prompt.instruction,
                              image=media.image, max_image_pixels=self.video.max_image_pixels,
                              resize_frames=media.resize_frames)

    def frame_sizing(self, frames: int, height: int, width: int) -> ClipFrames:
        """How ``frames`` decoded frames of ``height x width`` pixels reach the processor and how many visual
        tokens they give (:func:`~grasp_lightning.data.frames.clip_frames`, the rule the memory planner counts
        with): ``max_pixels`` and the processor's resize, or the released rule (``frame_max_tokens``: whole
        tokens of ``patch_size * merge_size`` pixels, at most ``frame_max_tokens`` per 2-frame temporal patch,
        ``socialmllm/utils/input_processing.py:154-173`` via ``qwen3vl.py:114-121``, passed unresized).

        Raises:
            GraspConfigError: the processor is not a Qwen3-VL-style video processor, or (released rule) a
                frame is smaller than one token on a side.
        """
        return clip_frames(frames, height, width, max_pixels=self.video.max_pixels,
                           frame_max_tokens=self.video.frame_max_tokens,
                           settings=video_processor_settings(self.processor.video_processor))

    def __getitem__(self, index: int) -> Sample:
        valid = index < len(self.items)
        item = self.items[index % len(self.items)]
        try:
            return Sample(index=index, item=item, example=self.encode(item), valid=valid)
        except GraspDataError as err:
            if not self.skip_bad:
                raise
            log.warning("skipping %s: %s", item.uid, err)
            return Sample(index=index, item=item, skip=SkipRecord(err.where, err.reason, item.uid), valid=valid)
        except Exception as err:  # noqa: BLE001 - a decoder/processor failure on one clip must not end the run
            if not self.skip_bad:
                raise
            reason = f"unexpected {type(err).__name__} while decoding or encoding: {err}"
            log.warning("skipping %s (%s): %s", item.uid, item.origin, reason)
            return Sample(index=index, item=item, skip=SkipRecord(item.origin, reason, item.uid), valid=valid)


class GraspDataModule(L.LightningDataModule):
    """GRASP train rows and GRASP-Bench for validation/test.

    The settings come in setting groups (:mod:`grasp_lightning.data.datamodule_config`), each kept as the attribute of its
    name (``datamodule.video.fps``) and saved in ``hparams`` as plain dicts.

    Args:
        source: where the rows, clips and evaluation items are read from (``root``, ``train_file``,
            ``videos``, ``bench``, ``predict_file``) and how many (``train_limit``, ...).
        video: how clips and images are decoded into frames (``fps``, ``max_frames``, pixel caps, the
            released resolution rule).
        prompt: the processor, the system turn and instruction, and the token budgets.
        loader: batch sizes, workers, the seeded shuffle, the SFT curriculum and the batch kind (``data_mode``).
        errors: what happens to an unusable row or clip (``on_bad_item``, ``max_skip_fraction``).
        eval_suites: more evaluation suites (``class_path`` plugins of ``grasp_lightning.evaluation``:
            MMSI, OnlineMMSI, TVQAPlus, HumanSense, ...), each with its own dataloader after GRASP-Bench
            and its own ``results.json`` section and table (``configs/eval_suites.yaml``).
    """

    def __init__(self, source: SourceConfig = SourceConfig(), video: VideoConfig = VideoConfig(),  # noqa: B008
                 prompt: PromptConfig = PromptConfig(), loader: LoaderConfig = LoaderConfig(),  # noqa: B008
                 errors: ErrorConfig = ErrorConfig(),  # noqa: B008 (the setting groups are copied below)
                 eval_suites: list[EvalSuite] | None = None) -> None:
        super().__init__()
        self.source = dataclasses.replace(source)
        self.video = dataclasses.replace(video)
        self.prompt = dataclasses.replace(prompt)
        self.loader = dataclasses.replace(loader)
        self.errors = dataclasses.replace(errors)
        # Plain dicts only, so checkpoints load with ``torch.load(weights_only=True)``; plugin objects stay out.
        self.save_hyperparameters({name: dataclasses.asdict(getattr(self, name))
                                   for name in ("source", "video", "prompt", "loader", "errors")})
        self.eval_suites: list[EvalSuite] = list(eval_suites or [])
        self.val_suites: list[EvalSuite] = []  # GRASP-Bench (data.source.bench) first, then data.eval_suites, loaded
        self.root = Path(self.source.root)
        self._processor = None
        self.train_items: list[GraspItem] = []
        self.val_items: list[GraspItem] = []
        self.predict_items: list[GraspItem] = []
        # Set by the prediction writer: the item keys (predictions.item_key) an earlier run answered with the same
        # model and decoding, asked when the predict loader is built (after a --ckpt_path is restored); left out.
        self.predict_done: Callable[[], set[str]] | None = None
        self._epoch = 0
        self._consumed = 0
        self._resume: tuple[int, int] | None = None
        self._window, self._repeat = 1, 1  # set by connect(): accumulation window and its repeats
        self._split = False  # set by connect(): the epoch ends after len(prompt loader) micro-batches
        self._data_mode = self.loader.data_mode  # set by connect(): the task's (None: not connected, data.loader.data_mode unset)
        self._draws = False  # set by connect(): the task may draw further windows (GRPO refill)
        self._lookahead = False  # set by connect(): the task peeks at the next window (rollout overlap)
        self._stream: tuple[int, int] | None = None  # resume: (stream index, draws) of the last window
        self._last_window = None  # the Window of the last consumed micro-batch (its draws grow in training_step)
        self.samples_seen = 0
        self.samples_skipped = 0  # training-time skips (unreadable clips), saved in checkpoints
        self.skipped: list[SkipRecord] = []  # every skip of this process: reader lines and samples
        self._skip_file: str | None = None
        self._unwritten: list[SkipRecord] = []

    # ------------------------------------------------------------------ loading
    @property
    def data_mode(self) -> str:
        """The training batch kind: the task's (:meth:`connect`), else ``data.loader.data_mode``, else ``"sft"``."""
        return self._data_mode or "sft"

    @property
    def processor(self):
        """The processor, loaded on first use."""
        if self._processor is None:
            name = self.prompt.processor
            module = getattr(getattr(self, "trainer", None), "lightning_module", None)
            if name is None and getattr(module, "processor", None) is not None:
                self._processor = module.processor  # Python API: share the module's processor
                return self._processor
            if name is None:
                raise GraspConfigError("data.prompt.processor is not set (the CLI links it to model.policy.name_or_path)")
            from grasp_lightning.policy import load_processor

            # the CLI links data.prompt.processor to model.policy.name_or_path: the key a user sets
            self._processor = load_processor(name, trust_remote_code=self.prompt.trust_remote_code,
                                             key="model.policy.name_or_path")
        return self._processor

    def read_train_items(self) -> list[GraspItem]:
        """Read the training rows with the reader chosen by the file name.

        Raises:
            GraspConfigError: the file name is not one of the GRASP training files.
        """
        path = self.root / self.source.train_file
        reader = reader_for(path)
        if reader is None:
            raise GraspConfigError(f"data.source.train_file {path}: expected data_sft.jsonl, data_rl.jsonl, annotations.jsonl "
                                   f"or qa.jsonl (the generic QA format), the kind read from the name up to its first dot")
        result = reader(path, on_error=self.errors.on_bad_item)
        if result.skipped:
            self._record_skips(list(result.skipped))
            total = len(result.items) + len(result.skipped)
            if len(result.skipped) / total > self.errors.max_skip_fraction:
                raise GraspDataError(str(path), f"{len(result.skipped)} of {total} lines are unusable, over "
                                                f"data.errors.max_skip_fraction={self.errors.max_skip_fraction}; the "
                                                f"first: {result.skipped[0].where}: {result.skipped[0].reason}")
        return result.items

    def setup(self, stage: str) -> None:
        """Read the rows (fit) and the bench (fit/validate/test)."""
        self._open_skip_file()
        if stage == "fit" and not self.train_items:
            items = self.read_train_items()
            self.train_items = items[: self.source.train_limit] if self.source.train_limit else items
            log.info("train: %d rows from %s", len(self.train_items), self.source.train_file)
        own_predict_file = stage == "predict" and self.source.predict_file
        if stage in ("fit", "validate", "test", "predict") and self.source.bench and not self.val_items \
                and not own_predict_file:
            result = read_bench(self.root / self.source.bench, on_error=self.errors.on_bad_item)
            items = result.items
            self.val_items = items[: self.source.val_limit] if self.source.val_limit else items
            log.info("bench: %d items from %s", len(self.val_items), self.source.bench)
        if stage == "predict" and self.source.predict_file and not self.predict_items:
            self.predict_items = self._read_predict_items()
            log.info("predict: %d items from %s", len(self.predict_items), self.source.predict_file)
        elif stage in ("fit", "validate", "test", "predict") and not self.val_suites:
            self.val_suites = self._load_suites()

    def _read_predict_items(self) -> list[GraspItem]:
        """The items of ``data.source.predict_file``: a GRASP-Bench tar or folder, a GRASP file by its name
        (:func:`~grasp_lightning.data.readers.reader_for`), or else a generic QA JSONL file of any name.

        Raises:
            GraspConfigError: no such file or folder.
            GraspFormatError: (``data.errors.on_bad_item: raise``) a bad row, naming its file and line.
        """
        path = self.root / self.source.predict_file
        if not path.exists():
            raise GraspConfigError(f"data.source.predict_file {path}: no such file or folder")
        if path.is_dir() or path.suffix == ".tar":
            result = read_bench(path, on_error=self.errors.on_bad_item)
        else:  # a GRASP file by its name; any other name (questions.jsonl) is the generic QA format
            result = (reader_for(path) or read_qa)(path, on_error=self.errors.on_bad_item)
        self._record_skips(list(result.skipped))
        items = result.items
        return items[: self.source.predict_limit] if self.source.predict_limit else items

    def _load_suites(self) -> list[EvalSuite]:
        """GRASP-Bench of ``bench`` (when it has items) then ``eval_suites``, loaded, each given the
        module's evaluation protocol (``model.evaluation.protocol``; GRASP-Bench encodes and scores by it).

        Raises:
            GraspConfigError: two suites share a name.
        """
        from grasp_lightning.evaluation.audio import audio_unavailable_reason
        from grasp_lightning.evaluation.grasp_bench import GraspBench

        loaded = [GraspBench.from_items(str(self.root / self.source.bench), self.val_items)] if self.val_items else []
        reason = audio_unavailable_reason(self.processor) if self.eval_suites else None
        for suite in self.eval_suites:
            suite.load(on_error=self.errors.on_bad_item, audio_unavailable=reason)
            loaded.append(suite)
        names = [s.name for s in loaded]
        if len(set(names)) != len(names):
            raise GraspConfigError(f"data.eval_suites: evaluation suite names must be unique, got {names} "
                                   f"(set `name` in their init_args)")
        trainer = getattr(self, "trainer", None)
        protocol = getattr(trainer.lightning_module if trainer is not None else None, "eval_protocol", None)
        for suite in loaded:
            suite.use_protocol(protocol)
        return loaded

    def dataset(self, items: list[GraspItem], store: ClipStore, with_target: bool,
                 system_prompt: str | None = None, training: bool = False) -> GraspDataset:
        """The dataset over ``items`` with this DataModule's decoding, prompt and budget settings: the one
        encoder of training, evaluation and ``check-data`` (``grasp_lightning/commands/check_data.py``).

        Args:
            items: the records to encode.
            store: where their clips are read from.
            with_target: encode the SFT target (labels) too.
            system_prompt: ``None``: ``data.prompt.system_prompt``; an evaluation suite passes its own.
            training: the training rows: with ``data.prompt.rows_as_written`` their user text gets no
                ``data.prompt.instruction`` appended.
        """
        prompt = dataclasses.replace(
            self.prompt, system_prompt=self.prompt.system_prompt if system_prompt is None else system_prompt,
            instruction="" if training and self.prompt.rows_as_written else self.prompt.instruction)
        return GraspDataset(items, store, self.processor, self.video, prompt, self.errors, with_target=with_target)

    def connect(self, window: int = 1, repeat: int = 1, draws: bool = False, data_mode: str | None = None,
                lookahead: bool = False, split_groups: bool = False, sequence_parallel: int = 1) -> None:
        """Receive what the module and trainer decide, once, before the first train loader is built.

        Called by :meth:`GraspModule.setup <grasp_lightning.module.GraspModule.setup>` (LitGPT's
        ``DataModule.connect`` pattern: values two parts need are passed, not configured twice).

        Args:
            window: micro-batches per accumulation window delivered together (``batch.window``):
                ``trainer.accumulate_grad_batches`` for tasks that work on whole windows (GRPO), else 1.
            repeat: how many times each window is yielded (the task's ``num_iterations``).
            draws: the task may draw further windows from the stream (``Window.draw``, GRPO
                ``dynamic_sampling: refill``): batches come through a :class:`WindowLoader` even for
                ``window = repeat = 1``, and checkpoints record the draws.
            data_mode: the batch kind the task consumes (``Task.data_mode``: ``"sft"`` or ``"rl"``);
                ``None`` keeps ``data.loader.data_mode``.
            lookahead: the task reads the next window ahead (``Window.peek``, ``model.rollout.overlap: 1``):
                batches come through a :class:`WindowLoader` even for ``window = repeat = 1``.
            split_groups: each repeat of a window trains other completions of its prompts (GRPO
                ``batching.micro_batch: rollout``): the epoch ends after as many micro-batches as this rank has
                micro-batches of prompts, as the released run's Hugging Face Trainer computed ``max_steps`` from
                ``len(dataloader)`` (docs/released-recipe.md, "What the released run did").
            sequence_parallel: ranks ``N`` sharing each sample (``model.sequence_parallel``): rank ``r`` reads the
                batches of data-parallel rank ``r // N`` of ``W / N``.

        Raises:
            GraspConfigError: ``window``/``repeat`` < 1, an unknown ``data_mode``, or a ``data.loader.data_mode`` set
                explicitly to another kind than the task's.
        """
        if window < 1 or repeat < 1:
            raise GraspConfigError(f"window and repeat must be >= 1, got {window}, {repeat}")
        if data_mode is not None:
            if data_mode not in DATA_MODES:
                raise GraspConfigError(f"the task's data_mode must be 'sft' or 'rl', got {data_mode!r}")
            given = self.loader.data_mode
            if given is not None and given != data_mode:
                raise GraspConfigError(f"data.loader.data_mode={given!r} contradicts the task, which consumes "
                                       f"{data_mode!r} batches; remove data.loader.data_mode (the task sets it)")
            self._data_mode = data_mode
        self._window, self._repeat, self._draws, self._lookahead = window, repeat, draws, lookahead
        self._split = split_groups
        self._sequence_parallel = sequence_parallel

    def _rank(self, train: bool = False) -> tuple[int, int]:
        """``(rank, ranks)`` a loader splits its items by: the training loader's per sample (the ranks of a
        sequence-parallel group read the same batches), evaluation and predict per process (not split)."""
        trainer = self._trainer if hasattr(self, "_trainer") else None
        trainer = trainer or getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        share = getattr(self, "_sequence_parallel", 1) if train else 1  # ranks g*N .. g*N+N-1: the same batches
        return trainer.global_rank // share, trainer.world_size // share

    def _loader(self, dataset: GraspDataset, batches: ResumableBatchSampler, padding_side: str,
                windowed: bool = False):
        pad_id = self.processor.tokenizer.pad_token_id
        collate = partial(collate_samples, pad_token_id=pad_id, padding_side=padding_side)
        if windowed:
            collate = WindowCollate(collate, self.loader.batch_size)
        return DataLoader(dataset, batch_sampler=batches, num_workers=self.loader.num_workers,
                          collate_fn=collate, persistent_workers=self.loader.num_workers > 0,
                          worker_init_fn=ignore_stop_signals)

    def train_dataloader(self) -> DataLoader | WindowLoader:
        """Training batches of :class:`Batch`; SFT right-padded with labels, RL left-padded prompts.

        After :meth:`connect` with ``window > 1`` or ``repeat > 1``: a :class:`WindowLoader` yielding
        each accumulation window of micro-batches ``repeat`` times (``batch.window`` set).

        Raises:
            GraspConfigError: windowed, and this rank's epoch has fewer micro-batches than one window.
            GraspDataError: RL batches, and a row has no ``answer`` (:meth:`_check_rl_answers`).
        """
        if self.data_mode == "rl":
            self._check_rl_answers()
        rank, world = self._rank(train=True)
        sampler = ResumableSampler(len(self.train_items), shuffle=True, seed=self.loader.seed, rank=rank,
                                   world_size=world, pad="wrap", groups=self._curriculum_groups())
        windowed = self._window > 1 or self._repeat > 1 or self._draws or self._lookahead or self._split
        per_item = self._window * self._repeat  # micro-batches Lightning sees per sampler item
        batches = ResumableBatchSampler(sampler, self.loader.batch_size, self._window)
        skip = first = exclude = 0
        if self._resume is not None:
            epoch, consumed = self._resume
            stream_index, draws = self._stream if self._stream is not None else (None, 0)
            if consumed >= len(batches) * per_item:
                # Saved after the last batch of an epoch: Lightning resumes with the next epoch, and builds
                # this loader's iterator before it calls set_epoch, so start the next epoch here.
                epoch, consumed, stream_index, draws = epoch + 1, 0, None, 0
            first, skip, exclude = resume_position(consumed, per_item, stream_index, draws)
            batches.set_start(epoch, first, exclude)
            self._epoch, self._consumed = epoch, consumed
            self._resume = self._stream = None
        dataset = self.dataset(self.train_items, store_for(self.train_items, self.root / self.source.videos),
                               self.data_mode == "sft", training=True)
        loader = self._loader(dataset, batches, "right" if self.data_mode == "sft" else "left", windowed)
        if not windowed:
            return loader
        micro = -(-len(sampler) // self.loader.batch_size)
        if micro < self._window:
            raise GraspConfigError(f"train: {micro} micro-batches per epoch and rank (data.loader.batch_size="
                                   f"{self.loader.batch_size}) fill no window of {self._window} "
                                   f"(trainer.accumulate_grad_batches): nothing would be trained; lower "
                                   f"trainer.accumulate_grad_batches or data.loader.batch_size, or add data")
        if micro % self._window:
            log.warning("train: %d micro-batches per epoch and rank do not fill windows of %d "
                        "(trainer.accumulate_grad_batches); the last %d are dropped each epoch",
                        micro, self._window, micro % self._window)
        return WindowLoader(loader, self._window, self._repeat, skip=skip, first_window=first, exclude=exclude,
                            on_draw=self._count_drawn, limit=micro if self._split else None)

    def _curriculum_groups(self) -> list[int] | None:
        """``data.loader.curriculum``: each training row's place in easy → medium → hard (0, 1, 2), else ``None``.

        Raises:
            GraspDataError: naming the training file and the first row without a difficulty (the
                released code would count such rows as ``medium``; here the curriculum needs every row's).
        """
        if not self.loader.curriculum:
            return None
        missing = [item for item in self.train_items if item.difficulty not in DIFFICULTIES]
        if missing:
            raise GraspDataError(missing[0].origin, f"data.loader.curriculum orders rows easy -> medium -> hard, but "
                                                    f"{len(missing)} of {len(self.train_items)} rows of "
                                                    f"{self.source.train_file} carry no difficulty (a "
                                                    f"`meta` spec with `difficulty`: easy, medium or hard); "
                                                    f"add it or set data.loader.curriculum=false")
        return [DIFFICULTIES.index(item.difficulty) for item in self.train_items]

    def _check_rl_answers(self) -> None:
        """GRPO rows need the ``answer`` the accuracy reward compares with (a generic QA row may have
        none; it would train on a reward of 0). ``on_bad_item: raise``: an error naming the first such
        row; ``skip``: those rows are counted, logged and written to ``skipped.jsonl``.

        Raises:
            GraspDataError: the first row without an answer (``raise``), or (``skip``) more than
                ``data.errors.max_skip_fraction`` of the rows have none.
        """
        missing = [item for item in self.train_items if not item.answer.strip()]
        if not missing:
            return
        reason = "GRPO needs an `answer` (the accuracy reward's target); this row has none"
        if self.errors.on_bad_item == "raise":
            raise GraspDataError(missing[0].origin, f"{reason} ({len(missing)} of {len(self.train_items)} rows "
                                                    f"like it; data.errors.on_bad_item=skip leaves them out)")
        self._record_skips([SkipRecord(item.origin, reason, item.uid) for item in missing])
        if len(missing) / len(self.train_items) > self.errors.max_skip_fraction:
            raise GraspDataError(missing[0].origin, f"{len(missing)} of {len(self.train_items)} rows have no "
                                                    f"`answer`, over data.errors.max_skip_fraction="
                                                    f"{self.errors.max_skip_fraction}")
        log.warning("train: %d rows without an answer are left out of GRPO", len(missing))
        dropped = {id(item) for item in missing}
        self.train_items = [item for item in self.train_items if id(item) not in dropped]

    def _suite_loader(self, suite: EvalSuite) -> DataLoader:
        rank, world = self._rank()
        sampler = ResumableSampler(len(suite.items), shuffle=False, rank=rank, world_size=world, pad="mark")
        dataset = self.dataset(suite.items, suite.store(), False, system_prompt=suite.system_prompt)
        dataset.encoder = suite.encoder(self.processor)  # GRASP-Bench: its protocol's encoder, or None (ours)
        return self._loader(dataset, ResumableBatchSampler(sampler, self.loader.val_batch_size), "left")

    def val_dataloader(self) -> DataLoader | list:
        """Prompts of every evaluation suite with items, left-padded; ranks padded with ``valid=False``
        rows. One loader per suite, GRASP-Bench first (``dataloader_idx`` in that order); a single
        suite gives a single loader."""
        from grasp_lightning.evaluation.suite import routes

        loaders = [self._suite_loader(s) for s in routes(self.val_suites)]
        return loaders[0] if len(loaders) == 1 else loaders

    def test_dataloader(self) -> DataLoader | list:
        """Same as validation: every evaluation suite."""
        return self.val_dataloader()

    def predict_dataloader(self) -> DataLoader | list:
        """Prompts to answer, left-padded, ``data.loader.val_batch_size`` per step; ranks padded with
        ``valid=False`` rows. ``data.source.predict_file``'s items (read from ``data.source.videos``; a bench file
        from its own archive), else one loader per evaluation suite as for validation. Items whose
        :func:`~grasp_lightning.predictions.item_key` is among :attr:`predict_done`'s (answered by an
        earlier run with the same model and decoding) are left out, said at WARNING with the count."""
        done = self.predict_done() if self.predict_done is not None else set()
        if not self.source.predict_file:
            suites = [s for s in self.val_suites if s.items]
            for suite in suites:
                suite.items = self._not_done(suite.items[: self.source.predict_limit or None], done, suite.name)
            loaders = [self._suite_loader(s) for s in suites]
            return loaders[0] if len(loaders) == 1 else loaders
        path = self.root / self.source.predict_file
        items = self._not_done(self.predict_items, done, str(path))
        bench = path.is_dir() or path.suffix == ".tar"
        store = bench_store(path) if bench else store_for(items, self.root / self.source.videos)
        rank, world = self._rank()
        sampler = ResumableSampler(len(items), shuffle=False, rank=rank, world_size=world, pad="mark")
        dataset = self.dataset(items, store, False)
        return self._loader(dataset, ResumableBatchSampler(sampler, self.loader.val_batch_size), "left")

    @staticmethod
    def _not_done(items: list[GraspItem], done: set[str], what: str) -> list[GraspItem]:
        """``items`` without those whose key is in ``done``; the count left out is said at WARNING."""
        left = [item for item in items if item_key(item) not in done] if done else items
        if len(left) < len(items):
            log.warning("predict: %d of %d items of %s were already answered by this model and decoding (in the "
                        "prediction file): left out, %d left to answer", len(items) - len(left), len(items), what,
                        len(left))
        return left

    # ------------------------------------------------------------------ accounting
    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        """Count consumed training samples (for exact resume) and record skips."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            if trainer.current_epoch != self._epoch:
                self._epoch, self._consumed = trainer.current_epoch, 0
            self._consumed += 1
            self._last_window = batch.window
            if getattr(batch.window, "iteration", 0):
                return batch  # a repeated window: its samples and skips were counted at its first use
            self._count(batch)
        return batch

    def _count_drawn(self, batches: list[Batch]) -> None:
        """A window drawn by the task (``Window.draw``): its samples are consumed too."""
        for batch in batches:
            self._count(batch)

    def _count(self, batch: Batch) -> None:
        """Count a consumed micro-batch's samples and skips; stop the run over ``data.errors.max_skip_fraction``."""
        self.samples_seen += len(batch) + len(batch.skipped)
        if batch.skipped:
            self.samples_skipped += len(batch.skipped)
            self._record_skips(batch.skipped)
        if self.samples_seen >= 20 and self.samples_skipped / self.samples_seen > self.errors.max_skip_fraction:
            last = self.skipped[-1]
            raise GraspDataError(
                self.source.train_file,
                f"{self.samples_skipped} of {self.samples_seen} samples skipped, over data.errors.max_skip_fraction="
                f"{self.errors.max_skip_fraction}; the last: {last.uid} ({last.where}: {last.reason}); "
                f"every skip is listed in {self._skip_file or 'the log'}")

    def _open_skip_file(self) -> None:
        """Resolve ``<run dir>/skipped.jsonl`` (``skipped.rank<r>.jsonl`` on rank r > 0) once, in
        ``setup`` where every rank calls it (``trainer.log_dir`` is a collective), and write the
        skips recorded before it was known."""
        trainer = getattr(self, "trainer", None)
        if self._skip_file is not None or trainer is None:
            return
        log_dir = trainer.log_dir or trainer.default_root_dir
        rank = trainer.global_rank
        self._skip_file = os.path.join(log_dir, "skipped.jsonl" if rank == 0 else f"skipped.rank{rank}.jsonl")
        self._record_skips([])

    def _record_skips(self, skips: list[SkipRecord]) -> None:
        """Keep, and append to the skip file once it is known (one JSON object per line: uid, where, reason)."""
        self.skipped.extend(skips)
        self._unwritten.extend(skips)
        if self._skip_file is None or not self._unwritten:
            return
        os.makedirs(os.path.dirname(self._skip_file) or ".", exist_ok=True)
        with open(self._skip_file, "a", encoding="utf-8") as fh:
            for s in self._unwritten:
                fh.write(json.dumps({"uid": s.uid, "where": s.where, "reason": s.reason}) + "\n")
        self._unwritten = []

    def state_dict(self) -> dict:
        """``{"epoch", "consumed", ...}``: micro-batches of the epoch this rank consumed, and the stream
        position and draws of the last consumed window (``stream_index``/``stream_draws``, -1/0 outside
        window mode; see :func:`~grasp_lightning.data.windows.resume_position`), and ``curriculum`` (the
        order's kind, checked on resume)."""
        w = self._last_window
        return {"epoch": self._epoch, "consumed": self._consumed, "samples_seen": self.samples_seen,
                "curriculum": bool(self.loader.curriculum),
                "samples_skipped": self.samples_skipped,
                "stream_index": int(w.index) if w is not None else -1, "stream_draws": int(getattr(w, "draws", 0))}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next train loader starts after the consumed batches.

        Raises:
            GraspConfigError: the checkpoint was written with another ``data.loader.curriculum`` (the consumed
                count would point into a different order).
        """
        saved, now = bool(state.get("curriculum", False)), bool(self.loader.curriculum)
        if saved != now:
            raise GraspConfigError(f"the checkpoint was trained with data.loader.curriculum={str(saved).lower()}, this run "
                                   f"sets {str(now).lower()}: the rows already consumed belong to the other order; "
                                   f"resume with data.loader.curriculum={str(saved).lower()}")
        self._resume = (int(state["epoch"]), int(state["consumed"]))
        index = int(state.get("stream_index", -1))
        self._stream = (index, int(state.get("stream_draws", 0))) if index >= 0 else None
        self.samples_seen = int(state.get("samples_seen", 0))
        self.samples_skipped = int(state.get("samples_skipped", 0))


def ignore_stop_signals(worker_id: int) -> None:  # noqa: ARG001 (DataLoader's worker_init_fn API)
    """DataLoader ``worker_init_fn``: workers ignore SIGTERM and SIGUSR1.

    SLURM and ``kill -- -PGID`` signal every process of a job; a worker killed by it would make the
    main process fail before ``grasp_lightning.callbacks.control.preemption.Preemption`` saves its checkpoint. Workers
    still exit when the main process shuts them down or dies (PyTorch's worker watchdog).
    """
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
