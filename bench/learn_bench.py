"""``ingest --learn`` on a long multi-turn log: time, peak memory, and kills.

Usage (from the repository root):

    python bench/learn_bench.py --tokenizer ../shared/tokenizers/qwen --out bench/results \
        [--turns 200] [--prompt-kb 64] [--kills 5]

The log is one conversation of ``--turns`` turns (trace format, ``prompt``
then ``prompt_delta``), each turn ``--prompt-kb`` KB of new prompt text
(words drawn at random) and a short output.  Each ``suffixspec ingest`` runs
in a child process: its wall time and peak RSS (VmHWM) with ``--learn 0`` and
``--learn 256``.  Then ``--kills`` runs of ``--learn 256``, each killed with
SIGKILL at a random moment and run again to the end: records lost, records
stored twice (by record id and tokens), against the unkilled run's pool.

Writes ``learn.json`` and ``learn.md`` into ``--out`` and prints the Markdown.
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
from collections import Counter
from pathlib import Path

from bench_common import save_results

# Runs the CLI in this child, then prints its peak RSS (MB) as the last stderr line.
CLI = r"""
import sys
from suffixspec.cli import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
print(f"peak_rss_mb {peak / 1024:.1f}", file=sys.stderr)
sys.exit(code)
"""


def write_log(path: Path, turns: int, prompt_kb: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]

    def text(kb: int) -> str:
        out, size = [], 0
        while size < kb * 1024:
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    with open(path, "w") as f:
        for t in range(turns):
            rec = {"id": f"conv#{t}", "session": "conv", "turn": t,
                   "output": f"step {t}: " + text(1)}
            rec["prompt" if t == 0 else "prompt_delta"] = text(prompt_kb)
            f.write(json.dumps(rec) + "\n")


def ingest(pool: Path, log: Path, tokenizer: str, learn: int, timeout: float = 3600):
    """Run ``suffixspec ingest`` in a child; returns (wall s, peak RSS MB, summary)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CLI, "ingest", str(pool), str(log),
                           "--tokenizer", tokenizer, "--learn", str(learn), "--json"],
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"ingest failed: {proc.stderr[-2000:]}")
    peak = float(proc.stderr.strip().splitlines()[-1].split()[1])
    return wall, peak, json.loads(proc.stdout.strip().splitlines()[-1])


def records(pool: Path) -> Counter:
    from suffixspec.pools.identity import record_key
    from suffixspec.pools.store import PoolStore

    with PoolStore(pool, readonly=True) as store:
        return Counter(record_key(q.namespace, q.request_id, q.tokens) for q in store.sequences())


def killed_runs(tmp: Path, log: Path, tokenizer: str, reference: Counter, runs: int,
                span: float) -> dict:
    out = {"runs": runs, "killed_before_done": 0, "lost": 0, "doubled": 0, "other": 0,
           "learning_file_left": 0}
    rng = random.Random(1)
    for k in range(runs):
        pool = tmp / f"killed{k}" / "pool.lmdb"
        pool.parent.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", CLI, "ingest", str(pool), str(log),
                                 "--tokenizer", tokenizer, "--learn", "256", "--json"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.1, span))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            out["killed_before_done"] += 1
        proc.wait()
        ingest(pool, log, tokenizer, 256)  # the same command again, to the end
        got = records(pool)
        out["lost"] += sum((reference - got).values())
        out["doubled"] += sum((got - reference).values())
        out["learning_file_left"] += pool.with_name(pool.name + ".learning").exists()
    return out


def markdown(r: dict) -> str:
    a, b, k = r["learn_0"], r["learn_256"], r["killed"]
    return "\n".join([
        f"One conversation of {r['turns']} turns, {r['prompt_kb']} KB of new prompt text per "
        f"turn ({r['log_mb']:.1f} MB log), qwen tokenizer; `suffixspec ingest` in a child "
        f"process each run.", "",
        "| run | wall s | peak RSS MB | sequences | learned from |", "|---|---|---|---|---|",
        f"| `--learn 0` | {a['wall_s']:.1f} | {a['peak_rss_mb']:.0f} | {a['sequences']} | |",
        f"| `--learn 256` | {b['wall_s']:.1f} | {b['peak_rss_mb']:.0f} | {b['sequences']} | "
        f"{b['learned_requests']} requests |", "",
        f"`--learn 256` / `--learn 0` time: **{b['wall_s'] / a['wall_s']:.2f}x**.", "",
        f"Killed with SIGKILL at a random moment, then run again: {k['runs']} runs "
        f"({k['killed_before_done']} killed before done): records lost {k['lost']}, stored "
        f"twice {k['doubled']}, learning files left {k['learning_file_left']}."])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--prompt-kb", type=int, default=64)
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="suffixspec-learn-"))
    try:
        log = tmp / "conversation.jsonl"
        write_log(log, args.turns, args.prompt_kb)
        r = {"turns": args.turns, "prompt_kb": args.prompt_kb,
             "log_mb": log.stat().st_size / 2**20}
        for learn in (0, 256):
            pool = tmp / f"learn{learn}" / "pool.lmdb"
            pool.parent.mkdir()
            wall, peak, summary = ingest(pool, log, args.tokenizer, learn)
            r[f"learn_{learn}"] = {"wall_s": round(wall, 2), "peak_rss_mb": peak,
                                   "sequences": summary["sequences"],
                                   "learned_requests": summary.get("learned_from", {}).get(
                                       "requests", 0)}
            print(f"--learn {learn}: {wall:.1f} s, {peak:.0f} MB", file=sys.stderr)
        reference = records(tmp / "learn256" / "pool.lmdb")
        r["killed"] = killed_runs(tmp, log, args.tokenizer, reference, args.kills,
                                  r["learn_256"]["wall_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    save_results(args.out, "learn", r, markdown(r))


if __name__ == "__main__":
    main()
