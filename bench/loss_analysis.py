"""Where suffixspec loses tokens to other drafters: per step, at the same context.

Usage (from the repository root):

    python bench/loss_analysis.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results [--fraction 0.5]

Each shared trace's slice (``policy_bench.SLICES`` times ``--fraction``) is
replayed one request at a time with three drafters in lockstep: suffixspec at
its defaults (paths), vLLM's GPU drafter model (``vllm-gpu``, plain) and
arctic-inference at its cost-aware setting (``arctic f2``: factor 2,
min_token_prob 0.2).  At each of suffixspec's steps all three draft from the
same context, and each draft's accepted length is its agreement with the
recorded output; the context then advances by suffixspec's accepted tokens
plus the bonus token.  So the figures are per step of suffixspec's replay,
not the others' own replays.

For the steps where another drafter accepted more, the tokens suffixspec
lost are broken down by its draft's source (own history, cross pool, anchored
cross pool, none), its match length, where its draft first missed (no draft,
at the first token, later, or nowhere: every drafted token was right and the
policy's cost cut ended the draft, where vLLM drafts all 16 slots), and, against vLLM, whether the next token was
that of the newest occurrence of vLLM's match in the request's own history,
of the most frequent one, of both (they agree), or of neither (vLLM drafted
from its corpus, or from another occurrence).

Two upper bounds, in tokens per step (accepted + 1): the best of the
candidates the policy enumerates (``SuffixProposer.candidate_windows``: the
best candidate of each place it draws from, continued past the cost cut,
and branch windows), chosen with hindsight; and the better of suffixspec's
and vLLM's drafts at each step.

Rules a policy could follow, decided at the step from what both drafts say
(no hindsight), in accepted tokens per step: take vLLM's draft (the
continuation of the newest occurrence of the longest match in the request's
own history) where its match is longer than suffixspec's; where it is at
least as long; and only where both match just the last token.  They size
what the newest-longest own-history match would add as a candidate of the
policy, and at which match lengths.  A fourth rule learns as the trace goes:
at each pair of match lengths (suffixspec's, vLLM's; each clipped to 5) it
takes the drafter that accepted more over the steps before, as a calibrated
candidate would.

Writes ``loss.json`` and ``loss.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict

import numpy as np

from suffixspec.native import layout as lay
from suffixspec.native.windows import W_AT, W_HEAD, W_LEN
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, save_results
from policy_bench import SLICES, load_slice

K = 16
ARCTIC = dict(max_depth=64, max_spec_tokens=K, max_spec_factor=2.0, min_token_prob=0.2)
RULES = ("vLLM's where its match is longer", "vLLM's where its match is at least as long",
         "vLLM's where both match only the last token",
         "vLLM's where it accepted more so far at these match lengths (learned, no hindsight)")
MATCH_BUCKETS = ((0, 0, "0"), (1, 3, "1-3"), (4, 7, "4-7"), (8, 15, "8-15"), (16, 1 << 30, "16+"))


def accepted(draft: np.ndarray, truth: np.ndarray) -> int:
    """Leading tokens of ``draft`` the recorded output agrees with."""
    n = min(draft.shape[0], truth.shape[0], K)
    miss = np.flatnonzero(draft[:n] != truth[:n])
    return int(miss[0]) if miss.size else n


def bucket(match: int) -> str:
    return next(name for lo, hi, name in MATCH_BUCKETS if lo <= match <= hi)


def occurrence_kind(ctx: np.ndarray, m: int, truth: int) -> str:
    """Whether ``truth`` follows the newest or the most frequent earlier
    occurrence of the context's last ``m`` tokens."""
    if m <= 0 or ctx.shape[0] <= m:
        return "no own match"
    suffix = ctx[-m:]
    windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], m)
    at = np.flatnonzero((windows == suffix).all(axis=1))
    if not at.size:
        return "no own match"
    following = ctx[at + m]
    newest = int(following[-1])
    values, counts = np.unique(following, return_counts=True)
    frequent = int(values[np.argmax(counts)])
    if newest == frequent:
        return "newest = most frequent" if truth == newest else "neither"
    if truth == newest:
        return "newest, not most frequent"
    if truth == frequent:
        return "most frequent, not newest"
    return "neither"


def best_window(windows, count: int, ctx_len: int, truth: np.ndarray) -> int:
    """The most any of the request's windows would have accepted from here."""
    best = 0
    for r in range(count):
        head, length, at = (int(windows.meta[0, r, f]) for f in (W_HEAD, W_LEN, W_AT))
        start = head - (at - ctx_len)  # a branch window's head runs into its path
        if length <= 0 or start < 0 or start > length:
            continue
        best = max(best, accepted(windows.tokens[0, r, start:length], truth))
    return best


def analyse(requests, draft_cost: float | None = None) -> dict:
    options = {} if draft_cost is None else {"draft_cost": draft_cost}
    s = make_proposer("suffixspec", cross_pool_tokens=None, **options)
    a = make_proposer("arctic", **ARCTIC)
    v = make_proposer("vllm-gpu", max_spec_tokens=K)
    windows = lay.windows(1, 8, 64)
    steps = tokens = 0
    acc = Counter()
    ub_windows = ub_pair = 0
    lost = {"vllm": Counter(), "arctic": Counter()}
    lost_steps = Counter()
    rules = Counter()
    past = defaultdict(Counter)  # (match lengths) -> accepted so far, per drafter
    by = {f"{other} {what}": Counter() for other in ("vllm", "arctic")
          for what in ("source", "match", "first miss", "occurrence")}
    for req in requests:
        rid, out = req.req_id, req.output
        for p in (s, a, v):
            p.start_request(rid, req.prompt)
        ctx = [req.prompt]
        i = 0
        while i < out.shape[0]:
            truth = out[i:]
            ds, da, dv = (p.propose([rid])[0] for p in (s, a, v))
            got = {"suffixspec": accepted(ds.token_ids, truth),
                   "arctic": accepted(da.token_ids, truth), "vllm": accepted(dv.token_ids, truth)}
            count = int(s.candidate_windows([rid], windows)[0])
            ctx_len = sum(c.shape[0] for c in ctx)
            win = best_window(windows, count, ctx_len, truth)
            steps += 1
            acc.update(got)
            ub_windows += max(win, got["suffixspec"]) + 1
            ub_pair += max(got["vllm"], got["suffixspec"]) + 1
            mine_len = int(ds.match_len) if len(ds.token_ids) else 0
            theirs = int(dv.match_len) if len(dv.token_ids) else -1
            # Learned as the trace goes, from past steps only: per pair of match
            # lengths (each clipped to 5), the drafter that accepted more so far.
            cell = (min(mine_len, 5), min(theirs, 5))
            learned = past[cell]["vllm"] > past[cell]["suffixspec"]
            for rule, take in ((RULES[0], theirs > mine_len), (RULES[1], theirs >= mine_len),
                               (RULES[2], theirs == mine_len == 1), (RULES[3], learned)):
                rules[rule] += got["vllm" if take else "suffixspec"]
            past[cell]["vllm"] += got["vllm"]
            past[cell]["suffixspec"] += got["suffixspec"]
            mine = got["suffixspec"]
            for other in ("vllm", "arctic"):
                if got[other] <= mine:
                    continue
                gap = got[other] - mine
                lost[other]["tokens"] += gap
                lost_steps[other] += 1
                source = ds.source if len(ds.token_ids) else "none"
                by[f"{other} source"][source] += gap
                by[f"{other} match"][bucket(ds.match_len if len(ds.token_ids) else 0)] += gap
                miss = ("no draft" if not len(ds.token_ids) else
                        "none: the draft ended (cost cut)" if mine == len(ds.token_ids) else
                        "first token" if mine == 0 else "token 2-4" if mine <= 3 else "token 5+")
                by[f"{other} first miss"][miss] += gap
                if other == "vllm":
                    if dv.source == "cross":
                        kind = "vLLM's corpus"
                    else:
                        whole = np.concatenate(ctx)
                        kind = occurrence_kind(whole, min(int(dv.match_len), 24), int(truth[0]))
                    by["vllm occurrence"][kind] += gap
            step = out[i:i + mine + 1]
            for p in (s, a, v):
                p.extend(rid, step)
            ctx.append(step)
            i += step.shape[0]
        tokens += out.shape[0]
        for p in (s, a, v):
            p.finish_request(rid)
    return {"requests": len(requests), "steps": steps, "tokens": tokens,
            "accepted_per_step": {k: acc[k] / steps for k in ("suffixspec", "arctic", "vllm")},
            "tokens_per_step": (tokens / steps),
            "upper_bound_windows": ub_windows / steps, "upper_bound_with_vllm": ub_pair / steps,
            "rules_accepted_per_step": {k: v / steps for k, v in rules.items()},
            "lost": {k: {"steps": lost_steps[k], "tokens": lost[k]["tokens"],
                         "share_of_output": lost[k]["tokens"] / tokens} for k in lost},
            "by": {k: dict(c.most_common()) for k, c in by.items()}}


def markdown(results: dict, fraction: float) -> str:
    names = list(results)
    lines = [f"Per step of suffixspec's replay (one request at a time, slices of "
             f"`policy_bench` x {fraction}), three drafters at the same context; accepted "
             f"lengths are agreement with the recorded output (k {K}).", "",
             "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]

    def row(label, f):
        lines.append(f"| {label} | " + " | ".join(f(results[n]) for n in names) + " |")

    row("steps", lambda r: f"{r['steps']:,}")
    row("tokens per step, suffixspec", lambda r: f"{r['tokens_per_step']:.3f}")
    row("accepted per step: suffixspec / vLLM / arctic f2", lambda r: " / ".join(
        f"{r['accepted_per_step'][k]:.3f}" for k in ("suffixspec", "vllm", "arctic")))
    row("upper bound: best window with hindsight", lambda r: f"{r['upper_bound_windows']:.3f}")
    row("upper bound: better of suffixspec and vLLM", lambda r: f"{r['upper_bound_with_vllm']:.3f}")
    for rule in RULES:
        row(f"accepted per step, rule: {rule}",
            lambda r, k=rule: f"{r.get('rules_accepted_per_step', {}).get(k, float('nan')):.3f}")
    for other, label in (("vllm", "vLLM"), ("arctic", "arctic f2")):
        row(f"steps where {label} accepted more", lambda r, o=other: f"{r['lost'][o]['steps']:,}")
        row(f"tokens lost to {label} (share of output)",
            lambda r, o=other: f"{r['lost'][o]['tokens']:,} ({100 * r['lost'][o]['share_of_output']:.1f}%)")
    for key in ("vllm source", "vllm match", "vllm first miss", "vllm occurrence",
                "arctic source", "arctic first miss"):
        cats = sorted({c for r in results.values() for c in r["by"][key]})
        for c in cats:
            row(f"lost to {key.split()[0].replace('vllm', 'vLLM')}, {' '.join(key.split()[1:])}: "
                f"{c}", lambda r, k=key, c=c: _share(r, k, c))
    return "\n".join(lines)


def _share(r: dict, key: str, cat: str) -> str:
    total = sum(r["by"][key].values())
    got = r["by"][key].get(cat, 0)
    return f"{got:,} ({100 * got / total:.0f}%)" if total else "0"


def main():
    ap = parser(__doc__)
    ap.add_argument("--fraction", type=float, default=0.5)
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    ap.add_argument("--draft-cost", type=float, default=None,
                    help="suffixspec's draft cost (default: its own); 0: drafts free, as at "
                         "one request in flight on a GPU")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    results = {}
    for name in args.only or SLICES:
        requests = load_slice(args.traces, name, encode, args.fraction)
        results[name] = analyse(requests, args.draft_cost)
        print(f"{name}: {results[name]['steps']} steps", file=sys.stderr)
    suffix = ("" if not args.only else "_" + "_".join(args.only)) + (
        "" if args.draft_cost is None else f"_cost{args.draft_cost:g}")
    save_results(args.out, f"loss{suffix}", {"fraction": args.fraction,
                                             "draft_cost": args.draft_cost, "traces": results},
                 markdown(results, args.fraction))


if __name__ == "__main__":
    main()
