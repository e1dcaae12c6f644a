"""Logger-neutral rich logging: text, tables, histograms and images to every logger of a trainer.

Lightning's ``self.log`` reaches every logger with scalars only; this module gives the callbacks the rest,
written natively to each logger in ``trainer.loggers``:

- ``TensorBoardLogger`` (its ``SummaryWriter``): ``add_text`` (the text plugin renders Markdown), a table as
  ``add_text`` of a Markdown table, ``add_histogram``, ``add_image`` (HWC).
- ``WandbLogger``: ``wandb.Html`` (the Markdown rendered as TensorBoard renders it), ``wandb.Table``,
  ``wandb.Histogram``, ``wandb.Image``, each at ``trainer/global_step``.
- ``MLFlowLogger`` (``MlflowClient`` on its ``run_id``): ``log_text`` to ``<tag>/step_<N>.md``; ``log_table`` to
  ``<tag>.json`` (rows appended across steps, a ``step`` column first); a histogram as summary metrics
  ``<tag>/min, p50, p90, p99, max, mean`` plus its 64-bin counts in ``<tag>/step_<N>.json``; ``log_image``
  with ``key`` and ``step`` (MLflow's per-step image series).
- ``CSVLogger``: a histogram's summary metrics; no text, table or image.

What a logger cannot hold is counted in :data:`skipped` and said once at info level (the run's JSONL files
and ``bench/`` reports stay the ground truth); a logger of another type gets one warning naming it. Every
function writes on global rank zero only (the loggers' experiments are rank-zero objects) and starts no
collective. :func:`run_dir` is the folder of a run's own files for every logger type.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

log = logging.getLogger(__name__)

#: Writes a logger could not hold: ``(logger class name, kind)`` -> count (kind: text, table, histogram, image).
skipped: Counter = Counter()
_warned: set[str] = set()
#: Quantiles of a histogram logged as summary metrics where a logger has no histogram (MLflow, CSV).
QUANTILES = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))


def log_text(trainer: L.Trainer, tag: str, text: str, step: int) -> None:
    """Write a Markdown ``text`` under ``tag`` at optimizer step ``step`` to every logger of ``trainer``
    (TensorBoard's text plugin renders Markdown; W&B gets the same HTML; MLflow a ``.md`` artifact)."""
    _dispatch(trainer, "text", tag, text, step)


def log_table(trainer: L.Trainer, tag: str, rows: list[dict], step: int) -> None:
    """Write ``rows`` (one dict per row, the first row's keys are the columns; values are numbers,
    strings or anything ``json.dumps`` takes) under ``tag`` at step ``step`` to every logger: a real table
    where the backend has one (W&B, MLflow), a Markdown table in TensorBoard (cells cut at 300 characters)."""
    _dispatch(trainer, "table", tag, [_flat(row) for row in rows], step)


def log_histogram(trainer: L.Trainer, tag: str, values: torch.Tensor | np.ndarray, step: int) -> None:
    """Write the distribution of ``values`` (any shape, flattened, as float32) under ``tag`` at step ``step``
    to every logger; nothing for an empty ``values``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    if values.size:
        _dispatch(trainer, "histogram", tag, values, step)


def log_image(trainer: L.Trainer, tag: str, image: np.ndarray, step: int) -> None:
    """Write an ``image`` (``(H, W, 3)`` or ``(H, W, 4)`` uint8, pixels) under ``tag`` at step ``step``
    to every logger.

    Raises:
        ValueError: ``image`` is not a uint8 array of that shape (the message names ``tag``).
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ValueError(f"image {tag!r}: expected (H, W, 3|4) uint8, got {image.shape} {image.dtype}")
    _dispatch(trainer, "image", tag, image, step)


def run_dir(trainer: L.Trainer) -> str:
    """The folder of this run's own files (``config.yaml``, ``rollouts.jsonl``, ``bench/``) beside its
    checkpoints: the first logger's ``log_dir`` for TensorBoard and CSV (``<save_dir>/<name>/version_<N>``),
    ``<save_dir or default_root_dir>/<name>/<version>`` for the others, as Lightning's ``ModelCheckpoint``
    places ``checkpoints/`` (W&B: ``<save_dir>/<project>/<run id>``; MLflow: ``.../<experiment id>/<run id>``);
    ``default_root_dir`` without a logger. Reads the logger on the calling rank, no collective (Lightning's
    ``trainer.log_dir`` broadcasts, and for W&B and MLflow is the store's root shared by every run)."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return logger.log_dir
    _ = logger.experiment  # the run id exists once the run does (Lightning creates it before ``setup``)
    version = logger.version
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def runs_root(trainer: L.Trainer) -> str:
    """The folder every run of the first logger's name shares, one level above :func:`run_dir`: TensorBoard's
    and CSV's ``root_dir`` (``<save_dir>/<name>``), ``<save_dir or default_root_dir>/<name>`` for the others
    (W&B: ``<save_dir>/<project>``; MLflow: ``.../<experiment id>``); ``default_root_dir`` without a logger.
    A file kept here is found again by the next run of the same command (``predict``'s answers). Reads the
    logger on the calling rank, no collective."""
    if not trainer.loggers:
        return trainer.default_root_dir
    logger = trainer.loggers[0]
    if isinstance(logger, (TensorBoardLogger, CSVLogger)):
        return logger.root_dir
    _ = logger.experiment  # MLflow's name is its experiment id, known once the experiment exists
    return os.path.join(logger.save_dir or trainer.default_root_dir, str(logger.name))


def _dispatch(trainer: L.Trainer, kind: str, tag: str, value, step: int) -> None:
    """Call the writer of ``kind`` for each logger's type (on global rank zero)."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        backend = next((b for t, b in _BACKENDS.items() if isinstance(logger, t)), None)
        if backend is None:
            _warn_once(logger)
            continue
        write = getattr(backend, kind, None)
        if write is None:
            _skip(logger, kind, tag)
        else:
            write(logger, tag, value, step)


def _skip(logger: Logger, kind: str, tag: str) -> None:
    """Count a write ``logger`` cannot hold; say it at info level the first time for its type and kind."""
    key = (type(logger).__name__, kind)
    if not skipped[key]:
        log.info("%s has no %s: %r and later %s writes are not logged there (the run's JSONL files and bench/ "
                 "reports hold them)", key[0], kind, tag, kind)
    skipped[key] += 1


def _warn_once(logger: Logger) -> None:
    """One warning per logger type that this module does not know."""
    name = f"{type(logger).__module__}.{type(logger).__qualname__}"
    if name not in _warned:
        _warned.add(name)
        log.warning("logger %s is not supported by grasp_lightning.monitoring.loggers: texts, tables, histograms and "
                    "images are not written to it (scalars are)", name)


def _flat(row: dict) -> dict:
    """A row with scalar cells: numbers, strings, booleans and ``None`` kept, anything else as JSON."""
    return {k: v if v is None or isinstance(v, (str, int, float, bool)) else json.dumps(v) for k, v in row.items()}


def markdown_table(rows: list[dict], max_cell: int = 300) -> str:
    """A Markdown table of ``rows`` (columns: the first row's keys; floats with 4 significant digits;
    ``|`` escaped, newlines as spaces, cells cut at ``max_cell`` characters); ``"(no rows)"`` when empty."""
    if not rows:
        return "(no rows)"

    def cell(v) -> str:
        text = f"{v:.4g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", " ")[:max_cell]

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _summary(tag: str, values: np.ndarray) -> dict[str, float]:
    """``{<tag>/min, /p50, /p90, /p99, /max, /mean: value}`` of a 1-D float array."""
    out = {f"{tag}/{name}": float(np.quantile(values, q)) for name, q in QUANTILES}
    out[f"{tag}/mean"] = float(values.mean())
    return out


class _TensorBoard:
    """``SummaryWriter`` calls of Lightning's ``TensorBoardLogger`` (its ``experiment``)."""

    @staticmethod
    def text(logger: TensorBoardLogger, tag: str, text: str, step: int) -> None:
        logger.experiment.add_text(tag, text, global_step=step)

    @staticmethod
    def table(logger: TensorBoardLogger, tag: str, rows: list[dict], step: int) -> None:
        logger.experiment.add_text(tag, markdown_table(rows), global_step=step)

    @staticmethod
    def histogram(logger: TensorBoardLogger, tag: str, values: np.ndarray, step: int) -> None:
        logger.experiment.add_histogram(tag, values, global_step=step)

    @staticmethod
    def image(logger: TensorBoardLogger, tag: str, image: np.ndarray, step: int) -> None:
        logger.experiment.add_image(tag, image, global_step=step, dataformats="HWC")


class _Wandb:
    """W&B media through ``WandbLogger.log_metrics``: like Lightning's own ``log_table``/``log_image``, the
    step goes in as ``trainer/global_step`` (the x-axis Lightning defines), never as ``wandb.log``'s
    ``step=``, which must grow by one per call and drops older steps."""

    @staticmethod
    def text(logger: WandbLogger, tag: str, text: str, step: int) -> None:
        import wandb
        from tensorboard.plugin_util import markdown_to_safe_html

        logger.log_metrics({tag: wandb.Html(markdown_to_safe_html(text))}, step=step)

    @staticmethod
    def table(logger: WandbLogger, tag: str, rows: list[dict], step: int) -> None:
        import wandb

        columns = list(rows[0]) if rows else []
        table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        logger.log_metrics({tag: table}, step=step)

    @staticmethod
    def histogram(logger: WandbLogger, tag: str, values: np.ndarray, step: int) -> None:
        import wandb

        logger.log_metrics({tag: wandb.Histogram(values)}, step=step)

    @staticmethod
    def image(logger: WandbLogger, tag: str, image: np.ndarray, step: int) -> None:
        import wandb

        logger.log_metrics({tag: wandb.Image(image)}, step=step)


class _MLflow:
    """``MlflowClient`` calls on ``MLFlowLogger.run_id`` (artifacts under the run's artifact root)."""

    @staticmethod
    def text(logger: MLFlowLogger, tag: str, text: str, step: int) -> None:
        logger.experiment.log_text(logger.run_id, text, f"{tag}/step_{step}.md")

    @staticmethod
    def table(logger: MLFlowLogger, tag: str, rows: list[dict], step: int) -> None:
        if not rows:
            return
        columns = ["step", *(c for c in rows[0] if c != "step")]
        data = {c: [step if c == "step" else row.get(c) for row in rows] for c in columns}
        logger.experiment.log_table(logger.run_id, data=data, artifact_file=f"{tag}.json")  # appends rows

    @staticmethod
    def histogram(logger: MLFlowLogger, tag: str, values: np.ndarray, step: int) -> None:
        logger.log_metrics(_summary(tag, values), step=step)
        counts, edges = np.histogram(values, bins=64)
        logger.experiment.log_dict(logger.run_id, {"step": step, "counts": counts.tolist(), "edges": edges.tolist()},
                                   f"{tag}/step_{step}.json")

    @staticmethod
    def image(logger: MLFlowLogger, tag: str, image: np.ndarray, step: int) -> None:
        logger.experiment.log_image(logger.run_id, image, key=tag, step=step)


class _CSV:
    """Lightning's ``CSVLogger``: scalars only, so a histogram is its summary metrics and the rest is skipped."""

    @staticmethod
    def histogram(logger: CSVLogger, tag: str, values: np.ndarray, step: int) -> None:
        logger.log_metrics(_summary(tag, values), step=step)


_BACKENDS: dict[type, type] = {TensorBoardLogger: _TensorBoard, WandbLogger: _Wandb,
                                          MLFlowLogger: _MLflow, CSVLogger: _CSV}
