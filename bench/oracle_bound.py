"""How far choosing among the candidates could go: a replay-level upper bound.

Usage (from the repository root):

    python bench/oracle_bound.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results [--fraction 0.5]

``loss_analysis``'s upper bounds are per step: at each of suffixspec's
contexts, the most a hindsight choice would have accepted there.  They
overstate what choosing differently adds up to, since the step after a short
draft drafts the rest of a copy.  Here the hindsight choice drives its own
replay: at every step an oracle sees the recorded output and drafts exactly
the accepted prefix of the best of

* ``windows``: the candidates the policy enumerates
  (``SuffixProposer.candidate_windows``: the best candidate of each place it
  draws from, continued past the cost cut, and branch windows) and the
  policy's own draft;
* ``windows + vLLM``: those and vLLM's GPU drafter's draft (``vllm-gpu``).

A third bound needs no replay of its own: suffixspec's drafts cut with
hindsight at their accepted length (``cut``) accept what they did, so its
replay is suffixspec's and only its est changes, to ``MTS / (1 + 0.03 *
(MTS - 1))``: what a perfect length cut alone would reach.

Each drafts no token that is rejected, so its est (``MTS / (1 + 0.03 *
drafted per step)``, as ``replay_bench``) is the most any policy choosing
among those candidates, and cutting them, could reach.  Beside them, in the
same run on the same slices: suffixspec's default, arctic at its cost-aware
best (f2: factor 2, min_token_prob 0.2) and vLLM's drafter, each in its own
replay.  The ratio row sets each against the better of arctic f2 and vLLM,
as issue 41's target does (1.10x).

Writes ``oracle.json`` and ``oracle.md`` into ``--out`` and prints the Markdown.
"""

from __future__ import annotations

import sys

import numpy as np

from suffixspec.draft import Draft
from suffixspec.native import layout as lay
from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import EST_TOKEN_COST, replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser, save_results
from loss_analysis import ARCTIC, K, accepted, best_window
from policy_bench import SLICES, load_slice


class Oracle:
    """Drafts the recorded output's prefix that the best candidate would have
    had accepted (``with_vllm``: vLLM's draft among them); the policy runs
    alongside, as it would, on the context the oracle's replay makes."""

    def __init__(self, requests, with_vllm: bool):
        self.truth = {r.req_id: r.output for r in requests}
        self.policy = make_proposer("suffixspec", cross_pool_tokens=None)
        self.vllm = make_proposer("vllm-gpu", max_spec_tokens=K) if with_vllm else None
        self.windows = lay.windows(1, 8, 64)
        self.at: dict = {}
        self.context: dict = {}
        self.max_spec_tokens = K

    def _each(self):
        return (self.policy,) if self.vllm is None else (self.policy, self.vllm)

    def start_request(self, req_id, prompt, anchors=None) -> None:
        for p in self._each():
            p.start_request(req_id, prompt)
        self.at[req_id] = 0
        self.context[req_id] = int(np.asarray(prompt).shape[0])

    def extend(self, req_id, tokens) -> None:
        for p in self._each():
            p.extend(req_id, tokens)
        n = int(np.asarray(tokens).shape[0])
        self.at[req_id] += n
        self.context[req_id] += n

    def finish_request(self, req_id) -> None:
        for p in self._each():
            p.finish_request(req_id)
        del self.at[req_id], self.context[req_id]

    def propose(self, req_ids, max_spec_tokens=None) -> list[Draft]:
        drafts = []
        for rid in req_ids:
            truth = self.truth[rid][self.at[rid]:]
            best = accepted(self.policy.propose([rid])[0].token_ids, truth)
            count = int(self.policy.candidate_windows([rid], self.windows)[0])
            best = max(best, best_window(self.windows, count, self.context[rid], truth))
            if self.vllm is not None:
                best = max(best, accepted(self.vllm.propose([rid])[0].token_ids, truth))
            tokens = truth[:best].astype(np.int32)
            drafts.append(Draft(tokens, np.arange(-1, best - 1, dtype=np.int32),
                                np.ones(best, np.float32), float(best), best, "oracle")
                          if best else Draft())
        return drafts


def measure(requests) -> dict:
    rows = {
        "suffixspec": make_proposer("suffixspec", requests, cross_pool_tokens=None),
        "arctic f2": make_proposer("arctic", requests, **ARCTIC),
        "vllm": make_proposer("vllm-gpu", requests, max_spec_tokens=K),
        "oracle: windows": Oracle(requests, with_vllm=False),
        "oracle: windows + vLLM": Oracle(requests, with_vllm=True),
    }
    out = {}
    for name, proposer in rows.items():
        m = replay(requests, proposer).metrics()
        out[name] = {k: m[k] for k in ("mean_tokens_per_step", "est", "drafted_per_step",
                                      "steps")}
        print(f"  {name}: MTS {m['mean_tokens_per_step']:.3f} est {m['est']:.3f}",
              file=sys.stderr, flush=True)
    return out


def cut_est(r: dict) -> float:
    """est of suffixspec's drafts cut at their accepted length (no replay: the
    same tokens are accepted, so MTS is the same)."""
    mts = r["suffixspec"]["mean_tokens_per_step"]
    return mts / (1 + EST_TOKEN_COST * (mts - 1))


def markdown(results: dict, fraction: float) -> str:
    names = list(results)
    rows = ("suffixspec", "arctic f2", "vllm", "oracle: windows", "oracle: windows + vLLM")
    lines = [(f"Replay-level upper bounds, one request at a time (slices of `policy_bench` x "
              f"{fraction}); MTS / est (est = MTS / (1 + 0.03 x drafted per step))."), "",
             "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(
            f"{results[n][row]['mean_tokens_per_step']:.3f} / {results[n][row]['est']:.3f}"
            for n in names) + " |")
    lines.append("| suffixspec, its drafts cut with hindsight | " + " | ".join(
        f"{results[n]['suffixspec']['mean_tokens_per_step']:.3f} / {cut_est(results[n]):.3f}"
        for n in names) + " |")
    for row in ("suffixspec", "cut", "oracle: windows", "oracle: windows + vLLM"):
        cells = []
        for n in names:
            r = results[n]
            other = max(r["arctic f2"]["est"], r["vllm"]["est"])
            est = cut_est(r) if row == "cut" else r[row]["est"]
            cells.append(f"{est / other:.3f}")
        label = "suffixspec cut with hindsight" if row == "cut" else row
        lines.append(f"| est of {label} / better of arctic f2 and vLLM | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = parser(__doc__)
    ap.add_argument("--fraction", type=float, default=0.5, help="of each policy_bench slice")
    ap.add_argument("--only", nargs="*", choices=list(SLICES), default=list(SLICES))
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    results = {}
    for name in args.only:
        print(f"{name}", file=sys.stderr, flush=True)
        results[name] = measure(load_slice(args.traces, name, encode, args.fraction))
    text = markdown(results, args.fraction)
    save_results(args.out, "oracle", results, text)


if __name__ == "__main__":
    main()
