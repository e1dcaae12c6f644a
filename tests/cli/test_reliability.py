"""Runs that survive signals, ``kill -9``, NaNs, unreadable clips and hostile inputs.

The signal and kill tests run the real CLI in a subprocess (its own session, so a signal reaches the
DataLoader workers too, as SLURM's does) on the tiny model and the sample data, with
``benchmarks.fault_callbacks.BatchIndexRecorder`` writing the dataset indices of every micro-batch. A resumed run
must see exactly the samples an uninterrupted run sees: the union over the runs, each keeping the
steps before the checkpoint the next run resumed from, equals the uninterrupted list, and the
losses agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grasp_lightning.data.datamodule_config import ErrorConfig, LoaderConfig, PromptConfig, SourceConfig, VideoConfig
from tests.helpers import REPO, run_cli, scalars

# 24 SFT rows, batch 2, two micro-batches per optimizer step: 12 micro-batches (6 steps) per epoch;
# 9 steps cross into epoch 2. Cosine schedule with warm-up (demo.yaml).
BASE = ["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", "--trainer.max_steps=9",
        "--trainer.max_epochs=2", "--trainer.accumulate_grad_batches=2", "--data.source.bench=null",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _args(tmp: Path, seen: Path, extra: list[str], pause_at: int | None = None) -> list[str]:
    recorder = ["--trainer.callbacks+=benchmarks.fault_callbacks.BatchIndexRecorder", f"--trainer.callbacks.init_args.path={seen}"]
    if pause_at is not None:
        recorder.append(f"--trainer.callbacks.init_args.pause_at={pause_at}")
    periodic = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                f"--trainer.callbacks.init_args.dirpath={tmp / 'periodic'}",
                "--trainer.callbacks.init_args.every_n_train_steps=2", "--trainer.callbacks.init_args.save_last=true"]
    return [*BASE, f"--trainer.logger.init_args.save_dir={tmp}", f"--trainer.default_root_dir={tmp}", *periodic,
            *recorder, *extra]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    # One intra-op thread: on a busy 2-core machine OpenMP's spinning threads make a run 3x slower.
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def run(tmp: Path, name: str, extra: list[str] = (), *, pause_at: int | None = None, send: int | None = None,
        env: dict | None = None, timeout: float = 240.0) -> tuple[int, list[dict], str]:
    """Run the CLI; with ``send``, deliver that signal to its process group once micro-batch
    ``pause_at`` started. Returns (exit status, recorder rows, output)."""
    seen = tmp / f"{name}.jsonl"
    out = tmp / f"{name}.log"
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "grasp_lightning", *_args(tmp, seen, list(extra), pause_at)],
                                cwd=REPO, env=env or _env(), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            if send is not None:
                while proc.poll() is None and time.monotonic() < deadline:
                    if seen.exists() and sum('"start"' in line for line in seen.open()) > pause_at:
                        os.killpg(proc.pid, send)
                        break
                    time.sleep(0.05)
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    rows = [json.loads(line) for line in seen.open()] if seen.exists() else []
    return rc, rows, out.read_text()


def run_here(tmp: Path, name: str, extra: list[str] = ()) -> list[dict]:
    """The same run in this process (no interpreter start-up); returns the recorder rows."""
    seen = tmp / f"{name}.jsonl"
    run_cli(_args(tmp, seen, list(extra)), tmp)
    return [json.loads(line) for line in seen.open()]


def micro_batches(rows: list[dict], before_step: int | None = None) -> list[tuple[int, int, tuple, float]]:
    """(step, epoch, indices, loss) of every completed micro-batch, optionally only steps < ``before_step``."""
    starts = [r for r in rows if r["event"] == "start"]
    ends = [r for r in rows if r["event"] == "done"]
    done = [(s["step"], s["epoch"], tuple(s["indices"]), e["loss"]) for s, e in zip(starts, ends)]
    return [d for d in done if before_step is None or d[0] < before_step]


def ckpt_step(path: str | Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def assert_same_samples(merged, full) -> None:
    assert [m[:3] for m in merged] == [f[:3] for f in full]  # none lost, none repeated, same order
    for m, f in zip(merged, full):
        assert m[3] == pytest.approx(f[3], rel=1e-4, abs=1e-5), (m, f)  # same weights, optimizer, schedule


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """In-process runs with one intra-op thread, as the subprocess runs (same numerics, and fast on a
    busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def in_repo_module():
    """The repository as working directory for the whole module (configs use repo-relative paths)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        yield REPO


@pytest.fixture(scope="module")
def full(tmp_path_factory, in_repo_module) -> list[tuple]:
    done = micro_batches(run_here(tmp_path_factory.mktemp("full"), "full"))
    assert len(done) == 18 and [d[0] for d in done] == [k // 2 for k in range(18)]
    assert sorted(i for d in done[:12] for i in d[2]) == list(range(24))  # epoch 1: every row once
    return done


def _fake_slurm(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'scontrol.txt'}\n")
    scontrol.chmod(0o755)
    return _env(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_NTASKS="1", SLURM_JOB_NAME="grasp",
                SLURM_JOB_ID="4242", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
                SLURM_NODELIST="localhost")


@pytest.mark.slow
def test_preempted_and_killed_runs_resume_exactly(full, tmp_path):
    """USR1 under (fake) SLURM, then SIGTERM, then ``kill -9``: four runs together see exactly the
    samples of the uninterrupted run, in its order, with its losses."""
    slurm = _fake_slurm(tmp_path)
    # Run a: USR1 at micro-batch 2, which opens step 2's window: the run finishes micro-batch 3,
    # saves at step 2 (last.ckpt and, through Lightning's SLURM routine, hpc_ckpt_1.ckpt), requeues.
    rc, rows_a, log = run(tmp_path, "a", pause_at=2, send=signal.SIGUSR1, env=slurm)
    assert rc == 0, log[-3000:]
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
    assert ckpt_step(tmp_path / "hpc_ckpt_1.ckpt") == 2
    assert ckpt_step(tmp_path / "demo" / "version_0" / "checkpoints" / "last.ckpt") == 2
    a = micro_batches(rows_a)
    assert len(a) == 4

    # Run b, the requeued job: no --ckpt_path (Lightning resumes from hpc_ckpt_1.ckpt under SLURM);
    # SIGTERM on its second micro-batch, which closes step 2's window: saved at step 3 at once.
    rc, rows_b, log = run(tmp_path, "b", pause_at=1, send=signal.SIGTERM, env=slurm)
    assert rc == 0, log[-3000:]
    last_b = tmp_path / "demo" / "version_1" / "checkpoints" / "last.ckpt"
    assert ckpt_step(last_b) == 3
    b = micro_batches(rows_b)
    assert [m[0] for m in b] == [2, 2]

    # Run c: resumed by hand; periodic checkpoints at steps 4 and 6 (the end of epoch 1); kill -9 in
    # step 7, so the work since step 6 is lost and redone.
    rc, rows_c, _ = run(tmp_path, "c", [f"--ckpt_path={last_b}"], pause_at=7, send=signal.SIGKILL)
    assert rc == -signal.SIGKILL
    periodic = tmp_path / "periodic" / "last.ckpt"
    assert ckpt_step(periodic) == 6
    assert micro_batches(rows_c)[0][0] == 3

    # Run d: resumed from the last periodic checkpoint, runs to the end (in this process).
    d = micro_batches(run_here(tmp_path, "d", [f"--ckpt_path={periodic}"]))
    assert d[0][:2] == (6, 1)
    assert_same_samples(a + b + micro_batches(rows_c, before_step=6) + d, full)


# ---------------------------------------------------------------------- numerical guards
FAST = ["fit", "--config", "configs/sft.yaml", "--config", "configs/demo.yaml", "--data.source.bench=null",
        "--data.loader.num_workers=0", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _callback(cli, name: str):
    return next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == name)


def test_nonfinite_loss_and_gradient_skip_the_update(in_repo, tmp_path, caplog):
    inject = ["--trainer.callbacks+=benchmarks.fault_callbacks.FaultInjector", "--trainer.callbacks.init_args.nan_loss_at=[1]",
              "--trainer.callbacks.init_args.nan_grad_at=[3]"]
    with caplog.at_level("WARNING"):
        cli = run_cli([*FAST, "--trainer.max_steps=5", "--model.optim.warmup_steps=0",  # lr > 0 from step 0
                       "--model.optim.scheduler=constant_with_warmup", *inject], tmp_path)
    faults, guard = _callback(cli, "FaultInjector"), _callback(cli, "NonFiniteGuard")
    assert faults.changed == [True, False, True, False, True]  # the NaN-loss and Inf-gradient steps changed nothing
    assert cli.model.nonfinite_losses == 1
    assert [v for _, v in scalars(cli.trainer.log_dir)["train/nonfinite_loss"]] == [0, 1, 0, 0, 0]
    assert guard.skipped_steps == 1 and guard.bad_streak == 0
    assert [step for step, _ in guard.bad_steps] == [1, 3]
    assert all(len(indices) == 2 for _, indices in guard.bad_steps)  # batch 2: the items are named
    adam = cli.trainer.optimizers[0]
    assert {int(adam.state[p]["step"]) for p in adam.param_groups[0]["params"]} == {3}  # 5 steps, 2 skipped
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
    messages = [r.getMessage() for r in caplog.records]
    assert any("non-finite loss" in m and str(guard.bad_steps[0][1]) in m for m in messages)
    assert any("non-finite gradient norm" in m and str(guard.bad_steps[1][1]) in m for m in messages)


def test_too_many_nonfinite_steps_in_a_row_stop_the_run(in_repo, tmp_path):
    inject = ["--trainer.callbacks+=benchmarks.fault_callbacks.FaultInjector",
              "--trainer.callbacks.init_args.nan_loss_at=[1, 2, 3, 4, 5, 6]"]
    with pytest.raises(FloatingPointError, match=r"5 optimizer steps in a row .*\(5, \["):
        run_cli([*FAST, "--trainer.max_steps=8", *inject], tmp_path)  # sft.yaml: max_consecutive 5


# ---------------------------------------------------------------------- skips with a budget
def _sample_copy(tmp: Path) -> Path:
    import shutil

    root = tmp / "data"
    shutil.copytree(REPO / "grasp_lightning" / "assets" / "sample", root)
    return root


def _break_clips(root: Path, rows: list[int]) -> list[str]:
    """Shadow the clips of these SFT rows (0-based) with garbage: an extracted file wins over the shard."""
    lines = (root / "train" / "data_sft.jsonl").read_text().splitlines()
    uids = []
    for n in rows:
        video = next(s for s in json.loads(lines[n]) if s["type"] == "video")["path"]
        target = root / "train" / "videos" / video
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video")
        uids.append(f"data_sft:{n + 1}")
    return uids


def test_unreadable_clips_and_lines_are_skipped_counted_and_listed(in_repo, tmp_path):
    root = _sample_copy(tmp_path)
    broken = _break_clips(root, [3])
    sft = root / "train" / "data_sft.jsonl"
    sft.write_text(sft.read_text() + "{not json\n")  # line 25, read before the run directory exists
    cli = run_cli([*FAST, f"--data.source.root={root}", "--data.errors.on_bad_item=skip", "--data.errors.max_skip_fraction=0.1",
                   "--trainer.max_steps=12"], tmp_path)
    rows = [json.loads(line) for line in (Path(cli.trainer.log_dir) / "skipped.jsonl").open()]
    assert rows[0]["where"] == f"{sft}:25" and rows[1]["where"].startswith(f"{sft}:4 (")  # file:line (clip)
    assert "malformed JSON" in rows[0]["reason"] and "cannot open video" in rows[1]["reason"]
    assert rows[1]["uid"] == broken[0]
    dm = cli.datamodule
    assert (dm.samples_seen, dm.samples_skipped) == (24, 1)
    assert dm.state_dict()["samples_skipped"] == 1  # kept across a resume
    assert sum(v for _, v in scalars(cli.trainer.log_dir)["data/skipped"]) == 1


def test_too_many_skips_stop_the_run_with_a_clear_error(in_repo, tmp_path):
    from grasp_lightning.errors import GraspDataError

    root = _sample_copy(tmp_path)
    _break_clips(root, [0, 1, 2])
    with pytest.raises(GraspDataError, match=r"3 of 2\d samples skipped, over data.errors.max_skip_fraction=0.1"):
        run_cli([*FAST, f"--data.source.root={root}", "--data.errors.on_bad_item=skip", "--data.errors.max_skip_fraction=0.1",
                 "--trainer.max_steps=12"], tmp_path)
    sft = root / "train" / "data_sft.jsonl"
    sft.write_text(sft.read_text() + "{not json\n[]\n[1]\n")  # 3 bad lines of 27: over 0.1 at setup
    with pytest.raises(GraspDataError, match=r"3 of 27 lines are unusable.*data_sft.jsonl:25"):
        run_cli([*FAST, f"--data.source.root={root}", "--data.errors.on_bad_item=skip", "--data.errors.max_skip_fraction=0.1"], tmp_path)


# ---------------------------------------------------------------------- hostile input
def test_hostile_tar_members_are_never_followed_or_written(in_repo, tmp_path, tiny_path):
    from grasp_lightning.datamodule import GraspDataModule
    from tests.helpers import make_mp4, make_tar, sft_row, write_jsonl

    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    root = tmp_path / "data"
    clip = make_mp4(n_frames=10, fps=5)
    make_tar(root / "train" / "videos" / "evil_part000.tar",
             {"../escape.mp4": clip, "/abs.mp4": clip, "ok/video/good.mp4": clip},
             symlinks={"ok/video/link.mp4": str(secret)}, hardlinks={"ok/video/hard.mp4": str(secret)})
    paths = ["../escape.mp4", "/abs.mp4", "ok/video/link.mp4", "ok/video/hard.mp4", "ok/video/good.mp4"]
    rows = []
    for path in paths:
        row = sft_row()
        row[0]["path"] = path
        rows.append(row)
    write_jsonl(root / "train" / "data_sft.jsonl", rows)
    before = {p for p in tmp_path.rglob("*")}
    dm = GraspDataModule(source=SourceConfig(root=str(root), bench=None),
                         video=VideoConfig(max_frames=4, max_pixels=4096),
                         prompt=PromptConfig(processor=str(tiny_path)),
                         loader=LoaderConfig(batch_size=5, num_workers=0),
                         errors=ErrorConfig(on_bad_item="skip", max_skip_fraction=1.0))
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert [item.clip.path for item in batch.items] == ["ok/video/good.mp4"]
    skipped = {s.uid: s.reason for s in batch.skipped}
    assert sorted(skipped) == [f"data_sft:{n}" for n in (1, 2, 3, 4)]
    assert all("unsafe clip path" in r or "not found" in r for r in skipped.values())
    created = {p for p in tmp_path.rglob("*")} - before
    assert {p.name for p in created} == {".grasp_index.json"}  # the shard index, nothing extracted
    assert not any(p.name == "escape.mp4" for p in tmp_path.parent.rglob("escape.mp4"))


def test_huge_clips_are_decoded_within_the_frame_and_pixel_budget(tmp_path):
    from grasp_lightning.data.video import decode_clip
    from tests.helpers import make_mp4

    four_k = make_mp4(n_frames=3, fps=1, width=3840, height=2160)
    long = make_mp4(n_frames=1800, fps=1, width=64, height=48)  # 30 minutes
    for data, seconds in ((four_k, 3.0), (long, 1800.0)):
        clip = decode_clip(data, fps=2.0, max_frames=8, max_pixels=4096)
        t, h, w, _ = clip.frames.shape
        assert 2 <= t <= 8 and h * w <= 4096
        assert clip.duration == pytest.approx(seconds, rel=0.01)
    assert w / h == pytest.approx(64 / 48, rel=0.1)  # aspect kept while downscaled
    assert clip.timestamps[0] == 0 and clip.timestamps[-1] > 1700  # spread over the whole half hour


def _remote_code_model(tmp_path: Path, marker: Path) -> Path:
    model = tmp_path / "model"
    shutil_copy = __import__("shutil").copytree
    shutil_copy(REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl", model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForImageTextToText": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('remote code ran')\n"
        "from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration\n"
        "class EvilConfig(Qwen3VLConfig):\n    pass\n"
        "class EvilModel(Qwen3VLForConditionalGeneration):\n    config_class = EvilConfig\n")
    return model


def test_remote_code_never_runs_unless_asked(tmp_path, monkeypatch):
    import transformers.dynamic_module_utils as dmu

    from grasp_lightning.datamodule import GraspDataModule
    from grasp_lightning.policy import LoraConfig, PolicyConfig, load_policy, load_processor

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    marker = tmp_path / "EXECUTED"
    model = _remote_code_model(tmp_path, marker)
    assert PolicyConfig().trust_remote_code is False and GraspDataModule().prompt.trust_remote_code is False
    policy = load_policy(PolicyConfig(name_or_path=str(model), dtype="float32"), LoraConfig())
    load_processor(str(model))
    assert type(policy).__name__ == "Qwen3VLForConditionalGeneration" and not marker.exists()
    policy = load_policy(PolicyConfig(name_or_path=str(model), dtype="float32", trust_remote_code=True), LoraConfig())
    assert type(policy).__name__ == "EvilModel" and marker.exists()  # asked for: it runs


def test_checkpoint_with_pickled_code_is_refused(in_repo, tmp_path):
    import pickle

    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.ckpt"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    torch.save({"state_dict": {}, "epoch": 0, "global_step": 0, "payload": Payload()}, evil)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        run_cli([*FAST, "--trainer.max_steps=1", f"--ckpt_path={evil}"], tmp_path)  # sft.yaml: weights_only
    assert not marker.exists()
    torch.load(evil, weights_only=False)  # the payload is live: a full unpickle runs it
    assert marker.exists()


def test_an_unexpected_error_on_one_item_is_a_skip_not_a_crash(in_repo, tiny_path, monkeypatch):
    import grasp_lightning.datamodule as dm_module

    real = dm_module.encode_example

    def flaky(processor, item, *args, **kwargs):
        if item.uid == "data_sft:2":
            raise RuntimeError("decoder bug")
        return real(processor, item, *args, **kwargs)

    monkeypatch.setattr(dm_module, "encode_example", flaky)
    dm = dm_module.GraspDataModule(source=SourceConfig(bench=None, train_limit=3),
                                   video=VideoConfig(max_frames=4, max_pixels=4096),
                                   prompt=PromptConfig(processor=str(tiny_path)),
                                   loader=LoaderConfig(batch_size=1, num_workers=0),
                                   errors=ErrorConfig(on_bad_item="skip"))
    dm.setup("fit")
    dataset = dm.train_dataloader().dataset
    samples = [dataset[i] for i in range(3)]
    assert [s.skip is None for s in samples] == [True, False, True]
    assert samples[1].skip.uid == "data_sft:2" and "RuntimeError" in samples[1].skip.reason
    dm_raise = dm_module.GraspDataModule(source=SourceConfig(bench=None, train_limit=3),
                                         prompt=PromptConfig(processor=str(tiny_path)),
                                         loader=LoaderConfig(num_workers=0))
    dm_raise.setup("fit")
    with pytest.raises(RuntimeError, match="decoder bug"):
        dm_raise.train_dataloader().dataset[1]  # on_bad_item=raise: the error is not hidden
