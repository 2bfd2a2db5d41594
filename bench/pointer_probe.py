"""Does an edit-aware copy pointer add to suffixspec's drafts?  A probe, not a policy.

Usage (from the repository root):

    python bench/pointer_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results [--only agent]

An agent that rewrites a file it has just viewed copies it with edits.  After
an edit the context's suffix no longer matches the place it was copying from,
so suffix matching (suffixspec's tries, vLLM's newest-longest rule) falls back
to one- or two-token matches anywhere in the history.  A *copy pointer*
remembers where the copy was: after a step it expects the next token at the
old place plus the tokens emitted, looks within ``WINDOW`` tokens of there for
the position whose preceding tokens match the context's end longest (ties to
the nearest), and where nothing near matches guesses a one-token substitution
and drafts from the expected place anyway.  It is (re)started at the newest
occurrence of the longest own match (vLLM's rule, two tokens or more) and
kept while its drafts are accepted, or for up to ``PATIENCE`` steps while
its local match holds.

Each trace's slice (``policy_bench.SLICES`` x ``--fraction``) is replayed one
request at a time with suffixspec at its defaults (paths), vLLM's GPU drafter
model (``vllm-gpu``, plain) and the pointer drafting from the same context;
the replay advances by the tokens the *driving rule's* draft would have had
accepted (agreement with the recorded output) plus the bonus token:

- ``suffixspec``: suffixspec's own draft (the baseline);
- ``learned``: per cell (suffixspec's match length, the pointer's local match,
  each clipped to 5, and whether the pointer's first token is vLLM's), the
  draft whose value so far leads: accepted tokens, less the threshold per
  drafted token at a draft cost; no hindsight (``--margins``: also with the
  pointer's lead required to pass a margin times the root of the cell's
  steps, after 10 steps).  At a draft cost the pointer's
  draft is cut where the running product of its learned per-depth acceptance
  (per local-match length) meets the threshold, as the policy cuts its own;
- ``hindsight``: the draft whose value (as above) was highest, among
  suffixspec's, no draft at all (at a draft cost, the cut made with
  hindsight), and the pointer's, vLLM's (uncut) or both: a replay-level
  bound of what choosing among them can add beyond cutting.

Tokens per step (MTS) and est (MTS / (1 + cost x drafted per step)) are of
each driven replay.  Writes ``pointer.json`` and ``pointer.md`` into ``--out``.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import numpy as np

from suffixspec.config import DEFAULT_DRAFT_COST
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.traces import hf_encoder

from bench_common import config_settings, parser, save_results
from policy_bench import SLICES, load_slice

K = 16
WINDOW = 24  # how far from the expected place the pointer looks for its match
PATIENCE = 2  # steps a pointer with a local match is kept without an accepted token
LOCAL_CAP = 32  # longest local match measured
DRIVES = ("suffixspec", "learned", "hindsight: suffixspec or none",
          "hindsight: suffixspec, pointer or none", "hindsight: suffixspec, vLLM or none",
          "hindsight: suffixspec, vLLM, pointer or none")


def accepted(draft: np.ndarray, truth: np.ndarray) -> int:
    """Leading tokens of ``draft`` the recorded output agrees with."""
    n = min(draft.shape[0], truth.shape[0], K)
    miss = np.flatnonzero(draft[:n] != truth[:n])
    return int(miss[0]) if miss.size else n


def local_matches(whole: np.ndarray, n: int, places: np.ndarray) -> np.ndarray:
    """How many tokens before each of ``places`` equal the last ones of ``whole[:n]``."""
    lengths = np.zeros(places.shape[0], np.int64)
    alive = np.ones(places.shape[0], bool)
    for j in range(min(LOCAL_CAP, n)):
        at = places - 1 - j
        alive &= at >= 0
        alive[alive] = whole[at[alive]] == whole[n - 1 - j]
        if not alive.any():
            break
        lengths += alive
    return lengths


def newest_place(whole: np.ndarray, n: int, m: int) -> int:
    """Where what followed the newest earlier occurrence of ``whole[n - m:n]`` starts, or -1."""
    ends = np.flatnonzero(whole[:n - 1] == whole[n - 1])
    ends = ends[ends >= m - 1]
    for j in range(1, m):
        ends = ends[whole[ends - j] == whole[n - 1 - j]]
    return int(ends[-1]) + 1 if ends.size else -1


class Pointer:
    """One request's copy pointer over ``whole`` (prompt and recorded output)."""

    label = "pointer"

    def __init__(self, req):
        self.whole = np.concatenate([req.prompt, req.output]).astype(np.int64)
        self.n = req.prompt.shape[0]
        self.expected = -1  # where the next token is expected; -1: no pointer
        self.idle = 0
        self.place = self.local = -1  # of the last draft

    def draft(self) -> tuple[np.ndarray, int]:
        """``(tokens, local match)``: the pointer's draft (empty: none)."""
        e, n = self.expected, self.n
        self.place = self.local = -1
        if e <= 0:
            return np.zeros(0, np.int64), -1
        places = np.arange(max(1, e - WINDOW), min(n - 1, e + WINDOW) + 1)
        if not places.size:
            return np.zeros(0, np.int64), -1
        lengths = local_matches(self.whole, n, places)
        best = int(lengths.max())
        tied = places[lengths == best]
        place = int(tied[np.argmin(np.abs(tied - e))]) if best > 0 else e
        if place >= n:
            return np.zeros(0, np.int64), -1
        self.place, self.local = place, best
        return self.whole[place:min(n, place + K)], best

    @staticmethod
    def agrees(tokens: np.ndarray, ds, dv) -> bool:
        """The cell's flag: the pointer's first token is vLLM's."""
        return bool(tokens.shape[0] and len(dv.token_ids) and tokens[0] == dv.token_ids[0])

    def advance(self, step: np.ndarray, drafted: np.ndarray, got: int, dv) -> None:
        """After ``step`` was emitted: follow the copy, or restart at vLLM's match."""
        vllm_match = int(dv.match_len) if len(dv.token_ids) else 0
        local = self.local
        if drafted.shape[0] and (got > 0 or (local > 0 and self.idle < PATIENCE)):
            self.idle = 0 if got > 0 else self.idle + 1
            self.expected = self.place + step.shape[0]
        else:
            self.idle = 0
            found = (newest_place(self.whole, self.n, vllm_match)
                     if vllm_match >= 2 and dv.source != "cross" else -1)
            self.expected = found + step.shape[0] if found >= 0 else -1
        self.n += step.shape[0]


def replay(requests, drive: str, cost: float, third=Pointer, settings=None) -> dict:
    """One replay driven by ``drive`` over suffixspec's, vLLM's and ``third``'s drafts.

    ``third(req)`` makes a request's extra drafter: ``draft()`` gives its
    tokens and local match, ``agrees(tokens, ds, dv)`` the flag of its
    learned cell, ``advance(step, drafted, accepted, dv)`` follows the
    emitted tokens.  Drive names call it by ``third.label``.  ``settings``:
    suffixspec's ``ProposerConfig`` settings besides the defaults.
    """
    s = make_proposer("suffixspec", cross_pool_tokens=None, draft_cost=cost, **(settings or {}))
    v = make_proposer("vllm-gpu", max_spec_tokens=K)
    value = defaultdict(Counter)  # learned: cell -> summed value per drafter
    depth = defaultdict(lambda: [0, 0])  # (local match, depth) -> reached, accepted
    emitted, drafted_mean, thr = 2.0, 4.0, 0.0
    steps = tokens = drafted = 0
    took = Counter()
    for req in requests:
        rid, out = req.req_id, req.output
        s.start_request(rid, req.prompt)
        v.start_request(rid, req.prompt)
        extra = third(req)
        i = 0
        while i < out.shape[0]:
            truth = out[i:]
            ds, dv = s.propose([rid])[0], v.propose([rid])[0]
            whole_ptr, local = extra.draft()
            local = min(local, 5)
            p_tokens = whole_ptr
            if cost > 0 and whole_ptr.shape[0]:  # cut as the policy cuts: the threshold
                prob, keep = 1.0, 0
                for d in range(whole_ptr.shape[0]):
                    reached, right = depth[(local, min(d, 8))]
                    prob *= (right + 1) / (reached + 2)
                    if prob <= thr:
                        break
                    keep += 1
                p_tokens = whole_ptr[:keep]
            got = {"s": accepted(ds.token_ids, truth), "v": accepted(dv.token_ids, truth),
                   "p": accepted(p_tokens, truth), "n": 0}
            lengths = {"s": len(ds.token_ids), "v": len(dv.token_ids), "p": p_tokens.shape[0],
                       "n": 0}
            full = accepted(whole_ptr, truth)
            if whole_ptr.shape[0]:
                for d in range(min(full + 1, whole_ptr.shape[0])):
                    cell = depth[(local, min(d, 8))]
                    cell[0] += 1
                    cell[1] += d < full
            cell = (min(int(ds.match_len) if len(ds.token_ids) else 0, 5), local,
                    third.agrees(p_tokens, ds, dv))
            if drive == "suffixspec":
                pick = "s"
            elif drive.startswith("learned"):
                # "learned, margin m": the third's lead must pass m x sqrt(steps in the cell)
                margin = float(drive.split()[-1]) if "margin" in drive else 0.0
                lead = value[cell]["p"] - value[cell]["s"]
                pick = ("p" if lengths["p"] and lead > 0 and
                        (margin == 0 or (value[cell]["steps"] >= 10 and
                                         lead > margin * value[cell]["steps"] ** 0.5)) else "s")
            else:
                among = [k for k, name in (("s", "suffixspec"), ("v", "vLLM"),
                                           ("p", third.label), ("n", "none")) if name in drive]
                pick = max(among, key=lambda k: (got[k] - thr * lengths[k], k == "s"))
            if lengths["p"]:
                for k in ("s", "p"):
                    value[cell][k] += got[k] - thr * lengths[k]
                value[cell]["steps"] += 1
            took[pick] += 1
            step = out[i:i + got[pick] + 1]
            s.extend(rid, step)
            v.extend(rid, step)
            extra.advance(step, whole_ptr, full, dv)
            i += step.shape[0]
            steps += 1
            drafted += lengths[pick]
            emitted = 0.999 * emitted + 0.001 * step.shape[0]
            drafted_mean = 0.999 * drafted_mean + 0.001 * lengths[pick]
            thr = cost * emitted / (1 + cost * drafted_mean)
        tokens += out.shape[0]
        s.finish_request(rid)
        v.finish_request(rid)
    mts = tokens / steps
    return {"steps": steps, "mts": mts, "drafted_per_step": drafted / steps,
            "est": mts / (1 + DEFAULT_DRAFT_COST * drafted / steps),
            "took": {k: took[k] / steps for k in ("s", "v", "p", "n")}}


def markdown(results: dict, fraction: float, third: str = "a copy pointer") -> str:
    names = list(results)
    lines = [f"Replays driven by a rule over suffixspec's, vLLM's and {third}'s drafts "
             f"(one request at a time, slices of `policy_bench` x {fraction}, k {K}).  "
             f"Change against suffixspec's own replay at the same cost.", "",
             "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for cost, what in ((0.0, "MTS, drafts free"), (DEFAULT_DRAFT_COST, "est, default cost")):
        key = "mts" if cost == 0 else "est"
        for drive in dict.fromkeys(d for r in results.values() for d in r.get(f"{cost:g}", {})):
            runs = [results[n].get(f"{cost:g}", {}) for n in names]
            if not any(drive in r for r in runs):
                continue
            cells = []
            for r in runs:
                if drive not in r:
                    cells.append("")
                    continue
                base = r["suffixspec"][key]
                cells.append(f"{r[drive][key]:.4f} ({100 * (r[drive][key] / base - 1):+.2f}%)")
            lines.append(f"| {what}: {drive} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def probe(doc: str, stem: str, drives: tuple, third, what: str) -> None:
    """A probe's command line: replays each slice under each drive and cost
    (``third()``: a fresh maker of the third drafter per replay) and writes
    ``{stem}.json`` / ``.md`` (``what`` names the third drafter)."""
    ap = parser(doc)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    ap.add_argument("--costs", nargs="*", type=float, default=[0.0, DEFAULT_DRAFT_COST])
    ap.add_argument("--margins", nargs="*", type=float, default=[],
                    help="also the learned rule with these margins (after 10 steps in a cell)")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="suffixspec's ProposerConfig settings besides the defaults")
    args = ap.parse_args()
    drives = drives + tuple(f"learned, margin {m:g}" for m in args.margins)
    settings = config_settings(args.set)
    encode = hf_encoder(args.tokenizer)
    results = {}
    for name in args.only or SLICES:
        requests = load_slice(args.traces, name, encode, args.fraction)
        results[name] = {}
        for cost in args.costs:
            results[name][f"{cost:g}"] = {d: replay(requests, d, cost, third(), settings)
                                          for d in drives}
            print(f"{name} cost {cost:g}: " + ", ".join(
                f"{d} {r['mts']:.4f}/{r['est']:.4f}"
                for d, r in results[name][f"{cost:g}"].items()), file=sys.stderr, flush=True)
    suffix = "" if not args.only else "_" + "_".join(args.only)
    save_results(args.out, f"{stem}{suffix}",
                 {"fraction": args.fraction, "settings": settings, "traces": results},
                 markdown(results, args.fraction, what))


if __name__ == "__main__":
    probe(__doc__, "pointer", DRIVES, lambda: Pointer, "a copy pointer")
