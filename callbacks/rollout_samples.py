"""Rollout samples: every N steps, the K completions of a few prompts with their reward terms,
extracted answers and named participants, as a table ``rollouts/samples`` in every logger
(:func:`grasp_lightning.loggers.log_table`: TensorBoard a Markdown text, W&B a ``wandb.Table``, MLflow a
logged table; none in CSV) and a JSONL file, the ground truth (``rollouts.jsonl`` in the run's folder,
:func:`grasp_lightning.loggers.run_dir`). Reads ``module.last_task_output.rollout``
(:class:`~grasp_lightning.task.RolloutRecord`); changes nothing.
"""

from __future__ import annotations

import json
import os

import lightning as L
from typing_extensions import override

from grasp_lightning.loggers import log_table, run_dir
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
    """Every ``every_n_steps`` steps, write the first ``num_prompts`` groups of the step.

    Args:
        every_n_steps: interval in optimizer steps (the first step is always written).
        num_prompts: groups (prompts) per dump; each has its K completions.
        filename: JSONL file in the run's folder (:func:`grasp_lightning.loggers.run_dir`).
    """

    def __init__(self, every_n_steps: int = 50, num_prompts: int = 2, filename: str = "rollouts.jsonl") -> None:
        self.every_n_steps = every_n_steps
        self.num_prompts = num_prompts
        self.filename = filename

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = getattr(pl_module, "last_task_output", None)
        step = trainer.global_step
        if out is None or out.rollout is None or not trainer.is_global_zero:
            return
        if step != 1 and step % self.every_n_steps:
            return
        rows = rollout_rows(out.rollout, self.num_prompts)
        log_dir = run_dir(trainer)  # rank zero only: no collective (trainer.log_dir broadcasts)
        os.makedirs(log_dir, exist_ok=True)
        with open(os.path.join(log_dir, self.filename), "a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps({"step": step, **row}) + "\n")
        log_table(trainer, "rollouts/samples", table_rows(rows), step)
