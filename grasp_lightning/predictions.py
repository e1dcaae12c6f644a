"""What ``predict`` writes for each item: one JSON-ready record per answered (or skipped) item.

``GraspModule.predict_step`` samples one completion per prompt (the ``model.evaluation`` decoding)
and returns :func:`prediction_records`; ``callbacks.predictions.PredictionWriter`` writes them to a
JSONL file as each batch ends, so an interrupted run keeps every line it wrote.
"""

from __future__ import annotations

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.formats import option_letters
from grasp_lightning.parsing import answer_block, extract_answer, extract_participants, reasoning_text

__all__ = ["parsed_answer", "prediction_records"]


def parsed_answer(completion: str, options: tuple[str, ...] | list[str]) -> str | None:
    """The answer of a completion: the option letter (:func:`~grasp_lightning.parsing.extract_answer`
    over the item's option letters) for a multiple-choice item, the stripped ``<answer>`` block for an
    open-ended one; ``None`` when nothing parses."""
    if options:
        letters = "".join(option_letters(options)) or "ABCD"
        return extract_answer(completion, letters)
    block = answer_block(completion)
    return block.strip() if block is not None and block.strip() else None


def prediction_records(batch: Batch, texts: list[str], completion_tokens: list[int], opened_think: list[bool],
                       seconds: float) -> list[dict]:
    """One record per valid row of ``batch`` (rank padding left out), then one per skipped item.

    Args:
        batch: the prompts (``B`` rows, ``batch.valid`` ``(B,)``, ``batch.prompt_lengths`` ``(B,)``).
        texts: ``B`` completions (special tokens removed).
        completion_tokens: ``B`` sampled token counts (tokens).
        opened_think: ``B`` flags: the prompt ended with an opened ``<think>``.
        seconds: wall time of the batch's generation (seconds), shared evenly by its rows.

    Returns:
        Dicts with ``id``, ``origin``, ``video`` and ``image`` (the paths, ``None`` where absent), ``question``, ``completion``,
        ``answer`` (:func:`parsed_answer`), ``target`` (the item's answer, ``None`` when it has none),
        ``correct`` (``None`` without a target), ``participants`` (named in the reasoning),
        ``category``, ``prompt_tokens``, ``completion_tokens``, ``seconds`` (the row's share); a
        skipped item gives ``id``, ``origin`` and ``skipped`` (the reason) instead.
    """
    rows = []
    valid = batch.valid.tolist()
    share = seconds / max(len(texts), 1)
    for n, item in enumerate(batch.items):
        if not valid[n]:
            continue
        answer = parsed_answer(texts[n], item.options)
        target = item.answer.strip() or None
        rows.append({
            "id": item.uid, "origin": item.origin, "video": item.clip.path if item.clip is not None else None,
            "image": item.image, "question": item.question,
            "completion": texts[n], "answer": answer, "target": target,
            "correct": None if target is None else answer == target,
            "participants": sorted(extract_participants(reasoning_text(texts[n], opened_think[n]))),
            "category": item.category, "prompt_tokens": int(batch.prompt_lengths[n]),
            "completion_tokens": int(completion_tokens[n]), "seconds": round(share, 4),
        })
    rows.extend({"id": skip.uid, "origin": skip.where, "skipped": skip.reason} for skip in batch.skipped)
    return rows
