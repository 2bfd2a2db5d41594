"""arctic-inference against ``suffixspec.compat.arctic`` in arctic mode, draft
for draft, over whole traces.

    python bench/compat_bench.py [--traces ../shared/data/traces] [--max-records N]

Each record is decoded as vLLM's suffix proposer drives the cache: start the
request with its prompt, then per step speculate from the last 64 tokens
(up to 16 tokens, max_spec_factor 2, min_token_prob 0.2), accept what the
recorded output confirms plus one token, add those, and stop the request at
the end; vLLM's default of 10,000 cached responses applies, so long traces
also evict.  Both caches get every call; reported per trace: steps, steps
whose drafts are identical in every field (token ids, parents, probabilities,
score, match length), and microseconds per speculate call of each.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
TRACES = ("sql_spider_bird", "tool_bfcl", "tool_gorilla_apibench", "code_humaneval_mbpp_leetcode",
          "agent_miniswe_swebench")
KNOBS = dict(max_spec_tokens=16, max_spec_factor=2.0, max_spec_offset=0.0, min_token_prob=0.2)


def requests(path: Path, max_records: int | None):
    """(prompt, output) token ids of a trace's records, prompts as recorded."""
    from suffixspec.replay.traces import hf_encoder, read_records

    encode = hf_encoder(SHARED / "tokenizers" / "qwen" / "tokenizer.json")
    records = list(read_records(path, max_records=max_records))
    prompts = encode([r["prompt"] for r in records])
    outputs = encode([r["output"] for r in records])
    return [(np.asarray(p, np.int32), o) for p, o in zip(prompts, outputs)]


def same(a, b) -> bool:
    return (list(a.token_ids) == b.token_ids and list(a.parents) == b.parents
            and list(np.float32(a.probs)) == list(np.float32(b.probs))
            and np.float32(a.score) == np.float32(b.score) and a.match_len == b.match_len)


def compare(reqs, cached: int) -> dict:
    from arctic_inference.suffix_decoding import SuffixDecodingCache as Arctic

    from suffixspec.compat.arctic import SuffixDecodingCache

    theirs, ours = Arctic(64, cached), SuffixDecodingCache(64, cached, mode="arctic")
    steps = identical = 0
    t_theirs = t_ours = 0.0
    for i, (prompt, output) in enumerate(reqs):
        for c in (theirs, ours):
            c.start_request(i, prompt)
        seq = list(prompt)
        done = 0
        while done < len(output):
            ctx = np.asarray(seq[-64:], np.int32)
            t0 = time.perf_counter()
            want = theirs.speculate(i, ctx, **KNOBS)
            t1 = time.perf_counter()
            got = ours.speculate(i, ctx, **KNOBS)
            t2 = time.perf_counter()
            t_theirs += t1 - t0
            t_ours += t2 - t1
            steps += 1
            identical += same(want, got)
            n = 0
            while n < len(want.token_ids) and done + n < len(output) \
                    and want.token_ids[n] == output[done + n]:
                n += 1
            new = output[done:done + n + 1]
            done += len(new)
            seq += new
            for c in (theirs, ours):
                c.add_active_response(i, new)
        for c in (theirs, ours):
            c.stop_request(i)
    return {"records": len(reqs), "steps": steps, "identical_steps": identical,
            "arctic_us_per_call": 1e6 * t_theirs / max(steps, 1),
            "dropin_us_per_call": 1e6 * t_ours / max(steps, 1)}


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=SHARED / "data" / "traces",
              show_default=True)
@click.option("--trace", "names", multiple=True, default=TRACES, show_default=True)
@click.option("--max-records", type=int, default=None, help="Per trace (default: all).")
@click.option("--max-cached", default=10_000, show_default=True,
              help="max_cached_requests of both caches (vLLM's default).")
@click.option("--out", type=click.Path(path_type=Path), default=HERE / "results",
              show_default=True, help="Folder for compat.json and compat.md.")
def main(traces, names, max_records, max_cached, out):
    from tabulate import tabulate

    rows = {}
    for name in names:
        reqs = requests(traces / f"{name}.jsonl.gz", max_records)
        rows[name] = compare(reqs, max_cached)
        print(name, rows[name], flush=True)
    table = [[n, r["records"], r["steps"], r["identical_steps"],
              f"{r['identical_steps'] / max(r['steps'], 1):.4f}", f"{r['arctic_us_per_call']:.1f}",
              f"{r['dropin_us_per_call']:.1f}"] for n, r in rows.items()]
    md = tabulate(table, headers=["trace", "records", "steps", "identical", "share",
                                  "arctic µs/call", "drop-in µs/call"], tablefmt="github")
    save_results(out, "compat", {"knobs": KNOBS, "max_cached": max_cached, "traces": rows},
                 f"arctic-inference vs suffixspec.compat.arctic (arctic mode), draft for draft: "
                 f"every record of each trace, prompts as recorded, {KNOBS}, "
                 f"max_cached_requests {max_cached}.  `python bench/compat_bench.py`\n\n{md}")


if __name__ == "__main__":
    main()
