"""Do copies hide behind a different tokenization?  A probe (issue 41).

Usage (from the repository root):

    python bench/text_copy_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --only agent code gorilla \\
        [--fraction 0.5] [--tails 8 12 24]

A request that copies text from its own context copies the text, not its
tokens: the same characters after a different neighbour can be split into
other tokens, and a token suffix match then finds nothing to copy.  This
bounds what drafting from text matches could add over token matches, with
hindsight on both sides, over the request's own context (prompt and output
so far; no cross-request pool).

Each request of a ``policy_bench`` slice (times ``--fraction``) is walked by
two hindsight drafters, one step at a time (at most ``K`` tokens a step):

* *tokens*: over the newest ``MAX_OCCURRENCES`` occurrences of the longest
  token suffix (up to 4 tokens) in the context, the one whose following
  tokens agree longest with the recorded output;
* *tokens or text*: the better of that and, over the newest occurrences of
  the context's last ``tail`` characters in the context's text, the one
  whose following text reproduces the most whole output tokens.

Prints, per slice and tail, the steps each needs and MTS (output tokens per
step); the second's gain is an upper bound of a text-matching candidate.
Writes nothing.
"""

from __future__ import annotations

import numpy as np

from suffixspec.fingerprint import load_hf_tokenizer

from bench_common import parser
from loss_analysis import K
from policy_bench import SLICES, load_slice

MAX_OCCURRENCES = 64
MAX_SUFFIX = 4


def _agreement(text: str, at: int, end: int, pieces: list[str], i: int) -> int:
    """Whole output tokens from ``pieces[i]`` on that ``text[at:end]`` spells."""
    got = 0
    while got < K and i + got < len(pieces):
        s = pieces[i + got]
        if at + len(s) > end or text[at:at + len(s)] != s:
            break
        at += len(s)
        got += 1
    return got


def _occurrences(text: str, pattern: str, end: int):
    """Starts of ``pattern`` in ``text`` ending before ``end``, newest first."""
    stop = end - 1
    for _ in range(MAX_OCCURRENCES):
        j = text.rfind(pattern, 0, stop)
        if j < 0:
            return
        yield j
        stop = j + len(pattern) - 1


def token_best(ids: str, end: int, truth: list[int], i: int) -> int:
    """Hindsight best run after the longest token suffix of ``ids[:end]``.

    ``ids`` holds one character per token id, so ``str.rfind`` matches whole tokens."""
    for m in range(MAX_SUFFIX, 0, -1):
        if end <= m:
            continue
        runs = [_agreement(ids, j + m, end, [chr(t) for t in truth[i:i + K]], 0)
                for j in _occurrences(ids, ids[end - m:end], end)]
        if runs:
            return max(runs)
    return 0


def text_best(text: str, end: int, pieces: list[str], i: int, tail: int) -> int:
    """Hindsight best run of whole tokens after the last ``tail`` characters of ``text[:end]``."""
    if end <= tail:
        return 0
    return max((_agreement(text, j + tail, end, pieces, i)
                for j in _occurrences(text, text[end - tail:end], end)), default=0)


def walk(requests, decode, tails) -> dict:
    """Steps of each hindsight drafter over ``requests``: {"tokens": n, tail: n}."""
    steps = {"tokens": 0, **{t: 0 for t in tails}}
    for req in requests:
        ctx = np.concatenate([req.prompt, req.output]).tolist()
        start, truth = len(req.prompt), req.output.tolist()
        ids = "".join(chr(t) for t in ctx)
        pieces = [decode(t) for t in ctx]
        offsets = np.cumsum([0] + [len(s) for s in pieces]).tolist()
        text = "".join(pieces)
        for tail in ("tokens", *tails):
            i = 0
            while i < len(truth):
                got = token_best(ids, start + i, truth, i)
                if tail != "tokens":
                    got = max(got, text_best(text, offsets[start + i], pieces[start:], i, tail))
                steps[tail] += 1
                i += got + 1
    return steps


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), default=["agent", "code", "gorilla"])
    ap.add_argument("--fraction", type=float, default=0.5, help="of each policy_bench slice")
    ap.add_argument("--tails", nargs="*", type=int, default=[8, 12, 24],
                    help="characters of the context's end matched in its text")
    args = ap.parse_args()
    tokenizer = load_hf_tokenizer(args.tokenizer)
    cache: dict = {}

    def decode(t: int) -> str:
        if t not in cache:
            cache[t] = tokenizer.decode([t])
        return cache[t]

    def encode(texts):
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    print("| slice | output tokens | MTS: tokens | " +
          " | ".join(f"tokens or text, tail {t}" for t in args.tails) + " |")
    print("|---" * (3 + len(args.tails)) + "|")
    for name in args.only:
        requests = load_slice(args.traces, name, encode, args.fraction)
        total = sum(r.output.shape[0] for r in requests)
        steps = walk(requests, decode, args.tails)
        base = total / steps["tokens"]
        cells = [f"{total / steps[t]:.3f} ({total / steps[t] / base - 1:+.2%})" for t in args.tails]
        print(f"| {name} | {total:,} | {base:.3f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
