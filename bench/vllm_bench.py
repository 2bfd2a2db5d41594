"""Real vLLM on CPU with SmolLM2-135M-Instruct: no speculation, vLLM ``ngram``,
vLLM ``suffix`` (arctic-inference) and suffixspec, in one run.

    python bench/vllm_bench.py [--traces ../shared/data/traces] [--prompts 48]

Workloads: the first 48 Spider gold records of the SQL trace and the first 48
single-turn BFCL records, sent as chat messages, greedy, max_tokens 128.
Each (method, workload, mode) runs in a fresh process: ``sequential`` sends
one request at a time, ``concurrent`` keeps 8 in flight.  Reported: output
tokens/s, vLLM's mean acceptance length (1 + accepted / drafts), drafted
tokens per draft, and whether every output equals the run without
speculation token for token.  Needs vLLM (CPU build) and, for the arctic
row, arctic-inference (bench/setup_arctic.sh).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402
from smollm2 import ensure_model  # noqa: E402

from suffixspec.replay.traces import read_records  # noqa: E402  (loads no Numba)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"

METHODS = ("none", "ngram", "arctic", "suffixspec")
WORKLOADS = ("sql", "bfcl")
MODES = {"sequential": 1, "concurrent": 8}
ROLE = re.compile(r"<\|(system|user|assistant|tool)\|>\n")


def chat(prompt: str) -> list[dict]:
    """A trace prompt rendered ``<|role|>\\ncontent`` as chat messages."""
    parts = ROLE.split(prompt)
    if len(parts) == 1:
        return [{"role": "user", "content": prompt}]
    messages = [{"role": parts[i], "content": parts[i + 1].rstrip("\n")}
                for i in range(1, len(parts) - 1, 2)]
    return [m if m["role"] != "tool" else {"role": "user", "content": m["content"]}
            for m in messages if m["content"]]


def workload(name: str, traces: Path, n: int) -> list[list[dict]]:
    if name == "sql":
        recs = (r for r in read_records(traces / "sql_spider_bird.jsonl.gz")
                if "spider" in r["source"] and r["model"] == "gold")
    else:
        recs = (r for r in read_records(traces / "tool_bfcl.jsonl.gz") if "session" not in r)
    out = []
    for r in recs:
        if len(r["prompt"]) <= 12_000:  # keep prompts well inside the context window
            out.append(chat(r["prompt"]))
        if len(out) == n:
            break
    return out


def spec_config(method: str, k: int, depth: int, factor: float, min_prob: float):
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}
    return {"method": "suffix", "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": depth,
            "suffix_decoding_max_spec_factor": factor,
            "suffix_decoding_min_token_prob": min_prob}


def run_one(model: str, method: str, conversations, concurrency: int, spec) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model, dtype="float32", enforce_eager=True, max_model_len=4096,
              max_num_seqs=concurrency, speculative_config=spec, seed=0,
              kv_cache_memory_bytes=1 << 30, disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=128)
    llm.chat(conversations[:1], params, use_tqdm=False)  # warm-up request, not timed
    before = spec_counts(llm)
    start = time.perf_counter()
    if concurrency == 1:
        outs = [llm.chat([c], params, use_tqdm=False)[0] for c in conversations]
    else:
        outs = llm.chat(conversations, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    after = spec_counts(llm)
    counts = {k: after[k] - before.get(k, 0) for k in after}
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    n_out = sum(len(t) for t in tokens)
    drafts = counts.get("vllm:spec_decode_num_drafts", 0)
    return {"method": method, "seconds": seconds, "output_tokens": n_out,
            "tokens_per_s": n_out / seconds,
            "acceptance_length": 1 + counts.get("vllm:spec_decode_num_accepted_tokens", 0)
            / drafts if drafts else 1.0,
            "draft_tokens_per_draft": counts.get("vllm:spec_decode_num_draft_tokens", 0)
            / drafts if drafts else 0.0,
            "outputs": tokens}


def spec_counts(llm) -> dict:
    return {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}


@click.group(invoke_without_command=True)
@click.option("--traces", type=click.Path(path_type=Path), default=TRACES, show_default=True)
@click.option("--prompts", default=48, show_default=True, help="Requests per workload.")
@click.option("--k", default=16, show_default=True, help="num_speculative_tokens.")
@click.option("--depth", default=64, show_default=True, help="suffix_decoding_max_tree_depth.")
@click.option("--factor", default=2.0, show_default=True, help="suffix_decoding_max_spec_factor.")
@click.option("--min-prob", default=0.2, show_default=True, help="suffix_decoding_min_token_prob.")
@click.option("--methods", default=",".join(METHODS), show_default=True)
@click.option("--out", type=click.Path(path_type=Path),
              default=Path(__file__).parent / "results", show_default=True,
              help="Folder for vllm.json and vllm.md.")
@click.pass_context
def main(ctx, traces, prompts, k, depth, factor, min_prob, methods, out):
    if ctx.invoked_subcommand is not None:
        return
    model = str(ensure_model())
    knobs = dict(k=k, depth=depth, factor=factor, min_prob=min_prob)
    rows = []
    for wl in WORKLOADS:
        for mode, conc in MODES.items():
            base = None
            for method in methods.split(","):
                res = child(model, method, wl, traces, prompts, conc, knobs)
                if method == "none":
                    base = res["outputs"]
                res["identical"] = None if base is None else res["outputs"] == base
                res.update(workload=wl, mode=mode)
                rows.append(res)
                print(f"{wl:5s} {mode:10s} {method:10s} {res['tokens_per_s']:7.1f} tok/s  "
                      f"accept {res['acceptance_length']:.2f}  identical {res['identical']}",
                      flush=True)
    write(rows, out, knobs, prompts)


def child(model, method, wl, traces, prompts, conc, knobs) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               NUMBA_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.pop("SUFFIXSPEC_ENABLE", None)
    if method == "suffixspec":
        env["SUFFIXSPEC_ENABLE"] = "1"
        env["SUFFIXSPEC_LOG_INTERVAL"] = "0"
    cmd = [sys.executable, __file__, "one", "--model", model, "--method", method, "--workload", wl,
           "--traces", str(traces), "--prompts", str(prompts), "--concurrency", str(conc),
           "--knobs", json.dumps(knobs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{method} {wl} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


@main.command()
@click.option("--model", required=True)
@click.option("--method", type=click.Choice(METHODS), required=True)
@click.option("--workload", "wl", type=click.Choice(WORKLOADS), required=True)
@click.option("--traces", type=click.Path(path_type=Path), required=True)
@click.option("--prompts", type=int, required=True)
@click.option("--concurrency", type=int, required=True)
@click.option("--knobs", required=True)
def one(model, method, wl, traces, prompts, concurrency, knobs):
    """One (method, workload, mode) in this process; prints a JSON line."""
    conversations = workload(wl, traces, prompts)
    res = run_one(model, method, conversations, concurrency, spec_config(method, **json.loads(knobs)))
    print(json.dumps(res))


def write(rows, out: Path, knobs: dict, prompts: int) -> None:
    from tabulate import tabulate

    slim = [{k: v for k, v in r.items() if k != "outputs"} for r in rows]
    table = []
    for r in slim:
        arctic = next((a for a in slim if a["method"] == "arctic" and a["workload"] == r["workload"]
                       and a["mode"] == r["mode"]), None)
        ratio = (f"{r['tokens_per_s'] / arctic['tokens_per_s']:.3f}"
                 if arctic and r["method"] == "suffixspec" else "")
        table.append([r["workload"], r["mode"], r["method"], f"{r['tokens_per_s']:.1f}", ratio,
                      f"{r['acceptance_length']:.3f}", f"{r['draft_tokens_per_draft']:.2f}",
                      r["output_tokens"], {None: "", True: "yes", False: "NO"}[r["identical"]]])
    md = tabulate(table, headers=["workload", "mode", "method", "tok/s", "vs arctic",
                                  "accept len", "drafted/draft", "out tokens", "identical"],
                  tablefmt="github")
    save_results(out, "vllm", {"knobs": knobs, "prompts": prompts, "rows": slim},
                 f"SmolLM2-135M-Instruct fp32, vLLM CPU, greedy, max_tokens 128, {prompts} "
                 f"prompts per workload; suffix knobs {knobs}\n\n{md}")


if __name__ == "__main__":
    main()
