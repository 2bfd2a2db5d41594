"""The window feeder's host work per step, replayed from recorded jobs.

    PYTHONPATH=.:bench python bench/feeder_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--jobs bench/cache/feeder_jobs_b64.pkl]

On a GPU the feeder's Python runs beside the worker's and holds the
interpreter lock while it does (at 64 in flight it cost the step 0.9-1.8 ms,
``docs/device.md``).  This measures that work alone, on the CPU:

1. record (once, or when ``--jobs`` does not exist): ``device_check``'s
   synthetic MRV2 loop on CPU tensors, with the device speculator at
   ``--level`` requests in flight over the sql trace, keeping a copy of every
   job the worker hands the feeder (requests added, step snapshots, finished
   requests' tails);
2. replay ``--repeats`` times (after one not counted): the same jobs, a step at a time, into a fresh
   speculator's feeder (``WindowFeeder.handle``) in this thread, with nothing
   else running.  Per repeat: the feeder's CPU per step, by phase
   (``feeder.PHASES``), and a digest of every payload it published.

Prints the minimum over repeats per phase and in all, and the digest: two
versions of the code that publish the same payloads from the same jobs have
the same digest, so a trim of the feeder is timed against its parent on
one jobs file and checked to change nothing.

3. beside a worker (``--worker-ms``, one run alone and one beside the feeder,
   ``--repeats`` times): this thread plays the worker, a step at a time: its
   own host work (pure Python holding the interpreter lock, ``--worker-ms``
   when alone), the step's jobs handed to the feeder's thread as the device
   speculator hands them, a forward (``--forward-ms``, the lock released, as
   while the GPU runs), then ``take`` with the worker's deadline.  What the
   worker loses is its host work's wall time beside the feeder less alone
   (the lock waits: a thread in Python holds the lock up to the switch
   interval, 5 ms, before handing it over) and its waits for the payload;
   the feeder's windows' age at each take (steps, p50 and p99) says whether
   it keeps up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import device_check as dc  # noqa: E402
from provenance import run_meta  # noqa: E402

STARTED = run_meta("feeder_bench")  # taken at the start: the code that runs

JOBS_FORMAT = 2  # 2: the add job carries its event


def record(traces: str | None, tokenizer: str | None, level: int,
           steps: int) -> list[list[tuple]]:
    """The loop's jobs for the feeder, grouped by step (each group ends with the
    step's snapshot), as numpy copies.  Without ``traces``, ``device_check``'s
    synthetic requests."""
    from suffixspec.device.feeder import WindowFeeder

    jobs: list[tuple] = []
    real = {name: getattr(WindowFeeder, name) for name in ("add", "snapshot", "finished")}

    def add(self, req_id, slot, epoch, tokens, prompt_len, event=None):
        jobs.append(("add", req_id, slot, epoch, np.array(tokens.numpy(), np.int32), prompt_len,
                     None))
        real["add"](self, req_id, slot, epoch, tokens, prompt_len, event)

    def snapshot(self, step, rows, req_ids, event):
        jobs.append(("snapshot", step, np.array(rows.numpy()), list(req_ids), None))
        real["snapshot"](self, step, rows, req_ids, event)

    def finished(self, req_ids, tails, event):
        jobs.append(("finish", list(req_ids), np.array(tails.numpy()), None))
        real["finished"](self, req_ids, tails, event)

    requests = dc._requests(traces, tokenizer, dc.LOOP_REQUESTS, np.random.default_rng(3))
    with mock.patch.multiple(WindowFeeder, add=add, snapshot=snapshot, finished=finished):
        dc.loop(torch.device("cpu"), "device", level, steps, requests, 4096)
    steps_of, group = [], []
    for job in jobs:
        group.append(job)
        if job[0] == "snapshot":
            steps_of.append(group)
            group = []
    return steps_of


def _fresh_feeder(level: int):
    """A device speculator on CPU tensors for ``level`` requests, ready, and its
    feeder with its figures counted from here (the ready job runs on the
    feeder's own thread and is left out)."""
    from suffixspec.integrations.vllm import device_speculator as ds

    max_reqs = max(level, 8)
    spec = ds.DeviceSuffixSpeculator(dc._config(max_reqs, 4096), torch.device("cpu"),
                                     dc.States(max_reqs, 4096, torch.device("cpu")),
                                     start=False)
    spec.start(wait=True)
    feeder = spec.drafter.feeder
    while feeder.stats.seconds == 0.0:
        time.sleep(0.01)
    feeder.stats = type(feeder.stats)()
    return spec, feeder


def replay(steps: list[list[tuple]], level: int) -> dict:
    """One replay into a fresh feeder: its CPU per step by phase, and the digest."""
    from suffixspec.device.feeder import PHASES

    spec, feeder = _fresh_feeder(level)
    payloads = [b.numpy() for b in spec.drafter._host_payloads]
    digest = hashlib.blake2b(digest_size=8)
    cpu = wall = 0.0
    for n, group in enumerate(steps, start=1):
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        feeder.handle(group)
        cpu, wall = cpu + time.thread_time() - cpu0, wall + time.perf_counter() - wall0
        b = feeder.take(n + 1, 0.0)
        if b is not None:
            digest.update(payloads[b].tobytes())
    out = {"cpu_ms_per_step": round(1e3 * cpu / len(steps), 3),
           "wall_ms_per_step": round(1e3 * wall / len(steps), 3),
           "phases": feeder.phases(len(steps)), "digest": digest.hexdigest(),
           "published": feeder.stats.published, "windows_built": feeder.stats.windows_built,
           "lost_requests": feeder.stats.lost_requests}
    assert set(out["phases"]) == set(PHASES)
    spec.close()
    return out


def _worker_host_work(n: int) -> int:
    """Pure Python, holding the interpreter lock throughout: a worker's own
    host work in a step (scheduling, input preparation)."""
    acc = 0
    for i in range(n):
        acc = (acc + i * 7) % 1000003
    return acc


def _calibrate(ms: float) -> int:
    """Iterations of ``_worker_host_work`` taking ``ms`` on this thread alone."""
    n = 20000
    while True:
        t0 = time.perf_counter()
        _worker_host_work(n)
        took = time.perf_counter() - t0
        if took > 0.02:
            return max(1, int(n * ms / 1e3 / took))
        n *= 2


_HAND = {"add": "add", "snapshot": "snapshot", "finish": "finished", "forget": "forget"}


def beside_worker(steps: list[list[tuple]], level: int, iters: int, forward_ms: float,
                  with_feeder: bool) -> dict:
    """The worker's step, played in this thread, with the feeder's thread fed
    the recorded jobs (or idle, ``with_feeder`` False): per step, the host
    work's wall milliseconds and the step period; the feeder's lag."""
    from suffixspec.device.drafter import DEADLINE

    spec, feeder = _fresh_feeder(level)
    host, period = [], []
    for n, group in enumerate(steps, start=1):
        t0 = time.perf_counter()
        _worker_host_work(iters)
        t1 = time.perf_counter()
        if with_feeder:
            for job in group:
                getattr(feeder, _HAND[job[0]])(*job[1:])
        time.sleep(forward_ms / 1e3)
        if with_feeder:
            feeder.take(n + 1, DEADLINE)
        host.append(t1 - t0)
        period.append(time.perf_counter() - t0)
    lag = feeder.lag()
    spec.close()
    host_ms, period_ms = 1e3 * np.asarray(host), 1e3 * np.asarray(period)
    return {"host_ms_p50": round(float(np.median(host_ms)), 3),
            "host_ms_mean": round(float(host_ms.mean()), 3),
            "host_ms_p99": round(float(np.percentile(host_ms, 99)), 3),
            "period_ms_mean": round(float(period_ms.mean()), 3),
            "feeder_cpu_ms_per_step": round(1e3 * feeder.stats.cpu_seconds / len(steps), 3),
            **({"age_p50": lag["age_p50"], "age_p99": lag["age_p99"],
                "taken": lag["taken"], "waits_timed_out": lag["waits_timed_out"],
                "wait_ms_per_take": lag["wait_ms_per_take"]} if with_feeder else {})}


def worker_loss(steps, level: int, worker_ms: float, forward_ms: float, repeats: int) -> dict:
    """Alone and beside the feeder, ``repeats`` times each, interleaved; the
    medians of the runs, and the worker's loss per step (beside less alone)."""
    iters = _calibrate(worker_ms)
    beside_worker(steps, level, iters, forward_ms, True)  # first: anything loaded on first use
    runs = {"alone": [], "beside": []}
    for _ in range(repeats):
        runs["alone"].append(beside_worker(steps, level, iters, forward_ms, False))
        runs["beside"].append(beside_worker(steps, level, iters, forward_ms, True))
    med = {k: {f: round(float(np.median([r[f] for r in v])), 3) for f in v[0]}
           for k, v in runs.items()}
    return {"worker_ms": worker_ms, "forward_ms": forward_ms, "repeats": repeats,
            "median": med, "runs": runs,
            "host_loss_ms_mean": round(med["beside"]["host_ms_mean"]
                                       - med["alone"]["host_ms_mean"], 3),
            "period_loss_ms_mean": round(med["beside"]["period_ms_mean"]
                                         - med["alone"]["period_ms_mean"], 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--level", type=int, default=64, help="requests in flight")
    ap.add_argument("--steps", type=int, default=400, help="loop steps recorded")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--jobs", default=None,
                    help="recorded jobs (made when missing; default "
                         "bench/cache/feeder_jobs_b<level>.pkl)")
    ap.add_argument("--worker-ms", type=float, default=2.0,
                    help="the worker's own host work per step, alone (0: not timed beside "
                         "a worker)")
    ap.add_argument("--forward-ms", type=float, default=6.5)
    ap.add_argument("--out", default=None, help="a JSON file for the figures")
    args = ap.parse_args()
    os.environ.setdefault("SUFFIXSPEC_LOG_INTERVAL", "0")
    os.environ.setdefault("SUFFIXSPEC_DRAFT_COST", "0.03")
    tokenizer = str(Path(args.tokenizer) / "tokenizer.json"
                    if Path(args.tokenizer).is_dir() else args.tokenizer)
    from suffixspec.kernels import compile_in_parallel
    from suffixspec.native.warmup import DEVICE, STEPS

    compile_in_parallel(STEPS + DEVICE)
    path = Path(args.jobs or ROOT / "bench" / "cache" / f"feeder_jobs_b{args.level}.pkl")
    if path.is_file():
        with path.open("rb") as f:
            saved = pickle.load(f)
        if saved.get("format") != JOBS_FORMAT or saved.get("level") != args.level:
            sys.exit(f"{path}: recorded in another format or at another level; remove it")
        steps = saved["steps"]
    else:
        steps = record(args.traces, tokenizer, args.level, args.steps)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump({"format": JOBS_FORMAT, "level": args.level, "steps": steps}, f)
    replay(steps, args.level)  # first: anything compiled or loaded on first use
    runs = [replay(steps, args.level) for _ in range(args.repeats)]
    digests = {r["digest"] for r in runs}
    best = {"cpu_ms_per_step": min(r["cpu_ms_per_step"] for r in runs),
            "wall_ms_per_step": min(r["wall_ms_per_step"] for r in runs),
            "phases": {p: min(r["phases"][p] for r in runs) for p in runs[0]["phases"]}}
    shown = path.resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    report = {**STARTED, "jobs": str(shown), "steps": len(steps), "level": args.level,
              "repeats": args.repeats, "min": best,
              "cpu_ms_per_step_all": [r["cpu_ms_per_step"] for r in runs],
              "digest": runs[0]["digest"] if len(digests) == 1 else sorted(digests),
              "published": runs[0]["published"], "windows_built": runs[0]["windows_built"],
              "lost_requests": runs[0]["lost_requests"]}
    if args.worker_ms > 0:
        report["worker"] = worker_loss(steps, args.level, args.worker_ms, args.forward_ms,
                                       args.repeats)
    report["table"] = markdown(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(report["table"])


def markdown(report: dict) -> str:
    """The feeder's host work per step, the smallest of the repeats, by phase."""
    best = report["min"]
    phases = " | ".join(best["phases"])
    return "\n".join([
        f"{report['steps']} recorded steps at {report['level']} in flight, replayed "
        f"{report['repeats']} times (smallest shown); digest {report['digest']}, payloads "
        f"{report['published']}, windows built {report['windows_built']}, requests lost "
        f"{report['lost_requests']}.", "",
        f"| CPU ms per step | wall ms per step | {phases} |",
        "|---|---|" + "---|" * len(best["phases"]),
        f"| {best['cpu_ms_per_step']} | {best['wall_ms_per_step']} | "
        + " | ".join(str(v) for v in best["phases"].values()) + " |"]
        + (worker_table(report["worker"]) if "worker" in report else []))


def worker_table(w: dict) -> list[str]:
    """The worker's step alone and beside the feeder (medians of the runs)."""
    from suffixspec.device.drafter import DEADLINE

    a, b = w["median"]["alone"], w["median"]["beside"]
    return [
        "", f"A worker-shaped thread beside the feeder: its own host work {w['worker_ms']} ms "
        f"of Python per step alone, a {w['forward_ms']} ms forward with the lock released, "
        f"the worker's {1e3 * DEADLINE:g} ms deadline; medians of {w['repeats']} runs each.", "",
        "| worker | host work ms (mean) | host work ms (p99) | step ms (mean) "
        "| feeder CPU ms per step | windows' age p50 / p99 (steps) | waits timed out |",
        "|---|---|---|---|---|---|---|",
        f"| alone | {a['host_ms_mean']} | {a['host_ms_p99']} | {a['period_ms_mean']} | "
        f"| | |",
        f"| beside the feeder | {b['host_ms_mean']} | {b['host_ms_p99']} | "
        f"{b['period_ms_mean']} | {b['feeder_cpu_ms_per_step']} | "
        f"{b['age_p50']:g} / {b['age_p99']:g} | {b['waits_timed_out']:g} |", "",
        f"The worker loses {w['host_loss_ms_mean']} ms per step to lock waits in its host "
        f"work and {w['period_loss_ms_mean']} ms per step in all."]


if __name__ == "__main__":
    main()
