"""Where in an agent's output drafts are accepted: prose or command.  A probe.

Usage (from the repository root):

    python bench/region_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen [--fraction 0.5]

The agent trace's outputs are a model's thoughts followed by a shell command
in a fenced block.  The agent slice of ``policy_bench`` (times
``--fraction``) is replayed one request at a time by suffixspec at its
defaults, by arctic at its cost-aware setting (f2, as ``loss_analysis``) and
by ``oracle_bound``'s hindsight choice among the policy's candidates (it
drafts exactly what would be accepted); each step counts in the region of
the output position it starts at: *command* inside a fenced block (the
fences included), *prose* elsewhere.
Per region and drafter: the share of output tokens and of steps, MTS,
drafted per step, first-token misses and est (``MTS / (1 + 0.03 x drafted
per step)``).  Prints a Markdown table; writes nothing.
"""

from __future__ import annotations

import numpy as np

from suffixspec.fingerprint import load_hf_tokenizer
from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import EST_TOKEN_COST, accepted_length, replay

from bench_common import parser
from loss_analysis import ARCTIC
from oracle_bound import Oracle
from policy_bench import load_slice

REGIONS = ("prose", "command")
FENCE = "```"


def command_mask(tokenizer, output: np.ndarray) -> np.ndarray:
    """Per output token, whether it lies in a fenced block (fences included)."""
    pieces = [tokenizer.decode([int(t)]) for t in output]
    mask = np.zeros(output.shape[0], bool)
    inside = False
    text = ""
    for i, piece in enumerate(pieces):
        before = text.count(FENCE)
        text += piece
        opened = text.count(FENCE) > before
        mask[i] = inside or opened
        inside = text.count(FENCE) % 2 == 1
    return mask


class Counting:
    """Counts each step of ``inner``'s replay in the region its position lies in."""

    def __init__(self, inner, requests, masks):
        self.inner = inner
        self.truth = {r.req_id: r.output for r in requests}
        self.masks = masks
        self.at: dict = {}
        self.counts = {r: np.zeros(4) for r in REGIONS}  # steps, tokens, drafted, misses

    def start_request(self, req_id, prompt, anchors=None) -> None:
        self.inner.start_request(req_id, prompt)
        self.at[req_id] = 0

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids)
        for rid, d in zip(req_ids, drafts):
            pos = self.at[rid]
            region = REGIONS[int(self.masks[rid][pos])]
            got = accepted_length(d, self.truth[rid][pos:])
            c = self.counts[region]
            c += (1, min(got + 1, self.truth[rid].shape[0] - pos), len(d),
                  len(d) > 0 and got == 0)
        return drafts

    def extend(self, req_id, tokens) -> None:
        self.inner.extend(req_id, tokens)
        self.at[req_id] += int(np.asarray(tokens).shape[0])

    def finish_request(self, req_id) -> None:
        self.inner.finish_request(req_id)
        del self.at[req_id]


def main():
    ap = parser(__doc__)
    ap.add_argument("--fraction", type=float, default=0.5, help="of the agent slice")
    args = ap.parse_args()
    warmup()
    tokenizer = load_hf_tokenizer(args.tokenizer)
    requests = load_slice(args.traces, "agent", lambda texts: [
        e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)], args.fraction)
    masks = {r.req_id: command_mask(tokenizer, r.output) for r in requests}
    total = sum(r.output.shape[0] for r in requests)
    lines = ["| drafter | region | tokens | steps | MTS | drafted/step | first-token miss | est |",
             "|---|---|---|---|---|---|---|---|"]
    drafters = {"suffixspec": lambda: make_proposer("suffixspec", requests,
                                                    cross_pool_tokens=None),
                "arctic f2": lambda: make_proposer("arctic", requests, **ARCTIC),
                "oracle: windows": lambda: Oracle(requests, with_vllm=False)}
    for name, make in drafters.items():
        counting = Counting(make(), requests, masks)
        replay(requests, counting)
        steps = sum(c[0] for c in counting.counts.values())
        for region, (n, tokens, drafted, misses) in counting.counts.items():
            mts, per = tokens / n, drafted / n
            lines.append(f"| {name} | {region} | {tokens / total:.1%} | {n / steps:.1%} | "
                         f"{mts:.3f} | {per:.2f} | {misses / n:.1%} | "
                         f"{mts / (1 + EST_TOKEN_COST * per):.3f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
