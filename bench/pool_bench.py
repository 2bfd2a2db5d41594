"""Persistent pool: ingest speed, warm start, disk use, warm-pool MTS, readers, crashes.

Usage (from the repository root):

    python bench/pool_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Sections (all in one run; pool files go to a temporary folder; pools of up
to 100M tokens: ``bench/scale_bench.py``):

1. ingest: every shared trace (outputs), tokens/s with and without
   tokenization, then the snapshot build;
2. open-to-first-draft at 1M and 10M tokens (the shared traces' outputs, then
   prompts, no repeats), each timed in a fresh process (kernels already
   compiled in the on-disk cache, timed apart);
3. bytes on disk per token (the pool file and its snapshot files);
4. replay of the agent and SQL traces with a pool pre-ingested from a disjoint
   first part of the same trace, against a cold pool;
5. 1 writer and 8 reader processes for ``--readers-seconds``; errors counted;
6. ``--kills`` writers killed with SIGKILL at random points; after each the
   pool must open, pass ``check()`` and hold every sequence whose commit
   returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from suffixspec import SuffixProposer
from suffixspec.config import DEFAULT_NAMESPACE
from suffixspec.fingerprint import tokenizer_id
from suffixspec.offline.ingest import ingest
from suffixspec.native import warmup
from suffixspec.pools.persistent import PersistentPool
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder
from suffixspec.pools.store import PoolStore

from bench_common import parser, TRACES, fill_store, load, save_results

_OPEN = """
import sys, time
t0 = time.perf_counter()
from suffixspec.native import warmup
warmup()
t1 = time.perf_counter()
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
t2 = time.perf_counter()
pool = PersistentPool(sys.argv[1])
prop = SuffixProposer(max_depth=pool.max_depth, pool=pool, namespace=sys.argv[2])
prop.start_request("probe", np.array([int(x) for x in sys.argv[3].split(",")], np.int32))
d = prop.propose(["probe"])[0]
t3 = time.perf_counter()
print(t1 - t0, t3 - t2, len(d), pool.tokens)
"""

_READER = """
import sys, time, numpy as np
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], refresh_interval=0.2)
prop = SuffixProposer(max_depth=pool.max_depth, pool=pool, namespace="w")
rng = np.random.default_rng(int(sys.argv[3]))
end = time.monotonic() + float(sys.argv[2])
drafts = errors = i = 0
while time.monotonic() < end:
    try:
        prop.start_request(i, rng.integers(0, 50, 40))
        for _ in range(5):
            d = prop.propose([i])[0]
            drafts += len(d) > 0
            prop.extend(i, rng.integers(0, 50, 2))
        prop.abort_request(i)  # readers only read: nothing is committed
    except Exception as e:
        errors += 1
        print("error", repr(e), file=sys.stderr)
    i += 1
print(i, drafts, errors, pool.tokens)
"""

_WRITER = """
import sys, time, numpy as np
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1])
rng = np.random.default_rng(0)
end = time.monotonic() + float(sys.argv[2])
n = errors = 0
while time.monotonic() < end:
    try:
        pool.add(rng.integers(0, 50, int(rng.integers(10, 400))).astype(np.int32), "w")
        n += 1
        if n % 200 == 0:
            pool.write_snapshot()
    except Exception as e:
        errors += 1
        print("error", repr(e), file=sys.stderr)
print(n, errors)
"""

_KILLED = """
import sys, numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=64, map_size=1 << 16)
rng = np.random.default_rng(int(sys.argv[2]))
while True:
    toks = rng.integers(0, 1000, int(rng.integers(1, 4000))).astype(np.int32)
    sid = store.add(toks, "k")
    print(sid, int(toks.astype(np.int64).sum()), len(toks), flush=True)
"""


def py(code: str, *args, timeout=600) -> str:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, timeout=timeout, check=True)
    return out.stdout


def section_ingest(tmp: Path, args, encode, tok) -> list[dict]:
    rows = []
    for name, (file, _) in TRACES.items():
        path = tmp / f"ingest-{name}.lmdb"
        with PoolStore(path, tokenizer=tok, max_depth=64) as store:
            t0 = time.perf_counter()
            report = ingest(store, [Path(args.traces) / file], encode, namespace=name)
            wall = time.perf_counter() - t0
            t1 = time.perf_counter()
            with PersistentPool(store) as pool:
                pool.write_snapshot()
            snap = time.perf_counter() - t1
            size = store.disk_bytes()  # the pool file and its snapshot files
        rows.append({"trace": name, "sequences": report.sequences, "tokens": report.tokens,
                     "store_tok_s": round(report.tokens / report.store_s),
                     "with_tokenize_tok_s": round(report.tokens / wall),
                     "snapshot_s": round(snap, 2), "snapshot_tok_s": round(report.tokens / snap),
                     "disk_bytes_per_token": round(size / report.tokens, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def build_pool(path: Path, tok, sequences, target: int) -> tuple[int, float]:
    """A pool of the first ``target`` tokens of ``sequences``; returns (tokens, snapshot s)."""
    with PoolStore(path, tokenizer=tok, max_depth=64) as store:
        total = fill_store(store, sequences, target)
        t0 = time.perf_counter()
        with PersistentPool(store) as pool:
            pool.write_snapshot()
        return total, time.perf_counter() - t0


def _disk_bytes(path: Path) -> int:
    with PoolStore(path, readonly=True) as store:
        return store.disk_bytes()


def section_open(tmp: Path, tok, traces: dict, sizes) -> list[dict]:
    # Distinct data: every trace's outputs first, then prompts.
    seqs = ([r.output for reqs in traces.values() for r in reqs if len(r.output)]
            + [r.prompt for reqs in traces.values() for r in reqs])
    probe = ",".join(map(str, traces["sql"][5].output[:12].tolist()))
    rows = []
    for target in sizes:
        path = tmp / f"open-{target}.lmdb"
        tokens, build_s = build_pool(path, tok, seqs, target)
        runs = [py(_OPEN, path, "main", probe).split() for _ in range(3)]
        compile_s = min(float(r[0]) for r in runs)
        open_s = sorted(float(r[1]) for r in runs)
        rows.append({"tokens": tokens, "snapshot_build_s": round(build_s, 1),
                     "open_to_first_draft_s": [round(x, 3) for x in open_s],
                     "draft_len": int(runs[0][2]), "kernel_load_s": round(compile_s, 3),
                     "disk_bytes_per_token": round(_disk_bytes(path) / tokens, 1)})
        print(json.dumps(rows[-1]), file=sys.stderr)
        path.unlink()
    return rows


def section_warm(tmp: Path, tok, name: str, requests) -> dict:
    cut = len(requests) // 2
    history, later = requests[:cut], requests[cut:]
    path = tmp / f"warm-{name}.lmdb"
    with PoolStore(path, tokenizer=tok, max_depth=64) as store:
        store.add_many([(r.output, DEFAULT_NAMESPACE, "history", r.req_id) for r in history
                        if len(r.output)])
        with PersistentPool(store) as pool:
            pool.write_snapshot()
    out = {"trace": name, "history_requests": len(history), "replayed_requests": len(later)}
    for label in ("cold", "warm"):
        pool_path = tmp / f"cold-{name}.lmdb" if label == "cold" else path
        with PersistentPool(pool_path, tokenizer=tok, max_depth=64) as pool:
            prop = SuffixProposer(max_depth=64, pool=pool)
            m = replay(later, prop).metrics()
        out[f"{label}_mts"] = m["mean_tokens_per_step"]
        out[f"{label}_acceptance"] = m["acceptance_rate"]
    out["warm_over_cold"] = round(out["warm_mts"] / out["cold_mts"], 4)
    print(json.dumps(out), file=sys.stderr)
    return out


def section_readers(tmp: Path, tok, seconds: float) -> dict:
    path = tmp / "readers.lmdb"
    PoolStore(path, tokenizer=tok, max_depth=64).close()
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(seconds)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    readers = [subprocess.Popen([sys.executable, "-c", _READER, str(path), str(seconds), str(i)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(8)]
    w_out, w_err = writer.communicate(timeout=seconds + 300)
    n_written, w_errors = map(int, w_out.split())
    totals = {"requests": 0, "drafts": 0, "errors": 0}
    for r in readers:
        out, err = r.communicate(timeout=seconds + 300)
        req, drafts, errors, _ = out.split()
        totals["requests"] += int(req)
        totals["drafts"] += int(drafts)
        totals["errors"] += int(errors) + (r.returncode != 0)
    row = {"seconds": seconds, "writer_sequences": n_written, "writer_errors": w_errors,
           "reader_processes": 8, "reader_requests": totals["requests"],
           "reader_drafts": totals["drafts"], "reader_errors": totals["errors"],
           "writer_exit": writer.returncode}
    print(json.dumps(row), file=sys.stderr)
    return row


def section_kills(tmp: Path, trials: int) -> dict:
    rng = np.random.default_rng(0)
    lost = checked = committed_total = 0
    for t in range(trials):
        path = tmp / f"kill-{t}.lmdb"
        proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(path), str(t)],
                                stdout=subprocess.PIPE, text=True)
        lines = []
        deadline = time.monotonic() + 0.5 + 1.5 * float(rng.random())
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        os.kill(proc.pid, signal.SIGKILL)
        lines += proc.stdout.read().splitlines()
        proc.wait()
        committed = [tuple(map(int, x.split())) for x in lines if x.strip()]
        with PoolStore(path) as store:
            store.check()
            stored = {s.seq_id: s for s in store.sequences()}
        for sid, total, n in committed:
            s = stored.get(sid)
            if s is None or len(s.tokens) != n or int(s.tokens.astype(np.int64).sum()) != total:
                lost += 1
        checked += 1
        committed_total += len(committed)
        for p in (path, Path(str(path) + "-lock")):
            p.unlink(missing_ok=True)
    row = {"trials": trials, "pools_opened_and_checked": checked,
           "committed_sequences": committed_total, "lost": lost}
    print(json.dumps(row), file=sys.stderr)
    return row


def markdown(r: dict) -> str:
    out = ["### Ingest (outputs of each shared trace)", "",
           "| trace | sequences | tokens | tok/s into the pool | tok/s with tokenizing "
           "| snapshot build s (tok/s) | disk B/token |", "|---|---|---|---|---|---|---|"]
    for x in r["ingest"]:
        out.append(f"| {x['trace']} | {x['sequences']} | {x['tokens']} | "
                   f"{x['store_tok_s'] / 1e6:.2f}M | {x['with_tokenize_tok_s'] / 1e6:.2f}M | "
                   f"{x['snapshot_s']} ({x['snapshot_tok_s'] / 1e6:.2f}M) | "
                   f"{x['disk_bytes_per_token']} |")
    out += ["", "### Open to first draft (fresh process; kernels loaded from cache, timed apart)",
            "", "| pool tokens | snapshot build s | open → first draft s (3 runs) "
            "| kernel load s | disk B/token |", "|---|---|---|---|---|"]
    for x in r["open"]:
        out.append(f"| {x['tokens']:,} | {x['snapshot_build_s']} | "
                   f"{', '.join(map(str, x['open_to_first_draft_s']))} | {x['kernel_load_s']} | "
                   f"{x['disk_bytes_per_token']} |")
    out += ["", "### Warm pool (first half of the trace ingested) vs cold, replaying the "
            "second half", "", "| trace | cold MTS | warm MTS | warm / cold |", "|---|---|---|---|"]
    for x in r["warm"]:
        out.append(f"| {x['trace']} | {x['cold_mts']} | {x['warm_mts']} | {x['warm_over_cold']} |")
    rd, k = r["readers"], r["kills"]
    out += ["", f"Readers: 1 writer ({rd['writer_sequences']} sequences, "
            f"{rd['writer_errors']} errors) and {rd['reader_processes']} reader processes "
            f"({rd['reader_requests']} requests, {rd['reader_drafts']} drafts) for "
            f"{rd['seconds']} s: **{rd['reader_errors']} reader errors**.", "",
            f"SIGKILL: {k['trials']} writers killed at random points; every pool opened and "
            f"passed check(); {k['committed_sequences']} committed sequences, "
            f"**{k['lost']} lost**."]
    return "\n".join(out)


def main():
    ap = parser(__doc__)
    ap.add_argument("--readers-seconds", type=float, default=60.0)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--open-sizes", default="1000000,10000000",
                    help="pool sizes (tokens) for the open-to-first-draft section")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    tok = tokenizer_id(args.tokenizer)
    warmup()
    results = {}
    with tempfile.TemporaryDirectory(dir=args.out) as tmp_name:
        tmp = Path(tmp_name)
        results["ingest"] = section_ingest(tmp, args, encode, tok)
        traces = {name: load(args.traces, name, encode, args.tokenizer) for name in TRACES}
        sql, agent = traces["sql"], traces["agent"]
        sizes = [int(x) for x in args.open_sizes.split(",")]
        results["open"] = section_open(tmp, tok, traces, sizes)
        results["warm"] = [section_warm(tmp, tok, "agent", agent),
                           section_warm(tmp, tok, "sql", sql)]
        results["readers"] = section_readers(tmp, tok, args.readers_seconds)
        results["kills"] = section_kills(tmp, args.kills)
    save_results(args.out, "pool", results, markdown(results))


if __name__ == "__main__":
    main()
