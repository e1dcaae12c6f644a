"""Rollout samples: every N optimizer steps, the K completions of a few prompts with their reward terms,
extracted answers and named participants, as a table ``rollouts/samples`` in every logger
(:func:`grasp_lightning.monitoring.loggers.log_table`: TensorBoard a Markdown text, W&B a ``wandb.Table``, MLflow a
logged table; none in CSV) and a JSONL file, the ground truth (``rollouts.jsonl`` in the run's folder,
:func:`grasp_lightning.monitoring.loggers.run_dir`). Reads ``module.last_task_output.rollout``
(:class:`~grasp_lightning.task.RolloutRecord`); changes nothing.
"""

from __future__ import annotations

import json
import os

import lightning as L
from typing_extensions import override

from grasp_lightning.callbacks.step_window import StepWindow
from grasp_lightning.monitoring.loggers import log_table, run_dir
from grasp_lightning.parsing import extract_answer, extract_participants, reasoning_text
from grasp_lightning.task import RolloutRecord


def rollout_rows(record: RolloutRecord, max_prompts: int) -> list[dict]:
    """Rows (one per completion) of the first ``max_prompts`` groups of a step's rollouts."""
    k = record.num_generations
    names = record.reward_names
    rows = []
    for n, text in enumerate(record.completions[: max_prompts * k]):
        item = record.items[n // k]
        rows.append({
            "uid": item.uid,
            "group": n // k,
            "rollout": n % k,
            "target": item.answer,
            "answer": extract_answer(text),
            "participants_named": sorted(extract_participants(reasoning_text(text))),
            "participants_gt": sorted(item.participants),
            "rewards": {name: float(record.terms[n, j]) for j, name in enumerate(names)},
            "reward": float(record.rewards[n]),
            "advantage": float(record.advantages[n]),
            "completion": text,
        })
    return rows


def table_rows(rows: list[dict]) -> list[dict]:
    """The logged table's rows: one per completion, flat (one column per reward term), short column names."""
    return [{"uid": r["uid"], "k": r["rollout"], "target": r["target"], "answer": r["answer"],
             "named": ", ".join(map(str, r["participants_named"])), "gt": ", ".join(map(str, r["participants_gt"])),
             **r["rewards"], "reward": r["reward"], "adv": r["advantage"], "completion": r["completion"]} for r in rows]


class RolloutSamples(L.Callback):
    """Every ``every_n_steps`` optimizer steps (0, n, 2n, ...), write the first ``num_prompts`` groups of
    the step: one dump per step, the groups taken in order over the micro-batches of the step's
    accumulation window (:class:`grasp_lightning.callbacks.step_window.StepWindow`) on rank zero, written when the
    optimizer has stepped, at the step's 0-based index (where Lightning writes the module's ``train/``
    values of the same window).

    Args:
        every_n_steps: interval in optimizer steps (the first step, 0, is always written).
        num_prompts: groups (prompts) per dump; each has its K completions.
        filename: JSONL file in the run's folder (:func:`grasp_lightning.monitoring.loggers.run_dir`).

    Attributes:
        dumps: the steps written so far.
    """

    def __init__(self, every_n_steps: int = 50, num_prompts: int = 2, filename: str = "rollouts.jsonl") -> None:
        if every_n_steps < 1:
            raise ValueError(f"RolloutSamples: every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.num_prompts = num_prompts
        self.filename = filename
        self.dumps: list[int] = []
        self._window = StepWindow()
        self._rows: list[dict] = []

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._window.start(trainer):
            self._rows = []

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        wanted = trainer.is_global_zero and self._window.step % self.every_n_steps == 0
        out = getattr(pl_module, "last_task_output", None)
        groups = len({row["group"] for row in self._rows})
        if wanted and out is not None and out.rollout is not None and groups < self.num_prompts:
            for row in rollout_rows(out.rollout, self.num_prompts - groups):
                self._rows.append(dict(row, group=row["group"] + groups))  # numbered over the step
        if not self._window.stepped(trainer) or not wanted or not self._rows:
            return
        step, rows, self._rows = self._window.step, self._rows, []
        log_dir = run_dir(trainer)  # rank zero only: no collective (trainer.log_dir broadcasts)
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, self.filename), "a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps({"step": step, **row}) + "\n")
        log_table(trainer, "rollouts/samples", table_rows(rows), step)
        self.dumps.append(step)
