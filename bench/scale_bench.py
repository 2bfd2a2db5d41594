"""Pool scale: snapshot build time and memory, disk, open and drafting cost up to 100M tokens.

Usage (from the repository root):

    python bench/scale_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --sizes 1000000,100000000

The pools hold the shared traces' outputs and prompts, repeated until the size
is reached; each repeat maps every token id through its own random
permutation of the vocabulary, so a repeat has the traces' shape but shares no
string with the others (the worst case for index size).  For each size, in
fresh processes:

1. the store is filled (``PoolStore.add_many``);
2. the whole pool is indexed as one snapshot segment with each of ``--jobs``
   (default 1 and 2): seconds, tokens/s, peak RSS of the building processes
   together (sampled every 50 ms) and the peak of each process alone
   (``getrusage``);
3. ``--grow`` more tokens are stored and the snapshot brought up to date
   with the last of ``--jobs``: it indexes only them, as a second segment;
4. bytes on disk per token (pool file and snapshot files);
5. open → first draft (kernels loaded apart), four opens, the first apart.
   Every file was checked before them (step 3's snapshot checks the segment
   it keeps, as every snapshot does, and records the check), so these opens
   read no file; a check of every file at 100M took 0.21–0.27 s;
6. a replay of ``--replay`` SQL requests against the pool (both segments and
   the in-memory part drafted together): proposer µs per step, p50 and p99.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from suffixspec.fingerprint import tokenizer_id
from suffixspec.pools.store import PoolStore
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, TRACES, fill_store, load, save_results


_BUILD = """
import resource, sys, threading, time
import psutil
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import PoolStore
peak = [0]
stop = threading.Event()
def sample():
    me = psutil.Process()
    while not stop.wait(0.05):
        try:
            procs = [me] + me.children(recursive=True)
            peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs))
        except psutil.Error:
            pass
threading.Thread(target=sample, daemon=True).start()
from suffixspec.native import warmup
warmup()
store = PoolStore(sys.argv[1])
if sys.argv[3] == "whole":
    store.update_segments(lambda current, txn: [])  # index every sequence anew
t0 = time.perf_counter()
write_snapshot(store, jobs=int(sys.argv[2]))
seconds = time.perf_counter() - t0
stop.set()
print(seconds, peak[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, store.disk_bytes())
"""

_OPEN = """
import sys, time
from suffixspec.native import warmup
warmup()
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.pools.persistent import PersistentPool
t0 = time.perf_counter()
pool = PersistentPool(sys.argv[1])
prop = SuffixProposer(max_depth=pool.max_depth, pool=pool, namespace="main")
prop.start_request("probe", np.array([int(x) for x in sys.argv[2].split(",")], np.int32))
d = prop.propose(["probe"])[0]
print(time.perf_counter() - t0, len(d))
"""

_REPLAY = """
import json, pickle, sys
from suffixspec import SuffixProposer
from suffixspec.native import warmup
from suffixspec.pools.persistent import PersistentPool
from suffixspec.replay.harness import replay
warmup()
requests = pickle.load(open(sys.argv[2], "rb"))
pool = PersistentPool(sys.argv[1])
prop = SuffixProposer(max_depth=pool.max_depth, pool=pool, namespace="main")
m = replay(requests, prop).metrics()
print(json.dumps({k: m[k] for k in ("mean_tokens_per_step", "proposer_us_per_step_p50",
                                     "proposer_us_per_step_p99")}))
"""


def py(code: str, *args, timeout=3600) -> str:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return out.stdout


def corpus(traces: dict) -> list[np.ndarray]:
    seqs = [r.output for reqs in traces.values() for r in reqs if len(r.output)]
    return seqs + [r.prompt for reqs in traces.values() for r in reqs if len(r.prompt)]


def permuted_copies(base: list[np.ndarray], seed: int = 0):
    """``base`` again and again, each repeat's ids through a random permutation
    (the first repeat's the identity when ``seed`` is 0)."""
    rng = np.random.default_rng(seed)
    vocab = max(int(s.max()) for s in base) + 1
    perm = np.arange(vocab, dtype=np.int32) if seed == 0 else rng.permutation(vocab).astype(
        np.int32)
    while True:
        yield from (perm[s] for s in base)
        perm = rng.permutation(vocab).astype(np.int32)


def fill(path: Path, tok, base: list[np.ndarray], target: int) -> tuple[int, float]:
    """A pool of ``target`` tokens of ``permuted_copies(base)``; returns (tokens, seconds)."""
    t0 = time.perf_counter()
    with PoolStore(path, tokenizer=tok, max_depth=64) as store:
        total = fill_store(store, permuted_copies(base), target)
    return total, time.perf_counter() - t0


def measure(tmp: Path, tok, base, size: int, jobs: list[int], grow: int, probe: str,
            replay_file: Path) -> dict:
    path = tmp / f"pool-{size}.lmdb"
    tokens, fill_s = fill(path, tok, base, size)
    row = {"tokens": tokens, "store_tok_s": round(tokens / fill_s)}

    def build(j: int, how: str, n: int) -> dict:
        seconds, tree_peak, self_peak, child_peak, disk = map(float,
                                                              py(_BUILD, path, j, how).split())
        row["disk_bytes_per_token"] = round(disk / (tokens + row.get("grown", 0)), 1)
        return {"build_s": round(seconds, 1), "tok_s": round(n / seconds),
                "peak_rss_gb": round(tree_peak / 1e9, 2),
                "parent_peak_gb": round(self_peak / 1e9, 2),
                "worker_peak_gb": round(child_peak / 1e9, 2)}

    for j in jobs:
        row[f"jobs{j}"] = build(j, "whole", tokens)
        print(json.dumps({"size": size, "jobs": j, **row[f"jobs{j}"]}), file=sys.stderr)
    with PoolStore(path) as store:
        row["grown"] = fill_store(store, permuted_copies(base, seed=1), grow)
    row["grow"] = build(jobs[-1], "new", row["grown"])
    with PoolStore(path) as store:
        row["segments"] = len(store.snapshot().segments)
    print(json.dumps({"size": size, "grow": row["grow"]}), file=sys.stderr)
    time.sleep(3)  # file times settle: the first open may record its check
    runs = [py(_OPEN, path, probe).split() for _ in range(4)]
    row["first_open_s"] = round(float(runs[0][0]), 3)
    row["open_to_first_draft_s"] = sorted(round(float(r[0]), 3) for r in runs[1:])
    row["probe_draft_len"] = int(runs[0][1])
    row["replay"] = json.loads(py(_REPLAY, path, replay_file))
    print(json.dumps(row), file=sys.stderr)
    for p in tmp.glob(f"pool-{size}.lmdb*"):
        subprocess.run(["rm", "-rf", str(p)], check=True)
    return row


def markdown(rows: list[dict], jobs: list[int]) -> str:
    head = ("| pool tokens | " + " | ".join(
        f"build s, jobs {j} (tok/s) | peak RSS GB, jobs {j} (parent / worker)" for j in jobs)
        + " | + new tokens: snapshot s (tok/s), peak RSS GB | disk B/token | "
          "first open s | open → first draft s | proposer µs/step p50 / p99 |")
    out = [head, "|" + "---|" * (2 * len(jobs) + 6)]
    for r in rows:
        cells = []
        for j in jobs:
            b = r[f"jobs{j}"]
            cells += [f"{b['build_s']} ({b['tok_s'] / 1e6:.2f}M)",
                      f"{b['peak_rss_gb']} ({b['parent_peak_gb']} / {b['worker_peak_gb']})"]
        g, rp = r["grow"], r["replay"]
        out.append(f"| {r['tokens']:,} | " + " | ".join(cells) +
                   f" | {r['grown']:,}: {g['build_s']} ({g['tok_s'] / 1e6:.2f}M), "
                   f"{g['peak_rss_gb']} | {r['disk_bytes_per_token']} | {r['first_open_s']} | "
                   f"{', '.join(map(str, r['open_to_first_draft_s']))} | "
                   f"{rp['proposer_us_per_step_p50']} / {rp['proposer_us_per_step_p99']} |")
    return "\n".join(out)


def main():
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="1000000,100000000")
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--grow", type=int, default=1_000_000,
                    help="tokens added after the whole build, indexed as a new segment")
    ap.add_argument("--replay", type=int, default=300, help="SQL requests replayed per pool")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    tok = tokenizer_id(args.tokenizer)
    traces = {name: load(args.traces, name, encode, args.tokenizer) for name in TRACES}
    base = corpus(traces)
    jobs = [int(x) for x in args.jobs.split(",")]
    probe = ",".join(map(str, traces["sql"][5].output[:12].tolist()))
    rows = []
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out) as tmp_name:
        tmp = Path(tmp_name)
        replay_file = tmp / "requests.pkl"
        import pickle
        with open(replay_file, "wb") as f:
            pickle.dump(traces["sql"][-args.replay:], f)
        for size in (int(x) for x in args.sizes.split(",")):
            rows.append(measure(tmp, tok, base, size, jobs, args.grow, probe, replay_file))
    save_results(args.out, "scale", {"rows": rows, "base_tokens": int(sum(map(len, base)))},
                 markdown(rows, jobs))


if __name__ == "__main__":
    main()
