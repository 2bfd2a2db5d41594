"""Insert throughput and memory per indexed token: suffixspec vs arctic-inference.

Usage (from the repository root, arctic-inference installed by
bench/setup_arctic.sh):

    python bench/index_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

Two workloads per trace, both at depth 64:

* ``outputs``: every output of the trace appended, one sequence each, into one
  tree (what a cross-request pool holds);
* ``prompts``: each prompt indexed into a fresh tree and dropped (what starting
  a request costs), on the first 300 requests.

Each measurement is the best of three runs.  Memory for suffixspec is the
allocated bytes of its arrays (capacity, as the process holds it) and the bytes
in use; for arctic, its own ``estimate_memory()``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


from suffixspec.index import SuffixIndex
from suffixspec.native import warmup
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, TRACES, load

DEPTH = 64


def ours_outputs(seqs):
    ix = SuffixIndex(DEPTH, node_capacity=1 << 16, token_capacity=1 << 16)
    tree = ix.add_tree()
    t0 = time.perf_counter()
    for toks in seqs:
        s = ix.add_sequence(tree, capacity=max(len(toks), 1))
        ix.extend(s, toks)
        ix.close(s)
    return time.perf_counter() - t0, ix.memory_bytes(), ix.used_bytes()


def arctic_outputs(seqs):
    from arctic_inference.suffix_decoding._C import SuffixTree

    tree = SuffixTree(DEPTH)
    t0 = time.perf_counter()
    for i, toks in enumerate(seqs):
        tree.extend_ndarray(i, toks)
    dt = time.perf_counter() - t0
    return dt, tree.estimate_memory()


def ours_prompts(prompts):
    ix = SuffixIndex(DEPTH, node_capacity=1 << 16, token_capacity=1 << 16)
    t0 = time.perf_counter()
    for toks in prompts:
        tree = ix.add_tree()
        s = ix.add_sequence(tree, capacity=len(toks) + 1)
        ix.extend(s, toks)
        ix.drop_tree(tree)
    return time.perf_counter() - t0


def arctic_prompts(prompts):
    from arctic_inference.suffix_decoding._C import SuffixTree

    t0 = time.perf_counter()
    for toks in prompts:
        tree = SuffixTree(DEPTH)
        tree.extend_ndarray(0, toks)
        del tree
    return time.perf_counter() - t0


def best_of(fn, *args, runs=3):
    results = [fn(*args) for _ in range(runs)]
    return min(results, key=lambda r: r[0] if isinstance(r, tuple) else r)


def main():
    ap = parser(__doc__)
    ap.add_argument("--prompts", type=int, default=300, help="prompts indexed per trace")
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    compile_s = warmup()
    rows = []
    for name in TRACES:
        reqs = load(args.traces, name, encode, args.tokenizer)
        outputs = [r.output for r in reqs if len(r.output)]
        prompts = [r.prompt for r in reqs[: args.prompts] if len(r.prompt)]
        n_out = sum(len(x) for x in outputs)
        n_prompt = sum(len(x) for x in prompts)
        o_t, o_alloc, o_used = best_of(ours_outputs, outputs)
        a_t, a_mem = best_of(arctic_outputs, outputs)
        op_t = best_of(ours_prompts, prompts)
        ap_t = best_of(arctic_prompts, prompts)
        row = {"trace": name, "output_tokens": n_out, "prompt_tokens": n_prompt,
               "ours_outputs_tok_s": round(n_out / o_t), "arctic_outputs_tok_s": round(n_out / a_t),
               "ours_bytes_per_token": round(o_alloc / n_out, 1),
               "ours_used_bytes_per_token": round(o_used / n_out, 1),
               "arctic_bytes_per_token": round(a_mem / n_out, 1),
               "ours_prompts_tok_s": round(n_prompt / op_t),
               "arctic_prompts_tok_s": round(n_prompt / ap_t)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    lines = ["| trace | outputs: tok/s ours | arctic | ratio | B/token ours (alloc / used) "
             "| arctic | prompts: tok/s ours | arctic | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['ours_outputs_tok_s'] / 1e6:.2f}M "
            f"| {r['arctic_outputs_tok_s'] / 1e6:.2f}M "
            f"| {r['ours_outputs_tok_s'] / r['arctic_outputs_tok_s']:.2f} "
            f"| {r['ours_bytes_per_token']} / {r['ours_used_bytes_per_token']} "
            f"| {r['arctic_bytes_per_token']} | {r['ours_prompts_tok_s'] / 1e6:.2f}M "
            f"| {r['arctic_prompts_tok_s'] / 1e6:.2f}M "
            f"| {r['ours_prompts_tok_s'] / r['arctic_prompts_tok_s']:.2f} |")
    lines.append(f"\nDepth {DEPTH}; best of three runs; kernel compilation timed apart: "
                 f"{compile_s:.2f} s.")
    md = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.json").write_text(json.dumps({"compile_s": compile_s, "rows": rows}, indent=1))
    (out / "index.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
