"""The drafting options measured on short slices of every trace, arctic beside.

Usage (from the repository root):

    python bench/policy_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Slices keep it short: sql 5,000 records, code whole, gorilla 4,000, bfcl 3,000,
agent 10 sessions.  k 16, depth 64; arctic at factor 1, min_token_prob 0.1.
Prints MTS / est / drafted per step per trace and writes ``policy.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder, load_trace

from bench_common import parser

SLICES = {"sql": ("sql_spider_bird.jsonl.gz", {"max_records": 5000}),
          "code": ("code_humaneval_mbpp_leetcode.jsonl.gz", {}),
          "gorilla": ("tool_gorilla_apibench.jsonl.gz", {"max_records": 4000}),
          "bfcl": ("tool_bfcl.jsonl.gz", {"max_records": 3000}),
          "agent": ("agent_miniswe_swebench.jsonl.gz", {"max_sessions": 10})}


def load_slice(traces, name: str, encode, fraction: float = 1.0):
    """The requests of slice ``name`` (``SLICES``), its bounds times ``fraction``."""
    file, kw = SLICES[name]
    kw = {k: max(1, int(v * fraction)) for k, v in kw.items()}
    return load_trace(Path(traces) / file, encode, **kw)


VARIANTS = [
    ("paths (default)", "suffixspec", {}),
    ("paths, no anchors", "suffixspec", {"anchors": False}),
    ("trees (merged)", "suffixspec", {"tree": True}),
    ("arctic-inference", "arctic", {}),
]


def main():
    ap = parser(__doc__)
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    traces = {name: load_trace(Path(args.traces) / f, encode, **kw)
              for name, (f, kw) in SLICES.items()}
    lines = ["| policy | " + " | ".join(traces) + " |", "|---" * (len(traces) + 1) + "|"]
    for label, engine, options in VARIANTS:
        cells = []
        for name, requests in traces.items():
            extra = {"cross_pool_tokens": None, **options} if engine == "suffixspec" else {}
            m = replay(requests, make_proposer(engine, requests, **extra)).metrics()
            cells.append(f"{m['mean_tokens_per_step']:.3f} / {m['est']:.3f} "
                         f"/ {m['drafted_per_step']:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    md = "\n".join(lines) + "\n\nCells: MTS / est / drafted tokens per step.\n"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "policy.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
