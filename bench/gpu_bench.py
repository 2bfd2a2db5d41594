"""Tokens per second in the GPU regime: replay priced by a GPU step roofline.

Usage (from the repository root):

    python bench/gpu_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

No GPU runs here: each engine step of a replay is priced by
``suffixspec.stepcost.H100_8B`` (an 8B model on an H100: a flat 6.5 ms until
about 240 verified tokens, then 0.027 ms per token; where each figure comes
from is in that module), with ``concurrency`` requests in flight.  Per
configuration, what the step also pays:

* ``none``: no speculation; async scheduling (nothing else on the step);
* ``vllm-gpu``, ``vllm-gpu adaptive``: vLLM's own GPU suffix drafter on Model
  Runner V2 (``native.vllm_suffix``), plain and with adaptive verification:
  it drafts on the device under async scheduling, so nothing is added;
* ``arctic V1``: arctic-inference at its cost-aware best (k 16, factor 2,
  min_token_prob 0.2) on the V1 runner: its measured drafting time per step
  (host, on the critical path) and the V1 runner's synchronous scheduling
  (``SYNC_MS``: async scheduling is worth 3-5% of an 8B model's step in
  published runs);
* ``suffixspec V1``: suffixspec drafting for this roofline (candidates cut
  to what the whole batch gains from: ``Roofline.admit``), its measured time,
  the plugin's bookkeeping around it, and ``SYNC_MS``;
* ``suffixspec MRV2 sync``: the same drafts on Model Runner V2 by the
  synchronous speculator (the design ``SUFFIXSPEC_RUNNER=mrv2`` had before):
  its measured time, the bookkeeping, one host round trip per step (copies
  and the host token mirror), and the host work async scheduling would have
  hidden: its wait drains the stream, so the GPU idles through vLLM's own
  per-step host work (``HIDDEN_MS``);
* ``suffixspec device``: drafting on the device (``suffixspec.device``,
  ``SUFFIXSPEC_RUNNER=mrv2``): windows one step old, fitted to the roofline
  on the device; no host time on the critical path, an estimated device time
  per step (``DEVICE_MS``, or measured: ``--device-check``).

vLLM's own drafter pays its estimated device time too (``VLLM_DEVICE_MS``).

Bookkeeping and round trip per step come from ``bench/mrv2_bench.py``'s
``mrv2.json`` (``--mrv2``), at the same numbers of requests in flight.
vLLM's own per-request loop around arctic on the V1 runner is not priced.

Host times are this machine's (a 2-core CPU; a server's is faster).  Slices
as in ``bench_common.SLICES`` times ``--fraction``.  Writes ``gpu.json``
and ``gpu.md``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder
from suffixspec.stepcost import H100_8B

from bench_common import SLICES, load_slice, parser, save_results, token_kinds

#: The V1 runner's synchronous scheduling per step (4% of the 6.5 ms step).
SYNC_MS = 0.26
#: vLLM's per-step host work (output processing, scheduling, prepare_inputs,
#: launch) that async scheduling hides and a synchronising speculator exposes:
#: the same figure (async scheduling is worth 3-5% of an 8B model's step in
#: published runs; vLLM PR #29184 reports +3-39% tokens/s).
HIDDEN_MS = SYNC_MS
#: Device time per step, estimated (no GPU has run them): vLLM's drafter, 2-3
#: small kernels and a scan of the history (its design notes: 20-100 us);
#: suffixspec's device step, 3 Triton kernels and about 100 small torch ops
#: (counted by bench/device_check.py: 54 to draft, 31 to apply the payload, and
#: the snapshot), at ~2 us each.
VLLM_DEVICE_MS = 0.05
DEVICE_MS = 0.2
CONFIGS = {  # name -> (engine, settings, host time counted, per-step costs: see host_costs);
    # every one drafts at most --k tokens
    "vllm-gpu": ("vllm-gpu", dict(max_depth=24), False, ("vllm device",)),
    "vllm-gpu adaptive": ("vllm-gpu", dict(max_depth=24, adaptive=True), False,
                          ("vllm device",)),
    "arctic V1": ("arctic", dict(max_depth=64, max_spec_factor=2.0, min_token_prob=0.2),
                  True, ("sync",)),
    "suffixspec V1": ("suffixspec", dict(max_depth=64, cross_pool_tokens=None), True,
                      ("sync", "bookkeeping")),
    "suffixspec MRV2 sync": ("suffixspec", dict(max_depth=64, cross_pool_tokens=None),
                             True, ("bookkeeping", "round trip", "hidden")),
    "suffixspec device": ("suffixspec-device", dict(max_depth=64, cross_pool_tokens=None),
                          False, ("device",)),
}


def run_one(requests, engine: str, settings: dict, concurrency: int) -> dict:
    proposer = make_proposer(engine, requests, **settings)
    if engine.startswith("suffixspec"):
        proposer.step_cost = H100_8B  # drafts for this regime
    res = replay(requests, proposer, concurrency=concurrency, step_cost=H100_8B)
    m = res.metrics()
    return {"steps": len(res.engine_step_us), "request_steps": res.steps,
            "output_tokens": res.output_tokens, "gpu_s": res.model_time,
            "host_s": sum(res.engine_step_us) / 1e6, "mts": m["mean_tokens_per_step"],
            "drafted": m["drafted_per_step"]}


def tokens_per_s(r: dict, host: bool, overheads: tuple, per_step_ms: dict) -> float:
    extra = sum(per_step_ms[o] for o in overheads) * 1e-3
    seconds = r["gpu_s"] + (r["host_s"] if host else 0.0) + r["steps"] * extra
    return r["output_tokens"] / seconds


def main():
    ap = parser(__doc__)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--fraction", type=float, default=0.5, help="of each slice (bench_common.SLICES)")
    ap.add_argument("--mrv2", type=Path, default=Path(__file__).parent / "results" / "mrv2.json",
                    help="bench/mrv2_bench.py's results: bookkeeping and round trip per step")
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    ap.add_argument("--configs", nargs="*", choices=list(CONFIGS), default=list(CONFIGS),
                    help="run only these configurations (the table leaves the others out)")
    ap.add_argument("--no-device-arbiter", dest="device_arbiter", action="store_false",
                    help="drafting on the device does not arbitrate "
                         "(SUFFIXSPEC_DEVICE_ARBITER=0)")
    ap.add_argument("--k", type=int, default=16,
                    help="num_speculative_tokens: every configuration's draft cap")
    ap.add_argument("--name", default="gpu", help="Name of the results files.")
    ap.add_argument("--device-check", type=Path, default=None,
                    help="bench/device_check.py's JSON from a GPU: its measured device time "
                         "per step replaces DEVICE_MS")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    levels = [int(c) for c in args.concurrency.split(",")]
    measured = host_costs(args.mrv2, levels, args.device_check)
    kinds = token_kinds(args)
    rows = []
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode, args.fraction)
        for b in levels:
            row = {"trace": name, "concurrency": b, "none": _plain(requests, b)}
            for config, (engine, settings, host, overhead) in CONFIGS.items():
                if config not in args.configs:
                    continue
                settings = dict(settings, max_spec_tokens=args.k)
                if engine == "suffixspec-device":
                    settings = dict(settings, arbiter=args.device_arbiter)
                if engine.startswith("suffixspec"):
                    settings = dict(settings, token_kinds=kinds)
                t0 = time.perf_counter()
                r = run_one(requests, engine, settings, b)
                row[config] = tokens_per_s(r, host, overhead, measured[b])
                row[config + " detail"] = r
                print(f"{name} @{b} {config}: {row[config]:.1f} tok/s, MTS {r['mts']:.3f}, "
                      f"drafted {r['drafted']:.2f}, host {1e3 * r['host_s'] / r['steps']:.3f} "
                      f"ms/step ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            rows.append(row)
    save_results(args.out, args.name, {"roofline": vars(H100_8B), "per_step_ms": measured,
                                       "k": args.k, "rows": rows}, markdown(rows, args, measured))


def host_costs(path: Path, levels: list[int], device_check: Path | None = None) -> dict:
    """Per level in flight, the milliseconds a step adds: ``sync`` (V1), the
    plugin's ``bookkeeping`` and MRV2 ``round trip`` measured by mrv2_bench,
    the host work a synchronising speculator exposes (``hidden``), and the
    device time of vLLM's drafter and of suffixspec's (``device``: measured
    by device_check on a GPU when given, 16K-token histories)."""
    try:
        rows = {r["in_flight"]: r for r in json.loads(path.read_text())["rows"]}
    except (OSError, ValueError, KeyError) as exc:
        sys.exit(f"gpu_bench: no MRV2 timings in {path} ({exc}); run bench/mrv2_bench.py first")
    missing = [b for b in levels if b not in rows]
    if missing:
        sys.exit(f"gpu_bench: {path} has no timings at {missing} in flight")
    device = {b: DEVICE_MS for b in levels}
    if device_check is not None:
        timed = json.loads(device_check.read_text())["device_time"]
        # As CUDA graphs when the check recorded them (the speculator's way on a GPU).
        device = {b: timed[f"b{b}_h16384"].get("graph_gpu_us",
                                                timed[f"b{b}_h16384"]["step_us"]) / 1e3
                  for b in levels}
    return {b: {"sync": SYNC_MS, "bookkeeping": rows[b]["bookkeeping_p50_ms"],
                "round trip": rows[b]["round_trip_p50_ms"], "hidden": HIDDEN_MS,
                "vllm device": VLLM_DEVICE_MS, "device": device[b]} for b in levels}


def _plain(requests, b: int) -> float:
    """Tokens per second without speculation, ``b`` requests in flight (replayed)."""
    proposer = make_proposer("oracle", requests, max_spec_tokens=0)
    res = replay(requests, proposer, concurrency=b, step_cost=H100_8B)
    return res.output_tokens / res.model_time


def _versus(r: dict, config: str) -> str:
    """``config``'s tokens/s over the better vLLM drafter's in row ``r``; "-"
    where either was not run."""
    vllm = [r[c] for c in ("vllm-gpu", "vllm-gpu adaptive") if c in r]
    return f"{r[config] / max(vllm):.3f}" if vllm and config in r else "-"


def markdown(rows: list[dict], args, measured: dict) -> str:
    configs = [c for c in CONFIGS if any(c in r for r in rows)]
    names = ["none"] + configs
    out = ["| trace | in flight | " + " | ".join(names)
           + " | MRV2 sync / vllm-gpu best | device / vllm-gpu best |",
           "|---|---|" + "---|" * (len(names) + 2)]
    for r in rows:
        out.append(f"| {r['trace']} | {r['concurrency']} | "
                   + " | ".join(f"{r[n]:.0f}" for n in names)
                   + f" | {_versus(r, 'suffixspec MRV2 sync')} | "
                     f"**{_versus(r, 'suffixspec device')}** |")
    costs = "; ".join(f"{b} in flight: bookkeeping {c['bookkeeping']:.3f}, round trip "
                      f"{c['round trip']:.3f}, device {c['device']:.3f}"
                      for b, c in measured.items())
    drafting = ["", "Drafting at one request in flight (the same replays): MTS, drafted "
                "tokens per step, est = MTS / (1 + 0.03 × drafted)", "",
                "| trace | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for r in (r for r in rows if r["concurrency"] == 1):
        cells = [f"{d['mts']:.3f} / {d['drafted']:.2f} / {d['mts'] / (1 + 0.03 * d['drafted']):.3f}"
                 if d else "-" for d in (r.get(c + " detail") for c in configs)]
        drafting.append(f"| {r['trace']} | " + " | ".join(cells) + " |")
    arbiter = ("" if getattr(args, "device_arbiter", True)
               else "  Drafting on the device does not arbitrate (`--no-device-arbiter`).")
    return "\n".join(out) + (
        f"\n\nTokens per second under the H100_8B roofline; host times measured here; "
        f"V1 steps add {SYNC_MS} ms of synchronous scheduling; suffixspec's host steps add the "
        f"plugin's measured ms per step ({costs}), MRV2 sync steps the round trip and "
        f"{HIDDEN_MS} ms of vLLM host work their wait exposes.  Device drafting pays an "
        f"estimated device time per step: vLLM's drafter {VLLM_DEVICE_MS} ms, suffixspec's "
        f"the 'device' figure above ({'measured on a GPU' if args.device_check else 'an estimate; no GPU has run it'}).  "
        f"Slices: the bench_common slices times {args.fraction}.  Drafts capped at "
        f"{getattr(args, 'k', 16)} tokens.{arbiter}\n") + "\n".join(drafting) + (
        "\n\nest prices a drafted token at 0.03 of a step, as the replay tables do; under "
        "the roofline a token below the knee is free, which is why every suffix drafter "
        "here drafts long.\n")


if __name__ == "__main__":
    main()
