"""The pool where it pays: replicas, restarts and yesterday's logs.

Usage (from the repository root):

    python bench/fleet_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Each shared trace (``SLICES``: its first records in file order, times
``--scale``) is served by ``suffixspec.replay.fleet`` in these deployments:

* ``one``: one server, never restarted;
* ``N replicas`` (2, 4, 8): round robin, a conversation's turns on one
  replica, requests served one at a time in arrival order (only where the
  history lives changes: ``replay.fleet``);
* ``8 replicas, all busy``: the same with the replicas in lockstep, 8
  requests in flight (a request no longer sees the 7 that overlap it);
* ``restart every R``: one server restarted after every ``R`` requests (250);
* ``from logs``: the second half served after ``suffixspec ingest`` of the
  first half's log (the CLI, as a user runs it; other engines start cold),
  beside suffixspec after the first half was served live on a pool, and
  suffixspec cold.

Engines: suffixspec with its defaults, every replica its own
``SuffixProposer`` on one pool file (LMDB, in a temporary folder) as
separate engine processes on a host would be, looking for the others'
commits at every step (``refresh_interval`` 0) and, between requests, with
its commits written and the others' read (``settle``: in a served fleet a
commit reaches the other replicas in milliseconds, measured here apart and
reported, and a request lasts seconds);
``suffixspec, own pools``: every replica its own in-memory pool (at 8
replicas only: what the sharing adds); arctic-inference at its cost-aware
best (k 16, depth 64, factor 2, min_token_prob 0.2), a cache per replica and
process; vLLM's GPU suffix drafter (``vllm-gpu``, its defaults), a corpus per
replica and process.  Figures: est (MTS / (1 + 0.03 × drafted per step)) and
suffixspec's ratio to the best other engine.  Writes ``fleet.json`` and
``fleet.md``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from suffixspec import SuffixProposer
from suffixspec.fingerprint import tokenizer_id
from suffixspec.native import warmup
from suffixspec.pools.persistent import PersistentPool
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.fleet import replay_fleet
from suffixspec.replay.traces import hf_encoder, load_trace, read_records

from bench_common import parser, save_results

#: Enough requests per trace for 8 replicas and restarts every 250 to show,
#: and conversations enough to spread the agent workload over 8 replicas.
SLICES = {"sql": ("sql_spider_bird.jsonl.gz", {"max_records": 2500}),
          "code": ("code_humaneval_mbpp_leetcode.jsonl.gz", {"max_records": 2000}),
          "gorilla": ("tool_gorilla_apibench.jsonl.gz", {"max_records": 2000}),
          "bfcl": ("tool_bfcl.jsonl.gz", {"max_records": 2000}),
          "agent": ("agent_miniswe_swebench.jsonl.gz", {"max_sessions": 24})}

ARCTIC = dict(max_spec_tokens=16, max_depth=64, max_spec_factor=2.0, min_token_prob=0.2)
RESTART_EVERY = 250
REPLICAS = (2, 4, 8)


class Fleet:
    """Proposer factories for one run: a fresh pool file per suffixspec run."""

    def __init__(self, folder: Path, tokenizer):
        self.folder = folder
        self.tokenizer = tokenizer
        self.runs = 0

    def new_pool(self) -> Path:
        self.runs += 1
        return self.folder / f"pool{self.runs}.lmdb"

    def shared(self, path: Path):
        def make(_replica: int) -> SuffixProposer:
            pool = PersistentPool(path, tokenizer=self.tokenizer, max_depth=64,
                                  refresh_interval=0.0)
            return SuffixProposer(pool=pool)
        return make


def settle(proposer) -> None:
    """A replica's commits in the file, and the others' in its index (see ``replay.fleet``)."""
    pool = getattr(proposer, "cross", None)
    if isinstance(pool, PersistentPool):
        pool.flush()
        pool.refresh(force=True)


def engines(fleet: Fleet, replicas: int, busy: bool = False) -> dict:
    """Engine name -> factory maker (called once per deployment run)."""
    out = {"arctic": lambda: (lambda r: make_proposer("arctic", **ARCTIC)),
           "vllm-gpu": lambda: (lambda r: make_proposer("vllm-gpu", max_spec_tokens=16,
                                                        max_depth=24)),
           "suffixspec": lambda: fleet.shared(fleet.new_pool())}
    if replicas == 8 and not busy:
        out["suffixspec, own pools"] = lambda: (lambda r: SuffixProposer())
    return out


def est(res) -> float:
    return res.metrics()["est"]


def run_trace(name: str, requests, fleet: Fleet, log_file: Path, tokenizer_path: str,
              folder: Path) -> list[dict]:
    rows = []
    half = len(requests) // 2
    plans = [("one", 1, None, False), *[(f"{n} replicas", n, None, False) for n in REPLICAS],
             ("8 replicas, all busy", 8, None, True),
             (f"restart every {RESTART_EVERY}", 1, RESTART_EVERY, False)]
    for deployment, n, restart, busy in plans:
        row = {"trace": name, "deployment": deployment}
        for engine, factory in engines(fleet, n, busy).items():
            t0 = time.perf_counter()
            res = replay_fleet(requests, n, factory(), restart_every=restart, busy=busy,
                               settle=settle)
            row[engine] = est(res)
            row[engine + " detail"] = res.metrics()
            print(f"{name} {deployment} {engine}: est {row[engine]:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        rows.append(row)
    # From logs: ingest the first half's log with the CLI, then serve the second.
    row = {"trace": name, "deployment": "from logs"}
    pool = fleet.new_pool()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "suffixspec", "ingest", str(pool), str(log_file),
                    "--tokenizer", tokenizer_path, "--json"], check=True,
                   stdout=subprocess.DEVNULL)
    row["ingest_s"] = time.perf_counter() - t0
    second = requests[half:]
    live = fleet.new_pool()  # the first half served live on a pool, for comparison
    replay_fleet(requests[:half], 1, fleet.shared(live), settle=settle)
    runs = {**{engine: (fleet.shared(pool) if engine == "suffixspec" else factory())
               for engine, factory in engines(fleet, 1, False).items()},
            "suffixspec, served live": fleet.shared(live),
            "suffixspec, cold": lambda r: SuffixProposer()}
    for engine, make in runs.items():
        res = replay_fleet(second, 1, make, settle=settle)
        row[engine] = est(res)
        row[engine + " detail"] = res.metrics()
        print(f"{name} from logs {engine}: est {row[engine]:.3f}", file=sys.stderr, flush=True)
    rows.append(row)
    return rows


def first_half_log(trace: Path, kw: dict, count: int, out: Path) -> Path:
    """The first ``count`` records of the slice, as the log a server wrote."""
    with out.open("w") as f:
        for n, rec in enumerate(read_records(trace, **kw)):
            if n >= count:
                break
            f.write(json.dumps(rec) + "\n")
    return out


def visibility_lag(folder: Path, tokenizer, trials: int = 20) -> dict:
    """Milliseconds from one pool's ``finish_request`` to another pool's
    draft holding that output (both in this process, refresh at every call)."""
    import numpy as np

    path = folder / "lag.lmdb"
    a, b = (SuffixProposer(pool=PersistentPool(path, tokenizer=tokenizer, max_depth=64,
                                                refresh_interval=0.0)) for _ in range(2))
    lags = []
    rng = np.random.default_rng(0)
    for t in range(trials):
        output = rng.integers(1000, 2000, 64).astype(np.int32)
        a.start_request(f"a{t}", output[:8])
        a.extend(f"a{t}", output)
        b.start_request(f"b{t}", np.arange(5, dtype=np.int32))
        b.extend(f"b{t}", output[:16])
        t0 = time.perf_counter()
        a.finish_request(f"a{t}")
        while True:
            draft = b.propose([f"b{t}"])[0]
            if len(draft) and draft.token_ids[0] == output[16]:
                break
            if time.perf_counter() - t0 > 10:
                raise RuntimeError("another pool never saw a commit")
            time.sleep(0.0005)
        lags.append((time.perf_counter() - t0) * 1e3)
        b.abort_request(f"b{t}")
    a.close()
    b.close()
    return {"p50_ms": float(np.percentile(lags, 50)), "max_ms": float(np.max(lags))}


def main():
    ap = parser(__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="of each trace's slice")
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    tokenizer = tokenizer_id(args.tokenizer)
    warmup()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet") as tmp:
        folder = Path(tmp)
        lag = visibility_lag(folder, tokenizer)
        print(f"visibility lag: {lag}", file=sys.stderr)
        fleet = Fleet(folder, tokenizer)
        for name in args.only or list(SLICES):
            file, kw = SLICES[name]
            kw = {k: max(1, int(v * args.scale)) for k, v in kw.items()}
            trace = Path(args.traces) / file
            requests = load_trace(trace, encode, **kw)
            log = first_half_log(trace, kw, len(requests) // 2, folder / f"{name}.jsonl")
            rows.extend(run_trace(name, requests, fleet, log, args.tokenizer, folder))
    save_results(args.out, "fleet", {"visibility_lag": lag, "rows": rows}, markdown(rows, lag))


def markdown(rows: list[dict], lag: dict) -> str:
    out = ["| trace | deployment | arctic | vllm-gpu | suffixspec | suffixspec / best other |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        best = max(r["arctic"], r["vllm-gpu"])
        own = f" (own pools {r['suffixspec, own pools']:.3f})" if "suffixspec, own pools" in r \
            else ""
        if "suffixspec, served live" in r:
            own = (f" (first half served live {r['suffixspec, served live']:.3f}, cold "
                   f"{r['suffixspec, cold']:.3f})")
        out.append(f"| {r['trace']} | {r['deployment']} | {r['arctic']:.3f} | "
                   f"{r['vllm-gpu']:.3f} | {r['suffixspec']:.3f}{own} | "
                   f"{r['suffixspec'] / best:.3f} |")
    return "\n".join(out) + (
        f"\n\nest (MTS / (1 + 0.03 × drafted per step)) over the whole fleet; \"from logs\": "
        f"the second half only.  suffixspec replicas share one pool file; a commit reached "
        f"another replica's draft after {lag['p50_ms']:.1f} ms p50 ({lag['max_ms']:.1f} ms at "
        f"most) with refresh at every call (vLLM's default refresh interval is 1 s).\n")


if __name__ == "__main__":
    main()
