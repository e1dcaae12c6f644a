"""Checkpoint plumbing shared by the checkpoint callback, the DeepSpeed strategy and the exporter.

* Atomic publication: a checkpoint (a Lightning ``.ckpt`` file, a DeepSpeed checkpoint directory
  or an exported Hugging Face directory) is written under a temporary name in the destination's
  folder and renamed into place only once complete (:func:`publish`), so a crash during a save
  leaves either the previous checkpoint or nothing under the final name.
* Completion marker: a directory checkpoint gets :data:`COMPLETE_MARKER` written last, listing
  every file with its size; :func:`require_complete` refuses a directory without it or whose
  files no longer match (a copy cut short, a truncated shard).
* RNG streams: :func:`rng_states_all_ranks` gathers the torch / numpy / Python (and CUDA) random
  states of every rank into the checkpoint, :func:`restore_rng_states` puts this rank's back.
* Trainable state only: a LoRA or QLoRA checkpoint holds the trainable parameters
  (:func:`trainable_state`: the adapters, and any module left trainable) and the optimizer state of
  those alone, not the frozen base, which reloads from ``model.policy.name_or_path``;
  :func:`check_trainable_state` refuses, on resume and on export, a state that lacks a trainable
  parameter or names one the model does not have (peft, TRL and verl's ``save_lora_only`` save the
  same).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grasp_lightning.errors import GraspConfigError

log = logging.getLogger(__name__)

#: File written last into a directory checkpoint: ``{"format": 1, "files": {relpath: bytes}, ...}``.
COMPLETE_MARKER = "CHECKPOINT_COMPLETE.json"
#: Prefix of the temporary names used while writing (hidden, and never ``last*.ckpt``).
PARTIAL_PREFIX = ".partial-"
#: Checkpoint key holding the gathered RNG states (one entry per rank).
RNG_KEY = "grasp_rng_states"


def partial_path(final: str | os.PathLike) -> Path:
    """A fresh temporary path beside ``final`` (same filesystem, so the rename is atomic)."""
    final = Path(final)
    return final.parent / f"{PARTIAL_PREFIX}{uuid.uuid4().hex[:12]}-{final.name}"


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:  # some filesystems refuse opening directories; nothing more we can do
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _listing(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != COMPLETE_MARKER}


def write_marker(directory: str | os.PathLike, **info: Any) -> Path:
    """Flush every file of ``directory`` to disk, then write :data:`COMPLETE_MARKER` (itself flushed).

    Args:
        directory: a finished checkpoint directory.
        info: extra JSON-serialisable fields recorded in the marker (e.g. ``global_step``).
    """
    directory = Path(directory)
    files = _listing(directory)
    for rel in files:
        _fsync(directory / rel)
    marker = directory / COMPLETE_MARKER
    with open(marker, "w", encoding="utf-8") as fh:
        json.dump({"format": 1, "files": files, **info}, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    return marker


def require_complete(path: str | os.PathLike) -> None:
    """Refuse an incomplete checkpoint directory (a plain file passes: files are only ever renamed
    into place once whole).

    Raises:
        GraspConfigError: ``path`` does not exist; or it is a directory without
            :data:`COMPLETE_MARKER` (its save never finished) or with a file missing or of another
            size than the marker records.
    """
    path = Path(path)
    if not path.exists():
        raise GraspConfigError(f"checkpoint {path} does not exist")
    if not path.is_dir():
        return
    marker = path / COMPLETE_MARKER
    if not marker.is_file():
        raise GraspConfigError(
            f"checkpoint directory {path} has no {COMPLETE_MARKER}: its save did not finish (a crash or a kill "
            f"while writing), so it is refused. Resume from an earlier checkpoint; if the directory was written "
            f"without grasp_lightning.callbacks.control.checkpoint.AtomicModelCheckpoint and you know it is whole, create the marker with "
            f"grasp_lightning.checkpointing.write_marker")
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError) as err:
        raise GraspConfigError(f"{marker}: unreadable completion marker ({err})") from err
    for rel, size in recorded.items():
        f = path / rel
        if not f.is_file():
            raise GraspConfigError(f"checkpoint {path}: {rel} is listed in {COMPLETE_MARKER} but missing")
        if f.stat().st_size != size:
            raise GraspConfigError(f"checkpoint {path}: {rel} has {f.stat().st_size} bytes, "
                                   f"{COMPLETE_MARKER} records {size} (truncated or overwritten)")


def publish(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Move a finished ``tmp`` file or directory to ``final`` atomically, replacing what was there.

    A file is flushed and ``os.replace``-d. A directory cannot replace a non-empty directory in one
    rename, so an existing ``final`` is first renamed aside, then ``tmp`` renamed in, then the old
    one deleted: at every instant ``final`` is either the old whole checkpoint, absent, or the new
    whole one.
    """
    tmp, final = Path(tmp), Path(final)
    if tmp.is_file():
        _fsync(tmp)
        os.replace(tmp, final)
    else:
        old = None
        if final.exists() or final.is_symlink():
            old = final.parent / f"{PARTIAL_PREFIX}old-{uuid.uuid4().hex[:12]}-{final.name}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    _fsync(final.parent)
    return final


def remove_partials(folder: str | os.PathLike) -> list[Path]:
    """Delete temporaries left in ``folder`` by saves that crashed; returns what was removed."""
    folder = Path(folder)
    removed = []
    if folder.is_dir():
        for p in folder.glob(f"{PARTIAL_PREFIX}*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            removed.append(p)
    if removed:
        log.warning("removed %d unfinished checkpoint save(s) in %s: %s", len(removed), folder,
                    ", ".join(p.name for p in removed))
    return removed


def save_checkpoint_atomic(trainer, filepath: str | os.PathLike, weights_only: bool = False) -> str:
    """``trainer.save_checkpoint`` made atomic; call it on every rank, as ``trainer.save_checkpoint``.

    The checkpoint is written to a temporary name beside ``filepath`` (rank 0 chooses it and
    broadcasts it), then, after every rank has written its part, rank 0 adds
    :data:`COMPLETE_MARKER` to a directory checkpoint (DeepSpeed) and :func:`publish`-es it.

    Returns:
        ``filepath`` as a string.
    """
    filepath = str(filepath)
    tmp = str(trainer.strategy.broadcast(str(partial_path(filepath))))
    trainer.save_checkpoint(tmp, weights_only)  # ends with a barrier: every shard is written
    if trainer.is_global_zero:
        if os.path.isdir(tmp):
            write_marker(tmp, global_step=trainer.global_step, epoch=trainer.current_epoch,
                         world_size=trainer.world_size)
        publish(tmp, filepath)
        log.info("checkpoint saved: %s", filepath)
    trainer.strategy.barrier("save_checkpoint_atomic")
    return filepath


# ---------------------------------------------------------------------- RNG streams
def _collect() -> dict[str, Any]:
    """This process's random states as tensors, lists and numbers only, so a checkpoint holding
    them still loads with ``torch.load(weights_only=True)``."""
    import random

    import numpy as np

    version, py_state, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [version, list(py_state), gauss],
             "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["torch.cuda"] = torch.cuda.get_rng_state_all()
    return state


def _apply(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if state.get("torch.cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch.cuda"])


def rng_states_all_ranks() -> list[dict[str, Any]]:
    """The random states of every rank, index = global rank (a collective call under
    ``torch.distributed``: every rank must call it, as every rank saves a checkpoint)."""
    state = _collect()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, state)
        return gathered
    return [state]


def restore_rng_states(states: list[dict[str, Any]], rank: int) -> None:
    """Set this process's torch / numpy / Python (and CUDA) random states from a checkpoint.

    A run resumed on another number of ranks takes ``states[rank % len(states)]`` and logs a
    warning: its streams cannot match the original run's.
    """
    if not states:
        return
    if rank >= len(states):
        log.warning("checkpoint holds RNG states of %d ranks, this is rank %d: random streams will differ from "
                    "the original run", len(states), rank)
    _apply(states[rank % len(states)])


# ---------------------------------------------------------------------- trainable state only (LoRA, QLoRA)
def trainable_keys(module: nn.Module) -> set[str]:
    """State-dict names of ``module``'s trainable parameters (``requires_grad``; with a LoRA policy its
    adapters, plus any module left trainable, e.g. a vision tower with ``freeze_vision: false``)."""
    return {name for name, param in module.named_parameters() if param.requires_grad}


def trainable_state(state: dict[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """``state`` (``module.state_dict()``) reduced to ``module``'s trainable parameters.

    A LoRA or QLoRA checkpoint keeps these only: the frozen base is the same tensors as
    ``from_pretrained`` of ``model.policy.name_or_path`` gives (quantizing it to 4 bit is deterministic),
    so it reloads from there and a resume continues bit for bit."""
    keep = trainable_keys(module)
    return {name: tensor for name, tensor in state.items() if name in keep}


def check_trainable_state(state: dict[str, torch.Tensor], module: nn.Module, where: str) -> None:
    """Refuse a checkpoint ``state`` that would not restore ``module``'s trained function when loaded
    without strictness (the frozen base is not in it, so ``strict=False`` would hide any mismatch).

    Frozen names that ``module`` has are accepted (a checkpoint saved with the whole model loads too).

    Raises:
        GraspConfigError: a trainable parameter of ``module`` is missing from ``state``, or ``state`` holds a
            name ``module``'s state dict does not have (naming the first few of either and their count).
    """
    missing = sorted(trainable_keys(module) - set(state))
    unknown = sorted(set(state) - set(module.state_dict()))
    if missing or unknown:
        raise GraspConfigError(
            f"{where}: {len(missing)} trainable parameter(s) missing, e.g. {missing[:3]}; {len(unknown)} unknown "
            f"name(s), e.g. {unknown[:3]}; is it a checkpoint of this LoRA run (same model.policy.name_or_path and "
            "model.lora settings)?")
