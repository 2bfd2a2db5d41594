"""The replay gate of drafting on the device: what one-step-old windows cost.

Usage (from the repository root):

    python bench/device_gate.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Per trace and requests in flight (1 and 32), k = 16, the same requests
through:

* ``host``: suffixspec drafting on the host at every step (``suffixspec``);
* ``device``: ``suffixspec-device``: drafts from windows the host built one
  step before, the own-history scan, the family row, the pool's device
  corpus and its one-token paths (``suffixspec.device``), scored with the
  same calibration;
* ``device, windows only``: the same without the corpus and the one-token
  paths, so the table shows what those tiers add;
* ``device, no arbiter``: the device without the arbiter
  (``SUFFIXSPEC_DEVICE_ARBITER=0``), its A/B;
* ``device, no family row``: the device without family rows (the family
  outputs reach it only as the own tree's window), their A/B.
* ``device, no live corpus``: the device without the other requests' open
  outputs (``corpus.LiveCorpus``; ``SUFFIXSPEC_DEVICE_LIVE=0``), its A/B.

Reports est (MTS / (1 + 0.03 x drafted)), its ratio to the host's (the gate:
>= 0.98), and the share of steps drafted from a window, the own-history
scan, the corpus, the open outputs, the one-token paths, the family row,
or not at all.  Slices:
the bench_common slices times ``--fraction``.  Writes ``device_gate.json`` and
``device_gate.md``.
"""

from __future__ import annotations

import sys
import time

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import SLICES, load_slice, parser, save_results, token_kinds

K16 = dict(max_depth=64, max_spec_tokens=16)
RUNS = {  # name -> (engine, settings)
    "host": ("suffixspec", K16),
    "device": ("suffixspec-device", K16),
    "device, no arbiter": ("suffixspec-device", dict(K16, arbiter=False)),
    "device, windows only": ("suffixspec-device", dict(K16, corpus_tokens=0, vocab_size=0)),
    "device, no family row": ("suffixspec-device", dict(K16, family=False)),
    "device, no live corpus": ("suffixspec-device", dict(K16, live=False)),
}
SOURCES = ("window", "scan", "corpus", "live", "short", "family", "none")
SOURCE_NAMES = {"live": "open outputs", "short": "one-token"}  # the rest as named
OPTIONAL = ("device, no arbiter", "device, no family row",
            "device, no live corpus")  # A/Bs, run when asked


def main():
    ap = parser(__doc__)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--fraction", type=float, default=0.5, help="of each slice (bench_common.SLICES)")
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    ap.add_argument("--runs", nargs="*", choices=list(RUNS),
                    default=[r for r in RUNS if r not in OPTIONAL])
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    kinds = token_kinds(args)
    rows = []
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode, args.fraction)
        for b in (int(c) for c in args.concurrency.split(",")):
            row = {"trace": name, "concurrency": b}
            for run, (engine, settings) in RUNS.items():
                if run not in args.runs:
                    continue
                t0 = time.perf_counter()
                proposer = make_proposer(engine, requests, token_kinds=kinds, **settings)
                m = replay(requests, proposer, concurrency=b).metrics()
                row[run] = {k: m[k] for k in ("mean_tokens_per_step", "est", "drafted_per_step")}
                counts = getattr(proposer, "counts", None)
                if counts:
                    steps = max(sum(counts.values()), 1)
                    row[run]["sources"] = {s: counts.get(s, 0) / steps for s in SOURCES}
                print(f"{name} @{b} {run}: est {m['est']:.4f}, MTS "
                      f"{m['mean_tokens_per_step']:.4f} ({time.perf_counter() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
            rows.append(row)
    save_results(args.out, "device_gate", {"fraction": args.fraction, "rows": rows},
                 markdown(rows, args))


def markdown(rows: list[dict], args) -> str:
    bare = any("device, windows only" in r for r in rows)
    abs_ = [run for run in OPTIONAL if any(run in r for r in rows)]
    out = ["| trace | in flight | host est | device est | device / host | "
           + ("windows only / host | " if bare else "")
           + "".join(f"{run} | device / {run} | " for run in abs_)
           + f"steps from {' / '.join(SOURCE_NAMES.get(s, s) for s in SOURCES)} |",
           "|---|---|---|---|---|" + ("---|" if bare else "") + "---|---|" * len(abs_)
           + "---|"]
    for r in rows:
        host, dev = r["host"]["est"], r["device"]["est"]
        shares = " / ".join(f"{100 * r['device']['sources'].get(s, 0.0):.0f}%" for s in SOURCES)
        alone = (f" {r['device, windows only']['est'] / host:.3f} |"
                 if "device, windows only" in r else " - |") if bare else ""
        versus = ""
        for run in abs_:
            other = r.get(run, {}).get("est")
            versus += (f" {other:.4f} | {100 * (dev / other - 1):+.2f}% |" if other
                       else " - | - |")
        out.append(f"| {r['trace']} | {r['concurrency']} | {host:.3f} | {dev:.3f} | "
                   f"**{dev / host:.3f}** |{alone}{versus} {shares} |")
    return "\n".join(out) + (
        f"\n\nk = 16, depth 64, draft cost 0.03 for every run; windows one step old (8 per "
        f"request, 64 tokens).  Slices: the bench_common slices times {args.fraction}.  The gate: "
        f"device / host >= 0.98.\n")


if __name__ == "__main__":
    main()
