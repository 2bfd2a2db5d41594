"""Proposer µs per step (p50) of settings side by side, interleaved, on the replay slices.

Usage (from the repository root):

    python bench/setting_timing.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --only agent --reps 5 \\
        --variant default: --variant no-arbiter:arbitrate=False \\
        --variant no-reference:newest_window=0

Each rep replays the slice (``policy_bench.SLICES``) once per variant, in
turn, so drift on a busy machine falls on every variant alike; a variant is
``label:name=value,...`` of ``ProposerConfig`` settings (nothing after the
colon: the defaults).  Prints each replay's p50 and MTS, then per variant
the smallest p50 of its reps and its ratio to the first variant's.  The
whole replay times propose and extend per step as ``replay_bench`` does.
Nothing is written: it is a timing to read, run with nothing else busy.
"""

from __future__ import annotations


from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import hf_encoder

from bench_common import config_settings, parser, token_kinds
from policy_bench import SLICES, load_slice


def variant(text: str) -> tuple[str, dict]:
    label, _, rest = text.partition(":")
    return label, config_settings(filter(None, rest.split(",")))


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), help="these slices only")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variant", action="append", type=variant, required=True)
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    kinds = token_kinds(args)
    warmup()
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode)
        p50 = {label: [] for label, _ in args.variant}
        for rep in range(args.reps):
            for label, settings in args.variant:
                proposer = make_proposer("suffixspec", requests, cross_pool_tokens=None,
                                         token_kinds=kinds, **settings)
                m = replay(requests, proposer).metrics()
                p50[label].append(m["proposer_us_per_step_p50"])
                print(f"{name:8s} {label:14s} rep {rep}: p50 {p50[label][-1]:6.2f} µs  "
                      f"MTS {m['mean_tokens_per_step']:.4f}", flush=True)
        first = min(p50[args.variant[0][0]])
        for label, times in p50.items():
            print(f"{name:8s} {label:14s} min p50 {min(times):6.2f} µs  "
                  f"x{min(times) / first:.3f} of {args.variant[0][0]}", flush=True)


if __name__ == "__main__":
    main()
