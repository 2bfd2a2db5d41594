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
  to what the whole batch gains from: ``Roofline.admit``), its measured time
  and ``SYNC_MS``;
* ``suffixspec device``: drafting on the device, as vLLM 0.34 serves
  ``method: "suffixspec"`` (``suffixspec.device``): windows one step old,
  fitted to the roofline on the device; what it adds to a step is taken
  from ``--device-check`` (``bench/device_check.py`` on a GPU: the loop's
  step period with the device drafter less that with no drafter, at the
  same number in flight, forward held at 6.5 ms), else ``DEVICE_MS``, an
  estimate.

What vLLM's own drafter adds to a step is ``VLLM_DEVICE_MS``, an estimate,
unless the device check timed vLLM's own speculator in its loop
(``vllm_b<N>`` rows).  Every tokens/s figure that rests on an estimate is
marked ``*`` in the table, and the list of per-step costs says which are
measured; the README's headline takes nothing from this table's tokens/s.

Host times are this machine's (a 2-core CPU; a server's is faster).  Slices
as in ``bench_common.SLICES`` times ``--fraction``.  Writes ``gpu.json``.
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
#: Estimates, used where no GPU measured them: vLLM's drafter's device time
#: per step (2-3 small kernels and a scan of the history; its design notes:
#: 20-100 us) and what suffixspec's device path adds to a step.
VLLM_DEVICE_MS = 0.05
DEVICE_MS = 0.2
CONFIGS = {  # name -> (engine, settings, host time counted, per-step costs: see step_costs);
    # every one drafts at most --k tokens
    "vllm-gpu": ("vllm-gpu", dict(max_depth=24), False, ("vllm device",)),
    "vllm-gpu adaptive": ("vllm-gpu", dict(max_depth=24, adaptive=True), False,
                          ("vllm device",)),
    "arctic V1": ("arctic", dict(max_depth=64, max_spec_factor=2.0, min_token_prob=0.2),
                  True, ("sync",)),
    "suffixspec V1": ("suffixspec", dict(max_depth=64, cross_pool_tokens=None), True,
                      ("sync",)),
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
    extra = sum(per_step_ms[o][0] for o in overheads) * 1e-3
    seconds = r["gpu_s"] + (r["host_s"] if host else 0.0) + r["steps"] * extra
    return r["output_tokens"] / seconds


def main():
    ap = parser(__doc__)
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--fraction", type=float, default=0.5, help="of each slice (bench_common.SLICES)")
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
                    help="bench/device_check.py's JSON from a GPU: what the device drafters "
                         "add to a step, measured, replaces the estimates")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    levels = [int(c) for c in args.concurrency.split(",")]
    measured = step_costs(levels, args.device_check)
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
                row[config + " estimated"] = any(measured[b][o][1] != "measured"
                                                 for o in overhead)
                row[config + " detail"] = r
                print(f"{name} @{b} {config}: {row[config]:.1f} tok/s, MTS {r['mts']:.3f}, "
                      f"drafted {r['drafted']:.2f}, host {1e3 * r['host_s'] / r['steps']:.3f} "
                      f"ms/step ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            rows.append(row)
    save_results(args.out, args.name, {"roofline": vars(H100_8B), "per_step_ms": measured,
                                       "k": args.k, "rows": rows}, markdown(rows, args, measured))


def step_costs(levels: list[int], device_check: Path | None = None) -> dict:
    """Per level in flight, the milliseconds a step adds and where each figure
    comes from: ``sync`` (the V1 runner's synchronous scheduling, published),
    ``vllm device`` and ``device`` (vLLM's drafter and suffixspec's device
    path: from the device check's loop when it ran them at that level, else
    the estimates)."""
    check = json.loads(device_check.read_text()) if device_check else {}
    loop = check.get("data", check).get("loop", {})  # a file kept here wraps the run in "data"

    def added(variant: str, b: int):
        ran, none = loop.get(f"{variant}_b{b}", {}), loop.get(f"none_b{b}", {})
        if "period_p50_ms" in ran and "period_p50_ms" in none:  # (a failed run has none)
            return (round(ran["period_p50_ms"] - none["period_p50_ms"], 3), "measured")
        return None

    return {b: {"sync": (SYNC_MS, "published estimate"),
                "vllm device": added("vllm", b) or (VLLM_DEVICE_MS, "estimate"),
                "device": added("device", b) or (DEVICE_MS, "estimate")} for b in levels}


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
    out = ["| trace | in flight | " + " | ".join(names) + " | device / vllm-gpu best |",
           "|---|---|" + "---|" * (len(names) + 1)]

    def cell(r, n):
        return f"{r[n]:.0f}" + ("*" if r.get(n + " estimated") else "")

    for r in rows:
        vs = _versus(r, "suffixspec device")
        star = "*" if vs != "-" and (r.get("suffixspec device estimated") or any(
            r.get(c + " estimated") for c in ("vllm-gpu", "vllm-gpu adaptive"))) else ""
        out.append(f"| {r['trace']} | {r['concurrency']} | "
                   + " | ".join(cell(r, n) for n in names) + f" | {vs}{star} |")
    costs = "; ".join(f"{b} in flight: " + ", ".join(f"{k} {v[0]} ms ({v[1]})"
                                                    for k, v in c.items())
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
        f"\n\nTokens per second under the H100_8B roofline (a model: no GPU ran these "
        f"replays); the drafters' host times measured here.  *: rests on an estimated "
        f"per-step cost.  Per-step costs added: {costs}.  Slices: the bench_common slices "
        f"times {args.fraction}.  Drafts capped at {getattr(args, 'k', 16)} tokens.{arbiter}\n"
    ) + "\n".join(drafting) + (
        "\n\nest prices a drafted token at 0.03 of a step, as the replay tables do; under "
        "the roofline a token below the knee is free, which is why every suffix drafter "
        "here drafts long.\n")


if __name__ == "__main__":
    main()
