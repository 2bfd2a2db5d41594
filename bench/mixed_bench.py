"""One server, five workloads: what one calibration table for all of them costs.

Usage (from the repository root):

    python bench/mixed_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results [--fraction 0.5]

The replay benchmarks replay each trace with a proposer of its own, so its
calibration table (``calibration``) and the arbiter's learn one workload.  A
server sees them mixed.  This replays the five slices (``policy_bench.SLICES``
x ``--fraction``) merged into one stream, one request at a time, each trace
spread evenly over it in its own order (a conversation's turns stay in
order), and reports each workload's MTS and est (its own steps, drafted and
emitted tokens) under:

- ``alone``: each slice replayed by a proposer of its own (what ``replay_bench``
  measures);
- ``one proposer, one namespace``: every output joins one namespace and one
  calibration table serves all, as a vLLM server does unless its requests
  name namespaces (``SUFFIXSPEC_REQUEST_NAMESPACES``);
- ``one proposer, a namespace each, one table``: each workload's outputs
  join and draft from a namespace of its own (``start_request(namespace=)``),
  with one calibration table for all (``namespace_tables=0``);
- ``one proposer, a namespace each``: the same with the defaults, a
  calibration table per namespace (``namespace_tables``);
- ``a proposer each, one threshold``: a proposer per workload (calibration
  and arbiter tables of its own) whose threshold state (running means of
  emitted and drafted tokens, ``Stats.state``) is one, shared.

Writes ``mixed.json`` and ``mixed.md`` into ``--out``.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import EST_TOKEN_COST, replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, save_results
from policy_bench import SLICES, load_slice

RUNS = ("alone", "one proposer, one namespace", "one proposer, a namespace each, one table",
        "one proposer, a namespace each", "a proposer each, one threshold")


class Tally:
    """Per workload: steps, drafted and emitted tokens, around a proposer."""

    def __init__(self, inner, workload_of: dict, namespaces: bool):
        self.inner, self.workload_of, self.namespaces = inner, workload_of, namespaces
        self.steps, self.drafted, self.emitted = Counter(), Counter(), Counter()

    def start_request(self, req_id, prompt, **kw):
        if self.namespaces:
            kw["namespace"] = self.workload_of[req_id]
        self.inner.start_request(req_id, prompt, **kw)

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids)
        for req_id, draft in zip(req_ids, drafts):
            self.steps[self.workload_of[req_id]] += 1
            self.drafted[self.workload_of[req_id]] += len(draft)
        return drafts

    def extend_batch(self, req_ids, emitted):
        for req_id, tokens in zip(req_ids, emitted):
            self.emitted[self.workload_of[req_id]] += len(tokens)
        self.inner.extend_batch(req_ids, emitted)

    def finish_request(self, req_id):
        self.inner.finish_request(req_id)

    def figures(self) -> dict:
        out = {}
        for w in list(self.steps) + ["all"]:
            steps, drafted, emitted = (sum(c.values()) if w == "all" else c[w]
                                       for c in (self.steps, self.drafted, self.emitted))
            mts = emitted / steps
            out[w] = {"steps": steps, "mts": mts,
                      "est": mts / (1 + EST_TOKEN_COST * drafted / steps)}
        return out


class PerWorkload:
    """A proposer per workload, one threshold state: each call copies the
    shared state into the proposer it routes to and back (in place: the
    kernels hold the arrays)."""

    def __init__(self, proposers: dict, workload_of: dict):
        self.proposers, self.workload_of = proposers, workload_of
        self.state = next(iter(proposers.values())).stats.state.copy()

    def _on(self, req_id):
        p = self.proposers[self.workload_of[req_id]]
        p.stats.state[:] = self.state
        return p

    def _off(self, p):
        self.state[:] = p.stats.state

    def start_request(self, req_id, prompt, **kw):
        p = self._on(req_id)
        p.start_request(req_id, prompt, **kw)
        self._off(p)

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = []
        for req_id in req_ids:
            p = self._on(req_id)
            drafts.append(p.propose([req_id])[0])
            self._off(p)
        return drafts

    def extend_batch(self, req_ids, emitted):
        for req_id, tokens in zip(req_ids, emitted):
            p = self._on(req_id)
            p.extend(req_id, tokens)
            self._off(p)

    def finish_request(self, req_id):
        p = self._on(req_id)
        p.finish_request(req_id)
        self._off(p)


def merged(slices: dict) -> list:
    """The slices in one stream, each spread evenly over it in its own order."""
    keyed = sorted((i / len(reqs), name, i) for name, reqs in slices.items()
                   for i in range(len(reqs)))
    return [slices[name][i] for _, name, i in keyed]


def markdown(results: dict, fraction: float) -> str:
    names = [n for n in results["alone"] if n != "all"] + ["all"]
    lines = [f"The five slices of `policy_bench` x {fraction} replayed as one stream, one "
             f"request at a time; per workload MTS / est, and the change in est against "
             f"`alone` (each slice replayed by a proposer of its own).", "",
             "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for run in RUNS:
        cells = []
        for n in names:
            r, a = results[run][n], results["alone"][n]
            change = "" if run == "alone" else f" ({100 * (r['est'] / a['est'] - 1):+.2f}%)"
            cells.append(f"{r['mts']:.4f} / {r['est']:.4f}{change}")
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = parser(__doc__)
    ap.add_argument("--fraction", type=float, default=0.5)
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    slices = {name: [replace(r, req_id=f"{name}/{r.req_id}")
                     for r in load_slice(args.traces, name, encode, args.fraction)]
              for name in SLICES}
    workload_of = {r.req_id: name for name, reqs in slices.items() for r in reqs}
    stream = merged(slices)

    def fresh(reqs, **settings):
        return make_proposer("suffixspec", reqs, cross_pool_tokens=None, **settings)

    results = {"alone": {}}
    alone_tally = Tally(None, workload_of, False)
    for name, reqs in slices.items():
        tally = Tally(fresh(reqs), workload_of, False)
        replay(reqs, tally)
        for c in ("steps", "drafted", "emitted"):
            getattr(alone_tally, c).update(getattr(tally, c))
    results["alone"] = alone_tally.figures()
    for run, tally in (
            (RUNS[1], Tally(fresh(stream), workload_of, False)),
            (RUNS[2], Tally(fresh(stream, namespace_tables=0), workload_of, True)),
            (RUNS[3], Tally(fresh(stream), workload_of, True)),
            (RUNS[4], Tally(PerWorkload({n: fresh(r) for n, r in slices.items()},
                                        workload_of), workload_of, False))):
        replay(stream, tally)
        results[run] = tally.figures()
        print(f"{run}: " + ", ".join(f"{n} {r['est']:.4f}" for n, r in results[run].items()),
              file=sys.stderr)
    save_results(args.out, "mixed", {"fraction": args.fraction, "runs": results},
                 markdown(results, args.fraction))


if __name__ == "__main__":
    main()
