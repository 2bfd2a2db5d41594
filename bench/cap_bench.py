"""The draft cap (``max_spec_tokens``, vLLM's ``num_speculative_tokens``): est of
suffixspec's default policy and of arctic-inference at its cost-aware best
(factor 2, min_token_prob 0.2) at each cap, on every shared trace.

    python bench/cap_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --caps 16 24 32

suffixspec's policy stops a draft where the next token's calibrated
probability no longer pays for its verification (``draft_cost``), so a
higher cap lets it draft further only where its estimate says so; arctic's
drafts are bounded by ``max_spec_factor`` times the match length.  est =
MTS / (1 + 0.03 * drafted tokens per step), as in ``replay_bench``.
``--concurrency 32`` replays 32 requests in flight, one batched propose per
engine step.  Writes ``cap.json`` and ``cap.md`` into ``--out``.
"""

from __future__ import annotations

import sys
import time

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import TRACES, load, parser, save_results, token_kinds

ARCTIC = dict(max_spec_factor=2.0, min_token_prob=0.2)


def run(args) -> list[dict]:
    encode = hf_encoder(args.tokenizer)
    warmup()
    kinds = token_kinds(args)
    rows = []
    for name in args.only or list(TRACES):
        requests = load(args.traces, name, encode, args.tokenizer)
        for engine in ("suffixspec", "arctic"):
            if engine == "arctic" and args.no_arctic:
                continue
            for cap in args.caps:
                knobs = dict(max_depth=64, max_spec_tokens=cap)
                knobs.update({"cross_pool_tokens": None, "token_kinds": kinds}
                             if engine == "suffixspec" else ARCTIC)
                t0 = time.perf_counter()
                m = replay(requests, make_proposer(engine, requests, **knobs),
                           concurrency=args.concurrency).metrics()
                row = {"trace": name, "engine": engine, "cap": cap,
                       "concurrency": args.concurrency, "mts": m["mean_tokens_per_step"],
                       "est": m["est"], "drafted": m["drafted_per_step"]}
                rows.append(row)
                print(f"{name} {engine} k{cap}: MTS {row['mts']:.4f} est {row['est']:.4f} "
                      f"drafted {row['drafted']:.2f} ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict], caps: list[int]) -> str:
    by = {(r["trace"], r["engine"], r["cap"]): r for r in rows}
    out = ["| trace | drafter | " + " | ".join(f"est k{c} (drafted/step)" for c in caps) + " |",
           "|---|---|" + "---|" * len(caps)]
    for trace in dict.fromkeys(r["trace"] for r in rows):
        for engine in ("suffixspec", "arctic"):
            cells = [f"{r['est']:.4f} ({r['drafted']:.2f})" if (r := by.get((trace, engine, c)))
                     else "-" for c in caps]
            if any(c != "-" for c in cells):
                out.append(f"| {trace} | {engine} | " + " | ".join(cells) + " |")
        arctic = [r["est"] for c in caps if (r := by.get((trace, "arctic", c)))]
        if arctic:
            best = max(arctic)
            out.append(f"| {trace} | suffixspec / arctic's best cap | " + " | ".join(
                f"{r['est'] / best:.3f}" if (r := by.get((trace, "suffixspec", c))) else "-"
                for c in caps) + " |")
    conc = rows[0]["concurrency"] if rows else 1
    out += ["", f"{conc} request(s) in flight; arctic at factor 2, min_token_prob 0.2."]
    return "\n".join(out)


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(TRACES), help="run only these traces")
    ap.add_argument("--caps", nargs="+", type=int, default=[16, 24, 32])
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--no-arctic", action="store_true", help="suffixspec only")
    ap.add_argument("--name", default="cap", help="file name of the results")
    args = ap.parse_args()
    rows = run(args)
    save_results(args.out, args.name, rows, markdown(rows, args.caps))


if __name__ == "__main__":
    main()
