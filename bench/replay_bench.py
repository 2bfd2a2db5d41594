"""Replay every shared trace through suffixspec and arctic-inference, side by side.

Usage (from the repository root, arctic-inference installed by
bench/setup_arctic.sh):

    python bench/replay_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Whole files, except the agent trace (first 40 sessions).  All engines run in
this one process on the same tokenized requests, so ratios are comparable.
Depth 64 everywhere.  Configurations (``RUNS``):

* ``new``: suffixspec's default policy (calibrated, cost-aware, start
  anchors, the newest-occurrence reference), k 16, draft cost 0.03;
* ``new, no family``: the same without its family's outputs
  (``family_outputs`` 0), so the ratio row shows what they add and what
  they cost per step;
* ``arctic f1`` / ``arctic f2``: arctic-inference at its defaults (factor 1,
  min_token_prob 0.1) and at its cost-aware best on these traces (factor 2,
  min_token_prob 0.2);
* ``new tree``: the default policy drafting trees;
* ``new k32 c0.01`` against ``arctic k32 f4``: a low draft cost against
  arctic's best-MTS setting (k 32, factor 4, min_token_prob 0.05);
* ``@32``: ``new`` and ``arctic f2`` with 32 requests in flight, one batched
  propose per engine step.

est = MTS / (1 + 0.03 * drafted tokens per step).  Compilation is timed
apart (``warmup``).  Writes ``replay.json`` and ``replay.md`` into ``--out``
and prints the Markdown.
"""

from __future__ import annotations

import platform
import sys
import time

from tqdm import tqdm

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import TRACES, load, parser, save_results, token_kinds

K16 = dict(max_depth=64, max_spec_tokens=16)
F1 = dict(K16, max_spec_factor=1.0, min_token_prob=0.1)
F2 = dict(K16, max_spec_factor=2.0, min_token_prob=0.2)
K32 = dict(max_depth=64, max_spec_tokens=32)
# name -> (engine, knobs, concurrency)
RUNS = {
    "new": ("suffixspec", K16, 1),
    "new, no family": ("suffixspec", dict(K16, family_outputs=0), 1),
    "arctic f1": ("arctic", F1, 1),
    "arctic f2": ("arctic", F2, 1),
    "new tree": ("suffixspec", dict(K16, tree=True), 1),
    "new k32 c0.01": ("suffixspec", dict(K32, draft_cost=0.01), 1),
    "arctic k32 f4": ("arctic", dict(K32, max_spec_factor=4.0, min_token_prob=0.05), 1),
    "new @32": ("suffixspec", K16, 32),
    "arctic f2 @32": ("arctic", F2, 32),
}
# (ours, anchor) pairs the ratio table compares.
RATIOS = [("new", "arctic f2"), ("new", "arctic f1"), ("new", "new, no family"),
          ("new tree", "arctic f2"),
          ("new k32 c0.01", "arctic k32 f4")]


def run(args) -> dict:
    encode = hf_encoder(args.tokenizer)
    compile_s = warmup()
    kinds = token_kinds(args)
    results = {"machine": platform.platform(), "python": sys.version.split()[0],
               "compile_s": round(compile_s, 2), "runs": []}
    for name in args.only or list(TRACES):
        t0 = time.perf_counter()
        requests = load(args.traces, name, encode, args.tokenizer)
        print(f"{name}: {len(requests)} requests loaded in {time.perf_counter() - t0:.0f}s",
              file=sys.stderr)
        for config, (engine, knobs, conc) in RUNS.items():
            extra = ({"cross_pool_tokens": None, "token_kinds": kinds} if engine == "suffixspec"
                     else {})
            proposer = make_proposer(engine, requests, **knobs, **extra)
            t0 = time.perf_counter()
            with tqdm(total=len(requests), desc=f"{name} {config}", file=sys.stderr,
                      leave=False, delay=2) as bar:
                res = replay(requests, proposer, concurrency=conc, progress=bar.update)
            row = {"trace": name, "config": config, "engine": engine, "concurrency": conc,
                   **res.metrics(), **res.engine_step_summary(),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            results["runs"].append(row)
            print(f"{name} {config}: MTS {row['mean_tokens_per_step']:.3f} est {row['est']:.3f} "
                  f"drafted {row['drafted_per_step']:.2f} µs {row['proposer_us_per_step_p50']}"
                  f"/{row['proposer_us_per_step_p99']} ({row['wall_s']} s)", file=sys.stderr)
    return results


def _get(rows, trace, config):
    for r in rows:
        if (r["trace"], r["config"]) == (trace, config):
            return r
    return None


def markdown(results: dict) -> str:
    rows = results["runs"]
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    out = ["### Every run", "",
           "| trace | config | MTS | est | drafted/step | accept | µs/step p50 | p99 "
           "| pos-0 accepted | first-token miss | no draft | start µs | B/token | step@32 p50 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        for config in RUNS:
            r = _get(rows, t, config)
            if r is None:
                continue
            step = f"{r['engine_step_us_p50']:.0f}" if r["concurrency"] > 1 else ""
            out.append(
                f"| {t} | {config} | {r['mean_tokens_per_step']:.3f} | {r['est']:.3f} "
                f"| {r['drafted_per_step']:.2f} | {r['acceptance_rate']:.3f} "
                f"| {r['proposer_us_per_step_p50']:.1f} | {r['proposer_us_per_step_p99']:.1f} "
                f"| {r['first_step_accepted_mean']:.2f} | {r['first_token_miss_rate']:.3f} "
                f"| {r['no_draft_rate']:.3f} | {r['start_us_mean']:.0f} "
                f"| {r['index_bytes_per_token'] or '-'} | {step} |")
    out += ["", "### Ratios (same run)", "",
            "| trace | ours / other | MTS | est | drafted | µs p50 | µs p99 |",
            "|---|---|---|---|---|---|---|"]
    for t in traces:
        for ours, anchor in RATIOS:
            a, b = _get(rows, t, ours), _get(rows, t, anchor)
            if a and b:
                out.append(f"| {t} | {ours} / {anchor} "
                           + " ".join(f"| {_ratio(a[k], b[k])}" for k in (
                               "mean_tokens_per_step", "est", "drafted_per_step",
                               "proposer_us_per_step_p50", "proposer_us_per_step_p99")) + " |")
        a, b = _get(rows, t, "new @32"), _get(rows, t, "arctic f2 @32")
        if a and b:
            out.append(f"| {t} | 32 in flight: new / arctic f2 "
                       f"| {_ratio(a['mean_tokens_per_step'], b['mean_tokens_per_step'])} "
                       f"| {_ratio(a['est'], b['est'])} "
                       f"| {_ratio(a['drafted_per_step'], b['drafted_per_step'])} "
                       f"| step {a['engine_step_us_p50']:.0f} / {b['engine_step_us_p50']:.0f} µs "
                       f"| step {a['engine_step_us_p99']:.0f} / {b['engine_step_us_p99']:.0f} µs |")
    out += ["", f"Kernel compilation (warmup, timed apart): {results['compile_s']} s. "
            f"Machine: {results['machine']}, Python {results['python']}."]
    return "\n".join(out)


def _ratio(x, y) -> str:
    return f"{x / y:.3f}" if y else "-"


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(TRACES), help="run only these traces")
    args = ap.parse_args()
    results = run(args)
    save_results(args.out, "replay", results, markdown(results))


if __name__ == "__main__":
    main()
