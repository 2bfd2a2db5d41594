"""Proposer µs per step (p50) of the default policy, in the checkout it is run from.

Usage, to compare two commits (one worktree each, its own Numba cache):

    cd OTHER && NUMBA_CACHE_DIR=/tmp/numba_other PYTHONPATH=OTHER \\
        python /path/to/bench/checkout_p50.py sql,code,gorilla,bfcl,agent [TRACES TOKENIZER REPS]

Runs in the working directory's checkout (its ``suffixspec`` package and
its ``bench/policy_bench.py`` slices, times 0.5), so it also times commits
older than this script.  Replays each named slice one request at a time,
``REPS`` times (default 1), and prints one JSON line per slice: the
smallest of its proposer p50s and the est.  On these
noisy 2-core machines, run the two checkouts at once, one per core, or in
turn several times, and compare the smallest p50 of each.
"""

import json
import sys

sys.path.insert(0, "bench")  # the checkout's own bench modules

import bench_common  # noqa: E402
from policy_bench import load_slice  # noqa: E402

from suffixspec.native import warmup  # noqa: E402
from suffixspec.replay.engines import make_proposer  # noqa: E402
from suffixspec.replay.harness import replay  # noqa: E402
from suffixspec.replay.traces import hf_encoder  # noqa: E402

TRACES = "../shared/data/traces"
TOKENIZER = "../shared/tokenizers/qwen"


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["sql", "code", "gorilla", "bfcl",
                                                              "agent"]
    traces = sys.argv[2] if len(sys.argv) > 2 else TRACES
    tokenizer = sys.argv[3] if len(sys.argv) > 3 else TOKENIZER
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    encode = hf_encoder(tokenizer)
    warmup()
    extra = {}
    if hasattr(bench_common, "token_kinds"):  # commits since the token kinds
        class Args:
            no_kinds = False
        Args.tokenizer = tokenizer
        extra["token_kinds"] = bench_common.token_kinds(Args)
    for name in names:
        requests = load_slice(traces, name, encode, 0.5)
        p50s = []
        for _ in range(reps):
            proposer = make_proposer("suffixspec", requests, max_depth=64, max_spec_tokens=16,
                                     cross_pool_tokens=None, **extra)
            m = replay(requests, proposer, concurrency=1).metrics()
            p50s.append(m["proposer_us_per_step_p50"])
        print(json.dumps({"trace": name, "p50": min(p50s), "est": round(m["est"], 4)}),
              flush=True)


if __name__ == "__main__":
    main()
