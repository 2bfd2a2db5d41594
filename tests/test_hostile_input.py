"""Input from outside never crashes, hangs or stalls a process: crafted segments,
shards added twice at once, pools opened and closed a thousand times, a damaged
kernel cache, a log line of any length."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from suffixspec.testing import segment_fuzz as fuzz_segments
from suffixspec.testing.crafted import DESCRIPTION_EDITS, DRAFT, MUTATIONS, craft, edit_description, make_pool
from suffixspec.cli import main
from suffixspec.fingerprint import BYTES
from suffixspec.pools.store import PoolStore



def _draft(path: Path) -> tuple[int, dict | None, str]:
    """Draft from ``path`` in a child process: (exit status, its result, what it logged)."""
    proc = subprocess.run([sys.executable, "-c", DRAFT, str(path)],
                          capture_output=True, text=True, timeout=120)
    out = json.loads(proc.stdout) if proc.returncode == 0 else None
    return proc.returncode, out, proc.stderr


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    path = tmp_path_factory.mktemp("intact") / "pool.lmdb"
    make_pool(path)
    code, out, err = _draft(path)
    assert code == 0 and out["segments"] == 1, err
    assert all(len(tokens) == 8 for tokens, _ in out["drafts"])
    return path, out["drafts"]


def _copy(pool: Path, to: Path) -> Path:
    shutil.copy(pool, to / pool.name)
    shutil.copytree(pool.with_name(pool.name + ".snapshots"), to / (pool.name + ".snapshots"))
    return to / pool.name


@pytest.mark.parametrize("name", ["root out of range", "next sibling out of range",
                                  "child table with no empty slot", "sibling list in a loop",
                                  "token storage cut short", "another layout version"])
def test_a_crafted_segment_in_place_is_never_mapped_and_nothing_is_lost(intact, tmp_path, name):
    path = _copy(intact[0], tmp_path)
    craft(path, MUTATIONS[name])
    code, out, err = _draft(path)
    assert code == 0, f"{name}: child ended with {code}: {err[-2000:]}"
    assert out["segments"] == 0 and "not used" in err  # said once, the segment left out
    assert out["drafts"] == intact[1]  # drafted from its stored sequences instead


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_every_crafted_segment_in_place_is_never_mapped(intact, tmp_path, name):
    test_a_crafted_segment_in_place_is_never_mapped_and_nothing_is_lost(intact, tmp_path, name)


def _stamp(path: Path, monkeypatch) -> None:
    """Open the pool's segment once, as a server would, so its files are stamped checked."""
    from suffixspec.pools import files, view

    monkeypatch.setattr(files, "RACY_S", -1.0)  # no wait for file times to settle
    with PoolStore(path) as store:
        seg = store.snapshot().segments[0]
        _, stamps = view.open_segment(store.snapshot_folders / seg.folder, seg, 16, None, None)
        store.record_stamps(seg.folder, stamps)
        assert store.stamps(seg.folder)["files"].keys() == seg.arrays.keys()


@pytest.mark.parametrize("name", sorted(DESCRIPTION_EDITS))
def test_a_description_edited_after_its_stamp_is_checked_again(intact, tmp_path, monkeypatch,
                                                                 name):
    path = _copy(intact[0], tmp_path)
    _stamp(path, monkeypatch)
    edit_description(path, DESCRIPTION_EDITS[name])
    code, out, err = _draft(path)
    assert code == 0, f"{name}: child ended with {code}: {err[-2000:]}"
    assert out["segments"] == 0 and "not used" in err
    assert out["drafts"] == intact[1]


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", ["parent out of range", "child table entry out of range",
                                  "description without its namespaces"])
def test_add_segment_refuses_a_crafted_shard_in_one_line_adding_nothing(tmp_path, name):
    shard, host = tmp_path / "shard.lmdb", tmp_path / "host.lmdb"
    make_pool(shard, n=20, seed=1)
    make_pool(host, n=10, seed=2)
    craft(shard, MUTATIONS[name])
    r = _cli("add-segment", host, shard)
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    with PoolStore(host, readonly=True) as store:
        assert store.stats()["sequences"] == 10


def test_add_segment_refuses_token_ids_past_the_pools_vocabulary(tmp_path):
    shard, host = tmp_path / "shard.lmdb", tmp_path / "host.lmdb"
    make_pool(host, n=10, seed=2)
    store = PoolStore(shard, tokenizer=BYTES, max_depth=16)
    store.add(np.array([1, 2, 300, 4], np.int32), "a")  # BYTES has 256 ids
    from suffixspec.pools.segments import write_snapshot
    write_snapshot(store)
    store.close()
    r = _cli("add-segment", host, shard)
    assert r.exit_code == 1 and "past the vocabulary" in r.output
    with PoolStore(host, readonly=True) as store:
        assert store.stats()["sequences"] == 10


ADD = "import sys; from suffixspec.cli import main; sys.exit(main())"


def test_two_add_segment_runs_of_one_shard_at_once_store_it_once(tmp_path):
    shard, host = tmp_path / "shard.lmdb", tmp_path / "host.lmdb"
    make_pool(shard, n=30, seed=1)
    make_pool(host, n=10, seed=2)
    procs = [subprocess.Popen([sys.executable, "-c", ADD, "add-segment", str(host), str(shard),
                               "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    added = sorted(json.loads(out)["sequences"] for out, _ in outs)
    assert added == [0, 30]  # one stored it, the other was told it was there
    with PoolStore(host, readonly=True) as store:
        assert store.stats()["sequences"] == 40
    # And after its segment merged with others, adding it again is refused too.
    r = _cli("add-segment", host, shard)
    assert "skipped" in r.output
    with PoolStore(host, readonly=True) as store:
        assert store.stats()["sequences"] == 40


def test_a_thousand_opens_and_closes_leak_no_file_descriptor(tmp_path):
    from suffixspec.pools.persistent import PersistentPool

    path = tmp_path / "pool.lmdb"
    make_pool(path, n=5)

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    PersistentPool(path).close()
    before = fds()
    for _ in range(1000):
        PoolStore(path).close()
    for _ in range(100):
        PersistentPool(path).close()
    assert fds() <= before


DAMAGE = r"""
import sys
from pathlib import Path
cache = Path(sys.argv[1])
victim = sorted(cache.rglob("propose.propose_batch-*.nbc"))[0]
data = bytearray(victim.read_bytes())
data[len(data) // 2] ^= 0xFF
victim.write_bytes(bytes(data))
"""

USE_CACHE = r"""
from suffixspec.kernels import compile_in_parallel, from_cache
from suffixspec import SuffixProposer
from suffixspec.native.warmup import SERVING
ready = from_cache(SERVING)
compile_in_parallel(SERVING)  # as a first run compiles them (an engine: in the background)
p = SuffixProposer(max_depth=8)
p.start_request("r", [1, 2, 3, 1, 2])
print(ready, p.propose(["r"])[0].token_ids.tolist())
"""


@pytest.mark.slow
def test_a_damaged_kernel_cache_is_compiled_again(tmp_path, first_run_kernel_cache):
    # Machine code of the drafting kernel, damaged in a copied cache; damaged
    # indexes and other kernels: test_native_cache.py.
    shutil.copytree(first_run_kernel_cache.path, tmp_path / "cache")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    loads = subprocess.run([sys.executable, "-c", "from suffixspec.kernels import from_cache; "
                            "from suffixspec.native.warmup import SERVING; "
                            "print(from_cache(SERVING))"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert loads.stdout.split() == ["True"], loads.stderr  # undamaged, the copy loads whole
    subprocess.run([sys.executable, "-c", DAMAGE, str(tmp_path / "cache")],
                   check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-c", USE_CACHE], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    # Not loaded from the damaged cache, compiled again, then drafted.
    assert proc.stdout.split(None, 1) == ["False", "[3, 1, 2]\n"]


LONG_LINE = r"""
import json, sys
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import ingest
from suffixspec.pools.store import PoolStore
from suffixspec.replay.traces import hf_encoder
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
store = PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16)
before = peak_mb()
encode = lambda texts: [list(t.encode()) for t in texts]
report = ingest(store, [sys.argv[2]], encode, fmt="trace")
print(json.dumps({"report": report.summary(), "problems": report.problems,
                  "grew_mb": peak_mb() - before}))
"""


def test_a_line_past_the_limit_is_refused_like_any_bad_line(tmp_path):
    log = tmp_path / "log.jsonl"
    with open(log, "w") as f:
        f.write(json.dumps({"prompt": "p", "output": "first"}) + "\n")
        f.write(json.dumps({"prompt": "p", "output": "x" * (64 << 20)}) + "\n")
        f.write(json.dumps({"prompt": "p", "output": "last"}) + "\n")
    proc = subprocess.run([sys.executable, "-c", LONG_LINE, str(tmp_path / "pool.lmdb"),
                           str(log)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    report = out["report"]
    assert report["sequences"] == 2 and report["skipped"] == 1
    assert any("longer than" in p for p in out["problems"])
    assert out["grew_mb"] < 200  # the 64 MB line was read past, never held


@pytest.mark.parametrize("cases", [pytest.param(60), pytest.param(10_000, marks=pytest.mark.slow)])
def test_the_segment_fuzzer_finds_no_signal_hang_or_out_of_range_read(tmp_path_factory, cases):
    """``fuzz_segments``: whatever the checks let through, every drafting kernel,
    compiled with bounds checks, reads in range and ends."""
    folder = tmp_path_factory.mktemp("fuzz")
    fuzz_segments.make_pool(folder / "pool.lmdb")
    r = fuzz_segments.run(folder / "pool.lmdb", cases, seed=7)
    c = r["counts"]
    assert sum(c.values()) == cases
    bad = {k: c[k] for k in ("check_error", "out_of_range", "draft_error", "signals", "hangs")}
    assert not any(bad.values()), (bad, r["failures"][:5])
    assert c["drafted"] >= cases // 50  # the checks leave plausible segments to draft from


def test_a_pool_removed_under_a_server_costs_no_error_in_serving_calls(tmp_path):
    from suffixspec import SuffixProposer

    path = tmp_path / "pool.lmdb"
    make_pool(path, n=20)
    prop = SuffixProposer(max_depth=16, max_spec_tokens=8, draft_cost=0.0, pool=path,
                          tokenizer=BYTES, namespace="a")
    prop.cross.refresh_interval = 0.0
    before = prop.cross.tokens
    shutil.rmtree(path.with_name(path.name + ".snapshots"))
    path.unlink()
    for i in range(20):
        prop.start_request(i, [7, 8, 9])
        assert prop.propose([i])[0].token_ids.tolist()[:3] == [1, 2, 3]  # from memory
        prop.extend(i, [1, 2, 3, 4])
        prop.finish_request(i)
    assert prop.cross.tokens >= before
    prop.close()


RECREATE = """
import sys
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16)
store.add_many([(np.array([7, 8, 9, 40, 41, 42, 43, 44] * 3, np.int32), "a", "", f"n{i}")
                for i in range(5)])
write_snapshot(store)
store.close()
"""


def test_a_pool_made_anew_where_a_server_lost_its_own_is_picked_up(tmp_path):
    """Removed under a server, then made again at the same path by another
    process: the server drafts from the new pool."""
    from suffixspec import SuffixProposer

    path = tmp_path / "pool.lmdb"
    make_pool(path, n=20)
    prop = SuffixProposer(max_depth=16, max_spec_tokens=8, draft_cost=0.0, pool=path,
                          tokenizer=BYTES, namespace="a")
    prop.cross.refresh_interval = 0.0
    shutil.rmtree(path.with_name(path.name + ".snapshots"))
    path.unlink()
    subprocess.run([sys.executable, "-c", RECREATE, str(path)], check=True, timeout=120)
    drafted, i, end = [], 0, time.monotonic() + 30
    while drafted != [40, 41, 42] and time.monotonic() < end:  # the loader swaps it in
        prop.start_request(i, [7, 8, 9])
        drafted = prop.propose([i])[0].token_ids.tolist()[:3]
        prop.abort_request(i)
        i += 1
        time.sleep(0.01)
    assert drafted == [40, 41, 42]
    prop.close()


FULL_DISK_ADD = r"""
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))  # writes fail as on a full disk
from suffixspec.cli import main
sys.exit(main())
"""


def test_add_segment_on_a_full_disk_says_so_in_one_line(tmp_path):
    shard, host = tmp_path / "shard.lmdb", tmp_path / "host.lmdb"
    make_pool(shard, n=40, seed=1)
    make_pool(host, n=10, seed=2)
    proc = subprocess.run([sys.executable, "-c", FULL_DISK_ADD, "add-segment", str(host),
                           str(shard)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "disk full" in proc.stderr and proc.stderr.strip().count("\n") == 0
    with PoolStore(host, readonly=True) as store:
        assert store.stats()["sequences"] == 10
