"""Shared test code, the one module tests import besides the library (conftest.py keeps the fixtures).

- Paths of the shipped assets (:data:`REPO`, :data:`TINY`, :data:`TINY35`, :data:`SAMPLE`) and the
  in-process CLI runner :func:`run_cli`; TensorBoard readers :func:`scalars` and :func:`event_tags`.
- Builders of tiny GRASP data: mp4 clips (PyAV), tar shards, JSONL rows, bench items, QA datasets.
  Rows follow ``docs/data-format.md`` exactly. Each synthetic frame ``i`` is a flat grey of level
  :func:`frame_level` so a test can tell which source frame was decoded.
- Several CPU processes over gloo with a hard timeout (:func:`free_port`, :func:`launch_ranks`,
  :func:`wait_ranks`, :func:`spawn_ranks`), so a hang fails instead of blocking.
- Recorders passed to the CLI by class path (``--trainer.callbacks+=tests.helpers.<Name>``), and the
  shared pieces of several test files (models, prompts, tolerances, stand-in runs).
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from grasp_lightning.data.datamodule_config import LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from grasp_lightning.data.records import ClipRef, GraspItem, SocialEvent
from grasp_lightning.evaluation.grasp_score import score_completion
from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4

# ------------------------------------ Paths of the shipped assets, the in-process CLI and its logs
REPO = Path(__file__).resolve().parents[1]

TINY = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"

#: The offline tiny hybrid Qwen3.5 (3 Gated DeltaNet linear-attention layers + 1 full-attention layer).
TINY35 = REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5"

#: Both tiny model families, for tests parametrised over them (``@pytest.mark.parametrize("family", FAMILIES)``).
TINY_MODELS = {"qwen3_vl": TINY, "qwen3_5": TINY35}

FAMILIES = tuple(TINY_MODELS)

SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"


def run_cli(args: list[str], tmp_path: Path):
    """Run ``python -m grasp_lightning`` in this process with logs under ``tmp_path``; return the CLI
    (built by :func:`grasp_lightning.commands.train.build_cli`, exactly as the command builds it)."""
    from grasp_lightning.commands.train import build_cli

    extra = [f"--trainer.logger.init_args.save_dir={tmp_path}", f"--trainer.default_root_dir={tmp_path}"]
    return build_cli([*args, *extra])


def scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of the TensorBoard event files under ``log_dir`` (read with EventAccumulator)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def event_tags(log_dir: str | Path) -> dict[str, list[str]]:
    """Tags of every kind (scalars, images, histograms, tensors) in the event files under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc.Tags()


FAST = ["--data.loader.num_workers=0", "--trainer.enable_progress_bar=false"]


def find_callback(cli, cls):
    """The trainer's callback of class ``cls``."""
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, cls))


# ---------- Tiny GRASP data: mp4 clips, tar shards, JSONL rows, bench items, the generic QA format
def _real_clip() -> Path:
    """The real two-person clip: ``../shared`` beside the checkout when present, else the byte-identical
    copy shipped inside the sample shard (extracted once into a temporary file)."""
    import tarfile
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    for candidate in (repo.parent / "shared/data/real/kitchen_two_person.mp4",
                      Path("/work/shared/data/real/kitchen_two_person.mp4")):
        if candidate.is_file():
            return candidate
    out = Path(tempfile.gettempdir()) / "grasp_lightning_kitchen_two_person.mp4"
    if not out.is_file():
        shard = repo / "grasp_lightning/assets/sample/train/videos/social-iq_part000.tar"
        with tarfile.open(shard) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("kitchen.two_person_qa0000.mp4"))
            out.write_bytes(tar.extractfile(member).read())
    return out


REAL_CLIP = _real_clip()


def frame_level(i: int) -> int:
    """Grey level (0-255) painted into synthetic frame ``i``."""
    return 16 + (20 * i) % 220


def level_to_index(level: float, n_frames: int) -> int:
    """The frame index whose grey level is nearest ``level`` (inverse of :func:`frame_level`)."""
    return int(np.argmin([abs(frame_level(i) - level) for i in range(n_frames)]))


def make_mp4(n_frames: int = 10, fps: int = 5, width: int = 32, height: int = 32, codec: str = "libx264",
             faststart: bool = False, noise: bool = False) -> bytes:
    """Encode ``n_frames`` flat grey frames (random ones if ``noise``) at ``fps`` into mp4 bytes (moov at
    the end unless ``faststart``); libx264 runs with preset ultrafast, crf 10."""
    x264 = {"preset": "ultrafast", "crf": 10} if codec == "libx264" else {}
    settings = Mp4Settings(codec=codec, fallback=None, faststart=faststart, **x264)

    def frames():
        for i in range(n_frames):
            if noise:
                yield np.random.default_rng(i).integers(0, 256, (height, width, 3), dtype=np.uint8)
            else:
                yield np.full((height, width, 3), frame_level(i), np.uint8)

    with tempfile.TemporaryDirectory() as tmp:
        return encode_mp4(frames(), fps, settings, out=Path(tmp) / "clip.mp4", size=(height, width)).read_bytes()


def make_tar(path: Path, members: dict[str, bytes], *, symlinks: dict[str, str] | None = None,
             hardlinks: dict[str, str] | None = None, fifos: tuple[str, ...] = ()) -> Path:
    """Write an uncompressed tar holding ``members`` (names written verbatim, even ``../x`` or ``/x``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), int(time.time())
            tf.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks or {}), (tarfile.LNKTYPE, hardlinks or {})):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tf.addfile(info)
        for name in fifos:
            info = tarfile.TarInfo(name)
            info.type = tarfile.FIFOTYPE
            tf.addfile(info)
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """One JSON value per line; a ``str`` row is written verbatim (for malformed lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


OPTIONS = ["A) Person 0", "B) Person 2", "C) Person 4", "D) No one"]


def annotation_row(**over: Any) -> dict:
    """An MCQ line of ``annotations.jsonl``."""
    row = {"id": "sg_0001", "video": "social_gesture/video/153_1_001_qa0000.mp4", "source": "social_gesture",
           "category": "T5", "difficulty": "hard", "format": "mcq",
           "question": "Between 1.5s and 3.5s, whose gaze does Person 3 follow?", "options": list(OPTIONS),
           "answer": "A", "response": None}
    row.update(over)
    return row


def rl_row(answer: str = "B", *, video: str = "social_gesture/video/153_1_001_qa0000.mp4",
           meta: dict | None = None, options: list[str] | None = None) -> list[dict]:
    """A ``data_rl.jsonl`` line: specs in a deliberately non-canonical order."""
    question = "Who does Person 1 point at?"
    user = "\n".join([question, *(OPTIONS if options is None else options),
                      "Think step by step about the gaze and gesture interactions."])
    meta = meta if meta is not None else {
        "type": "meta", "difficulty": "easy", "question_text": question, "extra_key": 1,
        "gt_events": [{"source": "gaze", "persons": [0, 3]}, {"source": "pointing", "persons": [1, 2]}]}
    return [
        {"type": "text", "content": answer, "output": True},
        meta,
        {"type": "video", "path": video, "fps": 2.0, "start_seconds": 0.0, "end_seconds": 5.5,
         "src_resolution": [360, 640]},
        {"type": "text", "content": user, "output": False},
    ]


def sft_row(response: str = "<think> <gaze>P0 looks at P2</gaze> </think><answer>B</answer>",
            with_options: bool = True) -> list[dict]:
    """A ``data_sft.jsonl`` line: video, user text, assistant target."""
    user = "Describe how Person 0 responds to the gesture." + ("\n" + "\n".join(OPTIONS) if with_options else "")
    return [{"type": "video", "path": "werewolf/video/ep1.s2_qa0003.mp4", "fps": 2.0},
            {"type": "text", "content": user, "output": False},
            {"type": "text", "content": response, "output": True}]


def bench_json(clip: str, **qa_over: Any) -> dict:
    """A GRASP-Bench ``json/<clip>.json`` object."""
    video_name = clip.rsplit("_qa", 1)[0]
    qa = {"category": "C3", "difficulty": "hard", "format": "mcq", "dataset": "social_gesture",
          "video_id": video_name, "question": "Between 1.5s and 3.5s, whose gaze does Person 3 follow?",
          "options": list(OPTIONS), "answer": "A", "answer_text": "Person 0", "reasoning": "<think> ... </think>",
          "source_event_ids": [2000], "time_range": [1.5, 3.5]}
    qa.update(qa_over)
    return {"video_name": video_name, "clip_file": f"{clip}.mp4", "clip_offset": 5.5, "clip_duration": 5.5, "qa": qa}


def bench_members(clips: dict[str, bytes], prefix: str = "", jsons: dict[str, Any] | None = None) -> dict[str, bytes]:
    """Tar members of a bench: ``<prefix>json/<clip>.json`` and ``<prefix>video/<clip>.mp4``."""
    members: dict[str, bytes] = {}
    for clip, video in clips.items():
        obj = (jsons or {}).get(clip, bench_json(clip))
        members[f"{prefix}json/{clip}.json"] = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        members[f"{prefix}video/{clip}.mp4"] = video
    return members


def make_image(height: int = 40, width: int = 56, seed: int = 0, fmt: str = "PNG") -> bytes:
    """A random RGB image of ``height`` × ``width`` pixels, encoded as ``fmt`` (PIL)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


QA_ANSWER = "<think> <gaze>Person 0 looks at Person 1</gaze> </think><answer>B</answer>"


def qa_row(**over: Any) -> dict:
    """A generic QA line (``docs/data-format.md``): an image, an MCQ, an SFT response and participants."""
    row = {"id": "qa_0001", "image": "media/img0.png", "question": "Whom does Person 0 look at?",
           "options": ["Person 0", "Person 1", "Person 2", "No one"], "answer": "B", "response": QA_ANSWER,
           "participants": [0, 1], "category": "gaze"}
    row.update(over)
    return row


def make_qa_dataset(folder: Path, *, name: str = "qa.jsonl", rows: list[Any] | None = None) -> Path:
    """A generic QA file under ``folder`` with its media: ``media/img0.png``, ``media/img1.png`` (different
    sizes) and ``media/clip.mp4`` (8 noisy frames at 4 fps, 32 × 32); default rows alternate image,
    video, image and image + video, two categories. Returns the JSONL path."""
    media = folder / "media"
    media.mkdir(parents=True, exist_ok=True)
    (media / "img0.png").write_bytes(make_image(40, 56, seed=0))
    (media / "img1.png").write_bytes(make_image(48, 32, seed=1))
    (media / "clip.mp4").write_bytes(make_mp4(n_frames=8, fps=4, noise=True))
    if rows is None:
        rows = [qa_row(),
                qa_row(id="qa_0002", image=None, video="media/clip.mp4", answer="A", category="gesture",
                       response=QA_ANSWER.replace(">B<", ">A<"), end=1.5),
                qa_row(id="qa_0003", image="media/img1.png", answer="C", response=QA_ANSWER.replace(">B<", ">C<")),
                qa_row(id="qa_0004", video="media/clip.mp4", answer="D", category="gesture",
                       response=QA_ANSWER.replace(">B<", ">D<"))]
    return write_jsonl(folder / name, rows)


# -------------------------------------------- Several CPU processes over gloo, with a hard timeout
def free_port() -> int:
    """A TCP port free on ``127.0.0.1`` now (the OS picks it; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_log(log: Path, rank: int) -> Path:
    """Where :func:`launch_ranks` writes rank ``rank``'s output: ``<log>.rank<rank>.log``."""
    return log.with_suffix(f".rank{rank}.log")


def launch_ranks(args: list[str], log: Path, world: int = 2, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Start ``python -m grasp_lightning <args>`` once per rank from the repository root.

    Args:
        args: the command's arguments (``["fit", "--config", ...]``).
        log: base path of the per-rank logs (:func:`rank_log`).
        world: number of ranks (one node).
        env: extra environment variables for every rank.

    Returns:
        The rank processes, index = rank; pass them to :func:`wait_ranks`.
    """
    port = str(free_port())
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world), "RANK": str(rank),
                    "LOCAL_RANK": str(rank), "NODE_RANK": "0", "OMP_NUM_THREADS": "1", "GRASP_LOG_LEVEL": "WARNING",
                    **(env or {})}
        with open(rank_log(log, rank), "w") as out:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, "-m", "grasp_lightning", *args], cwd=REPO, env=rank_env,
                                          stdout=out, stderr=subprocess.STDOUT))
    return procs


def _tails(log: Path, world: int, chars: int) -> str:
    parts = []
    for rank in range(world):
        path = rank_log(log, rank)
        text = path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
        parts.append(f"---- rank {rank} ({path}) ----\n{text}")
    return "\n".join(parts)


def wait_ranks(procs: list[subprocess.Popen], log: Path, timeout: float, chars: int = 3000) -> float:
    """Wait for every rank; kill them all and fail if any is still running after ``timeout`` seconds
    (a rank that died leaves the others blocked in their next collective) or exited non-zero.

    Returns:
        The seconds waited.

    Raises:
        AssertionError: a timeout or a non-zero exit, with the last ``chars`` characters of every rank's log.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            for q in procs:
                q.wait()
            raise AssertionError(f"{log.name}: still running after {timeout:.0f} s, all ranks killed\n"
                                 + _tails(log, len(procs), chars)) from None
    codes = [p.returncode for p in procs]
    if any(codes):
        raise AssertionError(f"{log.name}: exit codes {codes}\n" + _tails(log, len(procs), chars))
    return time.monotonic() - t0


def spawn_ranks(fn, args: tuple, nprocs: int, timeout: float) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` (``fn(rank, *args)`` in each process) with a
    hard ``timeout`` in seconds: the processes still running then are killed and the call fails.

    Raises:
        AssertionError: a process still ran after ``timeout`` seconds.
        torch.multiprocessing.ProcessRaisedException: a process raised (its traceback in the message).
    """
    import torch.multiprocessing as mp

    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            alive = [p for p in context.processes if p.is_alive()]
            for p in alive:
                p.kill()
            raise AssertionError(f"{len(alive)} of {nprocs} processes still running after {timeout:.0f} s: killed")


MP_TIMEOUT = 120  # seconds: a rank that skipped a collective would hang the other one


def spawn_two_ranks(fn, *args) -> None:
    """Run ``fn(rank, port, *args)`` on 2 gloo processes; fail (not hang) after MP_TIMEOUT seconds."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, rank, port, args)) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(MP_TIMEOUT)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} rank(s) still running after {MP_TIMEOUT} s: a collective was skipped"
    assert [p.exitcode for p in procs] == [0, 0]


def _entry(fn, rank: int, port: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------- What ZeRO-2 runs on the CPU record, per rank
def _global_grad_norm(trainer: L.Trainer, pl_module: L.LightningModule) -> float | None:
    engine = trainer.model if hasattr(trainer.model, "get_global_grad_norm") else None
    if engine is not None:
        norm = engine.get_global_grad_norm()
        return None if norm is None else float(norm)
    return getattr(pl_module, "_recorded_grad_norm", None)


class StepRecorder(L.Callback):
    """Record per micro-batch: rank, global step, batch index, dataset indices, the task's loss,
    the learning rate, one draw from torch's global RNG (after the step, as sampling would) and,
    at accumulation boundaries, the pre-clipping global gradient norm. On train end rank 0 saves
    the policy's logits on a fixed token sequence (``final_logits.pt``).

    Args:
        out_dir: where ``steps_rank{r}.jsonl`` and ``final_logits.pt`` are written (appended to,
            so a stopped and a resumed run land in one file).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        # Plain (non-DeepSpeed) runs: the accumulated, unclipped gradient is on the parameters here.
        grads = [p.grad.detach().float().norm() for p in pl_module.parameters() if p.grad is not None]
        pl_module._recorded_grad_norm = float(torch.stack(grads).norm()) if grads else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        boundary = (batch_idx + 1) % trainer.accumulate_grad_batches == 0
        metrics = out.metrics if out is not None else {}
        row = {"rank": trainer.global_rank, "global_step": trainer.global_step, "batch_idx": batch_idx,
               "epoch": trainer.current_epoch, "indices": list(batch.indices),
               "loss": float(out.loss.detach()) if out is not None and out.loss is not None else None,
               "kl": float(metrics["kl"]) if "kl" in metrics else None,
               "lr": float(trainer.optimizers[0].param_groups[0]["lr"]),
               "rng": float(torch.rand(1).item()),
               "grad_norm": _global_grad_norm(trainer, pl_module) if boundary else None}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"steps_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        # What the optimizer holds (DeepSpeed's ZeRO optimizer keeps the model's own tensors in
        # ``bit16_groups``) against the policy's trainable parameters and the reference model's.
        opt = trainer.optimizers[0]
        groups = getattr(opt, "bit16_groups", None) or [g["params"] for g in opt.param_groups]
        held = {id(p) for group in groups for p in group}
        ref = getattr(pl_module, "reference_model", None)
        meta = {"optimizer": type(opt).__name__, "world_size": trainer.world_size,
                "optimizer_numel": sum(p.numel() for group in groups for p in group),
                "policy_trainable_numel": sum(p.numel() for p in pl_module.policy.parameters() if p.requires_grad),
                "reference_loaded": ref is not None,
                "reference_params_in_optimizer": sum(id(p) in held for p in ref.parameters()) if ref is not None else 0,
                "reference_in_state_dict": any(k.startswith("reference") for k in pl_module.state_dict())}
        self._write_meta(trainer, "start", meta)

    def _write_meta(self, trainer, name: str, meta: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"meta_{name}_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(meta), encoding="utf-8")

    def on_train_end(self, trainer, pl_module) -> None:
        engine = trainer.model if hasattr(trainer.model, "global_steps") else None
        self._write_meta(trainer, "end", {"global_step": trainer.global_step,
                                          "engine_global_steps": getattr(engine, "global_steps", None),
                                          "engine_micro_steps": getattr(engine, "micro_steps", None)})
        if trainer.global_rank != 0:
            return
        policy = pl_module.policy
        ids = torch.arange(3, 35, device=pl_module.device).reshape(2, 16)
        with torch.no_grad():
            logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().cpu()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"input_ids": ids.cpu(), "logits": logits}, self.out_dir / "final_logits.pt")


def read_steps(out_dir: str | os.PathLike, rank: int = 0) -> list[dict]:
    """The rows :class:`StepRecorder` wrote for ``rank``, in order."""
    path = Path(out_dir) / f"steps_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def read_meta(out_dir: str | os.PathLike, name: str, rank: int = 0) -> dict:
    """The ``meta_{name}_rank{rank}.json`` :class:`StepRecorder` wrote (``start`` or ``end``)."""
    return json.loads((Path(out_dir) / f"meta_{name}_rank{rank}.json").read_text(encoding="utf-8"))


# -------------------- Callbacks and rewards the CLI runs name by class path (tests.helpers.<Name>)
class WeightRecorder(L.Callback):
    """Records every policy weight when the fit starts (``--trainer.callbacks+=``)."""

    def on_fit_start(self, trainer, pl_module) -> None:
        self.before = {n: p.detach().clone() for n, p in pl_module.policy.named_parameters()}


class GradRecorder(L.Callback):
    """Records the policy's gradients before the first optimizer step (``--trainer.callbacks+=``)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not hasattr(self, "grads"):
            self.grads = {n: p.grad.detach().clone() for n, p in pl_module.policy.named_parameters()
                          if p.grad is not None}


class MicroBatchLosses(L.Callback):
    """Records each micro-batch's optimizer step, task loss and loss tokens (``--trainer.callbacks+=``)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, float, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        self.rows.append((self._step, float(out.loss.detach()), float(out.metrics["tokens/loss"])))


class UpdateRecorder(L.Callback):
    """Record each trainable weight and its gradient just before the first optimizer step, and the
    weight after it."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        named = [(n, p) for n, p in pl_module.policy.named_parameters() if p.requires_grad and p.grad is not None]
        self.before = {n: p.detach().clone() for n, p in named}
        self.grads = {n: p.grad.detach().clone() for n, p in named}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        params = dict(pl_module.policy.named_parameters())
        self.after = {n: params[n].detach().clone() for n in self.before}


class WindowRecorder(L.Callback):
    """Per training micro-batch: ``trainer.global_step`` at its start and its task output's KL and
    entropy tokens, clip fraction and prompt ids (test-only; ``--trainer.callbacks+=`` this class).

    Args:
        path: if given, each rank saves its rows to ``<path>.rank<r>`` (``torch.save``) at the end of fit.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.rows: list[dict] = []
        self._step = -1

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.path:
            torch.save(self.rows, f"{self.path}.rank{trainer.global_rank}")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        record = out.rollout
        self.rows.append({"step": self._step, "kl": record.kl_tokens.detach().clone(),
                          "entropy": record.entropy_tokens.detach().clone(),
                          "clip": float(out.metrics["clip_ratio"]), "uids": [item.uid for item in record.items]})


class StepMetricsRecorder(L.Callback):
    """Writes, per micro-batch of this rank, what the step metrics are computed from: the rollouts the
    micro-batch trained (rewards, lengths, truncation, groups), its k3 KL and entropy of the loss tokens
    and its loss (``steps_rank{r}.jsonl`` under ``out_dir``)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        out = pl_module.last_task_output
        ro = pl_module.task._window_rollouts[batch.window.position]
        k = ro.num_generations
        row = {"step": self._step, "position": batch.window.position,
               "rewards": ro.rewards.tolist(), "k": k, "lengths": ro.completions.mask.sum(1).tolist(),
               "truncated": ro.completions.truncated.tolist(), "zero_variance": ro.zero_variance.tolist(),
               "kl": out.rollout.kl_tokens.tolist(), "entropy": out.rollout.entropy_tokens.tolist(),
               "loss": float(out.loss.detach())}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"steps_rank{trainer.global_rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")


class SigtermAt(L.Callback):
    """Sends this process SIGTERM after optimizer step ``step``, as a cluster would on preemption;
    ``grasp_lightning.callbacks.control.preemption.Preemption`` (in configs/sgr.yaml) then saves ``last.ckpt`` at the next
    step boundary and stops the run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class PromptRecorder(L.Callback):
    """Keep the prompt ids (padding removed) and the completions' inputs of every validation batch."""

    def __init__(self) -> None:
        self.prompts: list[torch.Tensor] = []
        self.uids: list[str] = []

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        ids, mask = batch.inputs["input_ids"], batch.inputs["attention_mask"].bool()
        self.prompts += [row[keep] for row, keep in zip(ids, mask)]
        self.uids += [item.uid for item in batch.items]


def checksum_reward(completion: str, item) -> float:
    """A reward term in [0, 1) that differs between any two distinct completions (CRC-32 of the text).

    The tiny models never earn the recipe's terms (every group's rewards are all 0, so every advantage
    is 0 and the first step's gradient is exactly 0); this term gives each group distinct rewards.
    """
    return zlib.crc32(completion.encode()) / 2**32


def half_degenerate_reward(completion: str, item) -> float:
    """A reward term: 0.5 for every completion of the prompts whose file line is even (degenerate groups),
    else a value that differs between any two distinct completions (CRC-32 of the text)."""
    if int(item.uid.rsplit(":", 1)[1]) % 2 == 0:
        return 0.5
    return zlib.crc32(completion.encode()) / 2**32


#: The SGR recipe plus :func:`checksum_reward` (non-zero advantages on the tiny models).
SGR_REWARDS = ["--model.task.init_args.reward.terms=[accuracy, format, grounding_presence, social_grounding, "
               "tests.helpers.checksum_reward]",
               "--model.task.init_args.reward.weights=[1.0, 0.1, 0.05, 0.2, 1.0]"]


def one_sgr_step_args(*configs: str) -> list[str]:
    """``fit`` of one SGR step (K = 4, 16 new tokens, lr without warm-up) over ``configs/<name>.yaml``."""
    return ["fit", *[a for name in configs for a in ("--config", f"configs/{name}.yaml")], *FAST, *SGR_REWARDS,
            "--trainer.max_steps=1", "--data.source.bench=null", "--model.rollout.num_generations=4",
            "--model.rollout.max_new_tokens=16", "--model.optim.warmup_steps=0"]


# ------------------------------- The tiny models under test: noisy weights, RL prompts, tolerances
K = 3

#: Per-step generation logits (noise 0.5 models: logits of order 1-10) per family.
LOGIT_TOLS = {"qwen3_vl": dict(rtol=1e-4, atol=1e-4), "qwen3_5": dict(rtol=1e-3, atol=5e-4)}

#: Log-prob tolerance and gradient tolerance (relative to each tensor's largest entry) per family.
LOGP_TOLS = {"qwen3_vl": dict(rtol=1e-5, atol=2e-5), "qwen3_5": dict(rtol=1e-5, atol=2e-5)}

GRAD_TOLS = {"qwen3_vl": 1e-5, "qwen3_5": 5e-5}


def sample_rl_datamodule(path):
    """The sample data's RL DataModule (8 frames, 4096 pixels, batches of 2) for the model at ``path``, set up."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(SAMPLE), train_file="train/data_rl.jsonl", bench=None),
                         video=VideoConfig(max_frames=8, max_pixels=4096), prompt=PromptConfig(processor=str(path)),
                         loader=LoaderConfig(data_mode="rl", batch_size=2, num_workers=0))
    dm.setup("fit")
    return dm


def load_model(family: str, train: bool = False, noise: float = 0.5):
    """The family's tiny model with seeded Gaussian noise on every weight (diverse greedy tokens)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(TINY_MODELS[family]), dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise)
    return model.train(train)


def generate_with_logits(model, tokenizer, inputs, **kwargs):
    """``model.generate`` of 10 new tokens returning the per-step logits (``output_logits``)."""
    return model.generate(**inputs, max_new_tokens=10, pad_token_id=tokenizer.pad_token_id, output_logits=True,
                          return_dict_in_generate=True, **kwargs)


def assert_grad_close(actual, expected, name: str, family: str) -> None:
    """Float32 tolerance relative to the tensor's largest entry (sums run in a different order)."""
    scale = GRAD_TOLS[family]
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=scale * expected.abs().max().item() + 1e-9,
                               msg=lambda m: f"{name}: {m}")


def random_completions(tok, n: int, lc: int = 9):
    """``n`` seeded random completions of up to ``lc`` tokens: ids ``(n, lc)`` padded with ``tok``'s pad id, and
    the bool mask ``(n, lc)`` of their lengths ``[lc, 4, 1, lc, 7, 2][:n]``."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 500, (n, lc), generator=gen)
    lengths = torch.tensor([lc, 4, 1, lc, 7, 2][:n])
    mask = torch.arange(lc)[None] < lengths[:, None]
    return ids.masked_fill(~mask, tok.pad_token_id), mask


# -------------------------------------------------------------- The hand-scored golden GRASP-Bench
# (category, difficulty, target, completion, gt participants). Comments: extraction route ->
# predicted letter, correct?, named people, precision |named ∩ gt| / |named|. Every item shows
# Person 0, 1 and 2 (its options) plus its gt; items 0, 3 and 13 have a gt event span (SPANS).
GOLDEN: list[tuple[str, str | None, str, str, tuple[int, ...]]] = [
    ("T1", "easy", "B", "<think>Person 0 looks at Person 2 from 1s to 2s.</think><answer>B</answer>", (0, 2)),  # 0 ok 1
    ("T1", "easy", "A", "<think>Person 1 looks at P3.</think><answer>C</answer>", (1, 2)),  # 1 answer C x {1,3} 1/2
    ("T2", "easy", "C", "<think>Mutual gaze between Person 0 and Person 1.</think>\\boxed{C}", (0, 1, 2, 3)),  # 2 boxed ok 1
    ("T3", "medium", "D", "D because the glance lasts longest.", (0,)),  # 3 leading D ok; names nobody
    ("T4", "medium", "A", "no idea", ()),  # 4 unparseable; no gt
    ("T5", "hard", "B", "<think>P0 follows P1, then Person 2 and Person 3 turn.</think><answer>(B)</answer>", (1,)),  # 5 ok 1/4
    ("T6", "hard", "A", "After watching: A) Person 0 leads the group.", (0, 4)),  # 6 marker A) ok {0} 1
    ("G1", "easy", "C", "<answer>C</answer>", (2,)),  # 7 answer ok; names nobody
    ("G2", "easy", "B", "%%%% garbage ####", ()),  # 8 unparseable; no gt
    ("G3", "medium", "A", "<think>Person 1 points first.</think><answer>B</answer>", (1,)),  # 9 x {1} 1
    ("G4", "medium", "D", "\\boxed{D}", ()),  # 10 boxed ok; no gt
    ("G5", "hard", "C", "B. Person 2 gives the cup.", (2, 3)),  # 11 marker B. x {2} 1
    ("G6", "hard", "A", "A", (0,)),  # 12 leading A ok; names nobody
    ("J1", "medium", "B", "<think>Person 0 looks while Person 1 points, from 2s to 4s.</think><answer>B</answer>",
     (0, 1)),  # 13 ok {0,1} 1
    ("C2", "medium", "C", "", (0, 1)),  # 14 bench spelling C2 = J2; empty: unparseable; names nobody
    ("J3", "hard", "D", "<answer>maybe</answer>", ()),  # 15 unparseable; no gt
    ("J4", "hard", "A", "<think>P2 reacts to P0.</think><answer>A</answer>", (0, 1)),  # 16 ok {0,2} 1/2
    ("T1", "medium", "B", "B) Person 0", (0, 1)),  # 17 marker B) ok {0} 1 (non-canonical difficulty)
    ("G2", None, "A", "<answer>A</answer>", ()),  # 18 ok; no difficulty; no gt
    ("J1", "hard", "C", "<think>Person 3 and Person 4 and Person 5 and Person 6.</think><answer>D</answer>", (3,)),  # 19 x 1/4
    ("T4", "easy", "A", "<answer>A</answer>", ()),  # 20 ok; no gt
]

# gt event spans (seconds): item 0 names (1, 2) exactly -> 1; item 3 names none -> 0; item 13 names
# (2, 4) against (0, 4) -> 2/4.
SPANS: dict[int, tuple[float, float]] = {0: (1.0, 2.0), 3: (0.5, 1.5), 13: (0.0, 4.0)}


def golden_items() -> list[GraspItem]:
    """The golden bench as GraspItems (clip paths are dummies; scoring never opens them)."""
    return [
        GraspItem(uid=f"clip{i:02d}", origin=f"golden:{i}", clip=ClipRef(f"video/clip{i:02d}.mp4"), question="q",
                  options=("A) Person 0", "B) Person 1", "C) Person 2", "D) No one"), answer=target,
                  category=cat, difficulty=diff, events=(SocialEvent("gaze", gt, span=SPANS.get(i)),) if gt else ())
        for i, (cat, diff, target, _, gt) in enumerate(GOLDEN)
    ]


def golden_records() -> list[dict]:
    """The scored records of the hand-scored golden GRASP-Bench (:data:`GOLDEN`)."""
    return [score_completion(row[3], item) for row, item in zip(GOLDEN, golden_items())]


# ------------------- The real-shape tier: stand-ins, their data and the checks both families share
#: Per stand-in family: what its generation prompt opens after ``<|im_start|>assistant\n``, and the labelled text
#: its template makes of an SFT response (``<think>...</think><answer>X</answer>``).
TEMPLATE_FORMS = {
    "qwen3_vl": ("", lambda response: response + "<|im_end|>\n"),
    "qwen3_5": ("<think>\n",
                lambda response: response.split("</think>")[0].split("<think>")[-1].strip() + "\n</think>\n\n"
                + response.split("</think>")[-1].lstrip("\n") + "<|im_end|>\n"),
}

#: A sample RL item (``grasp_lightning/assets/sample/train/data_rl.jsonl``, line 1) rendered by the
#: published Qwen3-VL Instruct chat template, written out by hand: ChatML turns, the system turn
#: first, the video placeholder straight before the user text, the generation prompt last.
PUBLISHED_INSTRUCT_PROMPT = (
    "<|im_start|>system\n"
    "You are watching a video of several people, named Person 0, Person 1, and so on. "
    "Answer the multiple-choice question with only the option letter inside <answer> tags.<|im_end|>\n"
    "<|im_start|>user\n"
    "<|vision_start|><|video_pad|><|vision_end|>Who is gesturing?\n"
    "A) Person 0\n"
    "B) Person 1\n"
    "C) Both people\n"
    "D) No one\n"
    "Think step by step about the gaze and gesture interactions, describe them in <gaze> and <gesture> "
    "tags, and give the letter in <answer> tags.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

TIMES: dict[str, float] = {}  # seconds per run, printed by the session summary (conftest)

QUESTION = "Who is looking at Person {p}?\nA) Person 1\nB) Person 2\nC) Person 0\nD) No one\nGive the letter in <answer> tags."

TARGET = "<think><gaze>Person 1</gaze></think><answer>{letter}</answer>"

CLIPS = (("social_gesture/video/154_1_005_qa0000.mp4", 3), ("social_gesture/video/156_1_002_qa0000.mp4", 12))


def _row(clip: str, person: int, output: str, rl: bool) -> list[dict]:
    """A ``data_sft.jsonl`` / ``data_rl.jsonl`` row (``docs/data-format.md``) over the first 2 s of ``clip``."""
    row = [{"type": "video", "path": clip, "fps": 2.0, "start_seconds": 0.0, "end_seconds": 2.0, "src_resolution": [72, 128]},
           {"type": "text", "content": QUESTION.format(p=person), "output": False},
           {"type": "text", "content": output, "output": True}]
    if rl:
        row.append({"type": "meta", "difficulty": "easy", "question_text": QUESTION.format(p=person).split("\n")[0],
                    "gt_events": [{"source": "gaze", "persons": [1, person]}]})
    return row


def write_dataset(root: Path) -> Path:
    """A GRASP-layout dataset over the sample clips: SFT rows answering each prompt with A and with B,
    RL rows whose answer is A, and the sample GRASP-Bench (32 items)."""
    (root / "train").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "train" / "videos").symlink_to(SAMPLE / "train" / "videos")
    (root / "test" / "grasp_bench.tar").symlink_to(SAMPLE / "test" / "grasp_bench.tar")
    sft = [_row(c, p, TARGET.format(letter=letter), False) for c, p in CLIPS for letter in "AB"]
    rl = [_row(c, p, "A", True) for c, p in CLIPS]
    (root / "train" / "data_sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))
    (root / "train" / "data_rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rl))
    return root


def standin_args(model: Path, root: Path, dtype: str = "float32") -> list[str]:
    """Overrides that point a recipe at a stand-in and keep its runs small (see the module docstring)."""
    return [f"--model.policy.name_or_path={model}", f"--model.policy.dtype={dtype}", "--trainer.precision=32-true",
            "--model.policy.gradient_checkpointing=false", f"--data.source.root={root}", "--data.prompt.system_prompt=",
            "--data.video.max_frames=4", "--data.video.max_pixels=8192", "--data.loader.num_workers=0",
            "--trainer.enable_progress_bar=false", "--trainer.max_epochs=-1"]


def scratch(tmp_path_factory, name: str, need_gib: float) -> Path:
    """A fresh directory for ``name`` under pytest's base temporary directory, after checking that its
    file system has ``need_gib`` GiB free (the size of what the caller writes there, measured).

    Raises:
        pytest.fail.Exception: too little free space, naming the directory and both sizes.
    """
    path = tmp_path_factory.mktemp(name)
    free = shutil.disk_usage(path).free / 2**30
    if free < need_gib:
        pytest.fail(f"{path}: {free:.1f} GiB free, {name} needs {need_gib:.1f} GiB (set --basetemp to a larger disk)")
    return path


def first_batch(root: Path, model: Path, train_file: str = "train/data_sft.jsonl", mode: str | None = None, **prompt):
    """The first training batch of ``train_file`` under ``root`` with the processor of ``model`` (``mode``: the
    loader's mode; ``prompt``: more ``data.prompt`` settings)."""
    from grasp_lightning.datamodule import GraspDataModule

    dm = GraspDataModule(source=SourceConfig(root=str(root), train_file=train_file, bench=None),
                         video=VideoConfig(max_frames=4, max_pixels=8192), prompt=PromptConfig(processor=str(model), **prompt),
                         loader=LoaderConfig(data_mode=mode, batch_size=2, num_workers=0))
    dm.setup("fit")
    return dm.processor, next(iter(dm.train_dataloader()))


def labelled_part(processor, batch, row: int) -> tuple[int, str, str]:
    """(first labelled position, decoded prompt before it, decoded labelled tokens) of one SFT row."""
    ids, labels = batch.inputs["input_ids"][row], batch.inputs["labels"][row]
    where = (labels != -100).nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    assert where.tolist() == list(range(first, last + 1))  # one contiguous target, padding unlabelled
    assert labels[first:last + 1].tolist() == ids[first:last + 1].tolist()
    tok = processor.tokenizer
    return first, tok.decode(ids[:first]), tok.decode(ids[first:last + 1])


def check_rendered_prompt_and_labels(family: str, standin: Path) -> None:
    """Through the saved and reloaded processor, with the real vocabulary: the sample item renders as the
    published format (Qwen3-VL Instruct; Qwen3.5 opening ``<think>\\n``), and SFT labels begin at the first
    token after the generation prompt and hold the response as the template writes it."""
    from grasp_lightning.data.formats import read_rl
    from grasp_lightning.data.prompts import DEFAULT_SYSTEM_PROMPT, render_texts

    opens, written = TEMPLATE_FORMS[family]
    processor, batch = first_batch(SAMPLE, standin)
    item = read_rl(SAMPLE / "train" / "data_rl.jsonl").items[0]
    assert render_texts(processor, item, None, DEFAULT_SYSTEM_PROMPT)[0] == PUBLISHED_INSTRUCT_PROMPT + opens
    for row, sample_item in enumerate(batch.items):
        first, prompt, target = labelled_part(processor, batch, row)
        assert first == int(batch.prompt_lengths[row])
        assert prompt.startswith("<|im_start|>system\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n<")
        user = sample_item.question.rstrip()
        assert prompt.endswith("<|vision_end|>" + user + "<|im_end|>\n<|im_start|>assistant\n" + opens), prompt[-300:]
        assert target == written(sample_item.response)
        assert processor.tokenizer.convert_ids_to_tokens(int(batch.inputs["input_ids"][row, first - 1])) == "Ċ"


def check_data_counts_prompt_tokens(family: str, standin: Path, data_root: Path, tmp_path: Path) -> None:
    """``check-data`` with the stand-in's processor (Qwen3 or Qwen3.5 vocabulary): a budget one token below
    the longest RL prompt flags exactly that row, quoting its real token count."""
    from grasp_lightning.commands.check_data import main as check_data_main

    processor, batch = first_batch(data_root, standin, train_file="train/data_rl.jsonl", mode="rl", system_prompt="")
    lengths = [int(n) for n in batch.prompt_lengths]
    assert len(set(lengths)) == 2, lengths
    report = tmp_path / "report.json"
    start = time.perf_counter()
    code = check_data_main(["--config", "configs/sgr.yaml", "--config", "configs/demo.yaml", f"--data.source.root={data_root}",
                            f"--model.policy.name_or_path={standin}", "--data.prompt.system_prompt=", "--data.video.max_frames=4",
                            "--data.video.max_pixels=8192", f"--data.prompt.max_prompt_tokens={max(lengths) - 1}",
                            "--files=[train/data_rl.jsonl]", "--workers=0", "--progress=false", f"--report={report}"])
    TIMES[f"check-data, 2 RL rows ({family})"] = time.perf_counter() - start
    problems = json.loads(report.read_text())["problems"]
    assert code == 1 and len(problems) == 1, problems
    line = lengths.index(max(lengths)) + 1
    assert problems[0]["where"].startswith(f"{data_root}/train/data_rl.jsonl:{line}")
    assert problems[0]["reason"].startswith(f"prompt has {max(lengths)} tokens (video included), over the budget of "
                                            f"{max(lengths) - 1}")


# ---------------------------------------------------- The docs' commands, read from their Markdown
def section(title: str, page: str) -> str:
    """The text of ``page`` (relative to the repository) under the heading ``title`` up to the next heading of
    level 2 or 3."""
    text = (REPO / page).read_text()
    start = text.index(title)
    match = re.compile(r"^#{2,3} ", re.M).search(text, start + len(title))
    return text[start: match.start() if match else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    """The contents of the fenced ``lang`` code blocks of a Markdown text, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def command(block: str) -> list[str]:
    """The arguments after ``python -m grasp_lightning`` of a docs bash block (continuations joined, ``# ...``
    comments dropped)."""
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    return words[words.index("grasp_lightning") + 1:]


# ----------------------------------------------------------------------------------- The vLLM tier
SHIM = REPO / "tests" / "vllm" / "vllm_cpu"

#: the CPU server's environment: the torchvision shim, and vLLM's engine core in the server's own process
SERVER_ENV = {"PYTHONPATH": str(SHIM), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_cfg(python: str, **over):
    """The vLLM tier's engine settings (:class:`VLLMConfig`) with vLLM's Python ``python``; ``over`` replaces fields."""
    from grasp_lightning.engines.vllm_config import VLLMConfig

    kw = dict(python=python, dtype="float32", gpu_memory_utilization=0.05, max_model_len=4096,
              env=dict(SERVER_ENV), engine_kwargs={"enforce_eager": True}, startup_timeout_s=600)
    kw.update(over)
    return VLLMConfig(**kw)


def load_tiny_policy(path):
    """The tiny Qwen3-VL at ``path`` as a float32 policy in eval mode."""
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()


def perturb_weights(model, seed, scale=0.05):
    """Add seeded Gaussian noise (std ``scale``) to every language-model weight in place (the vision tower unchanged)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" not in name:
                p.add_(torch.randn(p.shape, generator=g) * scale)


class ModelLoads:
    """Counts the models a run loads (:func:`grasp_lightning.policy.load_model`: the policy and the reference
    both go through it), as a context manager over ``monkeypatch``; ``paths`` lists each load's
    ``name_or_path``."""

    def __init__(self, monkeypatch) -> None:
        import grasp_lightning.policy as policy

        self.paths: list[str] = []
        real = policy.load_model

        def counting(name_or_path, **kwargs):
            self.paths.append(str(name_or_path))
            return real(name_or_path, **kwargs)

        monkeypatch.setattr(policy, "load_model", counting)


#: The command line in a child process that records each model it loads (``AutoModelForImageTextToText.from_pretrained``:
#: the policy, a reference and export's base all go through it) to the file ``$GRASP_MODEL_LOADS``, one path a line.
#: What a CPU process adds to ``plan-memory``'s GPU figure (GiB; measured on the size tier's commands): the
#: interpreter with torch, Lightning, transformers and the tokenizer (about 0.9 GiB), the pages of the bf16 weight
#: file while it is read (up to 1 GiB at the 2B widths), and the allocator's slack.
PROCESS_GIB = 2.5

_MEASURED_MAIN = """
import os, sys
from transformers import AutoModelForImageTextToText as Auto
real = Auto.from_pretrained.__func__
def counting(cls, name, *args, **kwargs):
    with open(os.environ["GRASP_MODEL_LOADS"], "a") as f:
        f.write(str(name) + "\\n")
    return real(cls, name, *args, **kwargs)
Auto.from_pretrained = classmethod(counting)
from grasp_lightning.__main__ import main
try:
    code = main(sys.argv[1:])
finally:  # this process's own high-water mark (since exec: not the parent's, as ru_maxrss would carry over)
    with open(os.environ["GRASP_PEAK_RSS"], "w") as f:
        f.write(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
sys.exit(code)
"""


def run_measured(args: list[str], out: Path, timeout: float = 600.0) -> dict:
    """Run ``python -m grasp_lightning ARGS`` in a child process from the repository root and measure it.

    Returns ``{"peak_rss": bytes, "loads": [model paths], "seconds": wall time, "log": the output}``. The peak
    is the child's own resident set at its highest, as the kernel counted it (``VmHWM`` of
    ``/proc/self/status``, read by the child as it ends): the interpreter, the libraries, the models, every
    tensor and the pages of memory-mapped weight files it touched; not its children (none:
    ``num_workers=0``). ``ru_maxrss`` of ``wait4`` would not do: Linux carries the parent's high-water mark
    over into it at ``exec``.

    Raises:
        AssertionError: the command failed or ran past ``timeout`` seconds (the output's tail is shown).
    """
    out.mkdir(parents=True, exist_ok=True)
    loads, log, peak = out / "model_loads.txt", out / "output.log", out / "peak_rss_kib.txt"
    loads.unlink(missing_ok=True)
    env = {**os.environ, "GRASP_MODEL_LOADS": str(loads), "GRASP_PEAK_RSS": str(peak), "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", _MEASURED_MAIN, *args], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
        deadline = start + timeout
        while True:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status = os.waitpid(proc.pid, 0)
                break
            time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    text = log.read_text()
    assert proc.returncode == 0 and seconds <= timeout, (args[0], proc.returncode, f"{seconds:.0f} s", text[-4000:])
    return {"peak_rss": int(peak.read_text()) * 1024, "loads": loads.read_text().split() if loads.exists() else [],
            "seconds": seconds, "log": text}


def run_state_tensors(checkpoint: dict) -> dict:
    """Every tensor of ``checkpoint`` outside the weights and the optimizer state, by path."""
    import torch

    found: dict = {}

    def walk(x, path: str) -> None:
        if torch.is_tensor(x):
            found[path] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{path}/{k}")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{path}[{i}]")

    for key, value in checkpoint.items():
        if key not in ("state_dict", "optimizer_states"):
            walk(value, key)
    return found
