"""``predict``'s output: one JSON line per item, written as each batch ends, resumed by default.

Lightning's ``BasePredictionWriter`` with ``write_interval="batch"``: the records of
``GraspModule.predict_step`` (:func:`grasp_lightning.predictions.prediction_records`) are appended to
the file and flushed to disk after every batch, so an interrupted run keeps what it wrote. Every line
names the model, checkpoint and decoding that wrote it and their key (``setup``,
:class:`grasp_lightning.predictions.PredictionSetup`).

The file's place does not change between runs of the same command (``output``, or
``<save_dir>/<name>/predictions.jsonl`` of the run's logger, never a ``version_N`` folder), so running
the same command again leaves out the items an earlier line answered with the same setup (by
:func:`~grasp_lightning.predictions.item_key`) and appends the rest; another model, checkpoint or
decoding answers every item again, into the same file (``resume``).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from pathlib import Path

from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from grasp_lightning.errors import GraspDataError
from grasp_lightning.monitoring.loggers import runs_root
from grasp_lightning.predictions import PredictionSetup

log = logging.getLogger(__name__)


class PredictionWriter(BasePredictionWriter):
    """Write ``predict``'s records as JSON lines, each stamped with the setup that wrote it.

    Args:
        output: the JSONL file; ``None``: ``predictions.jsonl`` in the folder every run of the logger's
            name shares (:func:`~grasp_lightning.monitoring.loggers.runs_root`: ``runs/<name>/predictions.jsonl`` for
            the recipes), so the same command finds it again. Under several processes each rank writes
            ``<stem>.rank<N>.jsonl``.
        resume: leave out the items that a line of the file (any rank's) answered with this run's setup
            (model, checkpoint, decoding and every setting that changes a prompt or an answer:
            ``GraspModule.prediction_setup``) and append the
            rest; lines of another setup stay and are not reused. ``False``: start the file afresh (every
            setup's lines are removed).

    Raises:
        GraspDataError: with ``resume``, an existing line is not JSON (the file and line are named).
    """

    def __init__(self, output: str | None = None, resume: bool = True) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self.resume = resume
        self.path: Path | None = None
        self.written = 0
        self.answered: dict[str, set[str]] = {}  # setup key -> item keys answered in the file
        self.stamps: dict[str, tuple] = {}  # setup key -> (model, checkpoint, decoding) its lines name
        self.setup_info: PredictionSetup | None = None

    def _paths(self, trainer) -> tuple[Path, list[Path]]:
        base = Path(self.output) if self.output else Path(runs_root(trainer)) / "predictions.jsonl"
        if trainer.world_size == 1:
            return base, [base]
        ranks = [base.with_name(f"{base.stem}.rank{r}{base.suffix}") for r in range(trainer.world_size)]
        return ranks[trainer.global_rank], ranks

    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        """Pick the file; with ``resume``, read which items each setup answered and hand the DataModule
        (``predict_done``) the function that gives this run's, asked once a checkpoint is restored."""
        if stage != "predict":
            return
        self.path, every = self._paths(trainer)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.written, self.setup_info = 0, None
        self.answered, self.stamps = defaultdict(set), {}
        if self.resume:
            for path in every:
                answered, stamps = _answered(path)
                for setup, keys in answered.items():
                    self.answered[setup] |= keys
                self.stamps.update(stamps)
        else:
            self.path.write_text("", encoding="utf-8")
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None and hasattr(datamodule, "predict_done"):
            datamodule.predict_done = (lambda: self._done(trainer, pl_module)) if self.resume else None

    def _setup(self, trainer, pl_module) -> PredictionSetup:
        """This run's setup, built once the checkpoint (if any) is restored."""
        if self.setup_info is None:
            hparams = getattr(getattr(trainer, "datamodule", None), "hparams", {})
            self.setup_info = pl_module.prediction_setup(dict(hparams))
            log.info("predict: model %s, checkpoint %s, setup %s; answers go to %s", self.setup_info.model,
                     self.setup_info.checkpoint, self.setup_info.key, self.path)
        return self.setup_info

    def _done(self, trainer, pl_module) -> set[str]:
        """The item keys this run's setup already answered in the file (the DataModule leaves them out)."""
        setup = self._setup(trainer, pl_module)
        done = set(self.answered.get(setup.key, ()))
        others = sum(len(keys) for key, keys in self.answered.items() if key != setup.key)
        stamp = _stamp_of(setup.stamp())
        alike = sum(len(keys) for key, keys in self.answered.items() if key != setup.key and self.stamps.get(key) == stamp)
        if alike:
            log.warning("predict: %s holds %d answers of this model, checkpoint and decoding under another `setup` key: "
                        "another prompt, frame, engine or dtype setting (data.video, data.prompt, model.rollout.vllm, "
                        "...), or a file written before the key covered every such setting (e.g. "
                        "data.video.frame_max_tokens, model.rollout.vllm.dtype). They are kept, not reused: their items "
                        "are answered again (resume: false starts the file afresh)", self.path, alike)
        elif others:
            log.info("predict: %s also holds %d answers of other models or decoding settings (other `setup` keys): "
                     "kept, not reused", self.path, others)
        return done

    @override
    def on_predict_start(self, trainer, pl_module) -> None:
        self._setup(trainer, pl_module)

    @override
    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx) -> None:
        """Append the batch's records, each with the setup's ``model``, ``checkpoint``, ``decoding`` and
        ``setup`` key, and flush them to disk."""
        stamp = self._setup(trainer, pl_module).stamp()
        with open(self.path, "a", encoding="utf-8") as fh:
            for record in prediction:
                fh.write(json.dumps({**record, **stamp}, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.written += len(prediction)

    @override
    def on_predict_end(self, trainer, pl_module) -> None:
        log.info("predict: %d records written to %s", self.written, self.path)


def _stamp_of(record: dict) -> tuple:
    """What a line says wrote it, comparable across lines: ``(model, checkpoint, decoding)``."""
    return record.get("model"), record.get("checkpoint"), json.dumps(record.get("decoding"), sort_keys=True)


def _answered(path: Path) -> tuple[dict[str, set[str]], dict[str, tuple]]:
    """``({setup key: item keys}, {setup key: (model, checkpoint, decoding)})`` of the answered lines of an
    earlier run's file; skipped items, and lines without the keys (written before lines carried them), are
    answered again."""
    if not path.exists():
        return {}, {}
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):  # a write cut short by a kill: its batch is answered again
        log.warning("predict: %s ends in an incomplete line (an interrupted write); it is removed", path)
        text = text[: text.rfind("\n") + 1]
        path.write_text(text, encoding="utf-8")
    answered: dict[str, set[str]] = defaultdict(set)
    stamps: dict[str, tuple] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GraspDataError(f"{path}:{lineno}", f"not a JSON line of predictions ({exc.msg}); remove it "
                                                     f"or set resume: false to start afresh") from None
        if isinstance(record, dict) and "skipped" not in record and record.get("setup") and record.get("item_key"):
            answered[str(record["setup"])].add(str(record["item_key"]))
            stamps[str(record["setup"])] = _stamp_of(record)
    return answered, stamps
