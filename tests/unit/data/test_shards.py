"""Tar shard index and clip reads (``grasp_lightning.data.shards``)."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import pickle
import tarfile

import pytest

from grasp_lightning.data.shards import INDEX_NAME, ClipStore, clean_member_path, scan_shard
from grasp_lightning.errors import ArchiveError, ClipNotFoundError
from tests.helpers import make_tar

A = "social_gesture/video/153_1_001_qa0000.mp4"
B = "werewolf/video/ep1.s2.x_qa0007.mp4"


@pytest.fixture
def videos(tmp_path):
    """A videos root with two shards (one nested) and a third clip only in the second."""
    root = tmp_path / "videos"
    make_tar(root / "social_gesture_part000.tar", {A: b"clip-a" * 100, "social_gesture/video/z_qa0001.mp4": b"z"})
    make_tar(root / "more" / "werewolf_part001.tar", {B: b"clip-b" * 333})
    return root


def test_open_from_shards_and_index_file(videos):
    store = ClipStore(videos)
    assert store.open(A) == b"clip-a" * 100 and store.open(B) == b"clip-b" * 333
    assert store.open("./" + A) == b"clip-a" * 100
    assert A in store and "nope.mp4" not in store and store.index_rebuilt
    assert store.index_path == videos.resolve() / INDEX_NAME
    cached = json.loads(store.index_path.read_text())
    assert cached["members"][B][0] == "more/werewolf_part001.tar"
    assert store.members == sorted([A, B, "social_gesture/video/z_qa0001.mp4"])


def test_missing_clip_names_clip_and_root(videos):
    with pytest.raises(ClipNotFoundError) as err:
        ClipStore(videos).open("tvqa/video/missing_qa0001.mp4")
    assert err.value.where == "tvqa/video/missing_qa0001.mp4" and str(videos.resolve()) in err.value.reason
    with pytest.raises(ClipNotFoundError, match="unsafe"):
        ClipStore(videos).open("../videos/" + A)


def test_extracted_file_takes_precedence(videos):
    (videos / A).parent.mkdir(parents=True)
    (videos / A).write_bytes(b"extracted")
    assert ClipStore(videos).open(A) == b"extracted"


def test_index_cache_and_invalidation(videos):
    assert ClipStore(videos).index_rebuilt
    assert not ClipStore(videos).index_rebuilt  # loaded from .grasp_index.json
    shard = videos / "social_gesture_part000.tar"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touch
    store = ClipStore(videos)
    assert store.index_rebuilt and store.open(A) == b"clip-a" * 100
    assert not ClipStore(videos).index_rebuilt
    make_tar(shard, {A: b"new content"})  # rewritten: size changes
    assert ClipStore(videos).open(A) == b"new content"
    make_tar(videos / "tvqa_part000.tar", {"tvqa/video/t_qa0000.mp4": b"t"})  # a new shard
    store = ClipStore(videos)
    assert store.index_rebuilt and store.open("tvqa/video/t_qa0000.mp4") == b"t"
    cached = json.loads(store.index_path.read_text())
    cached["members"][A] = "garbage"
    store.index_path.write_text(json.dumps(cached))
    assert ClipStore(videos).index_rebuilt  # a malformed index is rebuilt


def test_index_falls_back_when_root_not_writable(videos, tmp_path, monkeypatch):
    (videos / INDEX_NAME).mkdir()  # neither readable nor writable as a file: like a read-only root
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    store = ClipStore(videos)
    assert store.index_path.parent == tmp_path / "xdg" / "grasp_lightning" and store.open(B)
    assert not ClipStore(videos).index_rebuilt
    assert not ClipStore(videos, cache_dir=tmp_path / "cache").index_rebuilt  # any valid index is used
    shard = videos / "social_gesture_part000.tar"
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    explicit = ClipStore(videos, cache_dir=tmp_path / "cache")  # rebuilt: written to cache_dir first
    assert explicit.index_rebuilt and explicit.index_path.parent == tmp_path / "cache"


def test_unsafe_members_never_indexed(tmp_path, caplog):
    shard = make_tar(tmp_path / "v" / "evil_part000.tar",
                     {A: b"ok", "../escape.mp4": b"x", "/abs/clip.mp4": b"x", "a/../../b.mp4": b"x"},
                     symlinks={"link.mp4": "/etc/passwd"}, hardlinks={"hard.mp4": A}, fifos=("fifo.mp4",))
    with caplog.at_level(logging.WARNING):
        store = ClipStore(tmp_path / "v")
    assert store.members == [A] and store.unsafe_members == 6
    logged = " ".join(r.getMessage() for r in caplog.records)
    for name in ("../escape.mp4", "/abs/clip.mp4", "a/../../b.mp4", "link.mp4", "hard.mp4", "fifo.mp4"):
        assert f"{shard.resolve()}:{name}" in logged
    for name in ("../escape.mp4", "/abs/clip.mp4", "link.mp4"):
        with pytest.raises(ClipNotFoundError):
            store.open(name)
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["v", "evil_part000.tar", INDEX_NAME])
    assert not (tmp_path / "escape.mp4").exists()


def test_clean_member_path():
    assert clean_member_path("./a//b/c.mp4") == "a/b/c.mp4"
    assert [clean_member_path(p) for p in ("/a", "..", "a/../b", "C:x", "a\\b", "", ".")] == [None] * 7


@pytest.mark.parametrize("cut", ["in_data", "end_marker", "header"])
def test_truncated_tar_names_shard(tmp_path, cut):
    good = make_tar(tmp_path / "ok.tar", {A: b"a" * 3000, B: b"b" * 3000})
    data = good.read_bytes()
    shard = tmp_path / "v" / "bad_part000.tar"
    shard.parent.mkdir()
    shard.write_bytes({"in_data": data[:4000], "end_marker": data[: 512 * 14], "header": data[: 512 * 7 + 100]}[cut])
    with pytest.raises(ArchiveError) as err:
        ClipStore(tmp_path / "v")
    assert str(shard.resolve()) in err.value.where and "truncated" in err.value.reason


def test_corrupt_or_empty_tar(tmp_path):
    good = make_tar(tmp_path / "ok.tar", {A: b"a" * 600, B: b"b" * 600})
    data = bytearray(good.read_bytes())
    with tarfile.open(good) as tf:
        second_header = tf.getmember(B).offset
    data[second_header: second_header + 512] = b"\x7f" * 512
    (tmp_path / "corrupt.tar").write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="corrupt"):
        scan_shard(tmp_path / "corrupt.tar")
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(ArchiveError) as err:
        scan_shard(tmp_path / "empty.tar")
    assert err.value.where == str(tmp_path / "empty.tar")


def test_shard_truncated_after_indexing(videos):
    store = ClipStore(videos)
    shard = videos / "more" / "werewolf_part001.tar"
    shard.write_bytes(shard.read_bytes()[:1200])
    with pytest.raises(ArchiveError) as err:
        store.open(B)
    assert err.value.where == f"{shard.resolve()}:{B}"


def _child_read(store: ClipStore, queue) -> None:
    queue.put((store.open(B), store._pid == os.getpid()))


def test_reopens_after_fork_and_pickles(videos):
    store = ClipStore(videos)
    assert store.open(B)  # parent opens its descriptor
    parent_fds = dict(store._fds)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_read, args=(store, queue))
    proc.start()
    data, own_pid = queue.get(timeout=20)
    proc.join(20)
    assert data == b"clip-b" * 333 and own_pid and proc.exitcode == 0
    assert store._fds == parent_fds and store.open(A) == b"clip-a" * 100
    clone = pickle.loads(pickle.dumps(store))
    assert clone._fds == {} and clone.open(B) == b"clip-b" * 333


def test_single_tar_root_and_duplicates(tmp_path, caplog):
    tar = make_tar(tmp_path / "grasp_bench.tar", {"json/x.json": b"{}", "video/x.mp4": b"mp4"})
    store = ClipStore(tar)
    assert store.open("video/x.mp4") == b"mp4" and store.index_path == tmp_path / f".grasp_bench.tar{INDEX_NAME}"
    make_tar(tmp_path / "v" / "a_part000.tar", {A: b"first"})
    make_tar(tmp_path / "v" / "b_part001.tar", {A: b"second"})
    with caplog.at_level(logging.WARNING):
        assert ClipStore(tmp_path / "v").open(A) == b"second"
    assert "more than one shard" in caplog.text
