"""Fault runs against the persistent pool, with real processes and real files.

Usage (from the repository root):

    python bench/fault_bench.py --out bench/results [--quick]

* damage: byte flips and truncations of a pool file, each opened in a child
  process: crashes (a child killed by a signal), clear errors, drafts equal to
  the undamaged pool's, other drafts;
* killed commands: ``ingest``, ``snapshot``, ``prune`` and ``forget`` (the CLI)
  killed with SIGKILL at a random moment, then a fresh open and ``recover``
  (what the next maintenance command does): pools that open
  and pass ``check()``, untargeted sequences lost, partially stored
  sequences, half-done deletes, forgotten bytes left, drafts changed,
  leftover files;
* live forget: writers and readers in other processes for a while, with
  ``forget`` and ``prune`` every few seconds: errors, lost commits, forgotten
  bytes left in the file;
* other tenant: one process commits tokens into another namespace while a
  reader drafts: the reader's ``propose()`` p50 / p99 / max latency and RSS;
* long commit: one process commits a single 2M-token sequence while a reader
  drafts in the same namespace: the reader's worst ``propose()`` wall and CPU
  time (the sequence is indexed a piece per refresh);
* budget: a pool with a 1M-token budget that has 20M tokens committed to it,
  with and without ``snapshot_every``: peak RSS, file size, tokens indexed;
* crafted segments: each of ``suffixspec/testing/crafted.py``'s broken segments (checksums
  made to match), in place and through ``add-segment``, each in a child
  process: signals, hangs, wrong drafts, what was refused;
* stamped descriptions: a pool opened once (its files stamped checked), then
  only its segment's description edited (CRC mended): each opened in a child
  process: signals, hangs, wrong drafts, refused;
* fuzz: ``suffixspec/testing/segment_fuzz.py``'s structural mutations (every array's
  fields, freed rows, links, sizes, the description; re-signed), each case
  in a child process under a timeout with bounds-checked kernels: refused,
  drafted from, out-of-range reads, errors, signals, hangs;
* serving beside maintenance: a serving process on a 4M-token pool, its
  ``propose`` and ``finish_request`` latencies while a ``forget`` lands during
  a merge, and with ``snapshot_every``;
* rebuilds: offline builds done twice, as a user or a cluster does them
  (the CLI in child processes over shards of the sql trace): ``fleet-build``
  run again over its work folder, a shard's build run twice (a retried Ray
  task), a copy of the pool added to it, a shard the pool holds in part,
  a log ingested twice: sequences stored against those expected;
* settings and tables: out-of-range settings (the environment and a config
  file), and calibration tables kept in a pool that no proposer may draft
  with (NaN, inf, 1e308, negative, wrong shape), each in a child process:
  refused in one line or learned again with one log line, sequences the
  pool holds after, drafts made, the table kept after.

Writes ``faults.json`` and ``faults.md`` into ``--out`` (``faults_<sections>``
with ``--only``) and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import export
from suffixspec.pools import files
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import PoolStore
from suffixspec.testing import segment_fuzz as fuzz_segments
from suffixspec.testing.crafted import (DESCRIPTION_EDITS, DRAFT, HEAD, MUTATIONS, craft,
                                        edit_description, make_pool)
from suffixspec.testing.pool_children import PROBE, WRITER, damaged_pool_copies

from bench_common import save_results

DOOMED = [901_001, 902_002, 903_003, 904_004]

# Peak RSS of this process (ru_maxrss would carry the parent's over exec).
PEAK_RSS = r"""
def peak_rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

READER = PEAK_RSS + r"""
import json, sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import export
from suffixspec.pools.persistent import PersistentPool
path, namespace, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, refresh_interval=0.05)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace=namespace)
end = time.monotonic() + seconds
lat, cpu, errors, n = [], [], 0, 0
while time.monotonic() < end:
    try:
        prop.start_request(n, [1, 2, 3])
        for t in (5, 6, 7):
            t0, c0 = time.perf_counter(), time.thread_time()
            prop.propose([n])
            lat.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
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
                  "max_ms": float(lat.max()), "max_cpu_ms": 1e3 * float(np.max(cpu)),
                  "rss_mb": peak_rss_mb()}))
"""

COMMIT_MANY = r"""
import sys
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import export
from suffixspec.pools.store import PoolStore
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


def _run(script, *args, stdout=subprocess.PIPE, **kw):
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdout=stdout, stderr=subprocess.PIPE, text=True, **kw)


def damage(tmp: Path, cases: int) -> dict:
    path, copies, unsnapshotted = damaged_pool_copies(tmp, cases)
    copies = [str(c) for c in copies]
    results, rest = {}, [str(path), str(unsnapshotted)] + copies
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
    # A copy whose snapshot is not used drafts from its sequences alone.
    without = results[str(unsnapshotted)]["drafts"]
    out = {"cases": cases, "crashes": crashes, "errors": 0, "same_drafts": 0, "other_drafts": 0}
    for c in copies:
        r = results[c]
        if "error" in r:
            out["errors"] += 1
        elif "drafts" in r:
            out["same_drafts" if r["drafts"] in (reference, without) else "other_drafts"] += 1
    return out


KILLED_OPS = ("ingest", "snapshot", "prune", "forget")
KEEP, DOOMED_N, NEW_N = 3000, 50, 300  # sequences of the base pool and of the ingest file


def _killed_base(tmp: Path) -> tuple[Path, Path, dict]:
    """The pool every killed run starts from, the export file ``ingest`` reads,
    and what a fresh process drafts from the pool."""
    path = tmp / "base.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
    rng = np.random.default_rng(0)
    # Two snapshot segments of about one size, left unmerged: ``snapshot``
    # merges them, ``prune`` and ``forget`` rebuild the second, ``ingest``
    # adds a third and merges the first two.
    for i in range(KEEP):
        pool.add(rng.integers(0, 250, 40).astype(np.int32), "keep")
        if i == KEEP // 2:
            write_snapshot(pool.store, merge=False)
    for _ in range(DOOMED_N):
        pool.add(np.asarray(DOOMED + [8, 9], np.int32), "doomed")
        pool.add(rng.integers(0, 250, 40).astype(np.int32), "old")
    write_snapshot(pool.store, merge=False)
    pool.close()
    source = tmp / "source.lmdb"
    store = PoolStore(source, tokenizer=BYTES, max_depth=16)
    store.add_many([(rng.integers(0, 250, 4000).astype(np.int32), "new", "", f"new-{i}")
                    for i in range(NEW_N)])
    export_file = tmp / "new.jsonl"
    with open(export_file, "w") as f:
        export(store, f)
    store.close()
    return path, export_file, _drafts(path)


def _drafts(path: Path) -> list:
    """Each probe's one-token draft as (probability, match length, tokens).

    The segments a killed command leaves may differ (merged or not); drafts
    count all segments together, so these stay the same, though which of
    two equally frequent tokens is drafted may not.
    """
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
    prop = SuffixProposer(max_depth=16, max_spec_tokens=1, draft_cost=0.0, pool=pool,
                          namespace="keep", anchors=False)
    rng = np.random.default_rng(1)
    drafts = []
    for n in range(20):
        prop.start_request(n, rng.integers(0, 250, 2).tolist())
        d = prop.propose([n])[0]
        drafts.append((d.score, d.match_len, len(d.token_ids)))
    pool.close()
    return drafts


def _op_command(op: str, path: Path, export_file: Path) -> list[str]:
    args = {"ingest": ["ingest", path, export_file], "snapshot": ["snapshot", path, "--jobs", "2"],
            "prune": ["prune", path, "--namespace", "old", "--max-tokens", "0"],
            "forget": ["forget", path, "--namespace", "doomed"]}[op]
    return [*CLI, *map(str, args)]


#: The CLI in a child process, as a user runs it.
CLI = [sys.executable, "-c", "import sys; from suffixspec.cli import main; sys.exit(main())"]


def _copy_pool(src: Path, dst: Path) -> None:
    """A pool's file and its snapshot folders."""
    shutil.copy(src, dst)
    folders = src.with_name(src.name + ".snapshots")
    if folders.is_dir():
        shutil.copytree(folders, dst.with_name(dst.name + ".snapshots"))


def _remove_pool(folder: Path, pattern: str) -> None:
    for f in folder.glob(pattern):
        shutil.rmtree(f) if f.is_dir() else f.unlink()


def _on_disk(path: Path, data: bytes) -> bool:
    """Whether ``data`` is in the pool's file or any of its snapshot files."""
    folders = path.with_name(path.name + ".snapshots")
    files = [path] + (sorted(folders.rglob("*")) if folders.is_dir() else [])
    return any(data in f.read_bytes() for f in files if f.is_file())


def _stray_folders(path: Path) -> int:
    """Snapshot folders the pool does not name (once no build holds the lock)."""
    folders = path.with_name(path.name + ".snapshots")
    if not folders.is_dir():
        return 0
    snap = PoolStore(path, readonly=True).snapshot()
    named = {seg.folder for seg in snap.segments} if snap else set()
    return sum(1 for f in folders.iterdir() if f.is_dir() and f.name not in named)


def killed(tmp: Path, op: str, runs: int) -> dict:
    """``op`` killed (SIGKILL) at a random moment, then checked from a fresh open
    that recovers what it left (``PersistentPool.recover``, as the maintenance
    commands do; a server's open does not)."""
    tmp = tmp / op
    tmp.mkdir()
    base, export_file, reference = _killed_base(tmp)
    keep = sorted(s.tokens.tolist() for s in PoolStore(base, readonly=True).sequences()
                  if s.namespace == "keep")
    new = {s["request_id"]: s["anchors"] + s["token_ids"]
           for s in map(json.loads, export_file.read_text().splitlines()[1:])}
    for _ in range(2):  # the first run may compile kernels: time the second
        _copy_pool(base, tmp / "timing.lmdb")
        t0 = time.monotonic()
        subprocess.run(_op_command(op, tmp / "timing.lmdb", export_file), check=True,
                       capture_output=True)
        whole = time.monotonic() - t0  # how long the command takes unharmed
        _remove_pool(tmp, "timing.lmdb*")
    out = {"op": op, "runs": runs, "command_s": round(whole, 2), "killed_before_done": 0,
           "opened_and_checked": 0, "other_errors": 0, "untargeted_lost": 0,
           "partial_sequences": 0, "half_done": 0, "forgotten_left": 0,
           "drafts_changed": 0, "leftover_files": 0}
    for trial in range(runs):
        path = tmp / f"{op}{trial}.lmdb"
        _copy_pool(base, path)
        proc = subprocess.Popen(_op_command(op, path, export_file), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(random.Random(trial).random() * whole)
        proc.kill()
        out["killed_before_done"] += proc.wait() == -signal.SIGKILL
        # A snapshot build's workers outlive the killed command; they hold the
        # folders' lock until they end, and only then is a build's folder stray.
        with files.folder_lock(path.with_name(path.name + ".snapshots")):
            pass
        try:  # as the next maintenance command would: open, recover, check
            pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
            pool.recover()
            pool.store.check()
            stored = list(pool.store.sequences())
            pool.close()
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            out["other_errors"] += 1
            print(f"{op} run {trial}: {e!r}", file=sys.stderr)
            continue
        out["opened_and_checked"] += 1
        by_ns: dict[str, list] = {}
        for s in stored:
            by_ns.setdefault(s.namespace, []).append(s)
        out["untargeted_lost"] += sorted(s.tokens.tolist()
                                         for s in by_ns.get("keep", [])) != keep
        out["partial_sequences"] += sum(new.get(s.request_id) != s.tokens.tolist()
                                        for s in by_ns.get("new", []))
        target = {"prune": ("old", DOOMED_N), "forget": ("doomed", DOOMED_N)}.get(op)
        if target is not None:
            left = len(by_ns.get(target[0], []))
            out["half_done"] += left not in (0, target[1])
        on_disk = _on_disk(path, np.asarray(DOOMED, np.int32).tobytes())
        out["forgotten_left"] += op == "forget" and "doomed" not in by_ns and on_disk
        out["drafts_changed"] += _drafts(path) != reference  # "keep" is never targeted
        out["leftover_files"] += (path.with_name(path.name + ".compact").exists()
                                  + _stray_folders(path))
        _remove_pool(tmp, f"{op}{trial}.lmdb*")
    return out


def live_forget(tmp: Path, seconds: float) -> dict:
    path = tmp / "live.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=16).close()
    # Writers log to files: a pipe left unread fills up and blocks its writer
    # with the pool open.
    logs = [open(tmp / f"writer{tag}.log", "w+") for tag in (1, 2)]
    writers = [_run(WRITER, path, "keep", tag, seconds, "keep", stdout=log)
               for tag, log in zip((1, 2), logs)]
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
    for log in logs:
        log.seek(0)
    committed = [line.split() for log in logs for line in log.read().splitlines()]
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


COMMIT_ONE = r"""
import sys
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES)
tokens = np.random.default_rng(1).integers(0, 250, int(sys.argv[2])).astype(np.int32)
store.add_many([(tokens, sys.argv[3], "", "")])  # one sequence (one 8 MB ingest line)
store.close()
"""


def long_commit(tmp: Path, tokens: int, seconds: float) -> dict:
    """A reader drafting in the namespace another process commits one long
    sequence to: its ``propose()`` wall and CPU time, the worst of them."""
    path = tmp / "long.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
    for i in range(200):
        pool.add(np.arange(i % 50, i % 50 + 40, dtype=np.int32) % 250, "mine")
    pool.close()
    reader = _run(READER, path, "mine", seconds)
    time.sleep(2.0)
    t0 = time.monotonic()
    writer = _run(COMMIT_ONE, path, tokens, "mine")
    writer.communicate()
    write_s = time.monotonic() - t0
    out, err = reader.communicate()
    return {"sequence_tokens": tokens, "write_s": round(write_s, 1), **json.loads(out)}


BUDGET = PEAK_RSS + r"""
import json, os, sys, time
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
path, total, every = sys.argv[1], int(sys.argv[2]), sys.argv[3]
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, max_tokens=1_000_000,
                      snapshot_every=None if every == "none" else int(every), durable=False)
rng = np.random.default_rng(0)
t0, done = time.monotonic(), 0
while done < total:
    pool.add(rng.integers(0, 250, 2000).astype(np.int32), "mine")
    done += 2000
rss_now = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
print(json.dumps({"seconds": round(time.monotonic() - t0, 1), "indexed_tokens": pool.tokens,
                  "rss_mb": rss_now / 2**20,
                  "peak_rss_mb": peak_rss_mb(),
                  "file_mb": pool.store.disk_bytes() / 2**20}))  # file and snapshot files
pool.close()
"""


def budget(tmp: Path, total: int) -> list[dict]:
    out = []
    for every in ("none", "1000000"):
        path = tmp / f"budget{every}.lmdb"
        proc = subprocess.run([sys.executable, "-c", BUDGET, str(path), str(total), every],
                              capture_output=True, text=True, check=True)
        out.append({"snapshot_every": every, "committed": total, **json.loads(proc.stdout)})
    return out


def _child_draft(path: Path) -> tuple[str, list | None]:
    """Draft from a pool in a child process: ("ok", drafts), ("signal", None), ("hang", None)
    or ("error", None)."""
    try:
        proc = subprocess.run([sys.executable, "-c", DRAFT, str(path)],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "hang", None
    if proc.returncode < 0:
        return "signal", None
    if proc.returncode != 0:
        return "error", None
    return "ok", json.loads(proc.stdout)


def crafted(tmp: Path) -> dict:
    """Every crafted segment, in place and through ``add-segment``."""
    intact = tmp / "intact" / "pool.lmdb"
    intact.parent.mkdir()
    make_pool(intact)
    _, reference = _child_draft(intact)
    host = tmp / "host" / "pool.lmdb"
    host.parent.mkdir()
    make_pool(host, n=10, seed=2)
    out = {"cases": len(MUTATIONS), "in_place": {"signals": 0, "hangs": 0, "errors": 0,
                                                  "wrong_drafts": 0, "refused": 0},
           "add_segment": {"signals": 0, "hangs": 0, "refused_in_one_line": 0, "accepted": 0}}
    cli = "import sys; from suffixspec.cli import main; sys.exit(main())"
    for n, (name, mutation) in enumerate(MUTATIONS.items()):
        case = tmp / f"case{n}"
        case.mkdir()
        path = case / "pool.lmdb"
        _copy_pool(intact, path)
        craft(path, mutation)
        kind, got = _child_draft(path)
        key = {"signal": "signals", "hang": "hangs", "error": "errors"}.get(kind)
        if key is not None:
            out["in_place"][key] += 1
            print(f"in place, {name}: {kind}", file=sys.stderr)
        else:
            out["in_place"]["wrong_drafts"] += got["drafts"] != reference["drafts"]
            out["in_place"]["refused"] += got["segments"] == 0
        target = case / "host.lmdb"
        _copy_pool(host, target)
        try:
            proc = subprocess.run([sys.executable, "-c", cli, "add-segment", str(target),
                                   str(path)], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            out["add_segment"]["hangs"] += 1
            continue
        if proc.returncode < 0:
            out["add_segment"]["signals"] += 1
        elif proc.returncode == 1 and proc.stderr.strip().count("\n") == 0:
            out["add_segment"]["refused_in_one_line"] += 1
        else:
            out["add_segment"]["accepted"] += 1
            print(f"add-segment, {name}: exit {proc.returncode} {proc.stderr[-300:]}",
                  file=sys.stderr)
    return out


def stamped(tmp: Path) -> dict:
    """Each description edit after the pool's files were stamped checked."""
    from suffixspec.pools import view

    intact = tmp / "stamped" / "pool.lmdb"
    intact.parent.mkdir()
    make_pool(intact)
    _, reference = _child_draft(intact)
    out = {"cases": len(DESCRIPTION_EDITS), "signals": 0, "hangs": 0, "errors": 0,
           "wrong_drafts": 0, "refused": 0}
    racy, files.RACY_S = files.RACY_S, -1.0  # stamp at once: no wait for file times
    try:
        for n, (name, edit) in enumerate(DESCRIPTION_EDITS.items()):
            path = tmp / f"stamped{n}" / "pool.lmdb"
            path.parent.mkdir()
            _copy_pool(intact, path)
            with PoolStore(path) as store:
                seg = store.snapshot().segments[0]
                _, stamps = view.open_segment(store.snapshot_folders / seg.folder, seg,
                                              store.max_depth, None, None)
                store.record_stamps(seg.folder, stamps)
            edit_description(path, edit)
            kind, got = _child_draft(path)
            key = {"signal": "signals", "hang": "hangs", "error": "errors"}.get(kind)
            if key is not None:
                out[key] += 1
                print(f"stamped, {name}: {kind}", file=sys.stderr)
                continue
            out["wrong_drafts"] += got["drafts"] != reference["drafts"]
            out["refused"] += got["segments"] == 0
    finally:
        files.RACY_S = racy
    return out


def fuzz(tmp: Path, cases: int) -> dict:
    """``fuzz_segments`` over a two-namespace pool with freed rows."""
    pool = tmp / "fuzz" / "pool.lmdb"
    pool.parent.mkdir()
    fuzz_segments.make_pool(pool)
    r = fuzz_segments.run(pool, cases, seed=0)
    r["command"] = f"fuzz_segments.run(pool, {cases}, seed=0)"
    return r


SERVE = PEAK_RSS + r"""
import json, sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
path, seconds, every = sys.argv[1], float(sys.argv[2]), sys.argv[3]
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, durable=False,
                      snapshot_every=None if every == "none" else int(every))
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace="main")
rng = np.random.default_rng(7)
propose, finish, n, generations = [], [], 0, {pool.view.generation}
print("ready", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    prop.start_request(n, rng.integers(0, 250, 64).tolist())
    for _ in range(8):
        t0 = time.perf_counter()
        prop.propose([n])
        propose.append(time.perf_counter() - t0)
        prop.extend(n, rng.integers(0, 250, 64).tolist())
    t0 = time.perf_counter()
    prop.finish_request(n)
    finish.append(time.perf_counter() - t0)
    generations.add(pool.view.generation)
    n += 1
stats = lambda a: {"p50_ms": float(np.percentile(a, 50) * 1e3),
                   "p99_ms": float(np.percentile(a, 99) * 1e3), "max_ms": float(max(a) * 1e3)}
print(json.dumps({"requests": n, "propose": stats(propose), "finish_request": stats(finish),
                  "snapshot_generations_seen": len(generations), "peak_rss_mb": peak_rss_mb()}))
prop.close()
"""


def _serving_pool(path: Path, tokens: int) -> None:
    """A pool of ``tokens`` tokens in two snapshot segments of about one size
    (the next snapshot merges them)."""
    store = PoolStore(path, tokenizer=BYTES, max_depth=16)
    rng = np.random.default_rng(0)
    per = 500
    for half in range(2):
        store.add_many([(rng.integers(0, 250, per).astype(np.int32), "main", "",
                         f"r{half}-{i}") for i in range(tokens // 2 // per)])
        write_snapshot(store, jobs=2, merge=False)
    store.close()


def serving_latency(tmp: Path, tokens: int, seconds: float) -> list[dict]:
    """Latencies of a serving process beside a forget during a merge, and with snapshot_every."""
    cli = "import sys; from suffixspec.cli import main; sys.exit(main())"
    out = []
    for scenario, every in (("a forget lands during a merge", "none"),
                            ("snapshot_every 200,000 tokens", "200000")):
        path = tmp / f"serve-{every}.lmdb"
        _serving_pool(path, tokens)
        server = _run(SERVE, path, seconds, every)
        assert server.stdout.readline().strip() == "ready"
        time.sleep(2.0)
        ran = {}
        if every == "none":
            merge = subprocess.Popen([sys.executable, "-c", cli, "snapshot", str(path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(1.0)
            forget = subprocess.run([sys.executable, "-c", cli, "forget", str(path),
                                     "--request-id", "r0-3", "--json"], capture_output=True,
                                    text=True)
            merge.wait()
            ran = {"merge_exit": merge.returncode, "forget": json.loads(forget.stdout or "{}")}
        result, err = server.communicate()
        if server.returncode != 0:
            raise RuntimeError(err)
        out.append({"scenario": scenario, "pool_tokens": tokens, **json.loads(result), **ran})
    return out


def _cli(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False)


def _sequences(path: Path) -> int:
    with PoolStore(path, readonly=True) as store:
        return store.stats()["sequences"]


def rebuilds(tmp: Path, traces: Path, tokenizer: Path, per_shard: int = 40,
             shards: int = 3) -> list[dict]:
    """Offline builds done twice: what each stores against what it should."""
    import gzip

    work = tmp / "rebuilds"
    work.mkdir()
    with gzip.open(traces / "sql_spider_bird.jsonl.gz", "rt") as f:
        lines = [line for _, line in zip(range(shards * per_shard + per_shard), f)]
    logs = []
    for k in range(shards):
        log = work / f"part-{k}.jsonl"
        log.write_text("".join(lines[k * per_shard:(k + 1) * per_shard]))
        logs.append(log)
    extra = work / "extra.jsonl"  # records no shard holds
    extra.write_text("".join(lines[shards * per_shard:]))
    n = shards * per_shard
    rows = []

    def row(case: str, expected: int, got: int, ok: bool, said: str = "") -> None:
        rows.append({"case": case, "expected": expected, "stored": got,
                     "exact": got == expected and ok, "said": said.strip()[-200:]})

    fleet = work / "fleet.lmdb"
    build = ("fleet-build", fleet, *logs, "--tokenizer", tokenizer, "--work-dir",
             work / "shards", "--learn", 16)
    r = _cli(*build)
    row("fleet-build", n, _sequences(fleet), r.returncode == 0, r.stderr)
    r = _cli(*build)
    row("fleet-build again over its work folder", n, _sequences(fleet), r.returncode == 0,
        r.stderr)
    shard = work / "retried.lmdb"
    for _ in range(2):  # a Ray task retried after its worker was killed
        r = _cli("ingest", shard, logs[0], "--tokenizer", tokenizer, "--learn", 0)
    row("one shard's build run twice", per_shard, _sequences(shard), r.returncode == 0,
        r.stderr)
    copy = work / "copy.lmdb"
    _copy_pool(fleet, copy)
    r = _cli("add-segment", fleet, copy)
    row("a copy of the pool added to it", n, _sequences(fleet), r.returncode == 0, r.stderr)
    part = work / "part.lmdb"  # a shard the pool holds in part: one log it has, one it lacks
    r = _cli("ingest", part, logs[1], extra, "--tokenizer", tokenizer, "--learn", 0)
    r = _cli("add-segment", fleet, part)
    row("a shard the pool holds in part", n + per_shard, _sequences(fleet),
        r.returncode == 0, r.stderr)
    single = work / "single.lmdb"
    for _ in range(2):
        r = _cli("ingest", single, logs[2], "--tokenizer", tokenizer, "--learn", 0)
    row("a log ingested twice", per_shard, _sequences(single), r.returncode == 0, r.stderr)
    return rows


SETTINGS_CHILD = r"""
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from suffixspec.integrations.vllm.settings import Settings
try:
    Settings.from_env()
    print(json.dumps({"refused": None}))
except ValueError as e:
    print(json.dumps({"refused": str(e)}))
"""

TABLE_CHILD = r"""
import json, logging, sys
import numpy as np
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger().addHandler(Keep())
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import PoolStore
path = sys.argv[1]
pool = PersistentPool(path)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace="a")
drafted = 0
for i in range(20):
    prop.start_request(i, [int(x) for x in sys.argv[2].split(",")])
    drafted += len(prop.propose([i])[0])
    prop.abort_request(i)
finite = bool(np.isfinite(prop.stats.table).all())
prop.close()
pool.close()
kept = PoolStore(path, readonly=True).load_table("calibration")
print(json.dumps({"said": [m for m in records if "calibration" in m], "drafted": drafted,
                  "table_finite": finite,
                  "kept_ok": bool(kept is None or (np.isfinite(kept).all() and (kept >= 0).all()))}))
"""

BAD_SETTINGS = [("env", "SUFFIXSPEC_CROSS_TOKENS", "-1"), ("env", "SUFFIXSPEC_SNAPSHOT_EVERY", "-5"),
                ("env", "SUFFIXSPEC_REFRESH_INTERVAL", "nan"),
                ("env", "SUFFIXSPEC_REFRESH_INTERVAL", "inf"),
                ("env", "SUFFIXSPEC_REFRESH_INTERVAL", "-1"),
                ("env", "SUFFIXSPEC_LOG_INTERVAL", "-2"), ("env", "SUFFIXSPEC_DRAFT_COST", "1.5"),
                ("file", "cross_tokens", -5), ("file", "refresh_interval", "inf")]


def settings_tables(tmp: Path) -> dict:
    """Out-of-range settings and unusable kept calibration tables, each in a child."""
    import os

    from suffixspec.native import calibration as cal

    work = tmp / "settings"
    work.mkdir()
    settings = []
    for where, name, value in BAD_SETTINGS:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUFFIXSPEC_")}
        if where == "env":
            env[name] = value
        else:
            config = work / f"{name}.json"
            config.write_text(json.dumps({name: value}))
            env["SUFFIXSPEC_CONFIG"] = str(config)
        out = subprocess.run([sys.executable, "-c", SETTINGS_CHILD], capture_output=True,
                             text=True, env=env, timeout=120, check=False)
        refused = json.loads(out.stdout)["refused"] if out.returncode == 0 else None
        settings.append({"setting": f"{name}={value} ({where})", "refused": refused,
                         "one_line": bool(refused) and "\n" not in refused})
    tables = []
    probe = ",".join(map(str, HEAD[:3]))  # what every crafted pool's sequences begin with
    for bad in ("nan", "inf", "1e308", "negative", "shape"):
        path = work / f"table-{bad}.lmdb"
        make_pool(path, n=20)
        before = _sequences(path)
        table = cal.new_table()
        table[:, 1], table[:, 0] = 4.0, 2.0
        if bad == "shape":
            table = table[:100]
        else:
            table[5, 0 if bad in ("nan", "negative") else 1] = {
                "nan": np.nan, "inf": np.inf, "1e308": 1e308, "negative": -5.0}[bad]
        with PoolStore(path) as store:
            store.save_table("calibration", table)
        out = subprocess.run([sys.executable, "-c", TABLE_CHILD, str(path), probe],
                             capture_output=True, text=True, timeout=120, check=False)
        got = json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-300:]}
        tables.append({"table": bad, "returncode": out.returncode, **got,
                       "sequences_before": before, "sequences_after": _sequences(path)})
    return {"settings": settings, "tables": tables}


def markdown(r: dict) -> str:
    rows = ["| run | result |", "|---|---|"]
    if (d := r.get("damage")):
        rows.append(f"| {d['cases']} byte flips and truncations | crashes {d['crashes']}, clear "
                    f"errors {d['errors']}, drafts as the pool with or without its snapshot "
                    f"{d['same_drafts']}, other drafts {d['other_drafts']} |")
    rows += [f"| `{k['op']}` killed at random, {k['runs']} runs ({k['command_s']} s unharmed) | "
             f"killed before done {k['killed_before_done']}, opened and checked "
             f"{k['opened_and_checked']}, other errors {k['other_errors']}, runs losing "
             f"untargeted sequences {k['untargeted_lost']}, partial sequences "
             f"{k['partial_sequences']}, half done {k['half_done']}, forgotten bytes left "
             f"{k['forgotten_left']}, drafts changed {k['drafts_changed']}, leftover files "
             f"{k['leftover_files']} |" for k in r.get("killed", [])]
    if (c := r.get("long_commit")):
        rows.append(f"| one {c['sequence_tokens']:,}-token sequence committed by another "
                    f"process beside a reader ({c['write_s']} s to commit) | reader "
                    f"propose() p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms, max "
                    f"{c['max_ms']:.1f} ms (CPU max {c['max_cpu_ms']:.1f} ms), "
                    f"{c['proposes']} proposes, {c['errors']} errors |")
    if (live := r.get("live_forget")):
        rows.append(f"| {live['seconds']:.0f} s: 2 writers, 3 readers, forget + prune every few "
                    f"seconds | {live['forgets']} forgets ({live['forgets_compacted']} "
                    f"compacted), {live['prunes']} prunes, command failures "
                    f"{live['command_failures']}, process failures {live['process_failures']}, "
                    f"reader errors {live['reader_errors']}, commits {live['committed']}, lost "
                    f"{live['lost']}, forgotten bytes left {live['forgotten_bytes_left']} |")
    if (t := r.get("other_tenant")):
        rows.append(f"| reader while another process commits {t['other_tokens']:,} tokens to "
                    f"another namespace ({t['write_s']} s) | propose p50 {t['p50_ms']:.3f} ms, "
                    f"p99 {t['p99_ms']:.3f} ms, max {t['max_ms']:.1f} ms, peak RSS "
                    f"{t['rss_mb']:.0f} MB, errors {t['errors']} |")
    rows += [f"| 1M-token budget, {b['committed']:,} tokens committed, snapshot_every "
             f"{b['snapshot_every']} ({b['seconds']} s) | RSS {b['rss_mb']:.0f} MB (peak "
             f"{b['peak_rss_mb']:.0f} MB), tokens indexed {b['indexed_tokens']:,}, file "
             f"{b['file_mb']:.0f} MB |" for b in r.get("budget", [])]
    if (c := r.get("crafted")):
        p, a = c["in_place"], c["add_segment"]
        rows += [f"| {c['cases']} crafted segments in place, each in a child process | signals "
                 f"{p['signals']}, hangs {p['hangs']}, errors {p['errors']}, wrong drafts "
                 f"{p['wrong_drafts']}, refused (drafted from the stored sequences) "
                 f"{p['refused']} |",
                 f"| the same {c['cases']} as shards through `add-segment` | signals "
                 f"{a['signals']}, hangs {a['hangs']}, refused in one line "
                 f"{a['refused_in_one_line']}, accepted {a['accepted']} |"]
    if (c := r.get("stamped")):
        rows.append(f"| {c['cases']} description edits after the files were stamped checked, "
                    f"each in a child process | signals {c['signals']}, hangs {c['hangs']}, "
                    f"errors {c['errors']}, wrong drafts {c['wrong_drafts']}, refused (drafted "
                    f"from the stored sequences) {c['refused']} |")
    if (f := r.get("fuzz")):
        c = f["counts"]
        rows.append(f"| {f['cases']:,} fuzzed segments (seed {f['seed']}), cases in child "
                    f"processes under a timeout, kernels bounds-checked ({f['seconds']} s) | "
                    f"signals {c['signals']}, hangs {c['hangs']}, out-of-range reads "
                    f"{c['out_of_range']}, drafting errors {c['draft_error']}, check errors "
                    f"{c['check_error']}; refused {c['refused_description']} (description) + "
                    f"{c['refused_size']} (sizes) + {c['refused_structure']} (structure), "
                    f"drafted from {c['drafted']} |")
    rows += [f"| serving on a {s['pool_tokens']:,}-token pool, {s['scenario']} ({s['requests']} "
             f"requests) | propose p50 {s['propose']['p50_ms']:.2f} ms, p99 "
             f"{s['propose']['p99_ms']:.2f} ms, max {s['propose']['max_ms']:.1f} ms; "
             f"finish_request p50 {s['finish_request']['p50_ms']:.2f} ms, max "
             f"{s['finish_request']['max_ms']:.1f} ms; snapshot generations seen "
             f"{s['snapshot_generations_seen']} |" for s in r.get("serving", [])]
    rows += [f"| {b['case']} | stored {b['stored']} of {b['expected']} expected"
             f"{'' if b['exact'] else ' (NOT EXACT)'} |" for b in r.get("rebuilds", [])]
    if (st := r.get("settings_tables")):
        s_ = st["settings"]
        rows.append(f"| {len(s_)} out-of-range settings ({', '.join(x['setting'] for x in s_)}), "
                    f"each in a child process | refused {sum(bool(x['refused']) for x in s_)}, "
                    f"in one line {sum(x['one_line'] for x in s_)} |")
        t_ = st["tables"]
        rows.append(f"| {len(t_)} kept calibration tables no proposer may use "
                    f"({', '.join(x['table'] for x in t_)}), each in a child process | exits 0: "
                    f"{sum(x['returncode'] == 0 for x in t_)}, one log line each: "
                    f"{sum(len(x.get('said', [])) == 1 for x in t_)}, drafted (tokens over 20 "
                    f"probes) {', '.join(str(x.get('drafted')) for x in t_)}, table finite "
                    f"{sum(bool(x.get('table_finite')) for x in t_)}, kept table usable after "
                    f"{sum(bool(x.get('kept_ok')) for x in t_)}, sequences kept "
                    f"{sum(x['sequences_after'] == x['sequences_before'] for x in t_)} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter runs")
    ap.add_argument("--only", nargs="*", choices=("damage", "killed", "live_forget",
                                                   "other_tenant", "long_commit", "budget",
                                                   "crafted", "stamped", "fuzz", "serving",
                                                   "rebuilds", "settings_tables"),
                    help="run only these")
    ap.add_argument("--traces", default="../shared/data/traces",
                    help="the shared traces (rebuilds ingests the sql trace's first records)")
    ap.add_argument("--tokenizer", default="../shared/tokenizers/qwen")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="suffixspec-faults-"))
    try:
        q = args.quick
        runs = {"damage": lambda: damage(tmp, 40 if q else 100),
                "killed": lambda: [killed(tmp, op, 8 if q else 30) for op in KILLED_OPS],
                "live_forget": lambda: live_forget(tmp, 15.0 if q else 60.0),
                "other_tenant": lambda: other_tenant(tmp, 1_000_000 if q else 5_000_000,
                                                     20.0 if q else 60.0),
                "long_commit": lambda: long_commit(tmp, 2_000_000, 20.0 if q else 40.0),
                "budget": lambda: budget(tmp, 4_000_000 if q else 20_000_000),
                "crafted": lambda: crafted(tmp),
                "stamped": lambda: stamped(tmp),
                "fuzz": lambda: fuzz(tmp, 2_000 if q else 10_000),
                "serving": lambda: serving_latency(tmp, 4_000_000, 40.0 if q else 60.0),
                "rebuilds": lambda: rebuilds(tmp, Path(args.traces).resolve(),
                                             Path(args.tokenizer).resolve()),
                "settings_tables": lambda: settings_tables(tmp)}
        results = {name: run() for name, run in runs.items()
                   if not args.only or name in args.only}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # A partial run keeps its own files beside the full run's.
    name = "faults" if not args.only else "faults_" + "_".join(args.only)
    save_results(args.out, name, results, markdown(results))


if __name__ == "__main__":
    main()
