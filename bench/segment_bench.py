"""What drafting from K separate cross-request indexes costs against one index.

A pool split into time segments (each an index over the outputs of one
stretch of time) can draft from each segment apart and keep the best draft,
as suffixspec did for a persistent pool's snapshot and its in-memory part.
This replay measures what that loses against one index over the same outputs:
each finished output joins the newest of K cross-request trees (a new one
starts when it holds 1/K of the slice's output tokens) and every request
drafts from all of them.  K = 1 is the single index.

A second table replays each slice's first half into a persistent pool, writes
its snapshot, and replays the second half: the snapshot and the in-memory
part are counted together now (``suffixspec/native/union.py``), so the second
half should draft as with an in-memory pool that saw the same first half.

Usage (from the repository root):

    python bench/segment_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Slices as in ``bench/policy_bench.py``; suffixspec's default policy, an
unbounded in-memory cross pool.  Writes ``segments.md`` and ``segments.json``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from suffixspec import SuffixProposer
from suffixspec.fingerprint import tokenizer_id
from suffixspec.native import warmup
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder, load_trace

from bench_common import parser, save_results
from policy_bench import SLICES


class TimeSegments:
    """A proposer whose finished outputs go to the newest of several cross trees."""

    def __init__(self, proposer: SuffixProposer, lengths: dict, per_segment: float):
        self.proposer = proposer
        self.lengths = lengths
        self.per_segment = per_segment
        self.filled = 0
        self.segments = ["segment-0"]

    def start_request(self, req_id, prompt):
        self.proposer.start_request(req_id, prompt, namespace=self.segments[-1],
                                    draw_from=self.segments)

    def finish_request(self, req_id):
        self.proposer.finish_request(req_id)
        self.filled += self.lengths[req_id]
        if self.filled >= self.per_segment:
            self.filled = 0
            self.segments.append(f"segment-{len(self.segments)}")

    def __getattr__(self, name):  # propose, extend, extend_batch, abort_request
        return getattr(self.proposer, name)


def main():
    ap = parser(__doc__)
    ap.add_argument("--segments", default="1,2,4,8", help="segment counts to compare")
    args = ap.parse_args()
    counts = sorted({1, *(int(k) for k in args.segments.split(","))})
    encode = hf_encoder(args.tokenizer)
    warmup()
    lines = ["| trace | segments | MTS (vs 1) | est (vs 1) | µs/step p50 |", "|---|---|---|---|---|"]
    data = {}
    for name, (file, kw) in SLICES.items():
        requests = load_trace(Path(args.traces) / file, encode, **kw)
        lengths = {r.req_id: r.output.shape[0] for r in requests}
        total = sum(lengths.values())
        one = None
        for k in counts:
            proposer = TimeSegments(SuffixProposer(cross_pool_tokens=None), lengths,
                                    total / k + 1)
            m = replay(requests, proposer).metrics()
            m["segments"] = len(proposer.segments)
            one = one or m
            data[f"{name} {k}"] = m
            lines.append(f"| {name} | {m['segments']} | {m['mean_tokens_per_step']:.3f} "
                         f"({m['mean_tokens_per_step'] / one['mean_tokens_per_step']:.4f}) | "
                         f"{m['est']:.3f} ({m['est'] / one['est']:.4f}) | "
                         f"{m['proposer_us_per_step_p50']:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", "| trace | second half: in-memory pool MTS / est | persistent pool MTS / est "
              "| est ratio | µs/step p50 |", "|---|---|---|---|---|"]
    tokenizer = tokenizer_id(args.tokenizer)
    for name, (file, kw) in SLICES.items():
        requests = load_trace(Path(args.traces) / file, encode, **kw)
        memory, pool = (snapshot_then_live(requests, tokenizer, persistent)
                        for persistent in (False, True))
        data[f"{name} snapshot+live"] = {"memory": memory, "pool": pool}
        lines.append(f"| {name} | {memory['mean_tokens_per_step']:.3f} / {memory['est']:.3f} | "
                     f"{pool['mean_tokens_per_step']:.3f} / {pool['est']:.3f} | "
                     f"{pool['est'] / memory['est']:.4f} | "
                     f"{memory['proposer_us_per_step_p50']:.1f} / "
                     f"{pool['proposer_us_per_step_p50']:.1f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    save_results(args.out, "segments", data, "\n".join(lines))


def snapshot_then_live(requests, tokenizer, persistent: bool) -> dict:
    """Metrics of the second half, after the first half went into a snapshot (or memory)."""
    half = len(requests) // 2
    with tempfile.TemporaryDirectory() as folder:
        pool = Path(folder) / "pool.lmdb" if persistent else None
        proposer = SuffixProposer(cross_pool_tokens=None, pool=pool,
                                  tokenizer=tokenizer if persistent else None)
        replay(requests[:half], proposer)
        if persistent:
            proposer.cross.write_snapshot()
        metrics = replay(requests[half:], proposer).metrics()
        if persistent:
            proposer.cross.close()
        return metrics


if __name__ == "__main__":
    main()
