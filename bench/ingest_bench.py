"""Ingest at scale: `suffixspec ingest` of the shared traces, as a user runs it.

Usage (from the repository root):

    python bench/ingest_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--jobs N] [--runs 1] \\
        [--checkouts OTHER_CHECKOUT .] [--keep DIR]

Every trace file, outputs and prompts (``--include-prompts``), into a new
pool in a temporary folder, by the CLI in a fresh process (its kernels loaded
from the cache first, apart, so the figure is ingest and not compilation).
Reported from the command's own summary (``--json``): tokens stored, seconds
end to end and per phase (reading and tokenizing, storing, the snapshot
build, learning the calibration from the last requests), tokens per second
end to end and per core, and the peak resident memory of the command and its
children together (sampled every 50 ms), in all and its anonymous part (RSS
less file-backed pages: serving the held-back requests maps the snapshot just
written, whose pages are the page cache's, and on this machine's kernel a
few lookups map most of it).

``--checkouts`` runs the command of each checkout named (another commit's
worktree, say ``git worktree add /tmp/before <commit>``), one after the
other (Numba caches kernels per source file, so each has its own), so a change to ingest is timed before
and after in one run.  ``--keep DIR`` keeps each run's pool there
(``<commit>.lmdb``) for ``bench/draft_digest.py --pool``.
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

from bench_common import TRACES, copy_pool, parser, save_results

FILES = [file for file, _ in TRACES.values()]


def peak_rss(proc: psutil.Process, stop: threading.Event, out: list) -> None:
    """The largest RSS of ``proc`` and its children together until ``stop``, and
    the largest of its anonymous part (RSS less file-backed and shared pages:
    the snapshot files a process maps are page cache, not its own memory)."""
    peak = anon = 0
    while not stop.is_set():
        try:
            infos = [p.memory_info() for p in (proc, *proc.children(recursive=True))]
            peak = max(peak, sum(i.rss for i in infos))
            anon = max(anon, sum(i.rss - i.shared for i in infos))
        except psutil.Error:
            pass
        time.sleep(0.05)
    out += [peak, anon]


def cli(checkout: Path) -> tuple[list[str], dict]:
    """The command line that runs ``checkout``'s CLI, and its environment."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    return [sys.executable, "-c", "from suffixspec.cli import main; main()"], env


def commit_of(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or str(checkout)


def run_once(checkout: Path, traces: Path, tokenizer: str, jobs: int | None, extra: list[str],
             keep: Path | None) -> dict:
    prefix, env = cli(checkout)
    with tempfile.TemporaryDirectory() as tmp:
        pool = Path(tmp) / "pool.lmdb"
        cmd = [*prefix, "ingest", str(pool),
               *[str(traces / f) for f in FILES], "--tokenizer", tokenizer, "--include-prompts",
               "--json", *(["--jobs", str(jobs)] if jobs else []), *extra]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
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
        summary["peak_anon_mb"] = round(peak[1] / 2**20)
        summary["commit"] = commit_of(checkout)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            copy_pool(pool, keep / f"{summary['commit']}.lmdb")
        return summary


def markdown(rows: list[dict], cores: int) -> str:
    lines = ["| commit | run | tokens | seconds | tokens/s | per core | tokenize s | store s | snapshot s "
             "| learn s | peak RSS MB | peak anonymous MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        learn = (r.get("learned_from") or {}).get("learn_s", "")
        tps = r["tokens"] / r["wall_s"]
        lines.append(f"| {r['commit']} | {r['run']} | {r['tokens']:,} | {r['wall_s']:.1f} | {tps / 1e6:.3f}M | "
                     f"{tps / cores / 1e6:.3f}M | {r['tokenize_s']:.1f} | {r['store_s']:.1f} | "
                     f"{r['snapshot_s']:.1f} | {learn} | {r['peak_rss_mb']:,} | "
                     f"{r['peak_anon_mb']:,} |")
    return "\n".join(lines) + (f"\n\n{cores} CPUs.  seconds: the command's own, end to end "
                               "(its kernels loaded from the cache before, apart).")


def main():
    ap = parser(__doc__)
    ap.add_argument("--jobs", type=int, default=None,
                    help="ingest --jobs (default: the command's own default)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--checkouts", nargs="*", type=Path, default=[Path(".")],
                    help="checkouts whose CLI runs, one after the other (default: this one)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep each run's pool in this folder as <commit>.lmdb")
    ap.add_argument("--set", nargs="*", default=[], metavar="ARG",
                    help="more arguments for suffixspec ingest")
    args = ap.parse_args()
    rows = []
    for checkout in args.checkouts:
        checkout = checkout.resolve()
        prefix, env = cli(checkout)
        subprocess.run([*prefix, "warmup"], check=True, capture_output=True, env=env)
        for run in range(args.runs):
            rows.append({"run": run + 1, **run_once(checkout, Path(args.traces), args.tokenizer,
                                                     args.jobs, args.set, args.keep)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    cores = os.cpu_count() or 1
    save_results(args.out, "ingest", {"cpus": cores, "jobs": args.jobs, "runs": rows},
                 markdown(rows, cores))


if __name__ == "__main__":
    main()
