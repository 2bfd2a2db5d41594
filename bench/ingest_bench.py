"""Ingest at scale: `suffixspec ingest` of the shared traces, as a user runs it.

Usage (from the repository root):

    python bench/ingest_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--jobs N] [--runs 1]

Every trace file, outputs and prompts (``--include-prompts``), into a new
pool in a temporary folder, by the CLI in a fresh process (its kernels loaded
from the cache first, apart, so the figure is ingest and not compilation).
Reported from the command's own summary (``--json``): tokens stored, seconds
end to end and per phase (reading and tokenizing, storing, the snapshot
build, learning the calibration from the last requests), tokens per second
end to end and per core, and the peak resident memory of the command and its
children together (sampled every 50 ms).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench_common import TRACES, parser, save_results

FILES = [file for file, _ in TRACES.values()]


def peak_rss(proc: psutil.Process, stop: threading.Event, out: list) -> None:
    """The largest RSS of ``proc`` and its children together until ``stop``."""
    peak = 0
    while not stop.is_set():
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss
                                               for c in proc.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    out.append(peak)


def run_once(traces: Path, tokenizer: str, jobs: int | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "suffixspec.cli", "ingest", str(Path(tmp) / "pool.lmdb"),
               *[str(traces / f) for f in FILES], "--tokenizer", tokenizer, "--include-prompts",
               "--json", *(["--jobs", str(jobs)] if jobs else []), *extra]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stop, peak = threading.Event(), []
        sampler = threading.Thread(target=peak_rss, args=(psutil.Process(proc.pid), stop, peak))
        sampler.start()
        out, err = proc.communicate()
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"ingest failed ({proc.returncode}): {err[-2000:]}")
        summary = json.loads(out.strip().splitlines()[-1])
        summary["process_s"] = round(wall, 2)
        summary["peak_rss_mb"] = round(peak[0] / 2**20)
        return summary


def markdown(rows: list[dict], cores: int) -> str:
    lines = ["| run | tokens | seconds | tokens/s | per core | tokenize s | store s | snapshot s "
             "| learn s | peak RSS MB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        learn = (r.get("learned_from") or {}).get("learn_s", "")
        tps = r["tokens"] / r["wall_s"]
        lines.append(f"| {i + 1} | {r['tokens']:,} | {r['wall_s']:.1f} | {tps / 1e6:.3f}M | "
                     f"{tps / cores / 1e6:.3f}M | {r['tokenize_s']:.1f} | {r['store_s']:.1f} | "
                     f"{r['snapshot_s']:.1f} | {learn} | {r['peak_rss_mb']:,} |")
    return "\n".join(lines) + (f"\n\n{cores} CPUs.  seconds: the command's own, end to end "
                               "(its kernels loaded from the cache before, apart).")


def main():
    ap = parser(__doc__)
    ap.add_argument("--jobs", type=int, default=None,
                    help="ingest --jobs (default: the command's own default)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], metavar="ARG",
                    help="more arguments for suffixspec ingest")
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "suffixspec.cli", "warmup"], check=True,
                   capture_output=True)
    rows = []
    for _ in range(args.runs):
        rows.append(run_once(Path(args.traces), args.tokenizer, args.jobs, args.set))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cores = os.cpu_count() or 1
    save_results(args.out, "ingest", {"cpus": cores, "jobs": args.jobs, "runs": rows},
                 markdown(rows, cores))


if __name__ == "__main__":
    main()
