"""Snapshot files: killed builds, readers beside new snapshots, damage, permissions."""

from __future__ import annotations

import logging
import random
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools import files, view
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import PoolStore

DEPTH = 16
# Every sequence starts so, then random tokens of 20..69: [7, 8, 9] drafts [1, 2, ...] and
# [1, 2, 3] drafts [4, 5, ...], the same 8 tokens however the pool is split in segments.
HEAD = [7, 8, 9, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16]


def _pool(path, n=400, seed=0):
    """A pool of ``n`` sequences in namespace "a", with a snapshot."""
    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    rng = np.random.default_rng(seed)
    store.add_many([(np.concatenate([HEAD, rng.integers(20, 70, 300)]).astype(np.int32),
                     "a", "", f"r{i}") for i in range(n)])
    write_snapshot(store)
    store.close()


def _drafts(path):
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH)
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, max_spec_factor=8.0, pool=pool,
                          namespace="a", draft_cost=0.0)
    out = []
    for n, prompt in enumerate(([7, 8, 9], [1, 2, 3], [4, 5])):
        prop.start_request(n, prompt)
        out.append(prop.propose([n])[0].token_ids.tolist())
    pool.close()
    return out


def _folders(path):
    return sorted(p.name for p in path.with_name(path.name + ".snapshots").iterdir()
                  if p.is_dir())


_BUILD_FOREVER = """
import sys
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
print("start", flush=True)
while True:
    store.update_segments(lambda current, txn: [])  # every sequence indexed in memory
    write_snapshot(store, jobs=2, upto=200, merge=False)  # two segments of one size...
    write_snapshot(store, jobs=2)  # ...then merged
"""


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(4))
def test_a_killed_segment_build_or_merge_loses_nothing_and_leaves_no_folder(tmp_path, trial):
    path = tmp_path / "pool.lmdb"
    _pool(path)
    reference = _drafts(path)
    assert reference == [HEAD[3:11], HEAD[6:14], HEAD[8:16]]
    ids = [s.seq_id for s in PoolStore(path, readonly=True).sequences(with_tokens=False)]
    proc = subprocess.Popen([sys.executable, "-c", _BUILD_FOREVER, str(path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(random.Random(trial).uniform(0.2, 4.0))
    proc.kill()
    proc.wait()
    # The build's workers hold the folders' lock until they end.
    with files.folder_lock(path.with_name(path.name + ".snapshots")):
        pass
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH)
    pool.recover()  # removes stray folders, as the maintenance commands do
    pool.store.check()
    assert [s.seq_id for s in pool.store.sequences(with_tokens=False)] == ids
    info = pool.store.snapshot()
    named = sorted(seg.folder for seg in info.segments) if info else []
    assert _folders(path) == named and len(pool.view.segments) == len(named)
    pool.close()
    assert _drafts(path) == reference


_READER = """
import sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], refresh_interval=0.01)
prop = SuffixProposer(max_depth=pool.max_depth, max_spec_tokens=8, max_spec_factor=8.0,
                      pool=pool, namespace="a", draft_cost=0.0)
end = time.monotonic() + float(sys.argv[2])
drafted = steps = 0
while time.monotonic() < end:
    prop.start_request(steps, [7, 8, 9])
    drafted += len(prop.propose([steps])[0]) > 0
    prop.abort_request(steps)
    steps += 1
print(steps, drafted, pool.view.generation)
"""

@pytest.mark.slow
def test_a_reader_keeps_drafting_while_segments_are_added_and_merged(tmp_path):
    path = tmp_path / "pool.lmdb"
    _pool(path)
    reader = subprocess.Popen([sys.executable, "-c", _READER, str(path), "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = PoolStore(path)
    rng = np.random.default_rng(1)
    written = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        store.add(np.concatenate([HEAD, rng.integers(20, 70, 100)]).astype(np.int32), "a")
        write_snapshot(store)  # a new segment, merged with others: folders the reader maps go
        written += 1
    merged = len(store.snapshot().segments) < 1 + written
    store.close()
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    steps, drafted, generations = map(int, out.split())
    assert written >= 3 and merged and steps > 0 and drafted == steps
    assert generations > 1  # the reader moved on to newer snapshots


def test_damaged_or_missing_snapshot_files_are_logged_and_nothing_is_lost(tmp_path, caplog):
    path = tmp_path / "pool.lmdb"
    _pool(path)
    reference = _drafts(path)
    folder = path.with_name(path.name + ".snapshots") / _folders(path)[0]
    nodes = folder / "nodes.bin"
    data = bytearray(nodes.read_bytes())
    data[len(data) // 2] ^= 0x10
    nodes.write_bytes(bytes(data))
    with pytest.raises(Exception, match="checksum"):
        PoolStore(path).check()  # `suffixspec check` names the damage
    with caplog.at_level(logging.WARNING):
        assert _drafts(path) == reference  # drafted from the stored sequences
    assert "snapshot" in caplog.text and "not used" in caplog.text
    shutil.rmtree(folder)
    assert _drafts(path) == reference
    write_snapshot(PoolStore(path))  # writes it anew
    pool = PersistentPool(path)
    assert len(pool.view.segments) == 1 and _folders(path) == [
        pool.store.snapshot().segments[0].folder]
    pool.close()


def test_snapshot_files_are_private(tmp_path):
    path = tmp_path / "pool.lmdb"
    _pool(path)
    root = path.with_name(path.name + ".snapshots")
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


_FULL_DISK = """
import resource, signal, sys
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import DiskFullError, PoolStore
# Writes past this size fail as on a full disk (EFBIG instead of ENOSPC).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    write_snapshot(PoolStore(sys.argv[1]))
except DiskFullError as e:
    print(e)
"""


def test_a_full_disk_during_a_build_keeps_the_last_snapshot(tmp_path):
    path = tmp_path / "pool.lmdb"
    _pool(path, n=20)
    reference = _drafts(path)
    before = _folders(path)
    store = PoolStore(path)
    rng = np.random.default_rng(2)
    store.add_many([(rng.integers(20, 70, 5000).astype(np.int32), "a", "", "") for _ in range(100)])
    store.close()
    out = subprocess.run([sys.executable, "-c", _FULL_DISK, str(path)], capture_output=True,
                         text=True, timeout=300)
    assert "could not write the snapshot" in out.stdout, out.stdout + out.stderr
    assert _folders(path) == before  # the half-written folder is gone
    pool = PersistentPool(path)
    assert [seg.folder for seg in pool.store.snapshot().segments] == before
    assert len(pool.view.segments) == 1
    pool.close()
    assert _drafts(path) == reference


def test_files_checked_once_are_not_read_again_until_written(tmp_path, monkeypatch):
    path = tmp_path / "pool.lmdb"
    _pool(path, n=30)
    store = PoolStore(path)
    seg = store.snapshot().segments[0]
    folder = store.snapshot_folders / seg.folder
    monkeypatch.setattr(files, "RACY_S", -1.0)  # no wait for file times to settle
    read, checked = [], []
    checksum, check = files.file_checksum, view.check_segment
    monkeypatch.setattr(files, "file_checksum", lambda p: read.append(p) or checksum(p))
    monkeypatch.setattr(view, "check_segment", lambda *a: checked.append(1) or check(*a))

    def open_it():
        _, stamps = view.open_segment(folder, seg, DEPTH, None, store.stamps(seg.folder))
        if stamps is not None:
            store.record_stamps(seg.folder, stamps)

    # The snapshot that built the segment stamped it: the first open reads nothing.
    assert store.stamps(seg.folder) == view.built_stamps(folder, seg)
    open_it()
    assert read == [] and checked == []
    store.record_stamps(seg.folder, {})  # as if it had not: a segment never checked
    open_it()
    assert len(read) == len(seg.arrays) and checked == [1]  # the first open checks everything
    open_it()
    assert len(read) == len(seg.arrays) and checked == [1]  # the next reads nothing
    # A stamp file copied into the folder plays no part: stamps live in the pool file.
    (folder / ".verified").write_text('{"nodes": [0, 0, 0, 0, 0]}')
    open_it()
    assert len(read) == len(seg.arrays)
    nodes = folder / "nodes.bin"
    data = bytearray(nodes.read_bytes())
    data[len(data) // 3] ^= 0x04
    nodes.write_bytes(bytes(data))  # written since: checked again, and refused
    with pytest.raises(ValueError, match="checksum"):
        open_it()
    store.close()
