"""Whether a request's drafts keep faring as its earlier drafts did, against their estimates.

Usage (from the repository root):

    python bench/request_residual.py [--only gorilla agent] [--weight 8]

Replays ``policy_bench``'s slices one request at a time with the default
settings (as ``draft_digest``'s path mode) and, for every reached drafted
token, notes its estimate (the draft's ``probs``, made conditional on the
token before it being accepted), whether it was accepted, and its request's
*residual* before it: the accepted over the estimated of that request's
earlier reached tokens, shrunk towards 1 with ``--weight`` tokens of no
change.  Prints, per residual bucket, the tokens' share and their accepted
over estimated.  If a request whose drafts have done worse than estimated
keeps doing so by about as much (accepted over estimated near its residual),
a per-request factor on the estimates would sharpen the cut; if the
buckets' ratios stay near 1, the table's rows already carry it.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, token_kinds
from policy_bench import SLICES, load_slice

EDGES = (0.0, 0.7, 0.8, 0.9, 0.95, 1.05, 1.1, 1.2, np.inf)


class Residuals:
    """A proposer that scores each request's drafts against what it emitted."""

    def __init__(self, inner, weight: float):
        self.inner = inner
        self.weight = weight
        self.pending = {}
        self.sums = defaultdict(lambda: [0.0, 0.0])  # request: accepted, estimated
        self.rows = []  # per reached token: residual before it, estimate, accepted

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids, max_spec_tokens)
        self.pending.update(zip(req_ids, drafts))
        return drafts

    def extend(self, req_id, token_ids):
        self._score(req_id, np.asarray(token_ids))
        self.inner.extend(req_id, token_ids)

    def extend_batch(self, req_ids, token_ids):
        for req_id, emitted in zip(req_ids, token_ids):
            self._score(req_id, np.asarray(emitted))
        self.inner.extend_batch(req_ids, token_ids)

    def _score(self, req_id, emitted):
        draft = self.pending.pop(req_id, None)
        if draft is None or not draft.is_path:
            return
        sums = self.sums[req_id]
        residual = (sums[0] + self.weight) / (sums[1] + self.weight)
        before = 1.0
        for t in range(min(len(draft), emitted.shape[0])):
            reach = float(draft.probs[t])
            p = reach / before if before > 0 else 0.0
            hit = int(draft.token_ids[t]) == int(emitted[t])
            self.rows.append((residual, p, hit))
            sums[0] += hit
            sums[1] += p
            if not hit:
                break
            before = reach

    def __getattr__(self, name):
        return getattr(self.inner, name)


def table(rows: np.ndarray) -> list[str]:
    residual, p, hit = rows[:, 0], rows[:, 1], rows[:, 2]
    lines = ["| residual before | tokens | accepted / estimated | mean estimate |",
             "|---|---|---|---|"]
    for lo, hi in zip(EDGES, EDGES[1:]):
        sel = (residual >= lo) & (residual < hi)
        if sel.any():
            lines.append(f"| [{lo:g}, {hi:g}) | {sel.mean():.1%} | "
                         f"{hit[sel].sum() / p[sel].sum():.3f} | {p[sel].mean():.3f} |")
    return lines


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), help="these slices only")
    ap.add_argument("--weight", type=float, default=8.0,
                    help="tokens of no change the residual shrinks towards 1 with")
    args = ap.parse_args()
    kinds = token_kinds(args)
    encode = hf_encoder(args.tokenizer)
    warmup()
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode)
        proposer = Residuals(make_proposer("suffixspec", requests, cross_pool_tokens=None,
                                           token_kinds=kinds), args.weight)
        m = replay(requests, proposer).metrics()
        rows = np.asarray(proposer.rows, np.float64).reshape(-1, 3)
        print(f"\n{name}: est {m['est']:.4f}, {rows.shape[0]:,} reached drafted tokens, "
              f"accepted / estimated {rows[:, 2].sum() / rows[:, 1].sum():.3f}")
        print("\n".join(table(rows)), flush=True)


if __name__ == "__main__":
    main()
