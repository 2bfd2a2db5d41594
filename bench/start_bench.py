"""How long the README's first command takes to show something and to finish.

Usage (from the repository root):

    python bench/start_bench.py [--out bench/results] [--runs 2]

Runs ``suffixspec replay`` (the built-in workload) in a fresh process, first
with an empty Numba cache (``NUMBA_CACHE_DIR`` pointing at a new folder: a
newcomer's first run, which compiles every kernel), then again with that
cache filled (every later run).  For each: seconds until the first byte on
stdout or stderr, and until the process ended.  Writes ``start.json`` and
``start.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import save_results

COMMAND = [str(Path(sys.executable).with_name("suffixspec")), "replay"]


def timed_run(cache: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    t0 = time.monotonic()
    proc = subprocess.Popen(COMMAND, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    first = None
    open_streams = 2
    while open_streams:
        for key, _ in sel.select():
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
            elif first is None:
                first = time.monotonic() - t0
    code = proc.wait()
    return {"first_output_s": round(first, 2), "total_s": round(time.monotonic() - t0, 2),
            "exit_code": code}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--runs", type=int, default=2, help="warm runs after the cold one")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="suffixspec-numba-"))
    try:
        rows = [{"run": "cold (empty kernel cache)", **timed_run(cache)}]
        rows += [{"run": f"warm {i + 1}", **timed_run(cache)} for i in range(args.runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    md = "\n".join(["| `suffixspec replay` | first output | total |", "|---|---|---|",
                    *(f"| {r['run']} | {r['first_output_s']:.1f} s | {r['total_s']:.1f} s |"
                      for r in rows)])
    save_results(args.out, "start", {"command": " ".join(COMMAND[1:]), "runs": rows,
                                     "cpus": os.cpu_count()}, md)


if __name__ == "__main__":
    main()
