"""Do past outputs of the same prompt family add to suffixspec's drafts?  A probe, not a policy.

Usage (from the repository root):

    python bench/family_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results [--only sql code] \\
        [--set family_outputs=0]

Requests whose prompts start alike (one database's schema, one tool list,
one coding problem) write alike, but the cross pool drafts by counts over
every past output: after the output's first token that differs from all past
outputs of its family, the start anchors no longer hold and the counts mix
in other families' continuations.  A *family* drafter keeps the outputs of
the last ``MAX_SIBLINGS`` earlier requests whose prompt-start key
(``anchors.start_anchors``: a hash of the prompt's first 64 tokens) is the
request's, and drafts what follows the longest match of the output so far
in them (the output's start counts as a match of one), the newest output
first and, within it, the occurrence nearest the request's position.

Each trace's slice is replayed one request at a time by
``pointer_probe.replay`` with the family drafter as its third drafter:
``learned`` takes the family's draft in the cells (suffixspec's match
length, the family's, each clipped to 5, and whether their first tokens
agree) where its value so far leads, with no hindsight; ``hindsight`` rows
take the best of the drafts named.  ``--set family_outputs=0`` replays
suffixspec without the family outputs its own trie holds by default (the
analysis that led to them); without it the rows say what a family drafter
adds beyond them.  Writes ``family.json`` and ``family.md`` into ``--out``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from suffixspec.anchors import start_anchors

from pointer_probe import K, probe

MAX_SIBLINGS = 8
START = -1  # stands before each output: the output's start matches every sibling's
DRIVES = ("suffixspec", "learned", "hindsight: suffixspec or none",
          "hindsight: suffixspec, family or none", "hindsight: suffixspec, vLLM or none",
          "hindsight: suffixspec, vLLM, family or none")


class Family:
    """One request's drafter over its siblings' outputs (newest first)."""

    def __init__(self, siblings: list[np.ndarray]):
        self.siblings = [np.concatenate([[START], s]).astype(np.int64) for s in siblings]
        # matched[j]: how many tokens ending at sibling position j equal the output's last ones
        self.matched = [np.zeros(s.shape[0], np.int64) for s in self.siblings]
        for m in self.matched:
            m[0] = 1
        self.at = 0  # tokens of the output so far

    def draft(self) -> tuple[np.ndarray, int]:
        best, tokens = 0, np.zeros(0, np.int64)
        for sibling, matched in zip(self.siblings, self.matched):
            longest = int(matched.max())
            if longest > best:  # strictly longer: the newest sibling wins ties
                ends = np.flatnonzero(matched == longest)
                end = int(ends[np.argmin(np.abs(ends - self.at))])
                best, tokens = longest, sibling[end + 1:end + 1 + K]
        return tokens, best

    def advance(self, step: np.ndarray, drafted, got, dv) -> None:
        for t in step:
            for sibling, matched in zip(self.siblings, self.matched):
                hit = sibling[1:] == t
                grown = np.zeros_like(matched)
                grown[1:][hit] = matched[:-1][hit] + 1
                matched[:] = grown
        self.at += step.shape[0]


class Families:
    """Makes each request's ``Family``; a request's output joins its family
    when the next request starts (the replay runs one request at a time)."""

    label = "family"

    def __init__(self):
        self.outputs: dict[int, list[np.ndarray]] = defaultdict(list)
        self.last = None

    @staticmethod
    def agrees(tokens: np.ndarray, ds, dv) -> bool:
        """The cell's flag: the family's first token is suffixspec's."""
        return bool(tokens.shape[0] and len(ds.token_ids) and tokens[0] == ds.token_ids[0])

    def __call__(self, req) -> Family:
        if self.last is not None:
            key, output = self.last
            self.outputs[key].append(output)
        key = int(start_anchors(req.prompt)[1])
        self.last = (key, req.output)
        return Family(self.outputs[key][::-1][:MAX_SIBLINGS])


if __name__ == "__main__":
    probe(__doc__, "family", DRIVES, Families, "a family drafter")
