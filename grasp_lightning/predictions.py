"""What ``predict`` writes for each item, and the keys its resume matches on.

``GraspModule.predict_step`` samples one completion per prompt (the ``model.evaluation`` decoding)
and returns :func:`prediction_records`; ``grasp_lightning.callbacks.prediction_writer.PredictionWriter`` writes them to a
JSONL file as each batch ends, so an interrupted run keeps every line it wrote.

A rerun leaves out an item only when an earlier line holds the same item *and* the same setup:

- :func:`item_key`: the item as read (id, question with options, answer, category, the file names of
  its media and its clip window), never a path or line number, so a changed working directory or
  ``data.source.root`` finds the same keys; an edited item is answered again.
- :class:`PredictionSetup`: the model's weights (a signature of its files, or the Hub snapshot), the
  checkpoint ``predict`` restores (``--ckpt_path``), ``trainer.precision``, the decoding, and every
  setting of the module's and DataModule's groups (:func:`setup_settings`) but those
  :data:`NOT_IN_SETUP_KEY` names as changing no prompt and no answer; its :attr:`~PredictionSetup.key`
  and the model, checkpoint and decoding are written on every line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from grasp_lightning.data.collate import Batch
from grasp_lightning.data.formats import option_letters
from grasp_lightning.data.records import GraspItem
from grasp_lightning.parsing import answer_block, extract_answer, extract_participants, reasoning_text

__all__ = ["NOT_IN_SETUP_KEY", "PredictionSetup", "files_signature", "item_key", "model_identity", "not_in_key",
           "parsed_answer", "prediction_records", "setup_settings"]

#: The settings, by dotted config key (a whole setting group, or one key of it), that change neither a prompt nor an
#: answer of ``predict``, each with the reason. Every other setting of the module's setting groups (``model.policy``,
#: ``model.rollout``, ...) and the DataModule's (``data.video``, ``data.prompt``, ...) enters the setup key
#: (:func:`setup_settings`), so a setting added to a setting group is keyed unless it is named here
#: (``tests/unit/test_predictions.py`` checks that every field of every setting group is one or the other).
NOT_IN_SETUP_KEY: dict[str, str] = {
    "data.source": "which items are read, and from where: an item is matched by item_key, never by its folder",
    "data.loader": "batch sizes, workers, the training shuffle and batch kind: which items share a step, not "
                   "what a prompt holds",
    "data.errors": "what happens to an unreadable item: a skipped item is never reused",
    "data.prompt.processor": "keyed by its files when it is not model.policy.name_or_path (the CLI links the two)",
    "data.prompt.max_prompt_tokens": "a prompt over the budget is refused, never cut: it has no answer to reuse",
    "data.prompt.max_target_tokens": "the SFT target's budget: predict encodes no target",
    "model.task": "the training objective: predict answers with the policy and model.evaluation",
    "model.reference": "the KL reference of training: predict does not answer with it",
    "model.optim": "the optimizer of training",
    "model.policy.name_or_path": "keyed by its files (model_identity), so a moved folder is the same model",
    "model.policy.gradient_checkpointing": "recomputes activations in training's backward pass",
    "model.policy.freeze_vision": "which weights training updates",
    "model.rollout.engine": "keyed as the engine that answers (model.evaluation.engine, else this one)",
    "model.rollout.num_generations": "training rollouts: predict decodes with model.evaluation",
    "model.rollout.max_new_tokens": "training rollouts: predict decodes with model.evaluation",
    "model.rollout.temperature": "training rollouts: predict decodes with model.evaluation",
    "model.rollout.top_p": "training rollouts: predict decodes with model.evaluation",
    "model.rollout.top_k": "training rollouts: predict decodes with model.evaluation (no top-k)",
    "model.rollout.stop_at_answer": "training rollouts: predict decodes with model.evaluation",
    "model.rollout.overlap": "training rollouts sampled during the update",
    "model.rollout.compile_decode": "the HF engine's training rollouts (its answers use plain generate)",
    "model.rollout.compile_backend": "the HF engine's training rollouts (its answers use plain generate)",
    "model.rollout.vllm.python": "where vLLM's environment is (the path, not what is installed)",
    "model.rollout.vllm.address": "where the server runs",
    "model.rollout.vllm.gpu_memory_utilization": "the server's memory share (KV cache room, not values)",
    "model.rollout.vllm.startup_timeout_s": "how long to wait for the server",
    "model.rollout.vllm.request_timeout_s": "how long to wait for an answer",
    "model.rollout.vllm.weight_sync_dir": "where weights are handed to the server",
    "model.rollout.vllm.log_file": "where the server logs",
}


def not_in_key(key: str) -> bool:
    """Whether the dotted setting ``key`` (or a setting group holding it) is in :data:`NOT_IN_SETUP_KEY`."""
    parts = key.split(".")
    return any(".".join(parts[:n]) in NOT_IN_SETUP_KEY for n in range(1, len(parts) + 1))


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    """``{dotted key: value}`` of a group's settings, nested mappings (``model.rollout.vllm``, ``vllm.env``)
    flattened; an empty one is kept as the value ``{}``."""
    if not isinstance(value, Mapping) or not value:
        return {prefix: dict(value) if isinstance(value, Mapping) else value}
    flat: dict[str, Any] = {}
    for name, inner in value.items():
        flat.update(_flatten(f"{prefix}.{name}", inner))
    return flat


def setup_settings(groups: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting of ``groups`` that can change a prompt or an answer, by dotted key.

    Args:
        groups: the settings by group, ``{"data.video": {...}, "model.policy": {...}}`` (plain dicts, as
            ``dataclasses.asdict`` or a DataModule's ``hparams`` give them; nested groups such as
            ``model.rollout``'s ``vllm`` are flattened). A group that does not apply to the run is left out
            by the caller (``GraspModule.prediction_setup``: ``model.rollout.vllm`` unless vLLM answers,
            ``model.lora`` but ``enabled`` without LoRA).

    Returns:
        ``{dotted key: value}``, sorted, of every setting of ``groups`` but those :func:`not_in_key` names.
    """
    flat: dict[str, Any] = {}
    for name, group in groups.items():
        flat.update(_flatten(name, group))
    return {key: value for key, value in sorted(flat.items()) if not not_in_key(key)}


def _digest(value: Any) -> str:
    """16 hex digits of the SHA-256 of ``value`` as canonical JSON (sorted keys)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def item_key(item: GraspItem) -> str:
    """The key ``predict``'s resume matches an item on: 16 hex digits over its id, question (options
    included), options, answer, category, its clip's file name and window (start, end, fps) and its
    image's file name.

    No folder and no line number enters it (a clip or image path counts by its file name), so the same
    file read from another working directory or ``data.source.root`` gives the same keys, while an item edited
    in any of these fields is answered again. Two rows identical in all of them share a key."""
    clip = None
    if item.clip is not None:
        clip = {**dataclasses.asdict(item.clip), "path": PurePath(item.clip.path).name}
    return _digest({"id": item.uid, "question": item.question, "options": list(item.options), "answer": item.answer,
                    "category": item.category, "clip": clip,
                    "image": PurePath(item.image).name if item.image is not None else None})


def files_signature(path: str | Path) -> str:
    """16 hex digits over the relative name, size (bytes) and modification time (ns) of every file
    under ``path`` (or of ``path`` itself when it is a file), without reading them: re-exported or
    retrained weights in the same folder change it, a copy that keeps the times (``cp -p``, ``mv``) does
    not.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(root)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    stats = []
    for f in files:
        st = os.stat(f)
        stats.append([f.name if f == root else f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns])
    return _digest(stats)


def model_identity(name_or_path: str, revision: str | None = None) -> dict:
    """What names a model's weights for :class:`PredictionSetup`: a local folder by
    :func:`files_signature` (not its path: a moved folder is the same model), a Hub id by the id, the
    requested ``revision`` and the commit of its cached snapshot (``None`` when not cached)."""
    if Path(name_or_path).exists():
        return {"files": files_signature(name_or_path)}
    snapshot = None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json", revision=revision)
        snapshot = Path(cached).parent.name if isinstance(cached, str) else None
    except Exception:  # noqa: BLE001 - not a valid repo id: the id alone names it
        snapshot = None
    return {"hub": name_or_path, "revision": revision, "snapshot": snapshot}


@dataclass(frozen=True)
class PredictionSetup:
    """What, besides the item, decides ``predict``'s answers (built by ``GraspModule.prediction_setup``).

    Attributes:
        model: ``model.policy.name_or_path`` as configured (written on every line).
        checkpoint: the Lightning checkpoint ``predict`` restored (``--ckpt_path``), ``None`` for none.
        decoding: the ``model.evaluation`` settings, ``max_new_tokens`` resolved (written on every line).
        identity: everything :attr:`key` hashes besides ``decoding``: the model's :func:`model_identity`, the
            checkpoint's :func:`files_signature`, ``trainer.precision``, the answering engine and the setting
            groups' values (:func:`setup_settings`).
    """

    model: str
    checkpoint: str | None
    decoding: dict
    identity: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        """16 hex digits over :attr:`identity` (and :attr:`decoding`): lines of another key are never reused."""
        return _digest({"identity": self.identity, "decoding": self.decoding})

    def stamp(self) -> dict:
        """The fields every line of this setup carries: ``model``, ``checkpoint``, ``decoding``, ``setup`` (the key)."""
        return {"model": self.model, "checkpoint": self.checkpoint, "decoding": self.decoding, "setup": self.key}


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
        Dicts with ``id``, ``item_key`` (:func:`item_key`), ``origin``, ``video`` and ``image`` (the paths, ``None`` where absent), ``question``, ``completion``,
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
            "id": item.uid, "item_key": item_key(item), "origin": item.origin, "video": item.clip.path if item.clip is not None else None,
            "image": item.image, "question": item.question,
            "completion": texts[n], "answer": answer, "target": target,
            "correct": None if target is None else answer == target,
            "participants": sorted(extract_participants(reasoning_text(texts[n], opened_think[n]))),
            "category": item.category, "prompt_tokens": int(batch.prompt_lengths[n]),
            "completion_tokens": int(completion_tokens[n]), "seconds": round(share, 4),
        })
    rows.extend({"id": skip.uid, "origin": skip.where, "skipped": skip.reason} for skip in batch.skipped)
    return rows
