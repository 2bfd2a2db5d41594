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

from collections import Counter

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import TRACES, config_settings, load, parser, token_kinds
from mixed_bench import Tally


def group_of(req_id: str) -> str:
    """A record id without its last part (its number in its run)."""
    return req_id.rsplit("/", 1)[0] if "/" in req_id else ""


class BySource(Tally):
    """``mixed_bench.Tally`` per group, and the accepted tokens of each
    group's drafts by the source that drafted them."""

    def __init__(self, inner, group_of_request: dict):
        super().__init__(inner, group_of_request, namespaces=False)
        self.drafts = {}
        self.accepted = {}  # group -> Counter of source -> accepted tokens

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = super().propose(req_ids, max_spec_tokens)
        self.drafts.update(zip(req_ids, drafts))
        return drafts

    def extend_batch(self, req_ids, emitted):
        for req_id, tokens in zip(req_ids, emitted):
            draft = self.drafts.pop(req_id, None)
            if draft is None:
                continue
            n = min(len(draft), len(tokens))
            agree = [int(a) == int(b) for a, b in zip(draft.token_ids[:n], tokens[:n])]
            got = agree.index(False) if False in agree else n
            counts = self.accepted.setdefault(self.workload_of[req_id], Counter())
            counts[draft.source or "none"] += got
        super().extend_batch(req_ids, emitted)


def main():
    ap = parser(__doc__)
    ap.add_argument("--trace", choices=list(TRACES), default="gorilla")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="ProposerConfig settings")
    args = ap.parse_args()
    kinds = token_kinds(args)
    requests = load(args.traces, args.trace, hf_encoder(args.tokenizer), args.tokenizer)
    warmup()
    proposer = BySource(make_proposer("suffixspec", requests, cross_pool_tokens=None,
                                      token_kinds=kinds, **config_settings(args.set)),
                        {r.req_id: group_of(r.req_id) for r in requests})
    m = replay(requests, proposer).metrics()
    print(f"{args.trace} {' '.join(args.set)}: MTS {m['mean_tokens_per_step']:.4f} "
          f"est {m['est']:.4f} drafted {m['drafted_per_step']:.4f} steps {m['steps']}")
    print("\n| group | steps | tokens per step | drafted per step | est | accepted by source |")
    print("|---|---|---|---|---|---|")
    figures = proposer.figures()
    for group in dict.fromkeys(group_of(r.req_id) for r in requests):
        if group not in figures:
            continue
        f = figures[group]
        sources = ", ".join(f"{k} {v:,}" for k, v in sorted(proposer.accepted[group].items())
                            if v)
        print(f"| {group} | {f['steps']:,} | {f['mts']:.3f} | "
              f"{proposer.drafted[group] / f['steps']:.2f} | {f['est']:.3f} | {sources} |")


if __name__ == "__main__":
    main()
