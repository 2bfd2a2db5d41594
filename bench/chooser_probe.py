"""Could a richer learner choose among the policy's candidates?  A probe.

Usage (from the repository root; needs scikit-learn):

    python bench/chooser_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --only agent code gorilla

``oracle_bound`` chooses among the candidates the policy enumerates
(``SuffixProposer.candidate_windows``, and the policy's own draft) with
hindsight.  This probe chooses among the same candidates without it: a
gradient-boosted classifier (scikit-learn's ``HistGradientBoostingClassifier``)
estimates each candidate token's chance of acceptance given that the tokens
before it were accepted, from many more features than the calibration
table's buckets:

* the candidate's source, match length and whether it is a branch window
  (its index among the windows);
* the token's depth, its counts ``(c, n)`` and ratio;
* how many other candidates hold the same prefix up to and including it;
* whether the policy's draft holds that prefix, and the policy's own
  probability for it there;
* the policy draft's length, the request's last step (tokens drafted and
  accepted) and the output position.

A candidate's running product of those chances, cut where the net gain
``sum(p - thr)`` is largest (``thr`` the policy's rule, from running means of
tokens emitted and drafted), is its value; the best value is drafted, or
nothing where none is positive.

Each slice is replayed one request at a time.  Its first half of requests
drafts the policy's drafts and records every candidate token whose prefix
the recorded output agrees with (the label: the token is right too); the
classifier is fitted once on that; the second half drafts the classifier's
choices, and its drafts drive the replay.  A second replay drafts the
policy's drafts throughout.  MTS, drafted per step and est are over the
second half's requests in both, so their ratio is what the richer choice
would add where it had learned from the first half.  Writes nothing;
prints one line per slice.  ``--drop`` names features to leave out;
``--with-vllm`` adds vLLM's drafter's draft (``vllm-gpu``: the newest
occurrence of the longest match, in the request's history or its corpus)
as one more candidate; ``--refits N`` fits again N times over the second
half, on every candidate token recorded so far (the newest ``MAX_ROWS``).
``--lexical`` adds what the token ids say with the tokenizer's help
(``LEXICAL``): how many tokens the context's line holds so far, and the kind
of text (``suffixspec.token_kinds.KINDS``: a newline, spaces, punctuation, a word
with or without its leading space, digits, mixed) of the context's last token, of the token
before the candidate token and of the candidate token.
"""

from __future__ import annotations

import sys

import numpy as np

from suffixspec.draft import Draft
from suffixspec.fingerprint import load_hf_tokenizer
from suffixspec.token_kinds import token_kinds
from suffixspec.native import warmup
from suffixspec.native.windows import W_AT, W_HEAD, W_LEN, W_MATCH, W_SOURCE
from suffixspec.replay.harness import EST_TOKEN_COST, replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser
from loss_analysis import K, accepted
from oracle_bound import Oracle
from policy_bench import SLICES, load_slice

POLICY = 9            # source code of the policy's own draft as a candidate
VLLM = 10             # and of vLLM's drafter's (+1 from its corpus), with --with-vllm
MAX_ROWS = 2_000_000  # training rows of a fit (the newest)
#: The classifier's features, in ``Chooser._features``' order (``--drop`` leaves some out).
FEATURES = ("source", "match", "window", "depth", "c", "n", "ratio", "agree", "candidates",
            "on_policy", "policy_prob", "policy_len", "last_drafted", "last_accepted",
            "position", "column", "last_class", "prev_class", "cand_class")
#: The features ``--lexical`` adds: where the context's line is, and the kind
#: of text of its last token, of the token before the candidate token and of
#: the candidate token itself (``suffixspec.token_kinds``).
LEXICAL = FEATURES[-4:]
EMA = 0.01
MAX_COLUMN = 64

class Chooser(Oracle):
    """Drafts the policy's drafts until the classifier is fitted (always,
    without ``use_model``), the classifier's choice after; keeps its own
    counts of the requests in ``scored``.  The policy (and vLLM's drafter,
    ``with_vllm``) run alongside as in ``oracle_bound.Oracle``."""

    def __init__(self, requests, scored: set, use_model: bool, drop=(), with_vllm=False,
                 classes=None):
        super().__init__(requests, with_vllm)
        self.scored, self.use_model = scored, use_model
        self.classes = classes  # token kinds: the lexical features are used
        drop = set(drop) | (set() if classes is not None else set(LEXICAL))
        self.keep = [i for i, f in enumerate(FEATURES) if f not in drop]
        self.prompt: dict = {}
        self.column: dict = {}  # tokens since the context's last newline
        self.model = None
        self.last: dict = {}
        self.rows_x: list = []  # since the last fit
        self.rows_y: list = []
        self.seen_x: list = []  # every fit's
        self.seen_y: list = []
        self.emitted, self.drafted_ema = 2.0, 4.0
        self.steps = self.tokens = self.drafted = 0

    def start_request(self, req_id, prompt, anchors=None) -> None:
        super().start_request(req_id, prompt)
        self.last[req_id] = (0, 0)
        self.prompt[req_id] = np.asarray(prompt, np.int64)
        if self.classes is not None:
            lines = np.flatnonzero(self.classes[self.prompt[req_id]] == 0)
            self.column[req_id] = (self.prompt[req_id].shape[0] - 1 - int(lines[-1])
                                   if lines.shape[0] else MAX_COLUMN)

    def extend(self, req_id, tokens) -> None:
        super().extend(req_id, tokens)
        n = int(np.asarray(tokens).shape[0])
        if self.classes is not None:
            for t in np.asarray(tokens, np.int64):
                self.column[req_id] = 0 if self.classes[t] == 0 else self.column[req_id] + 1
        if req_id in self.scored:
            self.tokens += n
        self.emitted += EMA * (n - self.emitted)

    def finish_request(self, req_id) -> None:
        super().finish_request(req_id)
        del self.last[req_id], self.prompt[req_id]
        self.column.pop(req_id, None)

    def propose(self, req_ids, max_spec_tokens=None) -> list[Draft]:
        return [self._one(rid) for rid in req_ids]

    # -- candidates and their features
    def _candidates(self, rid, draft: Draft):
        count = int(self.policy.candidate_windows([rid], self.windows)[0])
        out = []
        ctx = self.context[rid]
        for r in range(count):
            head, length, at = (int(self.windows.meta[0, r, f]) for f in (W_HEAD, W_LEN, W_AT))
            start = head - (at - ctx)
            if length <= 0 or start < 0 or start >= length:
                continue
            end = min(length, start + K)
            out.append((int(self.windows.meta[0, r, W_SOURCE]),
                        int(self.windows.meta[0, r, W_MATCH]), r,
                        self.windows.tokens[0, r, start:end].astype(np.int64),
                        self.windows.c[0, r, start:end].astype(np.float64),
                        self.windows.n[0, r, start:end].astype(np.float64)))
        mine = draft.token_ids.astype(np.int64)
        if mine.shape[0] and not any(_prefix_equal(c[3], mine, mine.shape[0] - 1) for c in out):
            z = np.full(mine.shape[0], -1.0)
            out.append((POLICY, int(draft.match_len), 8, mine, z, z))
        if self.vllm is not None:
            theirs = self.vllm.propose([rid])[0]
            toks = theirs.token_ids.astype(np.int64)
            if toks.shape[0]:
                z = np.full(toks.shape[0], -1.0)
                out.append((VLLM + (theirs.source == "cross"), int(theirs.match_len), 9, toks,
                            z, z))
        return out

    def _features(self, rid, draft: Draft, cands):
        mine = draft.token_ids.astype(np.int64)
        probs = draft.probs.astype(np.float64)
        drafted_last, accepted_last = self.last[rid]
        if self.classes is not None:
            at = self.at[rid]
            tail = self.truth[rid][at - 1] if at else self.prompt[rid][-1]
            last_class, column = int(self.classes[tail]), min(self.column[rid], MAX_COLUMN)
        else:
            last_class = column = -1
        rows = []
        for src, match, r, toks, c, n in cands:
            kinds = (self.classes[toks] if self.classes is not None
                     else np.full(toks.shape[0], -1))
            for j in range(toks.shape[0]):
                agree = sum(1 for o in cands if o[3] is not toks and _prefix_equal(o[3], toks, j))
                on_policy = _prefix_equal(mine, toks, j)
                rows.append((src, match, r, j, c[j], n[j], c[j] / n[j] if n[j] > 0 else -1.0,
                             agree, len(cands), on_policy,
                             probs[j] / (probs[j - 1] if j > 0 else 1.0) if on_policy else -1.0,
                             mine.shape[0], drafted_last, accepted_last,
                             min(self.at[rid], 4096), column, last_class,
                             kinds[j - 1] if j else last_class, kinds[j]))
        return np.asarray(rows, np.float64)[:, self.keep]

    def _one(self, rid) -> Draft:
        draft = self.policy.propose([rid])[0]
        truth = self.truth[rid][self.at[rid]:]
        if self.model is None and self.use_model:
            cands = self._candidates(rid, draft)
            if cands:
                self._record(self._features(rid, draft, cands), cands, truth)
        chosen = draft if self.model is None else self._choose(rid, draft, truth)
        n = len(chosen)
        self.last[rid] = (n, accepted(chosen.token_ids, truth))
        self.drafted_ema += EMA * (n - self.drafted_ema)
        if rid in self.scored:
            self.steps += 1
            self.drafted += n
        return chosen

    def _record(self, x, cands, truth) -> None:
        """Keep a step's candidate tokens and their labels for the next fit."""
        self.rows_x.append(x)
        self.rows_y.append(np.concatenate([_labels(c[3], truth) for c in cands]))

    def _choose(self, rid, draft: Draft, truth) -> Draft:
        cands = self._candidates(rid, draft)
        if not cands:
            return Draft()
        x = self._features(rid, draft, cands)
        self._record(x, cands, truth)  # learned from only at a later fit (--refits)
        q = self.model.predict_proba(x)[:, 1]
        thr = EST_TOKEN_COST * self.emitted / (1.0 + EST_TOKEN_COST * self.drafted_ema)
        best, best_gain, at = None, 0.0, 0
        for _, match, _, toks, _, _ in cands:
            p = np.cumprod(q[at:at + toks.shape[0]])
            at += toks.shape[0]
            gain = np.cumsum(p - thr)
            j = int(np.argmax(gain))
            if gain[j] > best_gain:
                best_gain, best = float(gain[j]), (toks[:j + 1], p[:j + 1], match)
        if best is None:
            return Draft()
        toks, p, match = best
        return Draft(toks.astype(np.int32), np.arange(-1, toks.shape[0] - 1, dtype=np.int32),
                     p.astype(np.float32), float(p.sum()), match, "chooser")

    def fit(self) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        if self.rows_x:
            x, y = np.concatenate(self.rows_x), np.concatenate(self.rows_y)
            self.seen_x.append(x[y >= 0])
            self.seen_y.append(y[y >= 0])
        x, y = np.concatenate(self.seen_x), np.concatenate(self.seen_y)
        if x.shape[0] > MAX_ROWS:  # the newest rows
            x, y = x[-MAX_ROWS:], y[-MAX_ROWS:]
        self.model = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.1,
                                                    max_leaf_nodes=63,
                                                    categorical_features=[
                                                        self.keep.index(i) for i in (
                                                            0, 2, *(FEATURES.index(f) for f
                                                                    in LEXICAL[1:]))
                                                        if i in self.keep],
                                                    random_state=0).fit(x, y)
        print(f"    fitted on {x.shape[0]:,} candidate tokens ({y.mean():.3f} right)",
              file=sys.stderr, flush=True)
        self.rows_x, self.rows_y = [], []


def run(requests, use_model: bool, drop=(), with_vllm=False, refits=0, classes=None) -> dict:
    half = len(requests) // 2
    scored = {r.req_id for r in requests[half:]}
    chooser = Chooser(requests, scored, use_model, drop, with_vllm, classes)
    replay(requests[:half], chooser)
    # The second half in refits + 1 parts, fitting again on every row so far before each.
    cuts = np.linspace(half, len(requests), refits + 2).astype(int)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if use_model:
            chooser.fit()
        replay(requests[lo:hi], chooser)
    mts = chooser.tokens / max(chooser.steps, 1)
    drafted = chooser.drafted / max(chooser.steps, 1)
    return {"mts": mts, "drafted": drafted, "est": mts / (1 + EST_TOKEN_COST * drafted)}


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES), default=list(SLICES))
    ap.add_argument("--fraction", type=float, default=0.5, help="of each policy_bench slice")
    ap.add_argument("--drop", nargs="*", choices=FEATURES, default=[],
                    help="features the classifier goes without")
    ap.add_argument("--with-vllm", action="store_true",
                    help="vLLM's drafter's draft (vllm-gpu) is one more candidate")
    ap.add_argument("--refits", type=int, default=0,
                    help="fit again this many times in the second half, on every row so far")
    ap.add_argument("--lexical", action="store_true",
                    help="add the line's column and the kinds of token text (LEXICAL)")
    args = ap.parse_args()
    warmup()
    encode = hf_encoder(args.tokenizer)
    classes = token_kinds(load_hf_tokenizer(args.tokenizer)) if args.lexical else None
    for name in args.only:
        requests = load_slice(args.traces, name, encode, args.fraction)
        policy = run(requests, use_model=False)
        learned = run(requests, use_model=True, drop=args.drop, with_vllm=args.with_vllm,
                      refits=args.refits, classes=classes)
        print(f"{name:8s} second half: policy MTS {policy['mts']:.3f} est {policy['est']:.3f} "
              f"drafted {policy['drafted']:.2f} | chooser MTS {learned['mts']:.3f} "
              f"est {learned['est']:.3f} drafted {learned['drafted']:.2f} | "
              f"est ratio {learned['est'] / policy['est']:.4f}", flush=True)


if __name__ == "__main__":
    main()
