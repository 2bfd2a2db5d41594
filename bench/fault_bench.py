"""Fault runs against the persistent pool, with real processes and real files.

Usage (from the repository root):

    python bench/fault_bench.py --out bench/results [--quick]

* damage: byte flips and truncations of a pool file, each opened in a child
  process: crashes (a child killed by a signal), clear errors, drafts equal to
  the undamaged pool's, other drafts;
* killed forget: ``forget`` killed at a random moment, then a fresh process:
  pools that open and pass ``check()``, forgotten data drafted or on disk,
  untargeted sequences lost;
* live forget: writers and readers in other processes for a while, with
  ``forget`` and ``prune`` every few seconds: errors, lost commits, forgotten
  bytes left in the file;
* other tenant: one process commits tokens into another namespace while a
  reader drafts: the reader's ``propose()`` p50 / p99 / max latency and RSS.

Writes ``faults.json`` and ``faults.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from suffixspec.fingerprint import BYTES
from suffixspec.persistent import PersistentPool
from suffixspec.store import PoolStore

from bench_common import save_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pool_children import FORGET, PROBE, WRITER  # noqa: E402  the scripts the tests run

DOOMED = [901_001, 902_002, 903_003, 904_004]

READER = r"""
import json, resource, sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.persistent import PersistentPool
path, namespace, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, refresh_interval=0.05)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace=namespace)
end = time.monotonic() + seconds
lat, errors, n = [], 0, 0
while time.monotonic() < end:
    try:
        prop.start_request(n, [1, 2, 3])
        for t in (5, 6, 7):
            t0 = time.perf_counter()
            prop.propose([n])
            lat.append(time.perf_counter() - t0)
            prop.extend(n, [t])
        prop.abort_request(n)
    except Exception as e:
        errors += 1
        print(repr(e), file=sys.stderr)
    n += 1
pool.close()
lat = np.asarray(lat) * 1e3
print(json.dumps({"proposes": len(lat), "errors": errors,
                  "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
                  "max_ms": float(lat.max()),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

COMMIT_MANY = r"""
import sys
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES)
total, namespace = int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
done = 0
while done < total:
    batch = [(rng.integers(0, 250, 500).astype(np.int32), namespace, "", "") for _ in range(200)]
    store.add_many(batch)
    done += 200 * 500
store.close()
"""


def _run(script, *args, **kw):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def damage(tmp: Path, cases: int) -> dict:
    path = tmp / "pool.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
    rng = np.random.default_rng(0)
    for i in range(60):
        pool.add(np.asarray([1, 2, 3, 4, 5, 6] if i % 3 else [40, 41, 42, 43], np.int32), "a")
        pool.add(rng.integers(0, 60, 30).astype(np.int32), "a" if i % 2 else "b")
        if i == 40:
            pool.write_snapshot()
    pool.close()
    data = path.read_bytes()
    copies = []
    for n in range(cases):
        d = bytearray(data)
        if n % 4 == 3:
            d = d[:int(rng.integers(0, len(d)))]
        else:
            at = int(rng.integers(0, len(d)))
            d[at] ^= 1 << int(rng.integers(0, 8))
        copy = tmp / f"damaged{n}.lmdb"
        copy.write_bytes(bytes(d))
        copies.append(str(copy))
    results, rest = {}, [str(path)] + copies
    crashes = 0
    while rest:
        proc = subprocess.run([sys.executable, "-c", PROBE, *rest], capture_output=True,
                              text=True, timeout=600)
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            results[rec["path"]] = rec
        done = [p for p in rest if p in results]
        if proc.returncode != 0:
            crashes += 1
            results[rest[len(done)]] = {"died": proc.returncode}
            done.append(rest[len(done)])
        rest = [p for p in rest if p not in done]
    reference = results[str(path)]["drafts"]
    out = {"cases": cases, "crashes": crashes, "errors": 0, "same_drafts": 0, "other_drafts": 0}
    for c in copies:
        r = results[c]
        if "error" in r:
            out["errors"] += 1
        elif "drafts" in r:
            out["same_drafts" if r["drafts"] == reference else "other_drafts"] += 1
    return out


def killed_forget(tmp: Path, runs: int) -> dict:
    out = {"runs": runs, "opened_and_checked": 0, "forget_not_begun": 0, "forget_complete": 0,
           "half_done": 0, "untargeted_lost": 0, "forgotten_bytes_left": 0}
    for trial in range(runs):
        path = tmp / f"forget{trial}.lmdb"
        pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
        rng = np.random.default_rng(trial)
        for _ in range(3000):  # enough that forget takes a while to kill it midway
            pool.add(rng.integers(0, 500, 40).astype(np.int32), "keep")
        for _ in range(50):
            pool.add(np.asarray(DOOMED + [8, 9], np.int32), "doomed")
        pool.write_snapshot()
        pool.close()
        proc = _run(FORGET, path)
        proc.stdout.readline()
        time.sleep(random.Random(trial).random() * 0.6)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
        pool.store.check()
        out["opened_and_checked"] += 1
        stats = pool.store.stats()
        pool.close()
        out["untargeted_lost"] += 3000 - stats["namespaces"]["keep"]["sequences"]
        doomed = stats["namespaces"].get("doomed", {}).get("sequences", 0)
        on_disk = np.asarray(DOOMED, np.int32).tobytes() in path.read_bytes()
        if doomed == 50:
            out["forget_not_begun"] += 1
        elif doomed == 0 and not on_disk:
            out["forget_complete"] += 1
        else:
            out["half_done"] += 1
            out["forgotten_bytes_left"] += int(on_disk)
    return out


def live_forget(tmp: Path, seconds: float) -> dict:
    path = tmp / "live.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=16).close()
    writers = [_run(WRITER, path, "keep", tag, seconds, "keep") for tag in (1, 2)]
    readers = [_run(READER, path, "keep", seconds) for _ in range(3)]
    cli = "import sys; from suffixspec.cli import main; sys.exit(main())"
    end = time.monotonic() + seconds - 3
    forgets = prunes = failures = 0
    compacted = 0
    while time.monotonic() < end:
        doomed = _run(WRITER, path, "doomed", 9, 1.0, "doomed")
        doomed.communicate()
        r = subprocess.run([sys.executable, "-c", cli, "prune", str(path), "--namespace",
                            "doomed", "--max-tokens", "100", "--json"], capture_output=True,
                           text=True)
        prunes += 1
        failures += r.returncode != 0
        r = subprocess.run([sys.executable, "-c", cli, "forget", str(path), "--namespace",
                            "doomed", "--json"], capture_output=True, text=True)
        forgets += 1
        failures += r.returncode != 0
        compacted += r.returncode == 0 and json.loads(r.stdout)["compacted"]
    outs = [p.communicate() for p in writers + readers]
    committed = [line.split() for out, _ in outs[:2] for line in out.splitlines()]
    reader_stats = [json.loads(out) for out, _ in outs[2:]]
    store = PoolStore(path, tokenizer=BYTES)
    stored = {s.request_id for s in store.sequences() if s.namespace == "keep"}
    store.close()
    return {"seconds": seconds, "writers": 2, "readers": 3, "forgets": forgets,
            "forgets_compacted": compacted, "prunes": prunes, "command_failures": failures,
            "process_failures": sum(p.returncode != 0 for p in writers + readers),
            "reader_errors": sum(r["errors"] for r in reader_stats),
            "committed": len(committed),
            "lost": sum(f"{t}-{i}" not in stored for t, i in committed),
            "forgotten_bytes_left": int(np.asarray(DOOMED, np.int32).tobytes()
                                        in path.read_bytes())}


def other_tenant(tmp: Path, tokens: int, seconds: float) -> dict:
    path = tmp / "tenant.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
    for i in range(200):
        pool.add(np.arange(i % 50, i % 50 + 40, dtype=np.int32) % 250, "mine")
    pool.write_snapshot()
    pool.close()
    reader = _run(READER, path, "mine", seconds)
    time.sleep(2.0)
    t0 = time.monotonic()
    writer = _run(COMMIT_MANY, path, tokens, "other")
    writer.communicate()
    write_s = time.monotonic() - t0
    out, err = reader.communicate()
    return {"other_tokens": tokens, "write_s": round(write_s, 1), **json.loads(out)}


def markdown(r: dict) -> str:
    d, k, live, t = r["damage"], r["killed_forget"], r["live_forget"], r["other_tenant"]
    return "\n".join([
        "| run | result |", "|---|---|",
        f"| {d['cases']} byte flips and truncations | crashes {d['crashes']}, clear errors "
        f"{d['errors']}, same drafts {d['same_drafts']}, other drafts {d['other_drafts']} |",
        f"| forget killed at random, {k['runs']} runs | opened and checked "
        f"{k['opened_and_checked']}, not begun {k['forget_not_begun']}, complete "
        f"{k['forget_complete']}, half done {k['half_done']}, untargeted sequences lost "
        f"{k['untargeted_lost']}, forgotten bytes left {k['forgotten_bytes_left']} |",
        f"| {live['seconds']:.0f} s: 2 writers, 3 readers, forget + prune every few seconds | "
        f"{live['forgets']} forgets ({live['forgets_compacted']} compacted), {live['prunes']} "
        f"prunes, command failures {live['command_failures']}, process failures "
        f"{live['process_failures']}, reader errors {live['reader_errors']}, commits "
        f"{live['committed']}, lost {live['lost']}, forgotten bytes left "
        f"{live['forgotten_bytes_left']} |",
        f"| reader while another process commits {t['other_tokens']:,} tokens to another "
        f"namespace ({t['write_s']} s) | propose p50 {t['p50_ms']:.3f} ms, p99 "
        f"{t['p99_ms']:.3f} ms, max {t['max_ms']:.1f} ms, RSS {t['rss_mb']:.0f} MB, "
        f"errors {t['errors']} |"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter runs")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="suffixspec-faults-"))
    try:
        q = args.quick
        results = {"damage": damage(tmp, 40 if q else 100),
                   "killed_forget": killed_forget(tmp, 8 if q else 30),
                   "live_forget": live_forget(tmp, 15.0 if q else 60.0),
                   "other_tenant": other_tenant(tmp, 1_000_000 if q else 5_000_000,
                                                20.0 if q else 60.0)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save_results(args.out, "faults", results, markdown(results))


if __name__ == "__main__":
    main()
