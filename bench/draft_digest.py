"""A fingerprint of every draft suffixspec makes on the replay slices.

Usage (from the repository root):

    python bench/draft_digest.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen

Replays the slices of ``bench_common.SLICES`` (sql 5,000 records, code whole,
gorilla 4,000, bfcl 3,000, agent 10 sessions) with the default settings,
drafting paths and merged trees, and prints per slice MTS / est / drafted
per step and an XXH3-64 digest over every draft's tokens, parents and
probabilities.  Two commits whose lines are equal draft identically on
every step: run it before and after a change that must not move drafts.
``--draft-cost`` replays with that draft cost instead (0: drafts free);
``--set name=value`` changes any other ``ProposerConfig`` setting (an int,
float or bool value), e.g. ``--set newest_window=4096``.

``--pool POOL`` drafts with a persistent pool (``suffixspec ingest``'s, say)
as the cross-request pool: each replay works on a copy of it, so two pools
built by two versions of ``ingest`` are compared by their lines.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import xxhash

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import SLICES, config_settings, copy_pool, load_slice, parser, token_kinds

MODES = {"path": {}, "tree": {"tree": True}}


class Recording:
    """A proposer that hashes every draft it hands out."""

    def __init__(self, inner):
        self.inner = inner
        self.hash = xxhash.xxh3_64()

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids, max_spec_tokens)
        for d in drafts:
            self.hash.update(d.token_ids.tobytes())
            self.hash.update(d.parents.tobytes())
            self.hash.update(d.probs.tobytes())
            self.hash.update(b"|")
        return drafts

    def __getattr__(self, name):
        return getattr(self.inner, name)


def copied_pool(pool: Path, tmp: Path, tokenizer: str):
    """A ``PersistentPool`` over a copy of ``pool`` (its file and snapshot folder)."""
    from suffixspec.config import NO_REFRESH
    from suffixspec.fingerprint import tokenizer_id
    from suffixspec.pools.persistent import PersistentPool

    return PersistentPool(copy_pool(pool, tmp / pool.name), tokenizer=tokenizer_id(tokenizer),
                          refresh_interval=NO_REFRESH)


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), help="these slices only")
    ap.add_argument("--modes", nargs="*", choices=list(MODES), help="these modes only")
    ap.add_argument("--draft-cost", type=float, default=None,
                    help="ProposerConfig.draft_cost (default: the default; 0: drafts free)")
    ap.add_argument("--pool", type=Path, default=None,
                    help="a persistent pool to draft from (a copy of it per replay)")
    ap.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="other ProposerConfig settings")
    args = ap.parse_args()
    settings = {} if args.draft_cost is None else {"draft_cost": args.draft_cost}
    settings.update(config_settings(args.set))
    kinds = token_kinds(args)
    encode = hf_encoder(args.tokenizer)
    warmup()
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode)
        for mode in args.modes or list(MODES):
            options = MODES[mode]
            with tempfile.TemporaryDirectory() as tmp:
                pool = {} if args.pool is None else {"pool": copied_pool(args.pool, Path(tmp),
                                                                          args.tokenizer)}
                proposer = Recording(make_proposer("suffixspec", requests,
                                                   cross_pool_tokens=None, token_kinds=kinds,
                                                   **pool, **options, **settings))
                m = replay(requests, proposer).metrics()
                proposer.close()
            print(f"{name:8s} {mode}: MTS {m['mean_tokens_per_step']:.4f} est {m['est']:.4f} "
                  f"drafted {m['drafted_per_step']:.4f} digest {proposer.hash.hexdigest()}",
                  flush=True)
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
