"""The pool under real operations: what an operator's and a tenant's moves cost, measured.

Usage (from the repository root):

    python bench/operations_bench.py [--out bench/results] [--only SECTION ...]

Each section runs real processes on real pool files (in a temporary folder)
and prints its counts; ``tests/test_pool_operations.py`` holds every case to
its promise, this measures them:

* ``two_names``: two writer processes commit 300 sequences each, one through
  a symbolic link to the pool, with a compaction asked meanwhile: sequences
  acknowledged (their commit returned) against those stored;
* ``open_beside_compaction``: 50 opens of a 200k-token pool while another
  process asks to compact it at a random moment: the slowest open against
  an open with nothing beside it (a hang is counted at 20 s);
* ``stale_readers``: 20 processes killed inside a read transaction beside a
  process that keeps the pool open and rewrites a 1 MB table: the file's
  size against what it holds (the size of its compacted copy);
* ``serving_beside_maintenance``: a serving process (``propose`` and
  ``extend`` in a loop, its 22 MB calibration table kept every 5 s) while
  another process forgets a namespace every second (a compaction each) and
  a third commits a 2M-token output, then 1M tokens, and deletes them: the
  slowest serving call, what it was, and the 99th percentile;
* ``delete_elsewhere``: a serving process holds 1M tokens of commits in
  memory; another deletes 900k of them: the slowest ``propose`` after;
* ``concurrent_ingests``: two ``ingest`` runs of one 400-record export at
  once: records stored against 400.

Runs on any suffixspec on ``PYTHONPATH`` with the same commands (to compare
two commits, run it once with each).  Writes ``operations.json`` and
``operations.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import export
from suffixspec.pools.store import PoolStore
from suffixspec.testing.pool_children import READ_AND_WAIT

from bench_common import save_results

SECTIONS = ("two_names", "open_beside_compaction", "stale_readers",
            "serving_beside_maintenance", "delete_elsewhere", "concurrent_ingests")
DEPTH = 16


def _child(code: str, *args, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _spawn(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _new_pool(path: Path, sequences: int = 0, length: int = 1000) -> None:
    rng = np.random.default_rng(0)
    with PoolStore(path, tokenizer=BYTES, max_depth=DEPTH) as store:
        for at in range(0, sequences, 50):
            store.add_many([(rng.integers(0, 250, length).astype(np.int32), "default", "", "")
                            for _ in range(min(50, sequences - at))])


WRITER = r"""
import sys, numpy as np
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], refresh_interval=0.05)
tag = int(sys.argv[2])
for i in range(int(sys.argv[3])):
    pool.add(np.array([tag, i % 250, 7, 8], np.int32), "w")
    pool.flush()
    print(f"{tag} {i}", flush=True)
pool.close()
"""
COMPACT = r"""
import sys, time
from suffixspec.pools.store import PoolStore
time.sleep(float(sys.argv[2]))
store = PoolStore(sys.argv[1])
print("compacted" if store.compact(timeout=float(sys.argv[3])) else "refused", flush=True)
store.close()
"""


def two_names(tmp: Path) -> dict:
    real, link = tmp / "real.lmdb", tmp / "link.lmdb"
    _new_pool(real)
    link.symlink_to(real)
    writers = [_spawn(WRITER, name, tag, 300) for tag, name in ((1, real), (2, link))]
    compactor = _spawn(COMPACT, real, 0.5, 5.0)
    acknowledged = set()
    for w in writers:
        out, _ = w.communicate(timeout=600)
        acknowledged |= {tuple(map(int, line.split())) for line in out.split("\n") if line}
    compactor.communicate(timeout=600)
    try:
        with PoolStore(real) as store:
            stored = [tuple(q.tokens[:2].tolist()) for q in store.sequences()]
        error = None
    except Exception as e:  # noqa: BLE001 - what the file says, reported
        stored, error = [], f"{type(e).__name__}: {e}"
    found = sum(1 for tag, i in acknowledged if (tag, i % 250) in set(stored))
    return {"acknowledged": len(acknowledged), "stored": len(stored),
            "acknowledged_stored": found, "error": error}


OPEN = r"""
import sys, time
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
store.env
print("open", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
pool = PersistentPool(store)
print(f"{time.perf_counter() - t0:.3f}", flush=True)
pool.close()
store.close()
"""


def open_beside_compaction(tmp: Path, rounds: int = 50) -> dict:
    path = tmp / "pool.lmdb"
    _new_pool(path, sequences=200)
    base = []
    for _ in range(3):
        p = _spawn(OPEN, path)
        p.stdout.readline()
        out, _ = p.communicate("go\n", timeout=120)
        base.append(float(out.split()[-1]))
    baseline = min(base)
    rng = np.random.default_rng(1)
    times, hung = [], 0
    for _ in range(rounds):
        p = subprocess.Popen([sys.executable, "-c", OPEN, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.stdout.readline()  # it holds the file now
        asker = _spawn(COMPACT, path, 0.0, 30.0)
        time.sleep(float(rng.uniform(0, 0.5)))
        p.stdin.write("go\n")
        p.stdin.flush()
        try:
            out, _ = p.communicate(timeout=20)
            times.append(float(out.split()[-1]))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            hung += 1
            times.append(20.0)
        asker.kill()
        asker.communicate()
    return {"rounds": rounds, "open_alone_s": round(baseline, 3),
            "open_worst_s": round(max(times), 3), "over_alone_plus_1s": sum(
                t > baseline + 1.0 for t in times), "hung": hung}


def stale_readers(tmp: Path, kills: int = 20) -> dict:
    path = tmp / "pool.lmdb"
    _new_pool(path, sequences=2048, length=1024)  # 8 MB of outputs
    store = PoolStore(path)
    store.watch()
    table = np.zeros((1 << 16, 2), np.float64)
    for round_ in range(kills):
        reader = _spawn(READ_AND_WAIT, path)
        reader.stdout.readline()
        os.kill(reader.pid, signal.SIGKILL)
        reader.communicate()
        for i in range(5):
            table[:, 0] = round_ * 5 + i
            store.save_table("calibration", table)
            time.sleep(0.1)
    size = path.stat().st_size
    copy = tmp / "compacted.lmdb"
    store.env.copy(str(copy), compact=True)  # what the live data takes in a file
    live = copy.stat().st_size
    store.close()
    return {"killed_readers": kills, "live_mb": round(live / 2**20, 1),
            "file_mb": round(size / 2**20, 1), "file_over_live": round(size / live, 2)}


SERVE = r"""
import json, sys, time
import numpy as np
from suffixspec import SuffixProposer, proposer as proposer_module
from suffixspec.pools.persistent import PersistentPool
proposer_module.CALIBRATION_SAVE_SECONDS = 5.0  # its 22 MB table kept a few times in the run
pool = PersistentPool(sys.argv[1], refresh_interval=0.2)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, draft_cost=0.0)
stop = time.monotonic() + float(sys.argv[2])
rng = np.random.default_rng(0)
calls, worst, n = [], (0.0, ""), 0
while time.monotonic() < stop:
    r = f"r{n}"; n += 1
    prop.start_request(r, rng.integers(0, 250, 64).tolist())
    for _ in range(20):
        t0 = time.perf_counter(); prop.propose([r]); t = time.perf_counter() - t0
        calls.append(t); worst = max(worst, (t, "propose"))
        t0 = time.perf_counter(); prop.extend(r, rng.integers(0, 250, 2).tolist())
        t = time.perf_counter() - t0; calls.append(t); worst = max(worst, (t, "extend"))
    t0 = time.perf_counter(); prop.finish_request(r); t = time.perf_counter() - t0
    calls.append(t); worst = max(worst, (t, "finish_request"))
print(json.dumps({"calls": len(calls), "worst_ms": round(1e3 * worst[0], 1), "worst": worst[1],
                  "p99_ms": round(1e3 * float(np.percentile(calls, 99)), 2),
                  "over_50ms": sum(t > 0.05 for t in calls)}), flush=True)
pool.close()
"""
FORGET_EVERY = r"""
import sys, time
import numpy as np
from suffixspec.pools.persistent import PersistentPool
stop = time.monotonic() + float(sys.argv[2])
done = 0
while time.monotonic() < stop:
    pool = PersistentPool(sys.argv[1])
    pool.add(np.arange(5, dtype=np.int32), "gone")
    pool.forget(namespace="gone", timeout=2.0)
    pool.close()
    done += 1
    time.sleep(1.0)
print(done, flush=True)
"""
BIG_COMMIT_THEN_DELETE = r"""
import sys, time
import numpy as np
from suffixspec.pools.store import PoolStore
time.sleep(3.0)
store = PoolStore(sys.argv[1])
first = store.last_id() + 1
rng = np.random.default_rng(2)
store.add(rng.integers(0, 250, 2_000_000).astype(np.int32), "default")  # one 2M-token output
store.add_many([(rng.integers(0, 250, 1000).astype(np.int32), "default", "", "")
                for _ in range(1000)])  # then 1M tokens of outputs
time.sleep(3.0)
print(store.delete(range(first + 1, store.last_id() + 1)), flush=True)  # deleted again
store.close()
"""


def serving_beside_maintenance(tmp: Path, seconds: float = 20.0) -> dict:
    path = tmp / "pool.lmdb"
    _new_pool(path, sequences=200)
    server = _spawn(SERVE, path, seconds)
    time.sleep(2.0)
    forgetter = _spawn(FORGET_EVERY, path, seconds - 4)
    writer = _spawn(BIG_COMMIT_THEN_DELETE, path)
    out, err = server.communicate(timeout=seconds + 600)
    forgets, _ = forgetter.communicate(timeout=600)
    writer.communicate(timeout=600)
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        got = {"error": err[-400:]}
    got["forgets"] = int(forgets.split()[-1]) if forgets.strip() else 0
    return got


HOLD_AND_DRAFT = r"""
import json, sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], refresh_interval=0.0)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, draft_cost=0.0)
rng = np.random.default_rng(0)
for i in range(1000):
    pool.add(rng.integers(0, 250, 1000).astype(np.int32), "default")
pool.flush()
prop.start_request("r", [1, 2, 3])
prop.propose(["r"])
print(pool.store.last_id(), flush=True)
sys.stdin.readline()  # another process deletes now
worst, back = 0.0, None
t_deleted = time.perf_counter()
for _ in range(300):
    t0 = time.perf_counter(); prop.propose(["r"]); worst = max(worst, time.perf_counter() - t0)
    if back is None and pool.tokens >= 90000:  # what was kept, drafted from again
        back = time.perf_counter() - t_deleted
    time.sleep(0.01)
print(json.dumps({"worst_propose_ms": round(1e3 * worst, 1), "tokens_after": pool.tokens,
                  "kept_drafted_again_after_s": None if back is None else round(back, 2)}),
      flush=True)
pool.close()
"""
DELETE = r"""
import sys
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
print(store.delete(range(1, int(sys.argv[2]) + 1)), flush=True)
store.close()
"""


def delete_elsewhere(tmp: Path) -> dict:
    path = tmp / "pool.lmdb"
    _new_pool(path)
    server = subprocess.Popen([sys.executable, "-c", HOLD_AND_DRAFT, str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    last = int(server.stdout.readline())
    deleted = _child(DELETE, path, 900).stdout.strip()
    out, err = server.communicate("go\n", timeout=600)
    try:
        got = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        got = {"error": err[-400:]}
    got["deleted_tokens"] = int(deleted or 0) * 1000
    got["held_tokens"] = last * 1000
    return got


INGEST = r"""
import sys
from suffixspec.offline.ingest import ingest
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
r = ingest(store, [sys.argv[2]], None, batch_tokens=64)
print(r.sequences, flush=True)
store.close()
"""


def concurrent_ingests(tmp: Path) -> dict:
    src = tmp / "src.lmdb"
    with PoolStore(src, tokenizer=BYTES, max_depth=DEPTH) as store:
        store.add_many([(np.arange(i, i + 30, dtype=np.int32) % 250, "ns", "", f"r{i}")
                        for i in range(400)])
        log = tmp / "log.jsonl"
        with open(log, "w") as f:
            export(store, f)
    path = tmp / "pool.lmdb"
    _new_pool(path)
    runs = [_spawn(INGEST, path, log) for _ in range(2)]
    for r in runs:
        r.communicate(timeout=600)
    with PoolStore(path) as store:
        stored = sum(1 for _ in store.sequences())
    return {"records": 400, "stored": stored}


RUNS = {"two_names": two_names, "open_beside_compaction": open_beside_compaction,
        "stale_readers": stale_readers, "serving_beside_maintenance": serving_beside_maintenance,
        "delete_elsewhere": delete_elsewhere, "concurrent_ingests": concurrent_ingests}


def markdown(report: dict) -> str:
    lines = ["| section | figures |", "|---|---|"]
    for name, got in report["sections"].items():
        lines.append(f"| {name} | {', '.join(f'{k} {v}' for k, v in got.items())} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--only", nargs="*", choices=SECTIONS)
    ap.add_argument("--name", default="operations")
    ap.add_argument("--rounds", type=int, default=50, help="opens beside a compaction")
    args = ap.parse_args()
    import suffixspec

    report = {"suffixspec": str(Path(suffixspec.__file__).parent), "sections": {}}
    for name in args.only or SECTIONS:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            got = (open_beside_compaction(Path(tmp), args.rounds)
                   if name == "open_beside_compaction" else RUNS[name](Path(tmp)))
            got["seconds"] = round(time.perf_counter() - t0, 1)
        report["sections"][name] = got
        print(name, got, file=sys.stderr, flush=True)
    save_results(args.out, args.name, report, markdown(report))


if __name__ == "__main__":
    main()
