"""Accumulation windows (``grasp_lightning/data/windows.py``): whole windows repeated per iteration, resume
positions with draws, the lookahead that peeks without consuming, and the window collate."""

from __future__ import annotations

import logging

import pytest

from grasp_lightning.data.windows import Lookahead, Window, WindowCollate, WindowLoader, WindowSource, resume_position


def test_window_loader_repeats_whole_windows_and_resumes_inside_them():
    from grasp_lightning.data.windows import WindowLoader

    class B:  # a stand-in micro-batch
        def __init__(self, name):
            self.name, self.window = name, None

    loader = [[B("a0"), B("a1")], [B("b0"), B("b1")]]
    seen = [(b.name, b.window.position, b.window.iteration, b.window.index) for b in WindowLoader(loader, 2, 2)]
    # w0 w1 w0 w1: the second use of a window comes after the optimizer step of its first use
    assert seen == [("a0", 0, 0, 0), ("a1", 1, 0, 0), ("a0", 0, 1, 0), ("a1", 1, 1, 0),
                    ("b0", 0, 0, 1), ("b1", 1, 0, 1), ("b0", 0, 1, 1), ("b1", 1, 1, 1)]
    assert len(WindowLoader(loader, 2, 2)) == 8
    # resumed after 6 micro-batches: the batch sampler skipped window 0 (loader starts at b), and the
    # loader skips b's first iteration; the next epoch starts from its first window again
    resumed = WindowLoader(loader[1:], 2, 2, skip=2, first_window=1)
    assert [(b.name, b.window.iteration, b.window.index) for b in resumed] == [("b0", 1, 1), ("b1", 1, 1)]
    assert len(list(resumed)) == 4



class _Micro:
    """A stand-in micro-batch (``WindowLoader`` sets ``window`` on it)."""

    def __init__(self, name):
        self.name, self.window = name, None



def _as_window(items: list[int]) -> list[_Micro]:
    return [_Micro(i) for i in items]



def test_lightning_shuts_down_the_workers_of_a_window_loader_stopped_inside_a_window():
    """``fit`` that stops at ``max_steps`` leaves the window generator suspended; Lightning's loop teardown
    (``CombinedLoader.reset``) must still shut the persistent workers down. They ignore SIGTERM, so before
    this the interpreter's exit (terminate, then join) waited on them forever (a refill run never exited)."""
    from lightning.pytorch.utilities.combined_loader import CombinedLoader
    from torch.utils.data import DataLoader

    from grasp_lightning.data.windows import WindowLoader
    from grasp_lightning.datamodule import ignore_stop_signals

    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True, collate_fn=_as_window,
                        worker_init_fn=ignore_stop_signals)
    combined = CombinedLoader(WindowLoader(loader, 2, 1), "max_size_cycle")
    it = iter(combined)
    first, _, _ = next(it)
    assert first.name == 0 and first.window.position == 0  # stopped inside the first window
    workers = list(loader._iterator._workers)
    assert len(workers) == 1 and workers[0].is_alive()
    combined.reset()
    workers[0].join(timeout=20)
    assert not workers[0].is_alive() and loader._iterator is None


@pytest.mark.parametrize(("consumed", "stream_index", "draws", "expected"), [
    (0, 3, 2, (0, 0, 0)),  # nothing consumed: the epoch's start
    (6, None, 0, (1, 2, 0)),  # no stream position recorded: whole windows of 4, then 2 into the next
    (8, 3, 2, (6, 0, 0)),  # at a boundary: after window 3 and its 2 draws
    (9, 3, 2, (3, 1, 2)),  # inside window 3: re-yield it, skip 1 micro-batch, leave out its 2 draws
])
def test_resume_position_skips_whole_windows_and_the_draws_of_the_last(consumed, stream_index, draws, expected):
    assert resume_position(consumed, 4, stream_index, draws) == expected


def test_lookahead_peeks_without_consuming_and_ends_with_none():
    it = Lookahead(iter([1, 2]))
    assert it.peek() == 1 and it.peek() == 1  # held back, read twice
    assert next(it) == 1 and next(it) == 2
    assert it.peek() is None
    with pytest.raises(StopIteration):
        next(it)


def test_window_collate_splits_samples_into_micro_batches_the_last_shorter():
    collate = WindowCollate(collate=lambda samples: list(samples), batch_size=2)
    assert collate(list(range(5))) == [[0, 1], [2, 3], [4]]
    assert collate([]) == []


def test_a_window_without_a_source_draws_fetches_and_peeks_nothing():
    window = Window(batches=[_Micro("a")], position=0, iteration=0)
    assert (window.draws, window.draw(), window.fetch([0]), window.peek(), window.index) == (0, None, None, None, 0)


def test_window_source_draws_count_report_and_fetch_recollates():
    drawn: list = []
    source = WindowSource(iterator=iter([["w1"], ["w2"]]), dataset=["r0", "r1", "r2"], collate=lambda rows: "+".join(rows),
                          on_draw=drawn.append)
    assert source.draw() == ["w1"] and source.draw() == ["w2"] and source.draw() is None
    assert source.draws == 2 and drawn == [["w1"], ["w2"]] and source.iterator is None
    assert source.fetch([2, 0]) == "r2+r0"
    assert WindowSource().fetch([0]) is None and WindowSource().draw() is None


def test_a_drawn_window_is_never_yielded_and_the_epoch_logs_it(caplog):
    """Windows a, b, c, d of 2 micro-batches each; a draws b at its first micro-batch: the loader yields a, c, d
    (indices 0, 2, 3) and logs that 6 of the 8 announced micro-batches ran."""
    loader = [[_Micro(f"{w}0"), _Micro(f"{w}1")] for w in "abcd"]
    seen = []
    with caplog.at_level(logging.WARNING, logger="grasp_lightning.data.windows"):
        wl = WindowLoader(loader, 2, 1)
        for b in wl:
            if b.name == "a0":
                assert [m.name for m in b.window.draw()] == ["b0", "b1"] and b.window.draws == 1
            seen.append((b.name, b.window.index))
    assert seen == [("a0", 0), ("a1", 0), ("c0", 2), ("c1", 2), ("d0", 3), ("d1", 3)]
    assert wl.drawn_windows == 1 and len(wl) == 8
    assert any("drew 1 windows" in m and "6 of the 8 micro-batches" in m for m in caplog.messages)


def test_a_limit_ends_the_epoch_after_that_many_micro_batches():
    loader = [[_Micro("a0"), _Micro("a1")], [_Micro("b0"), _Micro("b1")]]
    limited = WindowLoader(loader, 2, 2, limit=5)
    assert len(limited) == 5
    assert [(b.name, b.window.iteration) for b in limited] == [("a0", 0), ("a1", 0), ("a0", 1), ("a1", 1), ("b0", 0)]
