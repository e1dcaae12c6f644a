"""The weight-sync folder of the vLLM engine (grasp_lightning/engines/weight_sync.py), without a server: weight
files written tensor by tensor, the per-run private folder, its key from the launcher, leftovers of killed
runs, and a full disk named by its setting."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TINY


def _tiny_policy():
    from transformers import Qwen3VLForConditionalGeneration

    return Qwen3VLForConditionalGeneration.from_pretrained(str(TINY), dtype=torch.float32)


def _mode(path) -> int:
    import stat

    return stat.S_IMODE(path.stat().st_mode)


def test_weight_file_written_tensor_by_tensor_reads_back_as_the_policy_state(tmp_path):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from grasp_lightning.engines.vllm import language_model_entries, language_model_state
    from grasp_lightning.engines.weight_sync import safetensors_header, write_safetensors

    model = get_peft_model(_tiny_policy(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    for dtype in (torch.bfloat16, torch.float32):
        want = language_model_state(model, dtype)
        size = write_safetensors(tmp_path / "m.safetensors", language_model_entries(model), dtype)
        got = load_file(tmp_path / "m.safetensors")  # safetensors' own reader: our header is the format's
        assert list(got) == list(want) or set(got) == set(want)
        assert all(got[k].dtype == dtype and torch.equal(got[k], want[k]) for k in want)
        data = sum(t.numel() * t.element_size() for t in want.values())
        head, counted = safetensors_header(language_model_entries(model), dtype)
        assert counted == data and size == len(head) + data == (tmp_path / "m.safetensors").stat().st_size
        assert _mode(tmp_path / "m.safetensors") == 0o600


def test_sync_folder_is_named_per_run_private_and_written_once_per_version(tmp_path, monkeypatch):
    import threading
    import time

    from grasp_lightning.engines.vllm import language_model_entries
    from grasp_lightning.engines.weight_sync import SyncFolder, folder_name

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    entries = language_model_entries(_tiny_policy())
    a, b = SyncFolder(tmp_path, rank=0, key="job-7"), SyncFolder(tmp_path, rank=1, key="job-7")
    assert a.path == b.path == tmp_path / folder_name("job-7") and a.path.name.startswith("grasp-vllm-")
    assert _mode(a.path) == 0o700 and _mode(a.path / "lock") == 0o600
    assert a.first_local_rank  # no LOCAL_RANK: the writer
    b.first_local_rank, b.writer_wait_s = False, 30.0  # LOCAL_RANK 1
    waiting = threading.Thread(target=lambda: results.append(b.publish(1, entries, torch.float32)))
    results: list[bool] = []
    waiting.start()  # rank 1 needs version 1 first: it waits for the writer
    time.sleep(0.3)
    assert results == [] and a.publish(1, entries, torch.float32)
    waiting.join(timeout=30)
    assert results == [False]  # rank 1 only loads
    file = a.weights_dir / "model.safetensors"
    inode = file.stat().st_ino
    assert _mode(file) == 0o600 and _mode(a.weights_dir) == 0o700 and _mode(a.path / "weights.json") == 0o600
    assert not b.publish(1, entries, torch.float32) and file.stat().st_ino == inode
    b.writer_wait_s = 0.2  # the writer sampled nothing this step (its window skipped): after the wait, rank 1 writes
    assert b.publish(2, entries, torch.float32) and not a.publish(2, entries, torch.float32)
    assert (a.writes, b.writes) == (1, 1) and [p.name for p in a.weights_dir.iterdir()] == ["model.safetensors"]
    path, metas = a.write_embeddings([torch.ones(3, 5)])
    assert _mode(path) == 0o600 and path.parent == a.path
    a.close()
    assert a.path.exists()  # rank 1 still holds it
    b.close()
    assert not a.path.exists()  # the last one out removes it
    assert SyncFolder(tmp_path, rank=0, key="job-8").path != a.path  # another run, another folder


def test_run_key_comes_from_the_launcher_so_a_requeued_job_reuses_its_folder(monkeypatch):
    from grasp_lightning.engines.weight_sync import run_key

    for var in ("GRASP_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    alone = run_key()
    assert alone.startswith(f"pid:{__import__('os').getpid()}.") and run_key() != alone  # one folder per engine
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_key() == run_key() == "rdzv:10.0.0.1:29500"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert run_key() == "slurm:4242."  # a requeued job keeps its id
    monkeypatch.setenv("GRASP_RUN_ID", "mine")
    assert run_key() == "id:mine"


def test_a_killed_runs_folder_is_removed_by_the_next_start_and_a_requeued_run_empties_its_own(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from grasp_lightning.engines.weight_sync import SyncFolder, folder_name, sweep_leftovers

    code = ("import sys, time; from grasp_lightning.engines.weight_sync import SyncFolder\n"
            "f = SyncFolder(sys.argv[1], 0, key=sys.argv[2]); (f.path / 'weights').mkdir(); "
            "(f.path / 'weights' / 'model.safetensors').write_bytes(b'x' * 100)\n"
            "print('ready', flush=True); time.sleep(120)")
    killed = []
    for key in ("killed-run", "requeued-run"):
        proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), key], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            assert proc.stdout.readline().strip() == "ready"
            live = tmp_path / folder_name(key)
            assert sweep_leftovers(tmp_path) == [] and live.exists()  # held by a live process: kept
        finally:
            proc.send_signal(signal.SIGKILL)  # no atexit, no cleanup
            proc.wait(timeout=30)
        killed.append(live)
    legacy = tmp_path / "grasp-vllm-weights-999999999-rank0"  # the pid-named folders of earlier versions
    legacy.mkdir()
    held = SyncFolder(tmp_path, rank=0, key="running")
    again = SyncFolder(tmp_path, rank=0, key="requeued-run")  # the requeued job: same name, emptied, reused
    assert again.path == killed[1] and sorted(p.name for p in again.path.iterdir()) == ["lock"]
    assert not killed[0].exists() and not legacy.exists() and held.path.exists()
    held.close()
    again.close()


def test_a_full_weight_sync_dir_mid_run_is_named_not_a_bare_enospc(tmp_path, monkeypatch):
    import errno
    import os

    from grasp_lightning.engines import weight_sync
    from grasp_lightning.engines.weight_sync import Entry, SyncFolder
    from grasp_lightning.errors import GraspConfigError

    folder = SyncFolder(tmp_path, rank=0, key="full")

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(GraspConfigError, match=r"no space left in .*grasp-vllm-.* for one request's video and image embeddings "
                                               r"\(64 bytes\).*model.rollout.vllm.weight_sync_dir"):
        folder.write_embeddings([torch.ones(4, 4)])
    monkeypatch.setattr(weight_sync, "write_safetensors", full)
    with pytest.raises(GraspConfigError, match="no space left in .* for the weights"):
        folder.publish(1, [Entry("w", (2,), lambda: torch.ones(2))], torch.float32)
    assert sorted(p.name for p in folder.path.rglob("*")) == ["lock", "weights", "write.lock"]  # nothing half-written
    folder.close()
