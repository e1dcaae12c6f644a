"""Fixtures, marks and hooks only; shared test code lives in :mod:`tests.helpers`."""

from __future__ import annotations

import os

# before anything imports huggingface_hub or tokenizers (they read these at import)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.helpers import FAMILIES, REPO, TIMES, TINY, TINY_MODELS, make_qa_dataset  # noqa: E402


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """The offline tiny Qwen3-VL shipped with the package."""
    return TINY


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_model_path(request) -> Path:
    """Each tiny model family in turn (Qwen3-VL, then the hybrid Qwen3.5): tests using it run once per family."""
    return TINY_MODELS[request.param]


@pytest.fixture(scope="session")
def processor(tiny_path):
    """The tiny model's processor, loaded once per session."""
    from grasp_lightning.policy import load_processor

    return load_processor(str(tiny_path))


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """One torch intra-op thread for a module's in-process runs (``pytestmark =
    pytest.mark.usefixtures("one_intra_op_thread")``). The tiny models' matrices are so small that a
    second thread only adds synchronisation: on a busy 2-core machine, greedy decoding of 8 prompts on
    the tiny Qwen3.5 took 3.3 s with 2 threads and 0.35 s with 1 (a training step 1.4 s and 0.13 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def in_repo(monkeypatch):
    """Run with the repository root as working directory (configs use repo-relative paths)."""
    monkeypatch.chdir(REPO)
    return REPO


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """W&B without network: offline mode, its files and settings under ``tmp_path``; the run finished after."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                       "WANDB_DATA_DIR": str(tmp_path / "data")}.items():
        monkeypatch.setenv(key, value)
    yield
    import wandb

    if wandb.run is not None:
        wandb.run.finish()


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory) -> Path:
    """A generic QA file of four rows (``qa.jsonl``): image, video, image, image + video (two categories)."""
    folder = tmp_path_factory.mktemp("qa")
    make_qa_dataset(folder)
    return folder


_PEAK_RSS: list[tuple[str, float]] = []


def _max_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def pytest_runtest_teardown(item, nextitem):
    """Record the process's peak resident memory after each real-shape test (for the session summary)."""
    if item.get_closest_marker("real_shapes") is not None:
        _PEAK_RSS.append((item.nodeid, _max_rss_gib()))


def pytest_terminal_summary(terminalreporter):
    """Print the real-shape tier's run times and the peak resident memory after each of its tests."""
    if not _PEAK_RSS:
        return
    terminalreporter.section("real-shape tier: run times and peak memory")
    for name, seconds in TIMES.items():
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    for nodeid, gib in _PEAK_RSS:
        terminalreporter.write_line(f"{gib:7.2f} GiB peak RSS after {nodeid}")
