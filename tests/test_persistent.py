"""PersistentPool: warm start, other processes, crashes, namespaces, forgetting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.anchors import start_anchors
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import PoolError, PoolStore

DEPTH = 16
PATTERN = [900001, 900002, 900003, 900004, 900005, 900006, 900007, 900008]


def pool_at(path, **kw):
    return PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH, **kw)


def proposer(pool, **kw):
    """A proposer whose path drafts follow the most frequent continuation (drafted
    tokens cost nothing), at most 4 per matched token."""
    return SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, max_spec_factor=4.0, pool=pool,
                          draft_cost=0.0, **kw)


def run_request(prop, req_id, prompt, output):
    prop.start_request(req_id, prompt)
    prop.extend(req_id, output)
    prop.finish_request(req_id)


def test_outputs_survive_restart_and_serve_from_the_snapshot(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    prop = proposer(pool)
    run_request(prop, "a", [1, 2], PATTERN)
    pool.flush()  # commits reach the file from the pool's writer thread
    assert pool.store.stats()["sequences"] == 1
    pool.write_snapshot()
    run_request(prop, "b", [3], [700, 701, 702, 703, 704, 705])  # after the snapshot
    pool.close()

    pool = pool_at(path)
    segs = pool.view.segments
    assert len(segs) == 1 and not segs[0].index.nodes.flags.writeable  # zero-copy
    assert pool.tokens == len(PATTERN) + 6 + 2 * 3  # and each output's three start anchors
    prop = proposer(pool)
    prop.start_request("c", [5, 5] + PATTERN[:3])
    d = prop.propose(["c"])[0]
    assert d.source == "cross" and d.token_ids.tolist() == PATTERN[3:]
    prop.start_request("d", [700, 701, 702])
    assert prop.propose(["d"])[0].token_ids.tolist()[:3] == [703, 704, 705]
    for seg in pool.view.segments:
        seg.index.check_integrity()
    pool.delta.index.check_integrity()


def test_own_outputs_after_the_snapshot_stay_drafted_when_the_pool_reloads(tmp_path):
    """A reload (here: a namespace asked for anew) rebuilds the in-memory part from the file,
    this process's own commits included."""
    pool = pool_at(tmp_path / "pool.lmdb")
    prop = proposer(pool)
    run_request(prop, "a", [1, 2], [600, 601, 602, 603])
    pool.write_snapshot()
    run_request(prop, "b", [3], PATTERN)  # committed by this process, after the snapshot
    pool.want(["another"])  # a reload in the background...
    pool._loader.join()
    pool.refresh()  # ...which the next refresh takes
    prop.start_request("c", [5] + PATTERN[:3])
    assert prop.propose(["c"])[0].token_ids.tolist() == PATTERN[3:]
    pool.delta.index.check_integrity()


def test_aborted_requests_are_not_stored(tmp_path):
    pool = pool_at(tmp_path / "pool.lmdb")
    prop = proposer(pool)
    prop.start_request("a", [1])
    prop.extend("a", PATTERN)
    prop.abort_request("a")
    pool.flush()
    assert pool.store.stats()["sequences"] == 0
    prop.start_request("b", PATTERN[:3])
    assert len(prop.propose(["b"])[0]) == 0


_WRITER = """
import sys, numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16, map_size=64 * 1024)
rng = np.random.default_rng(int(sys.argv[2]))
for i in range(int(sys.argv[3])):
    toks = rng.integers(0, 1000, int(rng.integers(1, 3000))).astype(np.int32)
    sid = store.add(toks, "ns", request_id=str(i))
    print(sid, int(toks.astype(np.int64).sum()), len(toks), flush=True)
"""


def spawn_writer(path, seed, count):
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(seed), str(count)],
                            stdout=subprocess.PIPE, text=True)


def test_another_process_commits_are_seen_on_refresh(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path, refresh_interval=3600)
    writer = spawn_writer(path, 1, 5)
    lines = writer.stdout.read().split("\n")
    assert writer.wait() == 0
    committed = [tuple(map(int, line.split())) for line in lines if line]
    assert len(committed) == 5
    assert pool.tokens == 0  # not yet refreshed
    pool.refresh(force=True)
    assert pool.tokens == sum(n for _, _, n in committed)
    pool.delta.index.check_integrity()


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(4))
def test_sigkill_mid_write_loses_no_committed_sequence(tmp_path, trial):
    path = tmp_path / "pool.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=DEPTH).close()
    writer = spawn_writer(path, trial, 100000)
    rng = np.random.default_rng(trial)
    committed = []
    deadline = time.monotonic() + 0.4 + float(rng.random())
    while time.monotonic() < deadline:
        line = writer.stdout.readline()
        if not line:
            break
        committed.append(tuple(map(int, line.split())))
    os.kill(writer.pid, signal.SIGKILL)
    rest = writer.stdout.read()  # printed after its commit returned, before the kill
    committed += [tuple(map(int, x.split())) for x in rest.split("\n") if x.strip()]
    writer.wait()
    assert committed, "the writer committed nothing before the kill"
    store = PoolStore(path, tokenizer=BYTES)
    assert store.check() >= len(committed)
    stored = {s.seq_id: s for s in store.sequences()}
    for sid, total, n in committed:
        assert sid in stored
        assert len(stored[sid].tokens) == n and int(stored[sid].tokens.sum()) == total


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_drafts_never_come_from_another_namespace(data, tree):
    alphabet = st.integers(0, 5)
    mine = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=25), min_size=1, max_size=4))
    theirs = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=25), min_size=1, max_size=4))
    prompt = data.draw(st.lists(alphabet, min_size=1, max_size=20))
    steps = data.draw(st.lists(st.lists(alphabet, min_size=1, max_size=3), max_size=6))
    # Both namespaces hold outputs of this very prompt: a leak through the
    # output-start anchors would show.
    anchors = start_anchors(np.asarray(prompt, np.int32))
    with tempfile.TemporaryDirectory() as tmp:
        pool = pool_at(Path(tmp) / "pool.lmdb")
        for i, toks in enumerate(mine):
            pool.add(np.asarray(toks, np.int32), "mine", anchors)
            if i == 0:
                pool.write_snapshot()  # part from the snapshot, part from the delta
        for toks in theirs:
            pool.add(np.asarray(toks, np.int32), "theirs", anchors)
        prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=6, max_spec_factor=4.0,
                              min_token_prob=0.0, draft_cost=0.0, pool=pool, namespace="mine",
                              tree=tree)
        prop.start_request("r", prompt)
        own = list(prompt)
        allowed = [list(t) for t in mine]
        for emitted in steps + [[]]:
            d = prop.propose(["r"])[0]
            for path in _paths(d):
                # What the draft claims followed must have followed in "mine" or
                # in the request itself (a merged tree's branches may come from
                # matches of other lengths: each must have followed after some
                # suffix of the context).
                claim = path if tree else own[len(own) - d.match_len:] + path
                assert any(_contains(seq, claim) for seq in allowed + [own]), (claim, d)
            if emitted:
                prop.extend("r", emitted)
                own += emitted
        pool.close()


def _paths(d) -> list[list[int]]:
    """Every root-to-leaf path of a draft (one for a path draft)."""
    tokens, parents = d.token_ids.tolist(), d.parents.tolist()
    leaves = set(range(len(tokens))) - set(parents)
    out = []
    for leaf in sorted(leaves):
        path, i = [], leaf
        while i >= 0:
            path.append(tokens[i])
            i = parents[i]
        out.append(path[::-1])
    return out


def _contains(seq, sub):
    n = len(sub)
    return any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def test_forget_removes_tokens_from_the_file(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    prop = proposer(pool)
    run_request(prop, "secret", [1], PATTERN * 3)
    run_request(prop, "keep", [1], [11, 12, 13, 14])
    pool.write_snapshot()
    needle = np.asarray(PATTERN[:4], np.int32).tobytes()
    assert needle in path.read_bytes()
    assert pool.forget(request_id="secret") == 1
    assert needle not in path.read_bytes()
    assert [s.request_id for s in pool.store.sequences()] == ["keep"]
    prop.start_request("probe", PATTERN[:3])
    assert len(prop.propose(["probe"])[0]) == 0
    pool.forget(namespace="default")
    assert pool.store.stats()["sequences"] == 0


def test_ttl_and_budget_delete_oldest_first(tmp_path):
    pool = pool_at(tmp_path / "pool.lmdb")
    pool.add(np.arange(100, 120, dtype=np.int32))
    time.sleep(0.3)
    for base in (200, 300, 400):
        pool.add(np.arange(base, base + 20, dtype=np.int32))
    assert pool.prune(older_than=0.2) == 1
    assert [int(s.tokens[0]) for s in pool.store.sequences()] == [200, 300, 400]
    pool.max_tokens = 45
    pool.write_snapshot()
    assert [int(s.tokens[0]) for s in pool.store.sequences()] == [300, 400]
    assert pool.tokens == 40


def test_snapshot_every_writes_the_snapshot_from_a_child_process(tmp_path):
    pool = pool_at(tmp_path / "pool.lmdb", snapshot_every=50)
    for i in range(6):
        pool.add(np.arange(i * 20, i * 20 + 20, dtype=np.int32))
        pool.flush()  # the child snapshots what is in the file
    assert pool.snapshotting() or pool.store.snapshot() is not None
    while pool.snapshotting():
        time.sleep(0.05)
    pool.refresh(force=True)
    assert pool.view.segments and pool.delta.tokens < 50
    assert pool.tokens == 120


def test_map_growth_while_the_snapshot_is_mapped(tmp_path):
    """Growing the map re-maps the file; the zero-copy snapshot must be re-mapped too."""
    store = PoolStore(tmp_path / "pool.lmdb", tokenizer=BYTES, max_depth=DEPTH,
                      map_size=256 * 1024)
    pool = PersistentPool(store)
    prop = proposer(pool)
    run_request(prop, "a", [1], PATTERN)
    pool.write_snapshot()
    rng = np.random.default_rng(0)
    for i in range(40):  # far more than the initial map holds
        run_request(prop, f"big{i}", [2], rng.integers(0, 50000, 3000))
        prop.start_request(f"probe{i}", [3] + PATTERN[:3])
        assert prop.propose([f"probe{i}"])[0].token_ids.tolist()[:5] == PATTERN[3:8]
        prop.abort_request(f"probe{i}")
    pool.flush()
    assert store.env.info()["map_size"] > 256 * 1024
    for seg in pool.view.segments:
        seg.index.check_integrity()


def test_a_pool_path_needs_the_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="tokenizer"):
        SuffixProposer(max_depth=DEPTH, pool=tmp_path / "pool.lmdb")
    prop = SuffixProposer(max_depth=DEPTH, pool=tmp_path / "pool.lmdb", tokenizer=BYTES)
    run_request(prop, "a", [1], PATTERN)
    prop.close()
    with PoolStore(tmp_path / "pool.lmdb") as store:
        assert store.stats()["sequences"] == 1


COMMIT_MANY = r"""
import sys
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES)
n, length, namespace = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
store.add_many([(rng.integers(0, 200, length).astype(np.int32), namespace, "", str(i))
                for i in range(n)])
store.close()
"""


def _commit_elsewhere(path, n, length, namespace):
    subprocess.run([sys.executable, "-c", COMMIT_MANY, str(path), str(n), str(length), namespace],
                   check=True, timeout=120)


def test_a_reader_indexes_only_its_namespaces_in_bounded_steps(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    pool.catch_up_tokens = 2_000
    pool.refresh_interval = 0.0
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=4, pool=pool, namespace="mine")
    prop.start_request("r", [1, 2])
    prop.propose(["r"])
    _commit_elsewhere(path, 300, 100, "other")  # another tenant's 30k tokens
    _commit_elsewhere(path, 5, 100, "mine")
    pool.refresh()
    steps = 1
    while pool.behind:  # each call reads about catch_up_tokens, then returns
        assert pool.delta.tokens <= 5 * 100 + 3
        pool.refresh()
        steps += 1
    assert steps >= 30 // 2  # 30k tokens read in about 2k-token steps
    assert "other" not in pool.delta.trees  # never indexed
    assert pool.store.stats()["namespaces"]["other"]["sequences"] == 300
    assert pool.delta.tokens == 5 * 100 + 3  # mine's 5 outputs and r's 3 anchors
    pool.close()


def test_memory_stays_within_the_budget_without_snapshots(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool_at(path).close()
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH, max_tokens=1_000)
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=4, pool=pool)
    for i in range(40):  # this process's own outputs
        run_request(prop, f"r{i}", [1], list(range(i, i + 50)))
    _commit_elsewhere(path, 100, 100, "default")  # and 10k tokens from elsewhere
    pool.refresh(force=True)
    while pool.behind:
        pool.refresh()
    pool.flush()
    assert pool.tokens <= 1_000 and pool.delta.tokens <= 1_000
    assert pool.store.stats()["tokens"] == 40 * 50 + 100 * 100  # the store keeps them all
    pool.delta.index.check_integrity()
    pool.close()


def _learn(prop, n):
    """Finish ``n`` requests repeating PATTERN, drafting and verifying as an engine does."""
    for i in range(n):
        prop.start_request(f"r{i}", [1, 2])
        for tok in PATTERN:
            prop.propose([f"r{i}"])
            prop.extend(f"r{i}", [tok])
        prop.finish_request(f"r{i}")


def test_calibration_survives_restart_and_is_refused_when_damaged(tmp_path, caplog,
                                                                  monkeypatch):
    from suffixspec import proposer
    from suffixspec.proposer import CALIBRATION_SAVE_EVERY

    monkeypatch.setattr(proposer, "CALIBRATION_SAVE_SECONDS", 0.0)  # saved by count alone
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    _learn(prop, CALIBRATION_SAVE_EVERY)  # the last finish saves the table
    learned = prop.stats.table.copy()
    assert learned[:, 1].sum() > 0
    _learn(prop, 1)  # learned after the save: not in the file
    pool.close()

    pool = pool_at(path)
    again = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    assert np.array_equal(again.stats.table, learned)
    pool.close()

    store = PoolStore(path)  # damage the kept table: one flipped byte
    with store.env.begin(write=True) as txn:
        raw = bytearray(txn.get(b"table:calibration", db=store.db("meta")))
        raw[-5] ^= 0xFF
        txn.put(b"table:calibration", bytes(raw), db=store.db("meta"))
    store.close()
    pool = pool_at(path)
    with caplog.at_level("WARNING"):
        fresh = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    assert fresh.stats.table[:, 1].sum() == 0
    assert sum("calibration is not used" in r.getMessage() for r in caplog.records) == 1
    fresh.start_request("x", [1, 2])  # drafts from the pool all the same
    assert fresh.propose(["x"])[0].token_ids.tolist()[:2] == PATTERN[:2]
    pool.close()


@pytest.mark.parametrize("bad", ["nan", "inf", "huge", "negative", "over", "flat", "rows"])
def test_a_kept_calibration_table_out_of_range_is_learned_again_not_used(tmp_path, caplog, bad):
    """A table kept in the pool (signed, so its checksum holds) is checked before
    it drafts: not finite, out of range or of a shape this version does not
    know, it is learned again with one log line; it is never saved back."""
    from suffixspec.native import calibration as cal

    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    table = cal.new_table()
    table[:, 1] = 4.0
    table[:, 0] = 2.0
    table = {"nan": lambda t: t.__setitem__((5, 0), np.nan) or t,
             "inf": lambda t: t.__setitem__((5, 1), np.inf) or t,
             "huge": lambda t: t.__setitem__((5, 1), 1e308) or t,
             "negative": lambda t: t.__setitem__((5, 0), -5.0) or t,
             "over": lambda t: t.__setitem__((5, 0), 5.0) or t,  # accepted past tried
             "flat": lambda t: t.ravel(),
             "rows": lambda t: t[:100]}[bad](table)
    pool.save_calibration(table)
    pool.close()
    pool = pool_at(path)
    with caplog.at_level("WARNING"):
        prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    assert [r.getMessage() for r in caplog.records if "calibration" in r.getMessage()] and \
        sum("calibration table is not used" in r.getMessage() for r in caplog.records) == 1
    assert prop.stats.table[:, 1].sum() == 0 and np.isfinite(prop.stats.table).all()
    run_request(prop, "a", [1, 2], PATTERN)
    prop.start_request("b", [1, 2])
    assert len(prop.propose(["b"])[0]) > 0  # drafts, with a table it learns afresh
    prop.close()
    kept = PoolStore(path).load_table("calibration")
    assert np.isfinite(kept).all() and (kept >= 0).all()  # the bad one was not written back


def test_a_table_the_previous_version_kept_is_upgraded_and_drafts(tmp_path, caplog):
    """A pool written by the previous version (0.8: token rows, no rows for
    the device's scans) opens with its counts in the upgraded rows, with no
    warning."""
    from suffixspec.native import calibration as cal

    path = tmp_path / "pool.lmdb"
    pool = pool_at(path)
    n_src, planes, _, positions, kind_rows = cal.EARLIER_LAYOUTS["0.8"]
    old = np.zeros((cal.layout_rows(n_src, planes, positions, kind_rows), 2))
    old[:, 1] = 4.0
    old[:, 0] = 3.0
    pool.save_calibration(old)
    pool.close()
    pool = pool_at(path)
    with caplog.at_level("WARNING"):
        prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    assert not [r for r in caplog.records if "calibration" in r.getMessage()]
    assert np.array_equal(prop.stats.table, cal.upgrade_table(old))
    assert prop.stats.table[:, 1].sum() == 4.0 * old.shape[0]  # every row kept
    run_request(prop, "a", [1, 2], PATTERN)
    prop.start_request("b", [1, 2])
    assert len(prop.propose(["b"])[0]) > 0
    prop.close()


def test_a_closed_proposer_refuses_every_call_in_one_line(tmp_path):
    from suffixspec.locking import Closed

    pool = pool_at(tmp_path / "pool.lmdb")
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool)
    run_request(prop, "a", [1, 2], PATTERN)
    prop.start_request("b", [1, 2])
    prop.close()
    prop.close()  # twice: nothing
    for call in (lambda: prop.propose(["b"]), lambda: prop.extend("b", [3]),
                 lambda: prop.finish_request("b"), lambda: prop.start_request("c", [1])):
        with pytest.raises(Closed, match="SuffixProposer.* was closed"):
            call()
    again = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=pool_at(tmp_path / "pool.lmdb"))
    again.start_request("c", [1, 2])
    assert len(again.propose(["c"])[0]) > 0  # the file opens again in this process
    again.close()


def test_a_long_commit_of_another_process_is_indexed_off_the_serving_calls(tmp_path):
    """A 100k-token sequence committed by another pool on the file: no serving
    refresh indexes it (the loader thread does, and its work is swapped in);
    the reader then drafts from it."""
    from suffixspec.pools.persistent import LONG

    path = tmp_path / "pool.lmdb"
    writer, reader = pool_at(path), pool_at(path, refresh_interval=0.0)
    rng = np.random.default_rng(0)
    long = rng.integers(0, 200, 100_000).astype(np.int32)
    long[-40:] = np.tile(PATTERN, 5)
    writer.add(long, "default")
    writer.flush()
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, pool=reader)
    prop.start_request("x", PATTERN[:4])
    end = time.monotonic() + 60
    while time.monotonic() < end:
        before = reader.delta.tokens
        swapped = reader._prepared is not None
        drafted = prop.propose(["x"])[0].token_ids.tolist()[:4]
        if not swapped:  # a serving call indexed at most a refresh's budget
            assert reader.delta.tokens - before <= LONG
        if drafted == PATTERN[4:8]:
            break
        time.sleep(0.01)
    assert drafted == PATTERN[4:8] and reader.delta.tokens >= long.shape[0]
    writer.close()
    prop.close()


def test_a_pool_opens_with_little_room_and_the_loader_makes_a_roomier_delta(tmp_path):
    """Opening fills only ``OPEN_ROOM_TOKENS`` of room (filling room is what an
    open costs); commits past half of it make the loader prepare a delta with
    ``ROOM_TOKENS`` of room, swapped in by a refresh, and once refreshes have caught
    up nothing is lost."""
    from suffixspec.pools.loader import OPEN_ROOM_TOKENS, ROOM_TOKENS

    pool = pool_at(tmp_path / "pool.lmdb", refresh_interval=0.0)
    opened_with = pool.delta.index.nodes.shape[0]
    assert opened_with < 2 * ROOM_TOKENS
    rng = np.random.default_rng(1)
    added = 0
    while added <= OPEN_ROOM_TOKENS:  # past the open's room: serving commits grow it
        seq = rng.integers(0, 5000, 4096).astype(np.int32)
        pool.add(seq, "default")
        added += seq.shape[0]
    pool.add(np.array(PATTERN * 3, np.int32), "default")
    end = time.monotonic() + 60
    while pool.delta.index.nodes.shape[0] < 2 * ROOM_TOKENS and time.monotonic() < end:
        pool.refresh()
        time.sleep(0.01)
    assert pool.delta.index.nodes.shape[0] >= 2 * ROOM_TOKENS
    # Commits stored after the loader's last read are dropped from the new delta
    # and caught up by later refreshes, ``CATCH_UP_TOKENS`` at a time (a serving
    # call's bounded work): on a slow machine that is several refreshes.
    pool.flush()
    while pool.behind and time.monotonic() < end:
        pool.refresh()
    assert not pool.behind
    prop = proposer(pool)
    prop.start_request("x", PATTERN[:4])
    assert prop.propose(["x"])[0].token_ids.tolist()[:4] == PATTERN[4:8]
    pool.flush()
    assert pool.store.stats()["sequences"] == added // 4096 + 1
    prop.close()


def test_serving_calls_do_not_wait_for_a_commit_to_reach_the_disk(tmp_path, monkeypatch):
    """The writer thread stores commits without the pool's lock: while one is
    held on its way to the disk (a slow fsync), serving calls go on.  The commit
    is held until the serving calls have returned (or 30 s, so that a serving
    call waiting for it would be seen, not hang the test)."""
    from suffixspec.pools.store import PoolStore as Store

    pool = pool_at(tmp_path / "pool.lmdb")
    prop = proposer(pool)
    writing, release = threading.Event(), threading.Event()
    timed_out = []
    add_many = Store.add_many

    def held_add_many(self, items):
        writing.set()
        timed_out.append(not release.wait(30))
        return add_many(self, items)

    monkeypatch.setattr(Store, "add_many", held_add_many)
    run_request(prop, "a", [1, 2], PATTERN)  # its commit goes to the writer
    assert writing.wait(10)
    prop.start_request("b", PATTERN[:4])
    drafted = prop.propose(["b"])[0].token_ids.tolist()[:4]
    prop.extend("b", PATTERN[4:6])
    release.set()  # only now may the commit reach the disk
    assert drafted == PATTERN[4:8]
    pool.flush()
    assert timed_out == [False]  # the serving calls returned while it was held
    assert pool.store.stats()["sequences"] == 1
    prop.close()


def test_closing_a_pool_whose_file_refused_a_commit_says_so_and_does_not_raise(tmp_path,
                                                                              monkeypatch,
                                                                              caplog):
    """A file that cannot take commits (a read-only disk): the failure is
    logged when it happens, and ``close`` says it once more instead of raising."""
    from suffixspec.pools.store import PoolError
    from suffixspec.pools.store import PoolStore as Store

    pool = pool_at(tmp_path / "pool.lmdb")
    prop = proposer(pool)

    def refuse(self, items):
        raise PoolError(f"could not write {self.path}: Read-only file system")

    monkeypatch.setattr(Store, "add_many", refuse)
    run_request(prop, "a", [1, 2], PATTERN)
    with caplog.at_level("WARNING"):
        prop.close()
        pool.close()
    said = [r.getMessage() for r in caplog.records]
    assert any("not stored" in m and "Read-only" in m for m in said), said
    assert any("closed with outputs it could not store" in m for m in said), said


def test_a_pool_that_cannot_be_created_says_why_in_one_line(tmp_path, monkeypatch):
    import lmdb

    from suffixspec.pools import store as store_module

    def read_only(*args, **kwargs):
        raise lmdb.ReadonlyError("mdb_env_open: Read-only file system")

    monkeypatch.setattr(store_module.lmdb, "open", read_only)
    with pytest.raises(PoolError, match="cannot create a pool at .*its folder cannot be written"):
        PoolStore(tmp_path / "new.lmdb", tokenizer=BYTES, max_depth=DEPTH)


def test_serving_imports_nothing_of_the_offline_wing():
    """A server (the proposer, the pool, the vLLM plugin's service) never loads
    ``suffixspec.offline``: log parsing, learning and fleet builds are the CLI's."""
    import subprocess
    import sys

    code = ("import sys, suffixspec, suffixspec.proposer, suffixspec.pools.persistent, "
            "suffixspec.integrations.vllm.build, suffixspec.integrations.vllm.v1_runner.service; "
            "bad = [m for m in sys.modules if m.startswith('suffixspec.offline')]; "
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
