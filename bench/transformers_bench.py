"""Hugging Face transformers ``generate`` on CPU with SmolLM2-135M-Instruct:
plain, prompt lookup, and suffixspec (``suffixspec.integrations.transformers``).

    python bench/transformers_bench.py [--traces ../shared/data/traces] [--prompts 48]

The prompts are the vLLM benchmark's (bench/vllm_bench.py): the first 48
Spider gold records of the SQL trace and the first 48 single-turn BFCL
records, as chat messages through the model's chat template; greedy,
max_new_tokens 128, one prompt at a time (assisted generation's batch size).
suffixspec keeps one proposer per workload, so later prompts draft from
earlier outputs.  Reported: output tokens/s, target-model forward passes,
output tokens per forward pass, and whether every output equals plain
``generate`` token for token.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402
from smollm2 import ensure_model  # noqa: E402
from vllm_bench import TRACES, workload  # noqa: E402

METHODS = ("plain", "prompt lookup", "suffixspec")
K = 16  # draft tokens (prompt lookup: prompt_lookup_num_tokens)


def run(model, tokenizer, method: str, conversations, max_new_tokens: int) -> dict:
    import torch

    from suffixspec import SuffixProposer
    from suffixspec.integrations.transformers import use_suffixspec

    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False)
    if method == "prompt lookup":
        kwargs["prompt_lookup_num_tokens"] = K
    if method == "suffixspec":
        use_suffixspec(model, SuffixProposer(max_depth=64, max_spec_tokens=K))
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    outputs, seconds = [], 0.0
    try:
        for messages in conversations:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            seconds += time.perf_counter() - start
            outputs.append(out[0, ids.shape[1]:].tolist())
    finally:
        hook.remove()
        if method == "suffixspec":  # back to the class's own methods
            del model._get_candidate_generator, model.generate
    n_out = sum(len(o) for o in outputs)
    return {"method": method, "seconds": seconds, "output_tokens": n_out,
            "tokens_per_s": n_out / seconds, "forward_passes": calls[0],
            "tokens_per_pass": n_out / calls[0], "outputs": outputs}


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=TRACES, show_default=True)
@click.option("--prompts", default=48, show_default=True, help="Prompts per workload.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--out", type=click.Path(path_type=Path),
              default=Path(__file__).parent / "results", show_default=True,
              help="Folder for transformers.json and transformers.md.")
def main(traces, prompts, max_new_tokens, out):
    import torch
    from tabulate import tabulate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    path = ensure_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    for wl in ("sql", "bfcl"):
        conversations = workload(wl, traces, prompts)
        run(model, tokenizer, "plain", conversations[:1], 8)  # warm-up, not counted
        base = None
        for method in METHODS:
            res = run(model, tokenizer, method, conversations, max_new_tokens)
            base = res["outputs"] if method == "plain" else base
            res.update(workload=wl, identical=res["outputs"] == base)
            rows.append(res)
            print(f"{wl:5s} {method:14s} {res['tokens_per_s']:6.1f} tok/s  "
                  f"{res['forward_passes']} passes  identical {res['identical']}", flush=True)
    slim = [{k: v for k, v in r.items() if k != "outputs"} for r in rows]
    table = []
    for r in slim:
        plain = next(p for p in slim if p["workload"] == r["workload"] and p["method"] == "plain")
        table.append([r["workload"], r["method"], f"{r['tokens_per_s']:.1f}",
                      f"{r['tokens_per_s'] / plain['tokens_per_s']:.2f}", r["forward_passes"],
                      f"{r['tokens_per_pass']:.2f}", r["output_tokens"],
                      "yes" if r["identical"] else "NO"])
    md = tabulate(table, headers=["workload", "method", "tok/s", "vs plain", "forward passes",
                                  "tokens/pass", "out tokens", "identical"], tablefmt="github")
    save_results(out, "transformers", {"prompts": prompts, "k": K, "rows": slim},
                 f"SmolLM2-135M-Instruct fp32, transformers generate on CPU "
                 f"({torch.get_num_threads()} thread), greedy, max_new_tokens {max_new_tokens}, "
                 f"{prompts} prompts per workload one at a time; {K} draft tokens.  "
                 f"`python bench/transformers_bench.py`\n\n{md}")


if __name__ == "__main__":
    main()
