"""The checks of drafting on the device, in one run, for a lent GPU (or the CPU).

    PYTHONPATH=. python bench/device_check.py --out "$OUT" [--device cuda]

It needs torch, Triton and Numba, and suffixspec's own dependencies (carry
their wheels: ``bench/device_wheels.sh``); no vLLM (a request state of MRV2's
shape stands in).  ``--device cpu`` runs every part small, as a smoke test
(the test suite does); on an H100 it took 106 s, plus about a minute to
compile the Numba kernels on a cold cache.  Writes ``device_check.json``
after each part (a run stopped at its limit keeps what it did):

1. ``correctness``: the fused Triton kernel against the torch reference on
   random cases at 1, 8, 32 and 64 rows, the Triton scans (own history,
   family rows) against the torch scans (on the device), and the open
   outputs' corpus voting with a corpus (torch on the device and on the CPU,
   and the Triton vote);
2. ``device_time``: one drafting step (scans of the own history and of a
   full family row, corpus, the other rows' open outputs, one-token paths,
   the fused kernel) at 1 / 8 /
   32 / 64 in flight with histories of 2K and 16K tokens: median of
   CUDA-event timings as launched, the scan alone, the torch operations a
   step issues; on a GPU also the GPU's time with the
   host ahead (a busy kernel first) and the host's time, kernel by kernel
   and replayed as a CUDA graph (``device.graphs``), and whether the replay
   equals the step run kernel by kernel;
3. ``no_sync``: 300 steps of ``DeviceSuffixSpeculator.propose`` (and its
   ``on_requests_finished``) under ``torch.cuda.set_sync_debug_mode("error")``
   (GPU only), with its graphs recorded;
4. ``loop``: a synthetic MRV2 step loop (a busy kernel stands in for a
   6.5 ms forward, the host one step ahead with 0.3 ms of emulated host work,
   a real proposer over the sql trace when ``--traces`` names it) with no
   drafter, the synchronous speculator and the device speculator kernel by
   kernel and as graphs: step period p50 / p99, tokens per step, the worker's
   time in ``propose``, and for the device the feeder's CPU per step (waiting
   for a snapshot's event included: CUDA spins) and its split by phase
   (``feeder.PHASES``, the wait apart), how old the windows were when
   used (steps), how often the one bounded wait ran out and how long the
   worker waited.  ``device_process``: the feeder in a process of its own
   (``device.feeder_process``).  ``device_idle`` (not run by default) tells the feeder
   nothing: the device's part of a step without the host's.  All speculators
   draft from the first step (the kernels are compiled first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch
from provenance import run_meta

STARTED = run_meta("device_check")  # taken at the start: the code that runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K = 16
#: The device speculator's loop variants: as served, kernel by kernel (no CUDA
#: graphs), and with its feeder told nothing (the device's part of a step alone).
DEVICE_VARIANTS = ("device", "device_eager", "device_idle", "device_process")
FORWARD_S = 6.5e-3
#: Requests the loop serves: on the sql trace some 240 steps at 64 in flight
#: (400 gave about 105, too few for a steady p50).
LOOP_REQUESTS = 1000
HOST_S = 0.3e-3


def now(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


# ---------------------------------------------------------------- 1. correctness
def correctness(device, cases: int, batches=(1, 8, 32, 64)) -> dict:
    from suffixspec.device.cases import compare_fused
    from suffixspec.device.draft_ref import own_history_scan
    from suffixspec.device.draft_triton import scan_triton

    rng = np.random.default_rng(11)
    out = {}
    for b in batches:
        mismatches, rows = compare_fused(rng, cases, device, batch=b)
        out[f"fused_b{b}"] = {"cases": cases, "rows": rows, "mismatches": len(mismatches),
                              "first": mismatches[:2]}
    bad = 0
    for _ in range(cases):
        width = int(rng.choice([64, 700, 3000]))
        hist = torch.from_numpy(rng.integers(0, 3, (8, width))).to(device, torch.int32)
        slots = torch.from_numpy(rng.choice(8, 4, replace=False)).to(device)
        total = torch.from_numpy(rng.integers(1, width + 1, 4)).to(device)
        want = own_history_scan(hist[slots], total, 24)
        got = scan_triton(hist, total, slots, 24)
        bad += not all(torch.equal(a, c) for a, c in zip(want, got))
    out["scan"] = {"cases": cases, "mismatches": bad}
    from suffixspec.device.draft_ref import context_tail, suffix_scan
    from suffixspec.device.draft_triton import family_scan_triton

    bad = 0
    for _ in range(cases):
        width = int(rng.choice([64, 700, 2050]))
        hist = torch.from_numpy(rng.integers(0, 3, (8, 300))).to(device, torch.int32)
        family = torch.from_numpy(rng.integers(-1, 3, (8, width))).to(device, torch.int32)
        family_len = torch.from_numpy(rng.integers(0, width + 1, 8)).to(device, torch.int32)
        slots = torch.from_numpy(rng.choice(8, 4, replace=False)).to(device)
        total = torch.from_numpy(rng.integers(1, 301, 4)).to(device)
        want = suffix_scan(family[slots], family_len[slots], context_tail(hist, total, 24, slots))
        got = family_scan_triton(family, family_len, hist, total, slots, 24)
        bad += not all(torch.equal(a, c) for a, c in zip(want, got))
    out["family_scan"] = {"cases": cases, "mismatches": bad}
    if device.type == "cuda":  # (on the CPU the tests hold it under the interpreter)
        from suffixspec.device.corpus import DeviceCorpus
        from suffixspec.device.draft_ref import context_tail
        from suffixspec.device.draft_triton import corpus_triton

        bad = 0
        for _ in range(cases):
            corpus = DeviceCorpus(int(rng.choice([64, 4096])), device)
            for _ in range(int(rng.integers(1, 20))):
                corpus.ingest(torch.from_numpy(rng.integers(0, 4, 40)).to(device, torch.int32))
            ctx = torch.from_numpy(rng.integers(0, 4, (8, 60))).to(device, torch.int32)
            total = torch.from_numpy(rng.integers(4, 61, 8)).to(device)
            tail = context_tail(ctx, total, 24)
            want = corpus.draft(tail, 24, K)
            got = corpus_triton(corpus, tail, 24, K)
            bad += not all(torch.equal(a, c) for a, c in zip(want, got))
        out["corpus"] = {"cases": cases, "mismatches": bad}
    out["live"] = {"cases": cases, "mismatches": live_mismatches(device, cases, rng)}
    return out


def live_mismatches(device, cases: int, rng) -> int:
    """The open outputs' corpus (``LiveCorpus``) indexing rows as they grow,
    then drafting: on ``device`` against the same on CPU tensors, and on a GPU
    the Triton vote (``live_triton``) against the torch one; cases that differ."""
    from suffixspec.device.corpus import LiveCorpus
    from suffixspec.device.draft_ref import context_tail

    bad = 0
    for _ in range(cases):
        hist = torch.from_numpy(rng.integers(0, 4, (16, 200)).astype(np.int32))
        slots = torch.from_numpy(rng.choice(16, 8, replace=False))
        final = torch.from_numpy(rng.integers(8, 201, 16).astype(np.int32))
        results = []
        for dev in (torch.device("cpu"), device):
            live = LiveCorpus(16, 2 * (K + 1), device=dev)
            h, s = hist.to(dev), slots.to(dev)
            for slot in range(16):
                live.start(slot, 4)
            shown = torch.full_like(final, 4)
            while (shown < final).any():
                shown = torch.minimum(shown + 5, final)
                live.tick()
                live.index(h, shown.to(dev), s)
            total = shown.to(dev)
            tail = context_tail(h, total[s].to(torch.int64), 24, s)
            results.append([x.cpu() for x in live.draft(h, total, s, tail, 24, K)])
            if dev.type == "cuda":
                from suffixspec.device.draft_triton import live_triton

                got = live_triton(live, h, total, s, tail, 24, K)
                results.append([x.cpu() for x in got])
        bad += not all(all(torch.equal(a, c) for a, c in zip(results[0], r))
                       for r in results[1:])
    return bad


# ------------------------------------------------------------ 2. device time
def _state(device, b: int, history: int, max_len: int, rng):
    """A drafting state with ``b`` requests of ``history`` tokens, full windows."""
    from suffixspec.device.corpus import DeviceCorpus, LiveCorpus, OneTokenPaths
    from suffixspec.device.draft_ref import StepOutputs
    from suffixspec.device.layout import Calibration, DeviceWindows, WindowSpec, family_width
    from suffixspec.native import calibration as cal

    spec = WindowSpec(k=K, family=family_width(2))  # the default family_outputs
    slots = max(b, 64)
    hist = torch.from_numpy(rng.integers(0, 500, (slots, max_len))).to(device, torch.int32)
    total = torch.full((slots,), history, dtype=torch.int32, device=device)
    windows = DeviceWindows(spec, slots, device)
    windows.tokens[:] = torch.from_numpy(rng.integers(0, 500, tuple(windows.tokens.shape))).to(
        device, torch.int32)
    windows.c[:] = 1
    windows.n[:] = 2
    windows.meta[:, :, 2] = spec.head
    windows.meta[:, :, 3] = spec.width
    windows.meta[:, :, 4] = history
    windows.family[:] = torch.from_numpy(rng.integers(0, 500, tuple(windows.family.shape))).to(
        device, torch.int32)
    windows.family_len[:] = spec.family
    calibration = Calibration(device)
    calibration.params[:] = torch.tensor(Calibration.host_params(
        cal.new_state(0.0), 0.0, -1.0, 0.0, 64, reference=True))
    corpus = DeviceCorpus(1 << 20, device)
    for _ in range(64):
        corpus.ingest(torch.from_numpy(rng.integers(0, 500, 2000)).to(device, torch.int32))
    paths = OneTokenPaths(152_000, K, device)
    out = StepOutputs.empty(slots, K, device)
    idx = torch.arange(b, device=device)
    sampled = torch.ones(b, dtype=torch.int64, device=device)
    live = LiveCorpus(slots, 1000, device=device)  # each row's last 1,000 tokens indexed
    for slot in range(slots):
        live.start(slot, max(history - 1000, 0))
    live.index(hist, total, torch.arange(slots, device=device))
    live.window = 2 * (K + 1)
    return spec, hist, total, windows, calibration, corpus, paths, out, idx, sampled, live


def _step_fn(device, state):
    from suffixspec.device.draft_ref import draft_step, fused_ref

    spec, hist, total, windows, calibration, corpus, paths, out, idx, sampled, live = state
    cuda = device.type == "cuda"
    if cuda:
        from suffixspec.device.draft_triton import (corpus_triton, family_scan_triton,
                                                    fused_triton, live_triton, scan_triton)
    depth = spec.scan_depth

    def ring(tail):
        return corpus_triton(corpus, tail, depth, K) if cuda else corpus.draft(tail, depth, K)

    def open_outputs(tail):  # the batch rows' new tokens, then their draft, as the speculator's
        live.index(hist, total, idx)
        if cuda:
            return live_triton(live, hist, total, idx, tail, depth, K)
        return live.draft(hist, total, idx, tail, depth, K)

    def step():
        scan = (scan_triton(hist, total[idx], idx, depth) if cuda else None)
        family = (family_scan_triton(windows.family, windows.family_len, hist, total[idx], idx,
                                     depth) if cuda else None)
        return draft_step(hist, total, idx, sampled, windows, calibration, K, 152_000, out,
                          scan=scan, scan_depth=depth, family_scan=family, corpus=ring,
                          short=paths.draft, fused=fused_triton if cuda else fused_ref,
                          live=open_outputs)

    def scan_only():
        if cuda:
            return scan_triton(hist, total[idx], idx, spec.scan_depth)
        from suffixspec.device.draft_ref import own_history_scan
        return own_history_scan(hist[idx], total[idx], spec.scan_depth)

    return step, scan_only


def _time(fn, device, reps: int) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU)."""
    for _ in range(min(20, reps)):
        fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _time_queued(fn, device, reps: int) -> tuple[float, float]:
    """Median seconds of ``fn`` on the GPU with the host ahead, and on the host.

    A busy kernel runs first, so every launch of ``fn`` is queued before the
    GPU reaches it: the events time the GPU's work alone, as when the step
    queues behind a forward; the host's seconds are the Python and launches.
    """
    gpu, host = [], []
    for i in range(reps + min(20, reps)):
        _sleep(device, 0.01)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        b.record()
        b.synchronize()
        if i >= min(20, reps):
            gpu.append(a.elapsed_time(b) / 1e3)
            host.append(t1 - t0)
    return float(np.median(gpu)), float(np.median(host))


def _launches(fn) -> int:
    """Torch operations a call issues (each at most a kernel launch on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    views = {"aten::" + v for v in (
        "view", "slice", "select", "expand", "expand_as", "as_strided", "reshape", "unsqueeze",
        "squeeze", "alias", "detach", "empty", "t", "permute", "lift_fresh", "unbind", "split",
        "to", "_to_copy", "arange")}
    return sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")
               and e.name not in views)


def _graph_equal(step, state) -> bool:
    """One step run kernel by kernel and the same step replayed from its CUDA
    graph (``device.graphs.Replay``), from the same state: equal outputs and
    equal slot state."""
    from suffixspec.device.graphs import Replay

    windows, out, b = state[3], state[7], state[8].shape[0]
    kept = [t.clone() for t in (windows.recent, windows.last_valid)]

    def result():
        rows = out.rows(b)
        return [getattr(rows, f).clone() for f in rows.__dataclass_fields__] + [
            windows.recent.clone(), windows.last_valid.clone()]

    def restore():
        windows.recent.copy_(kept[0])
        windows.last_valid.copy_(kept[1])

    replay = Replay(lambda _: step(), state[3].tokens.device)
    for _ in range(replay.warm):  # eager runs, then the recording
        restore()
        replay(0)
    if replay.recorded != 1:
        return False
    restore()
    step()
    want = result()
    restore()
    replay(0)
    got = result()
    restore()
    return all(torch.equal(a, c) for a, c in zip(want, got))


def device_time(device, histories, batches, reps: int, max_len: int) -> dict:
    rng = np.random.default_rng(5)
    out = {}
    for history in histories:
        for b in batches:
            state = _state(device, b, history, max_len, rng)
            step, scan = _step_fn(device, state)
            got = out[f"b{b}_h{history}"] = {
                "step_us": round(1e6 * _time(step, device, reps), 1),
                "scan_us": round(1e6 * _time(scan, device, reps), 1),
                "torch_ops": _launches(step)}
            if device.type == "cuda":
                from suffixspec.device.graphs import Replay

                queued, host = _time_queued(step, device, reps)
                got.update(step_gpu_us=round(1e6 * queued, 1), step_host_us=round(1e6 * host, 1))
                got["graph_equal"] = _graph_equal(step, state)
                replay = Replay(lambda _: step(), device)
                queued, host = _time_queued(lambda: replay(0), device, reps)
                got.update(graph_gpu_us=round(1e6 * queued, 1),
                           graph_host_us=round(1e6 * host, 1), graphs=replay.recorded)
            print(f"device time b={b} history={history}: {out[f'b{b}_h{history}']}",
                  file=sys.stderr, flush=True)
    return out


# --------------------------------------------------- MRV2 stand-ins (no vLLM)
class States:
    """MRV2's ``RequestState``, as much of it as the speculators read."""

    def __init__(self, max_reqs: int, max_len: int, device):
        self.all_token_ids = SimpleNamespace(
            gpu=torch.zeros(max_reqs, max_len, dtype=torch.int32, device=device))
        self.total_len = SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=torch.int32,
                                                         device=device))
        self.prompt_len = SimpleNamespace(np=np.zeros(max_reqs, np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(max_reqs, np.int32))
        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        self.free = list(range(max_reqs - 1, -1, -1))
        self.max_len = max_len

    def add_request(self, req_id, prompt_len, all_token_ids, *args, **kwargs):
        slot = self.free.pop()
        self.req_id_to_index[req_id] = slot
        self.index_to_req_id[slot] = req_id
        tokens = torch.as_tensor(np.asarray(all_token_ids, np.int32)[-self.max_len // 2:])
        self.all_token_ids.gpu[slot, :tokens.shape[0]] = tokens.to(self.all_token_ids.gpu.device)
        self.total_len.gpu[slot] = tokens.shape[0]
        self.prompt_len.np[slot] = min(prompt_len, tokens.shape[0])
        self.prefill_len.np[slot] = tokens.shape[0]

    def remove_request(self, req_id):
        slot = self.req_id_to_index.pop(req_id)
        del self.index_to_req_id[slot]
        self.free.append(slot)


def _config(max_reqs: int, max_len: int):
    spec = SimpleNamespace(method="suffix", num_speculative_tokens=K,
                           suffix_decoding_max_tree_depth=64,
                           suffix_decoding_max_cached_requests=-1,
                           suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1)
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=max_len, get_vocab_size=lambda: 152_000),
        scheduler_config=SimpleNamespace(max_num_seqs=max_reqs, max_num_batched_tokens=8192,
                                         async_scheduling=True),
        parallel_config=SimpleNamespace(tensor_parallel_size=1), use_v2_model_runner=True)


def _requests(traces: str | None, tokenizer: str | None, count: int, rng):
    """(prompt, output) pairs: the sql trace's, or repetitive synthetic ones."""
    if traces and tokenizer and Path(traces, "sql_spider_bird.jsonl.gz").is_file():
        from suffixspec.replay.traces import hf_encoder, load_trace

        reqs = load_trace(Path(traces) / "sql_spider_bird.jsonl.gz", hf_encoder(tokenizer),
                          max_records=count)
        return [(r.prompt, r.output) for r in reqs if r.output.shape[0] > 4]
    phrases = [rng.integers(0, 2000, 12) for _ in range(40)]
    out = []
    for _ in range(count):
        body = np.concatenate([phrases[i] for i in rng.integers(0, 40, 30)]).astype(np.int32)
        out.append((body[:200], body[200:]))
    return out


# ------------------------------------------------------------------ 4. the loop
def _sleep(device, seconds: float) -> None:
    """The forward: a GPU busy for ``seconds`` (the host goes on), or the host asleep."""
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * _sleep.cycles_per_s))
    else:
        time.sleep(seconds)


def _sleep_ms(device, cycles: int) -> float:
    """GPU milliseconds of ``torch.cuda._sleep(cycles)``, by CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def _calibrate_sleep(device) -> None:
    """Cycles per second of the busy kernel, on a GPU already busy (its clocks
    up): the median of five.  Each loop also reports the forward it got."""
    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    for _ in range(20):  # some 0.2 s busy first
        _sleep_ms(device, 10_000_000)
    ms = sorted(_sleep_ms(device, 10_000_000) for _ in range(5))[2]
    _sleep.cycles_per_s = 10_000_000 / (ms / 1e3)


def _forward_ms(device) -> float | None:
    """The busy kernel's length as the loop gets it (median of five), ms."""
    if device.type != "cuda":
        return None
    cycles = int(FORWARD_S * _sleep.cycles_per_s)
    return round(sorted(_sleep_ms(device, cycles) for _ in range(5))[2], 3)


@contextlib.contextmanager
def _sync_errors(on: bool):
    """CUDA's synchronizing calls raise inside (``torch.cuda.set_sync_debug_mode``)."""
    if not on:
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def loop(device, variant: str, b: int, steps: int, requests, max_len: int,
         check_sync: bool = False) -> dict:
    """The synthetic MRV2 loop (see the module docstring) with ``b`` in flight.

    ``check_sync``: the speculator's calls (not the loop's stand-in for vLLM,
    which copies as it likes) run with synchronizing CUDA calls raising.
    """
    from suffixspec.integrations.vllm import device_speculator as ds

    max_reqs = max(b, 8)
    states = States(max_reqs, max_len, device)
    config = _config(max_reqs, max_len)
    spec = None
    if variant in DEVICE_VARIANTS:  # device_eager: no CUDA graphs
        graphs = "0" if variant == "device_eager" else "1"
        process = "1" if variant == "device_process" else "0"
        with mock.patch.dict(os.environ, SUFFIXSPEC_CUDA_GRAPHS=graphs,
                             SUFFIXSPEC_DEVICE_FEEDER_PROCESS=process):
            spec = ds.DeviceSuffixSpeculator(config, device, states, start=False)
        spec.start(wait=True)
        if variant == "device_idle":  # the feeder hears of nothing: no host work, no windows
            for name in ("add", "snapshot", "finished", "take"):
                setattr(spec.drafter.feeder, name, lambda *args, **kwargs: None)
    drafts = torch.zeros(max_reqs, K, dtype=torch.int64, device=device)
    outputs = torch.full((max_reqs, max_len), -1, dtype=torch.int64, device=device)
    pos = torch.zeros(max_reqs, dtype=torch.int64, device=device)
    sampled = torch.ones(max_reqs, dtype=torch.int32, device=device)
    pending = iter(requests)
    active: dict[str, int] = {}
    n_req = 0

    def admit():
        nonlocal n_req
        while len(active) < b:
            item = next(pending, None)
            if item is None:
                return
            prompt, output = item
            req = f"r{n_req}"
            n_req += 1
            states.add_request(req, prompt.shape[0], prompt, 0, 1 << 20)
            slot = states.req_id_to_index[req]
            if spec is not None:
                spec.add_request(slot)  # as vLLM's runner does
            o = torch.as_tensor(output[:max_len // 2].astype(np.int64))
            outputs[slot] = -1
            outputs[slot, :o.shape[0]] = o.to(device)
            pos[slot] = 0
            sampled[slot] = 1
            active[req] = slot

    admit()
    pin = device.type == "cuda"
    seen = torch.zeros(max_reqs, dtype=torch.int64, pin_memory=pin)
    last_event = None
    periods, t_prev = [], None
    proposing = []  # the worker's seconds in ``propose`` per step
    made = torch.zeros((), dtype=torch.int64, device=device)  # tokens emitted, on the device
    k_range = torch.arange(K, device=device)
    for step in range(steps):
        if not active:
            break
        t0 = time.perf_counter()
        if t_prev is not None:
            periods.append(t0 - t_prev)
        t_prev = t0
        spin = time.perf_counter() + HOST_S  # vLLM's host work of the step
        while time.perf_counter() < spin:
            pass
        if last_event is not None:  # the previous step's output (AsyncOutput.get_output)
            last_event.synchronize()
        done = [r for r, s in active.items() if int(seen[s]) < 0]
        if done:
            if spec is not None:
                with _sync_errors(check_sync):
                    spec.on_requests_finished(done)
            for r in done:
                states.remove_request(r)
                del active[r]
            admit()
            if not active:
                break
        ids = list(active)
        slots = torch.tensor([active[r] for r in ids], dtype=torch.int64)
        slots = slots.pin_memory().to(device, non_blocking=True) if pin else slots
        _sleep(device, FORWARD_S)
        # Sampling: the longest draft prefix equal to the recorded output, and one more.
        at = pos[slots][:, None] + k_range
        target = outputs[slots[:, None], at.clamp(max=max_len - 1)]
        ok = (drafts[slots] == target).to(torch.int64).cumprod(dim=1).sum(dim=1)
        left = (outputs[slots] >= 0).sum(dim=1) - pos[slots]
        emit = torch.minimum(ok + 1, left).clamp(min=1)
        total = states.total_len.gpu[slots].to(torch.int64)
        for j in range(K + 1):
            live = j < emit
            tok = outputs[slots, (pos[slots] + j).clamp(max=max_len - 1)]
            dst = (total + j).clamp(max=max_len - 1)
            keep = states.all_token_ids.gpu[slots, dst]
            states.all_token_ids.gpu[slots, dst] = torch.where(live, tok, keep.to(
                torch.int64)).to(torch.int32)
        states.total_len.gpu[slots] = (total + emit).to(torch.int32)
        pos[slots] += emit
        made.add_(emit.sum())
        sampled[slots] = emit.to(torch.int32)
        batch = SimpleNamespace(req_ids=ids, num_reqs=len(ids), idx_mapping=slots,
                                idx_mapping_np=np.array([active[r] for r in ids]))
        if spec is not None:
            num_sampled = sampled[slots]
            num_rejected = torch.zeros(len(ids), dtype=torch.int32, device=device)
            began = time.perf_counter()
            with _sync_errors(check_sync):
                d = spec.propose(batch, None, None, None, None, num_sampled, num_rejected,
                                 None, None, None, None)
            proposing.append(time.perf_counter() - began)
            drafts[slots] = d.to(torch.int64)
        # The step's output to the host, behind an event: -1 where a request finished.
        flag = torch.where(left - emit <= 0, -1, emit)
        seen_dev = torch.zeros(max_reqs, dtype=torch.int64, device=device)
        seen_dev[slots] = flag
        seen.copy_(seen_dev, non_blocking=pin)
        if pin:
            last_event = torch.cuda.Event()
            last_event.record()
    now(device)
    result = {"steps": len(periods) + 1, "forward_ms": _forward_ms(device),
              "period_p50_ms": round(1e3 * float(np.percentile(periods, 50)), 3),
              "period_p99_ms": round(1e3 * float(np.percentile(periods, 99)), 3)}
    result["tokens_per_request_step"] = round(int(made) / max(len(periods) + 1, 1) / b, 3)
    if proposing:
        result["propose_ms_p50"] = round(1e3 * float(np.percentile(proposing, 50)), 3)
        result["propose_ms_mean"] = round(1e3 * float(np.mean(proposing)), 3)
    if variant in DEVICE_VARIANTS and spec is not None:
        drafter = spec.drafter
        result["feeder"] = drafter.feeder.lag()
        result["graphs"] = drafter._draft_graphs.recorded + drafter._apply_graph.recorded
        failed = drafter._draft_graphs.failed or drafter._apply_graph.failed
        result["graph_failed"] = None if failed is None else repr(failed)[:300]
        feeder = drafter.feeder
        spec.close()  # a feeder process reports its last figures as it closes
        stats = feeder.stats
        result["feeder_ms_per_step"] = round(1e3 * stats.seconds / max(step, 1), 3)
        result["feeder_cpu_ms_per_step"] = round(1e3 * stats.cpu_seconds / max(step, 1), 3)
        result["feeder_phase_cpu_ms_per_step"] = feeder.phases(step)
    return result


def no_sync(device, requests, steps: int = 300) -> dict:
    if device.type != "cuda":
        return {"skipped": "CUDA only"}
    try:
        got = loop(device, "device", 8, steps, requests, 4096, check_sync=True)
    except RuntimeError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames
                if str(ROOT) in f.filename]
        return {"raised": repr(exc)[:300], "where": ours[-6:]}
    return {"steps": got["steps"], "raised": None, "graphs": got["graphs"],
            "graph_failed": got["graph_failed"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--traces", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--only", nargs="*", default=None,
                    choices=["correctness", "device_time", "no_sync", "loop"])
    ap.add_argument("--levels", nargs="*", type=int, default=None,
                    help="requests in flight in the loop (default 1 8 32 64; 8 64 on the CPU)")
    ap.add_argument("--variants", nargs="*", default=None,
                    choices=["none", *DEVICE_VARIANTS])
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the loop (seconds; Python's default 0.005): "
                         "how long a thread holding the interpreter lock keeps it from one "
                         "waiting for it")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds the device drafter waits, at most, for the feeder's work "
                         "on the previous step (device.drafter.DEADLINE)")
    args = ap.parse_args()
    if args.deadline is not None:
        from suffixspec.device import drafter

        drafter.DEADLINE = args.deadline
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    device = torch.device(args.device)
    small = device.type == "cpu"
    os.environ.setdefault("SUFFIXSPEC_LOG_INTERVAL", "0")
    os.environ.setdefault("SUFFIXSPEC_DRAFT_COST", "0.03")
    if small:  # the interpreter runs the Triton kernels on CPU tensors
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _calibrate_sleep(device)
    rng = np.random.default_rng(3)
    requests = _requests(args.traces, args.tokenizer, LOOP_REQUESTS, rng)
    report = {**STARTED, "device": str(device),
              "name": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
              "torch": torch.__version__}
    parts = args.only or ["correctness", "device_time", "no_sync", "loop"]
    if {"no_sync", "loop"} & set(parts):  # steady state: every speculator drafts at once
        from suffixspec.kernels import compile_in_parallel
        from suffixspec.native.warmup import DEVICE, STEPS

        report["kernels_ready_s"] = round(compile_in_parallel(STEPS + DEVICE), 1)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each part: a run stopped at its limit keeps what it did
        report["seconds"] = round(time.perf_counter() - t0, 1)
        report["table"] = markdown(report)
        (out / "device_check.json").write_text(json.dumps(report, indent=1))
    if "correctness" in parts:
        # one program per row: on the CPU more rows only lengthen the interpreter's run
        report["correctness"] = (correctness(device, 3, batches=(1, 8)) if small
                                 else correctness(device, 50))
        save()
    if "device_time" in parts:
        report["device_time"] = device_time(
            device, (2048,) if small else (2048, 16384), (1, 8) if small else (1, 8, 32, 64),
            5 if small else 500, 4096 if small else 32768)
        save()
    if "no_sync" in parts:
        report["no_sync"] = no_sync(device, requests)
        save()
    if "loop" in parts:
        report["loop"] = {}
        levels = args.levels or ((8, 64) if small else (1, 8, 32, 64))
        report["switch_interval"] = sys.getswitchinterval()
        from suffixspec.device.drafter import DEADLINE

        report["deadline_s"] = DEADLINE
        for b in levels:
            for variant in args.variants or ("none", "device_eager", "device", "device_process"):
                try:
                    got = loop(device, variant, b, 40 if small else 400, requests, 4096)
                except Exception as exc:  # one variant failing loses none of the others
                    got = {"failed": repr(exc)[:500], "where": traceback.format_exc()[-1500:]}
                report["loop"][f"{variant}_b{b}"] = got
                save()
                print(f"loop {variant} b={b}: {got}", file=sys.stderr, flush=True)
    save()
    print(report["table"])


def markdown(report: dict) -> str:
    """The report's tables: correctness, device time per step, the serving loop."""
    lines = [f"{report.get('name', '?')}, torch {report.get('torch', '?')}; kernels ready in "
             f"{report.get('kernels_ready_s', '?')} s", ""]
    if (checks := report.get("correctness")):
        lines += ["| check | cases | mismatches |", "|---|---|---|"]
        lines += [f"| {k} | {v['cases']} | {v['mismatches']} |" for k, v in checks.items()]
        lines.append("")
    if (times := report.get("device_time")):
        lines += ["| batch, history | step µs (eager) | GPU µs | graph: GPU µs | graph: host µs |",
                  "|---|---|---|---|---|"]
        lines += [f"| {k} | {v.get('step_us')} | {v.get('step_gpu_us')} | "
                  f"{v.get('graph_gpu_us')} | {v.get('graph_host_us')} |" for k, v in times.items()]
        lines.append("")
    if (loop := report.get("loop")):
        lines += ["| loop | step period p50 / p99 ms | tokens per request step | propose ms p50 | "
                  "feeder CPU ms per step |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {v.get('period_p50_ms')} / {v.get('period_p99_ms')} | "
                  f"{v.get('tokens_per_request_step')} | {v.get('propose_ms_p50', '')} | "
                  f"{v.get('feeder_cpu_ms_per_step', '')} |" for k, v in loop.items()]
        lines.append("")
    if (ns := report.get("no_sync")):
        lines.append(f"No device read-back over {ns.get('steps')} steps: raised "
                     f"{ns.get('raised')}, graph failures {ns.get('graph_failed')}.")
    return "\n".join(lines).strip()


if __name__ == "__main__":
    main()
