"""How the reference is found, and what finding it costs.

Usage (from the repository root):

    python bench/reference_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--only agent code] [--out bench/results]

Replays the slices of ``policy_bench`` with the default proposer and, before
every step's draft, finds the request's reference again beside it, by
``calibrated.own_reference`` (the longest own match, a scan of the last
``max_depth`` tokens, then the own tree's list of older occurrences, then a
scan where the tree cannot list them) and by ``calibrated.reference`` at the
same match (a scan back to the newest occurrence, at most ``newest_window``
tokens).  Prints, per slice, how each step's reference was found and the
mean time per step of each call.  Each time is of ``--reps`` calls from
Python and includes one Numba dispatch per call, so what finding costs is a
difference of two rows: each call less the same call with a window of one
token (nothing to look through).  Writes ``reference.json`` and ``.md``
under ``--out``.
"""

from __future__ import annotations

import time

import numpy as np

from suffixspec.config import DEFAULT_NEWEST_WINDOW
from suffixspec.native import layout as lay
from suffixspec.native import warmup
from suffixspec.native.calibrated import (SCAN, listed_newest, longest, newest_occurrence,
                                          own_reference, reference)
from suffixspec.native.trie import longest_match
from suffixspec.native.union import side, table
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, save_results
from policy_bench import SLICES, load_slice

WAYS = ("own_reference (the default)", "own_reference, window 1: the longest match and the call",
        "reference: the scan back", "reference, window 1: the call")
FOUND = ("no own match", "scan of the last max_depth tokens", "listed by the own tree",
         "none before, listed by the own tree", "long scan (the tree could not list)")


class Finding:
    """A proposer that finds each request's reference beside its own drafting."""

    def __init__(self, inner, depth: int, window: int, reps: int):
        self.inner = inner
        self.depth, self.window, self.reps = depth, window, reps
        self.found = dict.fromkeys(FOUND, 0)
        self.seconds = dict.fromkeys(WAYS, 0.0)
        self.scanned = 0  # tokens the long scans went back
        self.steps = 0
        self.ref = np.zeros(self.inner.max_spec_tokens + 1, np.int64)

    def propose(self, req_ids, max_spec_tokens=None):
        pool = self.inner.requests
        arrays = pool.index.read_only_arrays()
        mine = table([arrays])
        arena, seqs = arrays[4], pool.index.seqs
        for r in req_ids:
            tree, s = pool.requests[r]
            n = int(seqs[s, lay.SEQ_LEN])
            off = int(seqs[s, lay.SEQ_OFF])
            end = off + n
            start = max(off, end - self.depth)
            trees = (mine, np.array([pool.index.roots[tree]], np.int64),
                     (int(seqs[s, lay.SEQ_SLOT]), n, n))
            self._classify(trees, s, arena, off, start, end)
            length = longest(trees, arena, start, end, self.depth, np.zeros(1, np.int64))
            calls = (lambda: own_reference(trees, s, arena, start, end, self.depth, self.window,
                                           self.ref),
                     lambda: own_reference(trees, s, arena, start, end, self.depth, 1, self.ref),
                     lambda: reference(arena, off, end, length, self.window, self.ref),
                     lambda: reference(arena, off, end, length, 1, self.ref))
            for way, call in zip(WAYS, calls):
                t0 = time.perf_counter()
                for _ in range(self.reps):
                    call()
                self.seconds[way] += (time.perf_counter() - t0) / self.reps
            self.steps += 1
        return self.inner.propose(req_ids, max_spec_tokens)

    def _classify(self, trees, s, arena, off, start, end):
        ix = side(trees[0], 0)
        length, x, at = longest_match(ix, trees[1][0], arena, start, end, self.depth - 1, True,
                                      trees[2])
        if length <= 0:
            kind = FOUND[0]
        elif newest_occurrence(arena, off, end, length, min(self.window, self.depth)) >= 0:
            kind = FOUND[1]
        else:
            e = listed_newest(ix, x, at, s, arena, end, length, self.window)
            if e == SCAN:
                kind = FOUND[4]
                e = newest_occurrence(arena, off, end, length, self.window)
                self.scanned += min(end - off, self.window) if e < 0 else end - e
            else:
                kind = FOUND[2] if e >= 0 else FOUND[3]
        self.found[kind] += 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), help="these slices only")
    ap.add_argument("--reps", type=int, default=20, help="calls timed per step and way")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    rows = {}
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode)
        proposer = make_proposer("suffixspec", requests, cross_pool_tokens=None)
        finding = Finding(proposer, proposer.max_depth, DEFAULT_NEWEST_WINDOW, args.reps)
        replay(requests, finding)
        rows[name] = {"steps": finding.steps, "found": finding.found,
                      "long scan tokens per such step": finding.scanned
                      / max(finding.found[FOUND[4]], 1),
                      "us per step": {w: 1e6 * t / finding.steps
                                      for w, t in finding.seconds.items()}}
    save_results(args.out, "reference", rows, markdown(rows, args.reps))


def markdown(rows: dict, reps: int) -> str:
    names = list(rows)
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|",
             "| steps | " + " | ".join(f"{rows[n]['steps']:,}" for n in names) + " |"]
    for kind in FOUND:
        lines.append(f"| found: {kind} | " + " | ".join(
            f"{rows[n]['found'][kind] / rows[n]['steps']:.1%}" for n in names) + " |")
    lines.append("| long scan: tokens back per such step | " + " | ".join(
        f"{rows[n]['long scan tokens per such step']:.0f}" for n in names) + " |")
    for way in WAYS:
        lines.append(f"| µs per step: {way} | " + " | ".join(
            f"{rows[n]['us per step'][way]:.2f}" for n in names) + " |")
    for label, (a, b) in (("finding it, the default (own_reference less its window-1 call)",
                           (0, 1)),
                          ("finding it by the scan (the scan less its window-1 call)", (2, 3))):
        lines.append(f"| **µs per step: {label}** | " + " | ".join(
            f"**{rows[n]['us per step'][WAYS[a]] - rows[n]['us per step'][WAYS[b]]:.2f}**"
            for n in names) + " |")
    return "\n".join(lines) + (
        f"\n\nSlices of `policy_bench`, default proposer; `newest_window` "
        f"{DEFAULT_NEWEST_WINDOW}.  Times: mean over steps of {reps} calls from Python each "
        "(one Numba dispatch per call included: the bold rows are differences of two calls alike).\n")


if __name__ == "__main__":
    main()
