"""Fault injection on the tiny model and the sample data: does a run survive, and is anything lost?

    python benchmarks/faults.py            # about 5 minutes on 2 CPU cores
    python benchmarks/faults.py --quick    # the training faults only

Training faults (the real CLI in a subprocess, ``configs/sft.yaml`` + ``configs/demo.yaml``, two
micro-batches per step, 9 steps over two epochs, ``benchmarks.fault_callbacks.BatchIndexRecorder`` writing the
dataset indices of every micro-batch):

- ``sigterm``: SIGTERM to the process group in the middle of an accumulation window; resume.
- ``sigusr1_slurm``: SLURM's warning signal under a (fake) SLURM job with auto-requeue; the requeued
  run resumes from Lightning's ``hpc_ckpt_1.ckpt`` without ``--ckpt_path``.
- ``kill9``: ``kill -9`` in epoch 2; resume from the last periodic checkpoint.
- ``nan_loss`` / ``nan_grad``: a NaN loss, an Inf gradient; the run must finish with finite weights.
- ``nan_streak``: non-finite losses at every step; the run must stop with ``FloatingPointError``.
- ``corrupt_clip``: an undecodable clip with ``on_bad_item=skip``; the run finishes and lists it in
  ``skipped.jsonl``; ``corrupt_many``: too many, the run stops with a clear ``GraspDataError``.

A resumed fault is *recovered* when the runs together saw exactly the uninterrupted run's dataset items
(``samples_lost`` and ``samples_repeated`` count the differences, as multisets of dataset indices).

Bad inputs (each *handled* when it is refused or bounded, never followed): hostile tar members
(absolute path, ``..``, symlink, hard link), a truncated shard, corrupt/empty/missing clips, a
malformed line, an answer outside the options, an RL row without participants, a prompt over the
token budget (all listed by ``check-data``), a 4K clip and a 30-minute clip (decoded within the
frame and pixel budget, peak memory printed), a model with remote code (not run), a checkpoint with
pickled code (refused).

``decode_soak_growth_mb``: four DataLoader workers decode 1,200 clips (the sample data clips and a 640x360
30 fps clip); the sum over workers of resident memory at the end minus after the first 20 %.

Prints a summary, then a JSON object as the last line with ``faults_tried``, ``faults_recovered``,
``samples_lost``, ``samples_repeated``, ``bad_inputs_tried``, ``bad_inputs_handled``,
``decode_soak_growth_mb`` and per-item details.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"
TINY = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"
sys.path.insert(0, str(REPO))  # benchmarks.fault_callbacks (class paths of the runs' callbacks)
BASE = ["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", "--trainer.max_steps=9",
        "--trainer.max_epochs=2", "--trainer.accumulate_grad_batches=2", "--data.source.bench=null",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


# ---------------------------------------------------------------------- running the CLI
def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out.update(extra)
    return out


def run(tmp: Path, name: str, extra=(), pause_at: int | None = None, send: int | None = None,
        environ: dict | None = None) -> tuple[int, list[dict], str]:
    """The CLI in its own session; with ``send``, signal its process group once micro-batch
    ``pause_at`` started (the recorder pauses there). Returns (status, recorder rows, output)."""
    seen, out = tmp / f"{name}.jsonl", tmp / f"{name}.log"
    args = [*BASE, f"--trainer.logger.init_args.save_dir={tmp}", f"--trainer.default_root_dir={tmp}",
            "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            f"--trainer.callbacks.init_args.dirpath={tmp / 'periodic'}",
            "--trainer.callbacks.init_args.every_n_train_steps=2",
            "--trainer.callbacks.init_args.save_last=true",
            "--trainer.callbacks+=benchmarks.fault_callbacks.BatchIndexRecorder", f"--trainer.callbacks.init_args.path={seen}",
            *([f"--trainer.callbacks.init_args.pause_at={pause_at}"] if pause_at is not None else []), *extra]
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "grasp_lightning", *args], cwd=REPO, env=environ or env(),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 600
        while send is not None and proc.poll() is None and time.monotonic() < deadline:
            if seen.exists() and sum('"start"' in line for line in seen.open()) > pause_at:
                os.killpg(proc.pid, send)
                break
            time.sleep(0.05)
        rc = proc.wait()
    rows = [json.loads(line) for line in seen.open()] if seen.exists() else []
    return rc, rows, out.read_text()


def done(rows: list[dict], before_step: int | None = None) -> list[tuple[int, tuple]]:
    """(step, dataset indices) of every micro-batch that finished its backward."""
    starts = [r for r in rows if r["event"] == "start"]
    ends = [r for r in rows if r["event"] == "done"]
    out = [(s["step"], tuple(s["indices"])) for s, _ in zip(starts, ends)]
    return [d for d in out if before_step is None or d[0] < before_step]


def compare(merged: list, full: list) -> tuple[int, int, bool]:
    """(items lost, items repeated, same order) between a resumed sequence and the uninterrupted one."""
    a = Counter(i for _, b in merged for i in b)
    f = Counter(i for _, b in full for i in b)
    return sum((f - a).values()), sum((a - f).values()), merged == full


def ckpt_step(path: Path) -> int:
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def fake_slurm(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scontrol.txt'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    return env(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_NTASKS="1", SLURM_JOB_NAME="grasp", SLURM_JOB_ID="77",
               SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_NODELIST="localhost")


# ---------------------------------------------------------------------- training faults
def resumed_faults(work: Path, full: list) -> dict[str, dict]:
    results = {}
    # SIGTERM while micro-batch 4 (first of step 2's window) runs: saved at step 3, resumed by path.
    tmp = work / "sigterm"
    tmp.mkdir()
    rc, a, _ = run(tmp, "a", pause_at=4, send=signal.SIGTERM)
    last = tmp / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    ok = rc == 0 and last.exists() and ckpt_step(last) == 3
    rc2, b, _ = run(tmp, "b", [f"--ckpt_path={last}"]) if ok else (1, [], "")
    results["sigterm"] = _resumed(done(a) + done(b), full, ok and rc2 == 0)
    # SLURM USR1: hpc checkpoint + scontrol requeue; the requeued job resumes by itself.
    tmp = work / "sigusr1_slurm"
    tmp.mkdir()
    slurm = fake_slurm(tmp)
    rc, a, _ = run(tmp, "a", pause_at=6, send=signal.SIGUSR1, environ=slurm)
    hpc = tmp / "hpc_ckpt_1.ckpt"
    ok = rc == 0 and hpc.exists() and (tmp / "scontrol.txt").read_text().split() == ["requeue", "77"]
    rc2, b, _ = run(tmp, "b", environ=slurm) if ok else (1, [], "")
    results["sigusr1_slurm"] = _resumed(done(a) + done(b), full, ok and rc2 == 0)
    # kill -9 in epoch 2 (micro-batch 13, step 6); the last periodic checkpoint is step 6.
    tmp = work / "kill9"
    tmp.mkdir()
    rc, a, _ = run(tmp, "a", pause_at=13, send=signal.SIGKILL)
    periodic = tmp / "periodic" / "last.ckpt"
    step = ckpt_step(periodic) if periodic.exists() else 0
    rc2, b, _ = run(tmp, "b", [f"--ckpt_path={periodic}"]) if step else (1, [], "")
    results["kill9"] = _resumed(done(a, before_step=step) + done(b), full, rc == -signal.SIGKILL and rc2 == 0)
    return results


def _resumed(merged: list, full: list, ran: bool) -> dict:
    lost, repeated, same = compare(merged, full)
    return {"recovered": ran and same and lost == 0 and repeated == 0, "samples_lost": lost,
            "samples_repeated": repeated}


def guard_faults(work: Path) -> dict[str, dict]:
    results = {}
    for name, extra, want_rc, want_text in [
        ("nan_loss", ["--trainer.callbacks.init_args.nan_loss_at=[3]"], 0, "non-finite loss"),
        ("nan_grad", ["--trainer.callbacks.init_args.nan_grad_at=[5]"], 0, "non-finite gradient norm"),
        ("nan_streak", ["--trainer.callbacks.init_args.nan_loss_at=[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]"],
         1, "FloatingPointError: 5 optimizer steps in a row"),
    ]:
        tmp = work / name
        tmp.mkdir()
        rc, rows, log = run(tmp, "a", ["--trainer.callbacks+=benchmarks.fault_callbacks.FaultInjector", *extra])
        finite = rc != 0 or _finite_weights(tmp / "periodic" / "last.ckpt")
        results[name] = {"recovered": rc == want_rc and want_text in log and finite}
    return results


def _finite_weights(path: Path) -> bool:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


def skip_faults(work: Path) -> dict[str, dict]:
    results = {}
    for name, rows, want_rc, want_text in [("corrupt_clip", [3], 0, None),
                                            ("corrupt_many", [0, 1, 2, 3, 4], 1, "over data.errors.max_skip_fraction")]:
        tmp = work / name
        root = tmp / "data"
        shutil.copytree(SAMPLE, root)
        lines = (root / "train" / "data_sft.jsonl").read_text().splitlines()
        for n in rows:
            video = next(s for s in json.loads(lines[n]) if s["type"] == "video")["path"]
            (root / "train" / "videos" / video).parent.mkdir(parents=True, exist_ok=True)
            (root / "train" / "videos" / video).write_bytes(b"\x00\x00\x00\x18ftypisom garbage")
        rc, _, log = run(tmp, "a", [f"--data.source.root={root}", "--data.errors.on_bad_item=skip", "--data.errors.max_skip_fraction=0.1"])
        listed = list(tmp.rglob("skipped.jsonl"))
        uids = {json.loads(line)["uid"] for line in listed[0].open()} if listed else set()
        ok = rc == want_rc and (want_text in log if want_text else uids == {f"data_sft:{n + 1}" for n in rows})
        results[name] = {"recovered": ok, "skipped_listed": sorted(uids)}
    return results


# ---------------------------------------------------------------------- bad inputs
def write_jsonl(path: Path, rows: list) -> None:
    """One JSON value per line; a ``str`` row is written verbatim (a malformed line)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


def make_mp4(n_frames: int, fps: int) -> bytes:
    """``n_frames`` grey 32x32 frames at ``fps`` as mp4 bytes (libx264, the library's encoder)."""
    import tempfile

    import numpy as np

    from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4

    settings = Mp4Settings(codec="libx264", fallback=None, preset="ultrafast", crf=10)
    frames = (np.full((32, 32, 3), 16 * (i + 1), np.uint8) for i in range(n_frames))
    with tempfile.TemporaryDirectory() as tmp:
        return encode_mp4(frames, fps, settings, out=Path(tmp) / "clip.mp4", size=(32, 32)).read_bytes()


def make_tar(path: Path, members: dict[str, bytes], *, symlinks: dict[str, str], hardlinks: dict[str, str]) -> Path:
    """An uncompressed tar holding ``members``, ``symlinks`` and ``hardlinks`` with names written verbatim
    (``../x`` and ``/x`` included): the hostile archive that check-data must list."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for kind, links in ((tarfile.SYMTYPE, symlinks), (tarfile.LNKTYPE, hardlinks)):
            for name, target in links.items():
                info = tarfile.TarInfo(name)
                info.type, info.linkname = kind, target
                tf.addfile(info)
    return path


def bad_inputs(work: Path) -> dict[str, bool]:
    """Every hostile or broken input, and whether it was handled (refused, listed or bounded)."""
    from grasp_lightning.commands.check_data import main as check_data

    root = work / "bad_data"
    shutil.copytree(SAMPLE, root)
    sft, rl, videos = root / "train" / "data_sft.jsonl", root / "train" / "data_rl.jsonl", root / "train" / "videos"
    s_rows = [json.loads(x) for x in sft.read_text().splitlines()]
    r_rows = [json.loads(x) for x in rl.read_text().splitlines()]
    video = lambda row: next(x for x in row if x["type"] == "video")  # noqa: E731
    video(s_rows[1])["path"] = "werewolf/video/missing.mp4"
    for n, data in ((2, b"\x00\x00\x00\x18ftypisom garbage"), (3, b"")):
        (videos / video(s_rows[n])["path"]).parent.mkdir(parents=True, exist_ok=True)
        (videos / video(s_rows[n])["path"]).write_bytes(data)
    next(x for x in s_rows[4] if x["type"] == "text" and not x.get("output"))["content"] += " Person 0 waves." * 1500
    write_jsonl(sft, s_rows)
    next(x for x in r_rows[0] if x["type"] == "text" and x.get("output"))["content"] = "E"
    next(x for x in r_rows[3] if x["type"] == "meta")["gt_events"] = []
    write_jsonl(rl, [*r_rows, "{not json"])
    clip = make_mp4(n_frames=4, fps=2)
    evil = make_tar(videos / "evil_part000.tar", {"/abs.mp4": clip, "../escape.mp4": clip},
                    symlinks={"x/video/sym.mp4": "/etc/passwd"}, hardlinks={"x/video/hard.mp4": "/etc/passwd"})
    cut = videos / "cut_part000.tar"
    shutil.copy(videos / "werewolf_part000.tar", cut)
    os.truncate(cut, cut.stat().st_size // 2)
    # the user's command: configs/demo.yaml's tiny processor and budgets (2 fps, 8 frames, 4096 pixels,
    # 2048 prompt and 512 target tokens), no bench, the two train files
    report_path = work / "check_data.json"
    with contextlib.redirect_stdout(sys.stderr):  # its printed report; the figures stay on stdout
        check_data(["--config", "configs/sft.yaml", "--config", "configs/demo.yaml", f"--data.source.root={root}",
                    "--data.source.bench=null", "--data.prompt.system_prompt=", "--files=[train/data_sft.jsonl, train/data_rl.jsonl]",
                    "--progress=false", f"--report={report_path}"])
    report = json.loads(report_path.read_text())
    listed = {p["where"].split(" (")[0] for p in report["problems"]}
    out = {
        "tar_absolute_path": f"{evil}:/abs.mp4" in listed,
        "tar_dotdot": f"{evil}:../escape.mp4" in listed and not (root / "train" / "escape.mp4").exists(),
        "tar_symlink": f"{evil}:x/video/sym.mp4" in listed,
        "tar_hardlink": f"{evil}:x/video/hard.mp4" in listed,
        "truncated_shard": any(w.startswith(f"{cut}:") for w in listed),
        "missing_clip": f"{sft}:2" in listed, "corrupt_clip": f"{sft}:3" in listed, "empty_clip": f"{sft}:4" in listed,
        "prompt_over_budget": f"{sft}:5" in listed, "answer_not_an_option": f"{rl}:1" in listed,
        "rl_row_without_participants": f"{rl}:4" in listed, "malformed_line": f"{rl}:25" in listed,
    }
    out.update(huge_clips(work))
    out["remote_code_model"] = remote_code(work)
    out["pickled_code_checkpoint"] = pickled_checkpoint(work)
    return out


_DECODE = """
import sys, json
from grasp_lightning.data.video import decode_clip
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) / 1024
data = open(sys.argv[1], "rb").read()
decode_clip(data, fps=2.0, max_frames=8, max_pixels=4096)  # imports the decoders
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current resident size
base = status("VmRSS:")
clip = decode_clip(data, fps=2.0, max_frames=8, max_pixels=200704)
print(json.dumps({"shape": list(clip.frames.shape), "peak_mb": status("VmHWM:") - base}))
"""


def moving_clip(path: Path, seconds: float, fps: int, width: int, height: int) -> Path:
    """An H.264 clip (libx264 ultrafast) of a random image sliding sideways: realistic motion, so the
    file size stays in the range of real footage (about 7 MB per 4K second)."""
    import numpy as np

    from grasp_lightning.synthetic.mp4 import Mp4Settings, encode_mp4

    base = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    frames = (np.roll(base, 4 * i, axis=1) for i in range(int(seconds * fps)))  # one frame in memory at a time
    return encode_mp4(frames, fps, Mp4Settings(preset="ultrafast", fallback=None), out=path)


PEAKS: dict[str, float] = {}


def huge_clips(work: Path) -> dict[str, bool]:
    """A 4K clip and a 30-minute clip, decoded in a fresh process at 2 fps into at most 8 frames of
    448x448 pixels; handled when the frames are within that budget and the decode's peak resident
    memory (``PEAKS``, MB above the process before it) is under 1 GB."""
    out = {}
    for name, args in (("clip_4k", (3.0, 30, 3840, 2160)), ("clip_30_minutes", (1800.0, 1, 320, 180))):
        path = moving_clip(work / f"{name}.mp4", *args)
        proc = subprocess.run([sys.executable, "-c", _DECODE, str(path)], cwd=REPO, env=env(), capture_output=True,
                              text=True, timeout=600)
        res = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        t, h, w = (res.get("shape") or [0, 0, 0])[:3]
        PEAKS[name] = round(res["peak_mb"], 1) if "peak_mb" in res else None
        PEAKS[f"{name}_file"] = round(path.stat().st_size / 2**20, 1)
        out[name] = 2 <= t <= 8 and h * w <= 200704 and res.get("peak_mb", 1e9) < 1024
    return out


def remote_code(work: Path) -> bool:
    model = work / "remote_model"
    shutil.copytree(TINY, model)
    marker = work / "REMOTE_CODE_RAN"
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForImageTextToText": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    from grasp_lightning.policy import LoraConfig, PolicyConfig, load_policy, load_processor

    load_policy(PolicyConfig(name_or_path=str(model), dtype="float32"), LoraConfig())
    load_processor(str(model))
    return not marker.exists()


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def pickled_checkpoint(work: Path) -> bool:
    import torch

    marker, ckpt = work / "PICKLE_RAN", work / "evil.ckpt"
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 0, "x": _Payload(str(marker))}, ckpt)
    (work / "pickled").mkdir()
    rc, _, log = run(work / "pickled", "a", [f"--ckpt_path={ckpt}"])
    return rc != 0 and "Weights only load failed" in log and not marker.exists()


# ---------------------------------------------------------------------- decode soak
class SoakDataset:
    """Index -> (pid, resident MB after decoding clip ``index % n``) in the worker that decoded it."""

    def __init__(self, clips: list[bytes]) -> None:
        self.clips = clips

    def __len__(self) -> int:
        return 1200

    def __getitem__(self, index: int) -> tuple[int, float]:
        from grasp_lightning.data.video import decode_clip

        decode_clip(self.clips[index % len(self.clips)], fps=2.0, max_frames=32, max_pixels=200704)
        with open("/proc/self/statm") as f:
            return os.getpid(), int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def decode_soak(work: Path, workers: int = 4) -> float:
    """Sum over DataLoader workers of (resident MB at the end - after the first 20 % of the clips)."""
    import torch
    from torch.utils.data import DataLoader

    from grasp_lightning.data.shards import ClipStore

    store = ClipStore(SAMPLE / "train" / "videos")
    clips = [store.open(m) for m in store.members if m.endswith(".mp4")]  # includes the 640x360 real clip
    torch.set_num_threads(1)
    series: dict[int, list[float]] = {}
    for pid, mb in DataLoader(SoakDataset(clips), batch_size=None, num_workers=workers, shuffle=False):
        series.setdefault(int(pid), []).append(float(mb))
    growth = sum(v[-1] - v[len(v) // 5] for v in series.values())
    ends = [(round(v[len(v) // 5]), round(v[-1])) for v in series.values()]
    print(f"decode soak: {sum(len(v) for v in series.values())} clips in {len(series)} workers, "
          f"MB per worker after 20 % / at the end {ends}", file=sys.stderr)
    return growth


# ---------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="training faults only")
    args = parser.parse_args()
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="grasp_faults_") as tmp:
        work = Path(tmp)
        (work / "full").mkdir()
        rc, rows, log = run(work / "full", "a")
        if rc != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{log[-3000:]}")
        full = done(rows)
        faults = {**resumed_faults(work, full), **guard_faults(work), **skip_faults(work)}
        inputs = {} if args.quick else bad_inputs(work)
        soak = None if args.quick else decode_soak(work)
    for name, res in faults.items():
        print(f"fault {name:<14} {'recovered' if res['recovered'] else 'NOT RECOVERED'} {res}")
    for name, ok in inputs.items():
        print(f"bad input {name:<28} {'handled' if ok else 'NOT HANDLED'}")
    print(json.dumps({
        "faults_tried": len(faults), "faults_recovered": sum(r["recovered"] for r in faults.values()),
        "samples_lost": sum(r.get("samples_lost", 0) for r in faults.values()),
        "samples_repeated": sum(r.get("samples_repeated", 0) for r in faults.values()),
        "bad_inputs_tried": len(inputs), "bad_inputs_handled": sum(inputs.values()),
        "decode_soak_growth_mb": None if soak is None else round(soak, 1),
        "huge_clip_decode_peak_mb": PEAKS,
        "faults": {k: v["recovered"] for k, v in faults.items()}, "bad_inputs": inputs,
    }))


if __name__ == "__main__":
    main()
