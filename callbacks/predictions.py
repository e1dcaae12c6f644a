"""``predict``'s output: one JSON line per item, written as each batch ends.

Lightning's ``BasePredictionWriter`` with ``write_interval="batch"``: the records of
``GraspModule.predict_step`` (:func:`grasp_lightning.predictions.prediction_records`) are appended to
the file and flushed to disk after every batch, so an interrupted run keeps what it wrote. Run again
with the same ``output``, the items already in the file are left out of the new run and its lines
appended (``resume``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from grasp_lightning.errors import GraspDataError

log = logging.getLogger(__name__)


class PredictionWriter(BasePredictionWriter):
    """Write ``predict``'s records as JSON lines.

    Args:
        output: the JSONL file; ``None``: ``predictions.jsonl`` in the run directory
            (``trainer.log_dir``). Under several processes each rank writes ``<stem>.rank<N>.jsonl``.
        resume: when the file (any rank's) already holds lines, leave their items (by ``origin``) out
            of this run and append; ``False``: start the file afresh.

    Raises:
        GraspDataError: with ``resume``, an existing line is not JSON (the file and line are named).
    """

    def __init__(self, output: str | None = None, resume: bool = True) -> None:
        super().__init__(write_interval="batch")
        self.output = output
        self.resume = resume
        self.path: Path | None = None
        self.written = 0

    def _paths(self, trainer) -> tuple[Path, list[Path]]:
        base = Path(self.output) if self.output else Path(trainer.log_dir or trainer.default_root_dir) / "predictions.jsonl"
        if trainer.world_size == 1:
            return base, [base]
        ranks = [base.with_name(f"{base.stem}.rank{r}{base.suffix}") for r in range(trainer.world_size)]
        return ranks[trainer.global_rank], ranks

    @override
    def setup(self, trainer, pl_module, stage: str) -> None:
        """Pick the file; with ``resume``, tell the DataModule which items are done (``predict_done``)."""
        if stage != "predict":
            return
        self.path, every = self._paths(trainer)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.resume:
            self.path.write_text("", encoding="utf-8")
            return
        done = set()
        for path in every:
            done |= _ids(path)
        datamodule = getattr(trainer, "datamodule", None)
        if done and datamodule is not None and hasattr(datamodule, "predict_done"):
            datamodule.predict_done = done
            log.info("predict: %d items already in %s are left out", len(done), self.path)

    @override
    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx) -> None:
        """Append the batch's records and flush them to disk."""
        with open(self.path, "a", encoding="utf-8") as fh:
            for record in prediction:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.written += len(prediction)

    @override
    def on_predict_end(self, trainer, pl_module) -> None:
        log.info("predict: %d records written to %s", self.written, self.path)


def _ids(path: Path) -> set[str]:
    """The ``origin`` (``<file>:<line>`` or ``<archive>:<member>``: one per question, even where two rows
    share an ``id``) of every answered line of an earlier run's file; skipped items are tried again."""
    if not path.exists():
        return set()
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):  # a write cut short by a kill: its batch is answered again
        log.warning("predict: %s ends in an incomplete line (an interrupted write); it is removed", path)
        text = text[: text.rfind("\n") + 1]
        path.write_text(text, encoding="utf-8")
    ids = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GraspDataError(f"{path}:{lineno}", f"not a JSON line of predictions ({exc.msg}); remove it "
                                                     f"or set resume: false to start afresh") from None
        if "skipped" not in record:
            ids.add(str(record.get("origin")))
    return ids
