"""What the target model's own next-token choices could add to suffixspec's drafts.

    python bench/successor_bench.py [--prompts 16]

Speculative decoding computes the target model's distribution at every
verified position anyway.  A *successor table* keeps, per token, the model's
top-1 next token from the last position that token was the input of (the
training-free adjacency idea of Token Recycling).  This runs transformers
``generate`` on CPU with SmolLM2-135M-Instruct drafting from suffixspec, feeds
the table from the logits the verification returns, and measures, at each
step where the table knows the last token:

- how often suffixspec's first drafted token is right when the table agrees
  with it and when it does not, and how often the table's token is right
  when they disagree (what choosing between the two could gain at most);
- forward passes when the table drafts (a chain of top-1 successors, up to
  ``--chain`` tokens) at steps where the tries draft nothing.

Outputs are checked equal to plain ``generate`` in both runs.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402
from smollm2 import ensure_model  # noqa: E402
from vllm_bench import TRACES, workload  # noqa: E402


def recording_generator(base, table: np.ndarray, counts: Counter, fallback_chain: int):
    """A ``SuffixCandidateGenerator`` that feeds and consults ``table``."""

    class Recording(base):
        def get_candidates(self, input_ids, **kwargs):
            import torch

            out, logits = super().get_candidates(input_ids, **kwargs)
            cur = input_ids.shape[1]
            last = int(input_ids[0, -1])
            self._cur, self._tries = cur, out[0, cur:].tolist()
            self._succ = int(table[last])
            room = self.max_length - cur - 1
            if not self._tries and fallback_chain and self._succ >= 0 and room > 0:
                chain, t = [], last
                while len(chain) < min(fallback_chain, room) and table[t] >= 0:
                    t = int(table[t])
                    if self.eos is not None and t in self.eos:
                        break
                    chain.append(t)
                if chain:
                    counts["table drafts"] += 1
                    out = torch.cat([input_ids, torch.tensor([chain], dtype=input_ids.dtype)], 1)
            self._cand = out[0].tolist()
            return out, logits

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            real = input_ids[0, self._cur:].tolist()
            top = scores[0].argmax(dim=-1).tolist()
            for i, t in enumerate(top):  # the input at position cur - 1 + i was followed by t
                table[self._cand[self._cur - 1 + i]] = t
            if not self._tries or self._succ < 0:
                return
            right = self._tries[0] == real[0]
            if self._succ == self._tries[0]:
                counts["agree"] += 1
                counts["agree, right"] += right
            else:
                counts["disagree"] += 1
                counts["disagree, suffixspec right"] += right
                counts["disagree, table right"] += self._succ == real[0]

    return Recording


def run(model, tokenizer, conversations, fallback_chain: int, max_new_tokens: int) -> dict:
    import suffixspec.integrations.transformers as integration
    from suffixspec import SuffixProposer

    table = np.full(model.config.vocab_size, -1, np.int64)
    counts: Counter = Counter()
    base = integration.SuffixCandidateGenerator
    integration.SuffixCandidateGenerator = recording_generator(base, table, counts,
                                                               fallback_chain)
    integration.use_suffixspec(model, SuffixProposer(max_depth=64, max_spec_tokens=16))
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    start = time.perf_counter()
    try:
        outputs = plain(model, tokenizer, conversations, max_new_tokens)
    finally:
        hook.remove()
        integration.SuffixCandidateGenerator = base
        del model._get_candidate_generator, model.generate
    return {"forward_passes": calls[0], "seconds": time.perf_counter() - start,
            "outputs": outputs, **counts}


def plain(model, tokenizer, conversations, max_new_tokens: int) -> list[list[int]]:
    """Greedy outputs of ``model.generate`` (drafting as installed, if at all)."""
    import torch

    outs = []
    for messages in conversations:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def share(n: int, of: int) -> str:
    return f"{n}/{of} ({100.0 * n / of:.0f}%)" if of else "0/0"


@click.command()
@click.option("--traces", type=click.Path(path_type=Path), default=TRACES, show_default=True)
@click.option("--prompts", default=16, show_default=True, help="Prompts per workload.")
@click.option("--workloads", default="sql,bfcl", show_default=True)
@click.option("--chain", default=3, show_default=True,
              help="Most tokens the table drafts where the tries draft none.")
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--out", type=click.Path(path_type=Path),
              default=Path(__file__).parent / "results", show_default=True)
def main(traces, prompts, workloads, chain, max_new_tokens, out):
    import torch
    from tabulate import tabulate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    path = ensure_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows, table = [], []
    for wl in workloads.split(","):
        conversations = workload(wl, traces, prompts)
        base = plain(model, tokenizer, conversations, max_new_tokens)
        tries = run(model, tokenizer, conversations, 0, max_new_tokens)
        with_table = run(model, tokenizer, conversations, chain, max_new_tokens)
        row = {"workload": wl, "prompts": prompts, "chain": chain,
               "identical": tries["outputs"] == base and with_table["outputs"] == base,
               "passes_tries": tries["forward_passes"],
               "passes_with_table": with_table["forward_passes"],
               "table_drafts": with_table.get("table drafts", 0),
               **{k: tries.get(k, 0) for k in ("agree", "agree, right", "disagree",
                                               "disagree, suffixspec right",
                                               "disagree, table right")}}
        rows.append(row)
        table.append([wl, share(row["agree, right"], row["agree"]),
                      share(row["disagree, suffixspec right"], row["disagree"]),
                      share(row["disagree, table right"], row["disagree"]),
                      row["passes_tries"], row["passes_with_table"], row["table_drafts"],
                      "yes" if row["identical"] else "NO"])
        print(*table[-1], flush=True)
    md = tabulate(table, headers=["workload", "agree: suffixspec right",
                                  "disagree: suffixspec right", "disagree: table right",
                                  "passes, tries", "passes, + table where none",
                                  "table drafts", "identical"], tablefmt="github")
    save_results(out, "successor", {"rows": rows},
                 f"SmolLM2-135M-Instruct fp32, transformers generate on CPU, greedy, "
                 f"max_new_tokens {max_new_tokens}, {prompts} prompts per workload one at a "
                 f"time, suffixspec drafting up to 16 tokens.  Table: each token's top-1 next "
                 f"token from the last verified position it was the input of.  First drafted "
                 f"token right, at steps where the table knows the last token.  "
                 f"`python bench/successor_bench.py --prompts {prompts}`\n\n{md}")


if __name__ == "__main__":
    main()
