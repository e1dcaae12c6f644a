"""Fixtures of the planner's tests."""

from __future__ import annotations

import inspect

import pytest

from grasp_lightning.module import GraspModule


@pytest.fixture(autouse=True)
def sequence_parallel_key(monkeypatch) -> None:
    """``model.sequence_parallel`` as the training CLI takes it, for plan-memory's configs and its candidate
    changes. While ``GraspModule`` does not declare the key itself (its wiring in grasp_lightning/module.py), a
    subclass that only records it stands in for the CLI's module; once it does, this fixture does nothing."""
    if "sequence_parallel" in inspect.signature(GraspModule.__init__).parameters:
        return

    class WithSequenceParallel(GraspModule):
        def __init__(self, *args, sequence_parallel: int = 1, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.sequence_parallel = sequence_parallel

    monkeypatch.setattr("grasp_lightning.commands.train.GraspModule", WithSequenceParallel)
