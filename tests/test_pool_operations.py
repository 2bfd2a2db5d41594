"""The pool under real operations: names, locks, forgets, namespaces, serving calls.

One test per way an operator or a tenant found the pool to lose, double,
keep or leak data, or hang (each fails on the code before these fixes,
0c46504).  Child processes stand in for other processes where locks and
LMDB's per-process handles are what is tested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import PoolError, PoolStore
from suffixspec.testing.pool_children import READ_AND_WAIT

DEPTH = 16
SECRET = [900011, 900012, 900013, 900014, 900015, 900016, 900017, 900018]


def pool_at(path, **kw):
    return PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH, **kw)


def proposer(pool, **kw):
    return SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, max_spec_factor=4.0, pool=pool,
                          draft_cost=0.0, **kw)


def child(code: str, *args, timeout: float = 60.0, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def in_thread(fn, timeout: float):
    """``fn()`` in a daemon thread: ``(finished, result or exception)``."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["value"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive(), box.get("value")


# ------------------------------------------------------- a pool is its file
def test_a_pool_reached_by_a_symbolic_link_is_its_file_with_one_lock(tmp_path):
    real, link = tmp_path / "real.lmdb", tmp_path / "link.lmdb"
    PoolStore(real, tokenizer=BYTES, max_depth=DEPTH).close()
    link.symlink_to(real)
    with PoolStore(link) as store:
        store.add(np.arange(5, dtype=np.int32), "a")
        assert store.path == real
        assert store.snapshot_folders == tmp_path / "real.lmdb.snapshots"
        assert store.compact(timeout=1.0)
    # LMDB's lock file, the gate and the compacted file: the real file's own.
    assert not (tmp_path / "link.lmdb-lock").exists()
    assert not (tmp_path / "link.lmdb-gate").exists()
    assert link.is_symlink() and link.resolve() == real
    with PoolStore(real) as store:
        assert [q.tokens.tolist() for q in store.sequences()] == [list(range(5))]


def test_a_dangling_link_makes_the_pool_at_its_target(tmp_path):
    link, target = tmp_path / "link.lmdb", tmp_path / "data" / "pool.lmdb"
    target.parent.mkdir()
    link.symlink_to(target)
    PoolStore(link, tokenizer=BYTES, max_depth=DEPTH).close()
    assert target.is_file() and link.resolve() == target
    assert (tmp_path / "data" / "pool.lmdb-gate").exists()
    assert not (tmp_path / "link.lmdb-gate").exists()


def test_a_pool_file_with_a_second_name_is_refused(tmp_path):
    real = tmp_path / "real.lmdb"
    PoolStore(real, tokenizer=BYTES, max_depth=DEPTH).close()
    os.link(real, tmp_path / "other.lmdb")
    for name in ("real.lmdb", "other.lmdb"):
        with pytest.raises(PoolError, match="2 names \\(hard links\\)"):
            PoolStore(tmp_path / name)


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_what_is_not_a_file_is_refused_without_being_opened(tmp_path, kind):
    path = tmp_path / "pool.lmdb"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path = Path("/dev/null")
    done, got = in_thread(lambda: PoolStore(path, tokenizer=BYTES, max_depth=DEPTH), 10.0)
    assert done, "opening it hung"
    assert isinstance(got, PoolError) and "not a pool file" in str(got)


# ---------------------------------------------------- locks no open can drop
HOLD_THEN_ASK = r"""
import sys
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
print("compacted" if store.compact(timeout=float(sys.argv[2])) else "refused", flush=True)
store.close()
"""


def test_a_refused_second_open_leaves_the_first_handles_gate(tmp_path):
    path = tmp_path / "pool.lmdb"
    first = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    first.add(np.arange(4, dtype=np.int32), "a")  # open, inside the gate
    with pytest.raises(PoolError, match="already open in this process"):
        PoolStore(path)
    # Another process's compaction must still wait for the first handle.
    done = child(HOLD_THEN_ASK, path, 0.5)
    assert done.stdout.strip() == "refused", done.stderr[-2000:]
    first.close()
    done = child(HOLD_THEN_ASK, path, 5.0)
    assert done.stdout.strip() == "compacted", done.stderr[-2000:]


# ------------------------------------ no wait only our own threads can end
ASK_AND_WAIT = r"""
import sys
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
store.env
print("asking", flush=True)
print("compacted" if store.compact(timeout=30.0) else "refused", flush=True)
store.close()
"""


def test_opening_beside_a_compaction_request_finishes(tmp_path):
    """This process holds the file; another asks to compact it; a pool opened
    here on that handle lets go for the compaction instead of waiting for
    itself, and both finish."""
    path = tmp_path / "pool.lmdb"
    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    store.add_many([(np.arange(i, i + 50, dtype=np.int32), "a", "", "") for i in range(20)])
    asker = subprocess.Popen([sys.executable, "-c", ASK_AND_WAIT, str(path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert asker.stdout.readline().strip() == "asking"
        deadline = time.monotonic() + 10
        while not store.gate.requested():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        done, pool = in_thread(lambda: PersistentPool(store, max_depth=DEPTH), 20.0)
        assert done, "the open waited for ever"
        assert not isinstance(pool, BaseException), pool
        assert asker.stdout.readline().strip() == "compacted"
        assert pool.tokens == 20 * 50
        pool.close()
    finally:
        asker.kill()
        store.close()


def test_the_watcher_never_holds_the_pool_while_a_write_holds_the_file(tmp_path):
    """A write transaction of the writer thread holds the file (here: its
    lock, held a second); a compaction asks to let go.  The watcher lets go
    only once the write ended, and holds the pool's lock only for moments
    meanwhile, so serving calls (which take that lock) go on."""
    path = tmp_path / "pool.lmdb"
    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    store.add(np.arange(3, dtype=np.int32), "a")
    writing = threading.Event()

    def long_write():
        with store._file_lock:
            writing.set()
            time.sleep(1.0)

    t = threading.Thread(target=long_write)
    t.start()
    writing.wait()
    fd = os.open(store.gate.path, os.O_RDWR)  # what a compaction does first: ask
    os.pwrite(fd, (store.gate.seen + 1).to_bytes(8, "little"), 8)
    os.close(fd)
    store.watch()
    waits = []
    for _ in range(10):
        t0 = time.monotonic()
        with store.lock:
            waits.append(time.monotonic() - t0)
        time.sleep(0.05)
    t.join()
    store.close()
    assert max(waits) < 0.1, waits


def test_a_delete_of_many_tokens_is_not_taken_out_inside_a_serving_call(tmp_path):
    """Another process deletes what this one indexed in memory (a prune of
    most of the pool): the next refresh stops drafting it at once, by a
    fresh delta with the outputs in flight, and the loader indexes again
    what is left; the serving call does not take them out one by one."""
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path, refresh_interval=0.0)
    prop = proposer(pool)
    rng = np.random.default_rng(0)
    for i in range(60):
        pool.add(rng.integers(0, 5000, 1000).astype(np.int32), "default")
    pool.add(np.array(SECRET, np.int32), "default")
    pool.flush()
    kept = pool.store.last_id()
    prop.start_request("open", [1, 2, 3])
    removed = []
    original = pool.delta.remove
    pool.delta.remove = lambda seq: (removed.append(seq), original(seq))
    done = child("import sys\nfrom suffixspec.pools.store import PoolStore\n"
                 "s = PoolStore(sys.argv[1])\n"
                 "print(s.delete(range(1, int(sys.argv[2]))))\ns.close()", path, kept)
    assert done.stdout.strip() == str(kept - 1), done.stderr
    prop.propose(["open"])  # refreshes
    assert removed == []  # not one by one in the serving call
    pool._loader.join(timeout=30)
    prop.propose(["open"])  # swaps the loader's delta in
    prop.start_request("q", SECRET[:3])
    assert prop.propose(["q"])[0].token_ids.tolist()[:3] == SECRET[3:6]  # what was kept
    assert pool.tokens < 2000
    pool.close()


# ---------------------------------------------------- forget reaches every copy
def test_forget_reaches_what_a_killed_learn_held_back(tmp_path):
    from click.testing import CliRunner

    from suffixspec.cli import main
    from suffixspec.offline import learn
    from suffixspec.offline.ingest import Held

    path = tmp_path / "pool.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=DEPTH).close()
    held = [Held(np.arange(3, dtype=np.int32), np.zeros(0, np.int32),
                 np.array(SECRET, np.int32) + i, "secret", f"r{i}") for i in range(5)]
    learn.keep(path, held)  # as a killed `ingest --learn` leaves them
    done = CliRunner().invoke(main, ["forget", str(path), "--namespace", "secret", "--json"])
    assert done.exit_code == 0, done.output
    assert not learn.learning_file(path).exists()
    assert learn.recover(path) == 0
    with PoolStore(path) as store:
        assert list(store.sequences(namespace="secret")) == []


FORGET = r"""
import sys
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1])
print(pool.forget(namespace=sys.argv[2], timeout=10.0), pool.compacted, flush=True)
pool.close()
"""


def test_forget_reaches_a_running_servers_kept_trees_and_family_outputs(tmp_path):
    """A server drafted the forgotten namespace's outputs from what it keeps
    in memory beside the pool (a finished request's tree, its family's
    outputs); after another process's forget, within the refresh interval,
    it drafts none of them."""
    path = tmp_path / "pool.lmdb"
    pool = pool_at(path, refresh_interval=0.0)
    prop = proposer(pool, namespace="secret", family_outputs=2)
    family = list(range(100, 164))  # one family: the same first 64 prompt tokens
    prop.start_request("a", family + [1])
    prop.extend("a", SECRET)
    prop.finish_request("a")
    pool.flush()
    prop.start_request("before", family + [2])
    assert SECRET[0] in prop.family_outputs("before")[0].tolist()
    done = child(FORGET, path, "secret")
    assert done.stdout.split()[0] == "1", done.stderr[-2000:]
    deadline = time.monotonic() + 5.0  # serving goes on: a refresh soon sees the forget
    while prop.forgets == 0 and time.monotonic() < deadline:
        prop.propose(["before"])
        time.sleep(0.02)
    assert prop.forgets == 1
    assert prop.family_outputs("before") == ()
    prop.start_request("b", family + [3])   # a new request of the family
    prop.start_request("c", family + [1] + SECRET)  # a next turn of the forgotten one
    assert prop.family_outputs("b") == ()
    assert prop.reused_tokens == 0
    for r, ctx in (("b", SECRET[:2]), ("before", SECRET[:2])):
        prop.extend(r, ctx)
        assert not set(prop.propose([r])[0].token_ids.tolist()) & set(SECRET[2:]), r
    pool.close()


# -------------------------------------------------------- namespaces are walls
def test_a_request_never_takes_over_another_namespaces_tree():
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, draft_cost=0.0,
                          max_spec_factor=4.0, family_outputs=2)
    prompt = list(range(200, 264))
    prop.start_request("a1", prompt, namespace="a")
    prop.extend("a1", SECRET)
    prop.finish_request("a1")
    prop.start_request("a2", prompt + [5], namespace="a")
    prop.extend("a2", [900101, 900102, 900103, 900104])
    prop.finish_request("a2")
    # b's prompt continues a1's conversation word for word.
    prop.start_request("b", prompt + SECRET + [7, 8, 900101], namespace="b")
    assert prop.reused_tokens == 0
    drafted = prop.propose(["b"])[0].token_ids.tolist()
    assert not set(drafted) & {900102, 900103, 900104}
    prop.start_request("a3", prompt + SECRET + [7], namespace="a")
    assert prop.reused_tokens == len(prompt) + len(SECRET)  # its own namespace: taken over


# ----------------------------------------------------------- ingest, export
def test_an_export_with_another_pools_records_after_it_is_refused_from_there(tmp_path):
    from suffixspec.fingerprint import TokenizerId
    from suffixspec.offline.ingest import export, ingest

    other = TokenizerId("other", "f" * 16, 300)
    a = PoolStore(tmp_path / "a.lmdb", tokenizer=BYTES, max_depth=DEPTH)
    a.add(np.arange(10, 20, dtype=np.int32), "ns", request_id="ra")
    b = PoolStore(tmp_path / "b.lmdb", tokenizer=other, max_depth=DEPTH)
    b.add(np.arange(200, 210, dtype=np.int32), "ns", request_id="rb")
    out = tmp_path / "both.jsonl"
    with open(out, "w") as f:
        export(a, f)
        export(b, f)
    b.close()
    target = PoolStore(tmp_path / "c.lmdb", tokenizer=BYTES, max_depth=DEPTH)
    report = ingest(target, [out], None)
    stored = [q.request_id for q in target.sequences()]
    assert stored == ["ra"]
    assert report.skipped == 1 and "second export header" in report.problems[0]
    a.close()
    target.close()


INGEST = r"""
import sys
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import ingest
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
r = ingest(store, [sys.argv[2]], None, batch_tokens=64)
print(r.sequences, r.duplicates, flush=True)
store.close()
"""


@pytest.mark.slow
def test_two_ingests_of_one_log_at_once_store_each_record_once(tmp_path):
    from suffixspec.offline.ingest import export

    src = PoolStore(tmp_path / "src.lmdb", tokenizer=BYTES, max_depth=DEPTH)
    src.add_many([(np.arange(i, i + 30, dtype=np.int32) % 250, "ns", "", f"r{i}")
                  for i in range(400)])
    log = tmp_path / "log.jsonl"
    with open(log, "w") as f:
        export(src, f)
    src.close()
    path = tmp_path / "pool.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=DEPTH).close()
    runs = [subprocess.Popen([sys.executable, "-c", INGEST, str(path), str(log)],
                             stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [r.communicate(timeout=300)[0].split() for r in runs]
    with PoolStore(path) as store:
        ids = [q.request_id for q in store.sequences()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(400))
    assert sum(int(o[0]) for o in outs) == 400 and sum(int(o[1]) for o in outs) == 400


# ------------------------------------------------------------ LMDB's engines
MAKE_WITH_ENGINE_1 = r"""
import sys, lmdb
from suffixspec.fingerprint import BYTES
from suffixspec.pools import store as s
real = lmdb.open
s._open_lmdb = lambda path, **o: real(path, lib_version=1, **o)  # what py-lmdb's 1.0 engine makes
st = s.PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16)
import numpy as np
st.add(np.arange(7, dtype=np.int32), "a")
st.close()
"""


def _data_version(path: Path) -> int:
    """The LMDB data format of a file (1: LMDB 0.9, 3: LMDB 1.0): the word
    after the meta page's magic."""
    import struct

    head = path.read_bytes()[:64]
    for at in range(0, len(head) - 7, 4):
        if struct.unpack("=I", head[at:at + 4])[0] == 0xBEEFC0DE:
            return struct.unpack("=I", head[at + 4:at + 8])[0]
    return 0


def test_a_pool_made_by_lmdbs_1_0_engine_opens_and_new_pools_use_0_9(tmp_path):
    made = tmp_path / "one.lmdb"
    done = child(MAKE_WITH_ENGINE_1, made)
    if "lib_version" in done.stderr and done.returncode:
        pytest.skip("this py-lmdb has one engine")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _data_version(made) == 3  # LMDB 1.0's format
    with PoolStore(made) as store:  # not "an LMDB file of something else"
        assert [q.tokens.tolist() for q in store.sequences()] == [list(range(7))]
    fresh = tmp_path / "fresh.lmdb"
    env = dict(os.environ, LMDB_DEFAULT_LIB_VERSION="1")
    done = child("import sys\nfrom suffixspec.fingerprint import BYTES\n"
                 "from suffixspec.pools.store import PoolStore\n"
                 "PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16).close()", fresh, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _data_version(fresh) == 1  # LMDB 0.9's format, whatever the default


# ------------------------------------------------------ crafted stored data
@pytest.mark.parametrize("shape, values", [
    ([-1, -4], 4),               # negative dimensions whose product is the size
    ([1 << 32, 1 << 32], 0),     # a product that wraps to 0 in 64 bits
    ([-2, 2], 4), ("rows", 4)])
def test_a_calibration_record_with_a_bogus_shape_is_learned_afresh(tmp_path, caplog, shape,
                                                                   values):
    import zlib

    import msgpack

    path = tmp_path / "pool.lmdb"
    with PoolStore(path, tokenizer=BYTES, max_depth=DEPTH) as store:
        data = np.zeros(values, np.float64)
        store.write(lambda txn: txn.put(b"table:calibration", msgpack.packb(
            {"shape": shape, "crc": zlib.crc32(data), "saved": 0.0, "data": data.tobytes()}),
            db=store.db("meta")))
    pool = pool_at(path)
    prop = proposer(pool)  # one log line, not an exception
    assert not prop.stats.table.any()
    assert any("calibration" in r.getMessage() for r in caplog.records)
    pool.close()


def test_the_device_feeder_drops_a_request_whose_tokens_are_not_ids_not_the_batch():
    """A row whose tokens are out of range (a negative id, or one past the
    largest) loses that request only; the others of the step are learned."""
    from types import SimpleNamespace

    from suffixspec.device.feeder import S_SAMPLED, S_SLOT, S_TOTAL, WindowFeeder, snapshot_columns
    from suffixspec.device.layout import WindowSpec
    from suffixspec.device.payload import Packer, PayloadSpec, views  # noqa: F401

    k = 4
    spec = PayloadSpec(WindowSpec(k=k), rows=4)
    packer = Packer(spec, trash_slot=4, trash_key=100, corpus_tokens=0, corpus_buckets=1)
    buffers = [np.zeros(spec.size, np.int32) for _ in range(2)]
    feeder = WindowFeeder(spec, k, 100, buffers, packer, [0.0] * 9, threaded=False)
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=k)
    feeder.ready(prop)
    for slot, req in enumerate(("good", "bad")):
        feeder.add(req, slot, 1, np.array([1, 2, 3], np.int32), 3)
    col = snapshot_columns(k)
    rows = np.zeros((2, col["pair_tokens"].stop), np.int32)
    rows[:, S_SLOT] = [0, 1]
    rows[:, S_TOTAL] = 4
    rows[:, S_SAMPLED] = 1
    rows[:, col["tail"]] = [[0, 1, 2, 3, 7], [0, 1, 2, 3, -5]]
    feeder.snapshot(1, rows, ["good", "bad"], None)
    feeder.take(2, 0.0)
    assert "good" in prop.active_requests and "bad" not in prop.active_requests
    assert feeder.stats.lost_requests == 1
    assert SimpleNamespace(**feeder.lag())
    feeder.close()


def test_stats_and_export_of_a_pool_with_damaged_records_say_so_in_one_line(tmp_path):
    import msgpack
    from click.testing import CliRunner

    from suffixspec.cli import main
    from suffixspec.pools.store import _key

    path = tmp_path / "pool.lmdb"
    with PoolStore(path, tokenizer=BYTES, max_depth=DEPTH) as store:
        store.add(np.arange(5, dtype=np.int32), "a")
        for i, rec in enumerate([{"ns": 5, "n": 1, "a": 0, "crc": 0, "tok": b"xxxx"},
                                 [1, 2, 3], {"ns": "a"}]):
            store.write(lambda txn: txn.put(_key(10 + i), msgpack.packb(rec),
                                            db=store.db("seqs")))
    runner = CliRunner()
    done = runner.invoke(main, ["stats", str(path), "--json"])
    assert done.exit_code == 0, done.output
    stats = json.loads(done.output)
    assert (stats["sequences"], stats["damaged_sequences"]) == (1, 3)
    done = runner.invoke(main, ["export", str(path)])
    assert done.exit_code == 1  # one clear line, no traceback
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert [x.get("token_ids") for x in lines[1:]] == [[0, 1, 2, 3, 4]]
    assert "3 damaged sequences left out (ids 10, 11, 12)" in done.output


FORGOTTEN_MID_COMPACTION = r"""
import sys, time
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], refresh_interval=0.05)
print("serving", flush=True)
while True:
    pool.refresh()
    time.sleep(0.05)
"""


def test_snapshot_finishes_a_cut_short_forget_while_a_server_has_the_pool_open(tmp_path):
    from click.testing import CliRunner

    from suffixspec.cli import main

    path = tmp_path / "pool.lmdb"
    with PoolStore(path, tokenizer=BYTES, max_depth=DEPTH) as store:
        store.add(np.array(SECRET, np.int32), "secret")
        store.delete([1], forget=True)  # as a forget killed before its compaction leaves it
        assert store.compaction_pending()
    server = subprocess.Popen([sys.executable, "-c", FORGOTTEN_MID_COMPACTION, str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "serving"
        done = CliRunner().invoke(main, ["snapshot", str(path), "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["compacted"] is True
    finally:
        server.kill()
    with PoolStore(path) as store:
        assert not store.compaction_pending()
    assert SECRET[0].to_bytes(4, "little") not in path.read_bytes()


@pytest.mark.slow
def test_readers_killed_inside_a_read_leave_the_file_no_bigger_than_twice_its_data(tmp_path):
    """20 processes killed with SIGKILL inside a read transaction, beside a
    process that keeps the pool open and rewrites a 1 MB table: their reader
    slots are cleared, freed pages are reused, the file stays within twice
    what it holds (the size of its compacted copy)."""
    import signal

    path = tmp_path / "pool.lmdb"
    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    store.watch()  # clears dead readers' slots from its thread
    rng = np.random.default_rng(0)
    store.add_many([(rng.integers(0, 256, 4096).astype(np.int32), "a", "", "")
                    for _ in range(512)])  # 8 MB of outputs
    table = np.zeros((1 << 16, 2), np.float64)  # and a 1 MB table, rewritten
    store.save_table("calibration", table)
    for round_ in range(20):
        reader = subprocess.Popen([sys.executable, "-c", READ_AND_WAIT, str(path)],
                                  stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "reading"
        os.kill(reader.pid, signal.SIGKILL)
        reader.wait()
        for i in range(5):
            table[:, 0] = round_ * 5 + i
            store.save_table("calibration", table)
            time.sleep(0.1)
    size = path.stat().st_size
    store.env.copy(str(tmp_path / "compacted.lmdb"), compact=True)
    live = (tmp_path / "compacted.lmdb").stat().st_size  # what the live data takes in a file
    store.close()
    assert size <= 2 * live, (size, live)


@pytest.mark.parametrize("tree", [False, True])
def test_drafts_never_come_from_another_namespaces_requests_property(tree):
    """Another namespace's requests of one family finish on this proposer (the
    second's tree indexes the first's output beside its own); a request of
    this namespace whose prompt continues the second's conversation drafts
    nothing that followed only in the other namespace's outputs."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    alphabet = st.integers(0, 5)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(alphabet, min_size=1, max_size=12), st.lists(alphabet, min_size=1, max_size=12),
           st.lists(alphabet, min_size=1, max_size=12), st.lists(alphabet, max_size=6),
           st.lists(st.lists(alphabet, min_size=1, max_size=3), max_size=5),
           st.lists(st.lists(alphabet, min_size=1, max_size=12), max_size=3))
    def check(prompt, first, second, extra, steps, mine):
        prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=6, max_spec_factor=4.0,
                              min_token_prob=0.0, draft_cost=0.0, family_outputs=2, tree=tree)
        for i, out in enumerate(mine):
            prop.start_request(f"m{i}", [9], namespace="mine")
            prop.extend(f"m{i}", out)
            prop.finish_request(f"m{i}")
        for name, out in (("t1", first), ("t2", second)):
            prop.start_request(name, prompt, namespace="theirs")
            prop.extend(name, out)
            prop.finish_request(name)
        own = prompt + second + extra
        prop.start_request("r", own, namespace="mine")
        assert prop.reused_tokens == 0
        allowed = [list(t) for t in mine]
        for emitted in steps + [[]]:
            d = prop.propose(["r"])[0]
            for path in _paths(d):
                claim = path if tree else own[len(own) - d.match_len:] + path
                assert any(_contains(seq, claim) for seq in allowed + [own]), (claim, d)
            if emitted:
                prop.extend("r", emitted)
                own = own + emitted

    check()


def _paths(d) -> list[list[int]]:
    """Every root-to-leaf path of a draft (one for a path draft)."""
    tokens, parents = d.token_ids.tolist(), d.parents.tolist()
    children = {i for i in parents if i >= 0}
    out = []
    for leaf in (i for i in range(len(tokens)) if i not in children):
        path, at = [], leaf
        while at >= 0:
            path.append(tokens[at])
            at = parents[at]
        out.append(path[::-1])
    return out


def _contains(seq: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(seq[i:i + n] == part for i in range(len(seq) - n + 1))
