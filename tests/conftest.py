"""Shared fixtures: the shipped tiny model and sample data, and an in-process CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "grasp_lightning" / "assets" / "tiny-qwen3vl"
#: The offline tiny hybrid Qwen3.5 (3 Gated DeltaNet linear-attention layers + 1 full-attention layer).
TINY35 = REPO / "grasp_lightning" / "assets" / "tiny-qwen3_5"
#: Both tiny model families, for tests parametrised over them (``@pytest.mark.parametrize("family", FAMILIES)``).
TINY_MODELS = {"qwen3_vl": TINY, "qwen3_5": TINY35}
FAMILIES = tuple(TINY_MODELS)
SAMPLE = REPO / "grasp_lightning" / "assets" / "sample"
REAL_CLIP = SAMPLE / "train" / "videos" / "social-iq_part000.tar"


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
    import sys

    module = sys.modules.get("tests.real_shapes.test_qwen3_vl")
    terminalreporter.section("real-shape tier: run times and peak memory")
    for name, seconds in (getattr(module, "TIMES", None) or {}).items():
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    for nodeid, gib in _PEAK_RSS:
        terminalreporter.write_line(f"{gib:7.2f} GiB peak RSS after {nodeid}")
