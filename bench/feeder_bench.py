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
one jobs file and checked to change nothing.  The same jobs go once more
through a feeder in a process of its own (``device.feeder_process``), each
step's payload waited for: its digest must be the same.

3. beside a worker (``--worker-ms``; alone, beside the feeder's thread and
   beside the feeder's process, ``--repeats`` times, interleaved): this
   thread plays the worker, a step at a time: its own host work (pure Python
   holding the interpreter lock, ``--worker-ms`` when alone) with the feeder
   working beside it on the jobs just handed over (as on a GPU, where the
   last step's snapshot lands as the worker's host work for the next one
   starts), a forward (``--forward-ms``, the lock released, as while the GPU
   runs), then ``take`` with the worker's deadline and the payload's copy.  Its lock
   wait per step is the step's wall time less its CPU time, its time waiting
   for a CPU (this thread's ``/proc`` schedstat), the forward asked for and
   its time off the CPU in ``take`` (the payload wait, shown apart): mostly
   taking the lock back after the forward, where a thread in Python holds it
   up to the switch interval, 5 ms, before handing it over.  Alone it is the
   timer's slack.  Also: its host work's wall time, its step period; the
   feeder's windows' age at each take (steps, p50 and p99) says whether it
   keeps up.  On these 2 cores the
   feeder's process competes with the worker for a core as its thread does
   not (its thread mostly waits for the lock): the lock waits are the
   figure that carries to a GPU host with cores to spare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import sys
import threading
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


def _fresh_feeder(level: int, process: bool = False):
    """A device speculator on CPU tensors for ``level`` requests, ready, and its
    feeder (in a process of its own with ``process``); its CPU so far (the
    ready job, left out of the figures)."""
    from suffixspec.integrations.vllm import device_speculator as ds

    max_reqs = max(level, 8)
    with mock.patch.dict(os.environ, {"SUFFIXSPEC_DEVICE_FEEDER_PROCESS": str(int(process))}):
        spec = ds.DeviceSuffixSpeculator(dc._config(max_reqs, 4096), torch.device("cpu"),
                                         dc.States(max_reqs, 4096, torch.device("cpu")),
                                         start=False)
    spec.start(wait=True)
    feeder = spec.drafter.feeder
    while feeder.stats.seconds == 0.0:
        if process:
            feeder.take(0, 0.0)  # reads the child's replies
        time.sleep(0.01)
    return spec, feeder, feeder.stats.cpu_seconds


def _cpu_ms(spec, feeder, before: float, steps: int) -> float:
    """The feeder's CPU milliseconds per step since ``before``, once closed
    (a child reports its last figures as it closes)."""
    spec.close()
    return round(1e3 * (feeder.stats.cpu_seconds - before) / steps, 3)


def replay(steps: list[list[tuple]], level: int, process: bool = False) -> dict:
    """One replay into a fresh feeder: its CPU per step by phase, and the digest.
    In this thread, or (``process``) handed to a feeder process a step at a
    time, each step's payload waited for."""
    from suffixspec.device.feeder import PHASES

    spec, feeder, before = _fresh_feeder(level, process)
    payloads = [b.numpy() for b in spec.drafter._host_payloads]
    digest = hashlib.blake2b(digest_size=8)
    phases0 = dict(feeder.stats.phase_cpu)
    wall = 0.0
    for n, group in enumerate(steps, start=1):
        wall0 = time.perf_counter()
        if process:
            for job in group:
                getattr(feeder, _HAND[job[0]])(*job[1:])
            b = feeder.take(n + 1, 60.0)
        else:
            feeder.handle(group)
            b = feeder.take(n + 1, 0.0)
        wall += time.perf_counter() - wall0
        if b is not None:
            digest.update(payloads[b].tobytes())
            feeder.sent(b, None)
    cpu = _cpu_ms(spec, feeder, before, len(steps))
    feeder.stats.phase_cpu = {p: t - phases0.get(p, 0.0) for p, t in feeder.stats.phase_cpu.items()}
    out = {"cpu_ms_per_step": cpu,
           "wall_ms_per_step": round(1e3 * wall / len(steps), 3),
           "phases": feeder.phases(len(steps)), "digest": digest.hexdigest(),
           "published": feeder.stats.published, "windows_built": feeder.stats.windows_built,
           "lost_requests": feeder.stats.lost_requests}
    assert set(out["phases"]) == set(PHASES)
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


def _queued(path: str) -> float:
    """This thread's seconds so far waiting for a CPU (``/proc``'s schedstat;
    its time on a CPU there is only brought up to date at a switch, so that
    comes from ``time.thread_time``)."""
    with open(path) as f:
        return int(f.read().split()[1]) / 1e9


#: The worker's runs: alone (the feeder idle), beside the feeder's thread, beside
#: the feeder's own process (``device.feeder_process``).
ARMS = ("alone", "beside", "beside_process")


def beside_worker(steps: list[list[tuple]], level: int, iters: int, forward_ms: float,
                  arm: str) -> dict:
    """The worker's step, played in this thread, with the feeder fed the
    recorded jobs (``arm``, one of ``ARMS``): per step, the host work's wall
    milliseconds and the step period; the feeder's CPU and lag."""
    from suffixspec.device.drafter import DEADLINE

    with_feeder = arm != "alone"
    spec, feeder, before = _fresh_feeder(level, process=arm == "beside_process")
    payloads, device_payload = spec.drafter._host_payloads, spec.drafter.payload
    host, period, lock, payload_wait = [], [], [], []
    stat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    forward = forward_ms / 1e3
    for n, group in enumerate(steps, start=1):
        queued0, cpu0, t0 = _queued(stat), time.thread_time(), time.perf_counter()
        if with_feeder:  # the last step's snapshot is ready as this step's host work starts
            for job in group:
                getattr(feeder, _HAND[job[0]])(*job[1:])
        _worker_host_work(iters)
        t1 = time.perf_counter()
        time.sleep(forward)
        w0, wcpu0 = time.perf_counter(), time.thread_time()
        if with_feeder:
            b = feeder.take(n + 1, DEADLINE)
            if b is not None:  # as the worker does: the payload to the device
                device_payload.copy_(payloads[b])
                feeder.sent(b, None)
        t2, cpu2, queued2 = time.perf_counter(), time.thread_time(), _queued(stat)
        waited = (t2 - w0) - (cpu2 - wcpu0)  # off the CPU in ``take``: the payload wait
        host.append(t1 - t0)
        period.append(t2 - t0)
        payload_wait.append(waited)
        # The rest of its time off a CPU, neither runnable nor asleep by choice: lock waits.
        lock.append((t2 - t0) - (cpu2 - cpu0) - (queued2 - queued0) - forward - waited)
    lag = feeder.lag()
    cpu = _cpu_ms(spec, feeder, before, len(steps))
    host_ms, period_ms = 1e3 * np.asarray(host), 1e3 * np.asarray(period)
    lock_ms = 1e3 * np.clip(lock, 0.0, None)
    return {"lock_wait_ms_mean": round(float(lock_ms.mean()), 3),
            "lock_wait_ms_p99": round(float(np.percentile(lock_ms, 99)), 3),
            "payload_wait_ms_mean": round(1e3 * float(np.mean(payload_wait)), 3),
            "host_ms_p50": round(float(np.median(host_ms)), 3),
            "host_ms_mean": round(float(host_ms.mean()), 3),
            "host_ms_p99": round(float(np.percentile(host_ms, 99)), 3),
            "period_ms_mean": round(float(period_ms.mean()), 3),
            "feeder_cpu_ms_per_step": cpu if with_feeder else 0.0,
            **({"age_p50": lag["age_p50"], "age_p99": lag["age_p99"],
                "taken": lag["taken"], "waits_timed_out": lag["waits_timed_out"],
                "wait_ms_per_take": lag["wait_ms_per_take"]} if with_feeder else {})}


def worker_loss(steps, level: int, worker_ms: float, forward_ms: float, repeats: int) -> dict:
    """Alone and beside the feeder's thread and its process (``ARMS``),
    ``repeats`` times each, interleaved; the medians of the runs, and the
    worker's loss per step beside each (beside less alone)."""
    iters = _calibrate(worker_ms)
    for arm in ARMS[1:]:  # first: anything loaded on first use
        beside_worker(steps, level, iters, forward_ms, arm)
    runs = {arm: [] for arm in ARMS}
    for _ in range(repeats):
        for arm in ARMS:
            runs[arm].append(beside_worker(steps, level, iters, forward_ms, arm))
    med = {k: {f: round(float(np.median([r[f] for r in v])), 3) for f in v[0]}
           for k, v in runs.items()}
    alone = med["alone"]
    return {"worker_ms": worker_ms, "forward_ms": forward_ms, "repeats": repeats,
            "median": med, "runs": runs,
            **{f"{arm}_lock_wait_loss_ms_mean": round(med[arm]["lock_wait_ms_mean"]
                                                       - alone["lock_wait_ms_mean"], 3)
               for arm in ARMS[1:]},
            **{f"{arm}_host_loss_ms_mean": round(med[arm]["host_ms_mean"]
                                                  - alone["host_ms_mean"], 3)
               for arm in ARMS[1:]},
            **{f"{arm}_period_loss_ms_mean": round(med[arm]["period_ms_mean"]
                                                    - alone["period_ms_mean"], 3)
               for arm in ARMS[1:]}}


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
    # The same jobs through a feeder process, each step's payload waited for: the
    # same payloads (its digest), and its CPU per step in the child.
    in_process = replay(steps, args.level, process=True)
    report["process"] = {f: in_process[f] for f in ("digest", "cpu_ms_per_step",
                                                    "wall_ms_per_step", "published")}
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
        + " | ".join(str(v) for v in best["phases"].values()) + " |", "",
        f"In a feeder process, each step's payload waited for: digest "
        f"{report['process']['digest']}, payloads {report['process']['published']}, "
        f"{report['process']['cpu_ms_per_step']} CPU ms per step in the child, "
        f"{report['process']['wall_ms_per_step']} ms per step from the jobs handed over "
        f"to the payload taken."]
        + (worker_table(report["worker"]) if "worker" in report else []))


def worker_table(w: dict) -> list[str]:
    """The worker's step alone and beside the feeder's thread and its process
    (medians of the runs)."""
    from suffixspec.device.drafter import DEADLINE

    names = {"alone": "alone", "beside": "beside the feeder's thread",
             "beside_process": "beside the feeder's process"}
    rows = []
    for arm in ARMS:
        m = w["median"][arm]
        lag = (f"{m['feeder_cpu_ms_per_step']} | {m['age_p50']:g} / {m['age_p99']:g} | "
               f"{m['waits_timed_out']:g} |" if arm != "alone" else " | | |")
        rows.append(f"| {names[arm]} | {m['lock_wait_ms_mean']} | {m['lock_wait_ms_p99']} | "
                    f"{m['payload_wait_ms_mean']} | {m['host_ms_mean']} | {m['host_ms_p99']} | "
                    f"{m['period_ms_mean']} | {lag}")
    return [
        "", f"A worker-shaped thread beside the feeder: its own host work {w['worker_ms']} ms "
        f"of Python per step alone, a {w['forward_ms']} ms forward with the lock released, "
        f"the worker's {1e3 * DEADLINE:g} ms deadline; medians of {w['repeats']} runs each.", "",
        "| worker | lock wait ms (mean) | lock wait ms (p99) | payload wait ms (mean) "
        "| host work ms (mean) | host work ms (p99) | step ms (mean) | feeder CPU ms per step "
        "| windows' age p50 / p99 (steps) | waits timed out |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "Lock wait: the step's wall time less its CPU time (``time.thread_time``), its time "
        "waiting for a CPU (``/proc``'s schedstat for this thread), the forward and the "
        "payload wait (off the CPU in ``take``). Alone it is the timer's slack.", "",
        f"Beside the feeder's thread the worker waits {w['beside_lock_wait_loss_ms_mean']} ms "
        f"more per step for the lock than alone, and its step takes "
        f"{w['beside_period_loss_ms_mean']} ms longer; beside the feeder's process "
        f"{w['beside_process_lock_wait_loss_ms_mean']} ms and "
        f"{w['beside_process_period_loss_ms_mean']} ms."]


if __name__ == "__main__":
    main()
