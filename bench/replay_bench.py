"""Replay every shared trace through suffixspec, arctic-inference and ngram.

Usage (from the repository root, arctic-inference installed by
bench/setup_arctic.sh):

    python bench/replay_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Whole files, except the agent trace (first 40 sessions).  All engines run in
this one process on the same tokenized requests, so ratios are comparable.
Configurations:

* ``default``: k 16, depth 64, factor 1, min_token_prob 0.1 (arctic's
  defaults) for suffixspec and arctic, and ngram (n 2..5, k 16);
* ``cost-aware``: arctic's best on these traces (factor 2, min_token_prob
  0.2) for both;
* ``concurrency 32``: the default configuration with 32 requests in flight,
  one batched propose per engine step.

Compilation is timed apart (``warmup``).  Writes ``replay.json`` and
``replay.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

from tqdm import tqdm

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import TRACES, load, save_results

DEFAULT = dict(max_depth=64, max_spec_tokens=16, max_spec_factor=1.0, min_token_prob=0.1)
COST_AWARE = dict(DEFAULT, max_spec_factor=2.0, min_token_prob=0.2)
RUNS = [
    ("default", "suffixspec", DEFAULT, 1),
    ("default", "arctic", DEFAULT, 1),
    ("default", "ngram", dict(max_spec_tokens=16), 1),
    ("cost-aware", "suffixspec", COST_AWARE, 1),
    ("cost-aware", "arctic", COST_AWARE, 1),
    ("concurrency 32", "suffixspec", DEFAULT, 32),
    ("concurrency 32", "arctic", DEFAULT, 32),
]


def est(m: dict) -> float:
    """Tokens per step, discounted for verifying drafted tokens."""
    return m["mean_tokens_per_step"] / (1 + 0.03 * m["drafted_per_step"])


def run(args) -> dict:
    encode = hf_encoder(args.tokenizer)
    compile_s = warmup()
    results = {"machine": platform.platform(), "python": sys.version.split()[0],
               "compile_s": round(compile_s, 2), "runs": []}
    names = args.only or list(TRACES)
    for name in names:
        t0 = time.perf_counter()
        requests = load(args.traces, name, encode)
        print(f"{name}: {len(requests)} requests tokenized in {time.perf_counter() - t0:.0f}s",
              file=sys.stderr)
        for config, engine, knobs, conc in RUNS:
            extra = {"cross_pool_tokens": None} if engine == "suffixspec" else {}
            proposer = make_proposer(engine, requests, **knobs, **extra)
            t0 = time.perf_counter()
            with tqdm(total=len(requests), desc=f"{name} {config} {engine}", file=sys.stderr,
                      leave=False, delay=2) as bar:
                res = replay(requests, proposer, concurrency=conc, progress=bar.update)
            row = {"trace": name, "config": config, "engine": engine, "concurrency": conc,
                   **res.metrics(), **res.engine_step_summary(),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            row["est"] = round(est(row), 4)
            results["runs"].append(row)
            print(json.dumps(row), file=sys.stderr)
    return results


def _get(rows, trace, config, engine):
    for r in rows:
        if (r["trace"], r["config"], r["engine"]) == (trace, config, engine):
            return r
    return None


def markdown(results: dict) -> str:
    rows = results["runs"]
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    out = ["### Default knobs (k 16, depth 64, factor 1, min_token_prob 0.1)", "",
           "| trace | engine | MTS | accept | drafted/step | est | µs/step p50 | µs/step p99 "
           "| start µs | index B/token |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        for e in ("suffixspec", "arctic", "ngram"):
            r = _get(rows, t, "default", e)
            if r:
                out.append(
                    f"| {t} | {e} | {r['mean_tokens_per_step']:.3f} | {r['acceptance_rate']:.3f} "
                    f"| {r['drafted_per_step']:.2f} | {r['est']:.3f} "
                    f"| {r['proposer_us_per_step_p50']:.1f} | {r['proposer_us_per_step_p99']:.1f} "
                    f"| {r['start_us_mean']:.0f} | {r['index_bytes_per_token'] or '-'} |")
    out += ["", "### suffixspec / arctic ratios", "",
            "| trace | MTS (default) | est (default) | est (cost-aware) | µs p50 | µs p99 "
            "| start µs | B/token | step µs @32 p50 | step µs @32 p99 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        s, a = _get(rows, t, "default", "suffixspec"), _get(rows, t, "default", "arctic")
        sc, ac = _get(rows, t, "cost-aware", "suffixspec"), _get(rows, t, "cost-aware", "arctic")
        s32, a32 = (_get(rows, t, "concurrency 32", "suffixspec"),
                    _get(rows, t, "concurrency 32", "arctic"))
        if not (s and a and sc and ac and s32 and a32):
            continue

        def ratio(x, y):
            return f"{x / y:.3f}" if y else "-"
        out.append(
            f"| {t} | {ratio(s['mean_tokens_per_step'], a['mean_tokens_per_step'])} "
            f"| {ratio(s['est'], a['est'])} | {ratio(sc['est'], ac['est'])} "
            f"| {ratio(s['proposer_us_per_step_p50'], a['proposer_us_per_step_p50'])} "
            f"| {ratio(s['proposer_us_per_step_p99'], a['proposer_us_per_step_p99'])} "
            f"| {ratio(s['start_us_mean'], a['start_us_mean'])} "
            f"| {ratio(s['index_bytes_per_token'] or 0, a['index_bytes_per_token'] or 1)} "
            f"| {ratio(s32['engine_step_us_p50'], a32['engine_step_us_p50'])} "
            f"| {ratio(s32['engine_step_us_p99'], a32['engine_step_us_p99'])} |")
    out += ["", "### Cost-aware knobs (factor 2, min_token_prob 0.2) and 32 requests in flight",
            "", "| trace | engine | MTS (cost-aware) | drafted/step | est "
            "| engine step µs @32 p50 | p99 | MTS @32 |", "|---|---|---|---|---|---|---|---|"]
    for t in traces:
        for e in ("suffixspec", "arctic"):
            c, k = _get(rows, t, "cost-aware", e), _get(rows, t, "concurrency 32", e)
            if c and k:
                out.append(f"| {t} | {e} | {c['mean_tokens_per_step']:.3f} "
                           f"| {c['drafted_per_step']:.2f} | {c['est']:.3f} "
                           f"| {k['engine_step_us_p50']:.0f} | {k['engine_step_us_p99']:.0f} "
                           f"| {k['mean_tokens_per_step']:.3f} |")
    out += ["", f"Kernel compilation (warmup, timed apart): {results['compile_s']} s. "
            f"Machine: {results['machine']}, Python {results['python']}."]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default="../shared/data/traces", help="folder of trace files")
    ap.add_argument("--tokenizer", default="../shared/tokenizers/qwen",
                    help="tokenizer.json or its folder")
    ap.add_argument("--out", default="bench/results", help="folder for replay.json/.md")
    ap.add_argument("--only", nargs="*", choices=list(TRACES), help="run only these traces")
    args = ap.parse_args()
    results = run(args)
    save_results(args.out, "replay", results, markdown(results))


if __name__ == "__main__":
    main()
