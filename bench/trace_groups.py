"""suffixspec's replay of one whole trace, by group of records.

Usage (from the repository root):

    python bench/trace_groups.py --trace gorilla [--set name=value ...]

Replays the trace's whole file (``bench_common.TRACES``: agent's first 40
sessions) one request at a time with the default settings, as
``replay_bench``'s "new", and prints the trace's MTS / est / drafted per step,
then per group of records (the record id without its last part: gorilla's
``huggingface/0_shot/Gorilla_FT``, a domain, retriever and model) the steps,
tokens per step, drafted per step, est and the accepted tokens by the
source that drafted them.  Where a workload mixes runs of several models or
settings, this says which of them the drafts fare worse on.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import EST_TOKEN_COST, replay
from suffixspec.replay.traces import hf_encoder

from bench_common import TRACES, config_settings, load, parser, token_kinds


def group_of(req_id: str) -> str:
    """A record id without its last part (its number in its run)."""
    return req_id.rsplit("/", 1)[0] if "/" in req_id else ""


class ByGroup:
    """A proposer that counts each draft's outcome in its request's group."""

    def __init__(self, inner):
        self.inner = inner
        self.drafts = {}
        self.steps = defaultdict(lambda: np.zeros(3))  # steps, drafted, accepted
        self.by_source = defaultdict(lambda: defaultdict(int))

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids, max_spec_tokens)
        self.drafts.update(zip(req_ids, drafts))
        return drafts

    def extend_batch(self, req_ids, token_ids):
        for r, emitted in zip(req_ids, token_ids):
            self._score(r, np.asarray(emitted))
        return self.inner.extend_batch(req_ids, token_ids)

    def extend(self, req_id, token_ids):
        self._score(req_id, np.asarray(token_ids))
        return self.inner.extend(req_id, token_ids)

    def _score(self, req_id, emitted):
        draft = self.drafts.pop(req_id, None)
        if draft is None:
            return
        n = len(draft)
        accepted = 0
        while accepted < min(n, emitted.shape[0]) and draft.token_ids[accepted] == emitted[accepted]:
            accepted += 1
        group = group_of(req_id)
        self.steps[group] += (1, n, accepted)
        self.by_source[group][draft.source or "none"] += accepted

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main():
    ap = parser(__doc__)
    ap.add_argument("--trace", choices=list(TRACES), default="gorilla")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="ProposerConfig settings")
    args = ap.parse_args()
    kinds = token_kinds(args)
    requests = load(args.traces, args.trace, hf_encoder(args.tokenizer), args.tokenizer)
    warmup()
    proposer = ByGroup(make_proposer("suffixspec", requests, cross_pool_tokens=None,
                                     token_kinds=kinds, **config_settings(args.set)))
    m = replay(requests, proposer).metrics()
    print(f"{args.trace} {' '.join(args.set)}: MTS {m['mean_tokens_per_step']:.4f} "
          f"est {m['est']:.4f} drafted {m['drafted_per_step']:.4f} steps {m['steps']}")
    print("\n| group | steps | tokens per step | drafted per step | est | accepted by source |")
    print("|---|---|---|---|---|---|")
    for group in dict.fromkeys(group_of(r.req_id) for r in requests):
        steps, drafted, accepted = proposer.steps[group]
        if steps == 0:
            continue
        per_step = (accepted + steps) / steps
        est = per_step / (1 + EST_TOKEN_COST * drafted / steps)
        sources = ", ".join(f"{k} {v:,}" for k, v in sorted(proposer.by_source[group].items())
                            if v)
        print(f"| {group} | {int(steps):,} | {per_step:.3f} | {drafted / steps:.2f} | "
              f"{est:.3f} | {sources} |")


if __name__ == "__main__":
    main()
