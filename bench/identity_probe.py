"""Is a drafted token's identity worth a calibration feature?  A probe.

Usage (from the repository root):

    python bench/identity_probe.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --only agent code

Replays policy_bench's slices with the default policy (paths) and keeps
every draft: its tokens, each token's acceptance probability given its
parent (the policy's, from ``Draft.probs``), and how many were accepted.
Then, online and in step order, it corrects each probability by a factor
learned per *key* (``(hits + a) / (predicted + a)`` over the reached tokens
of that key so far) and reports, per key and prior weight ``a``:

* the log loss of the reached tokens, before and after;
* est if each draft were cut where its corrected running product falls to
  the policy's threshold (``calibration.threshold`` from running means, as
  the policy keeps them).  Cutting only: a draft cannot grow past what the
  policy drafted, so this bounds the change from below where a correction
  would raise probabilities.

Keys: the token before (``prev``), the token itself (``tok``), both
(``pair``), the token before for first tokens only (``prev_d0``); and the
request's longer past, beside the one draft calibration's fine rows see,
each with the depth (0, 1-2, 3+): the run of wholly accepted or missed
drafts (``streak``), the tokens its last three drafts accepted
(``recent3``).  Writes
nothing; prints one line per key.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from suffixspec.native import warmup
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import EST_TOKEN_COST, replay
from suffixspec.replay.traces import hf_encoder

from bench_common import parser
from policy_bench import SLICES, load_slice

def _depth(d: int) -> int:
    return 0 if d == 0 else 1 if d <= 2 else 2


def _streak(past) -> int:
    """Signed run of the request's last drafts: +s after s wholly accepted in a
    row, -s after s whose first token was rejected (each up to 3), else 0."""
    s = 0
    for n, acc in reversed(past):
        if n == 0:
            continue
        whole, missed = acc == n, acc == 0
        if whole and s >= 0:
            s += 1
        elif missed and s <= 0:
            s -= 1
        else:
            break
        if abs(s) == 3:
            break
    return s


def _recent3(past) -> int:
    """Tokens accepted by the request's last three drafts, bucketed."""
    got = sum(acc for _, acc in past[-3:])
    return 0 if got == 0 else 1 if got <= 2 else 2 if got <= 5 else 3 if got <= 10 else 4


KEYS = {"prev": lambda prev, tok, depth, past: prev,
        "tok": lambda prev, tok, depth, past: tok,
        "pair": lambda prev, tok, depth, past: (prev, tok),
        "prev_d0": lambda prev, tok, depth, past: prev if depth == 0 else -1,
        "streak": lambda prev, tok, depth, past: (_streak(past), _depth(depth)),
        "recent3": lambda prev, tok, depth, past: (_recent3(past), _depth(depth))}


class Keeping:
    """A proposer that keeps each step's draft with what was accepted."""

    def __init__(self, inner, requests):
        self.inner = inner
        self.last_token = {r.req_id: int(r.prompt[-1]) for r in requests}
        self.steps = []  # (token before, draft tokens, conditional probs, accepted, emitted, req)

    def propose(self, req_ids, max_spec_tokens=None):
        drafts = self.inner.propose(req_ids, max_spec_tokens)
        self._drafts = dict(zip(req_ids, drafts))
        return drafts

    def extend(self, req_id, tokens):
        draft = self._drafts[req_id]
        n = len(draft)
        accepted = 0
        while accepted < min(n, len(tokens)) and draft.token_ids[accepted] == tokens[accepted]:
            accepted += 1
        probs = draft.probs.astype(np.float64)
        given_parent = probs / np.concatenate([[1.0], probs[:-1]]) if n else probs
        self.steps.append((self.last_token[req_id], draft.token_ids.copy(), given_parent,
                           accepted, len(tokens), req_id))
        self.last_token[req_id] = int(tokens[-1])
        self.inner.extend(req_id, tokens)

    def extend_batch(self, req_ids, emitted):
        for req_id, tokens in zip(req_ids, emitted):
            self.extend(req_id, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _log_loss(q, hit):
    q = np.clip(np.asarray(q), 1e-4, 1 - 1e-4)
    hit = np.asarray(hit)
    return float(-(hit * np.log(q) + (1 - hit) * np.log(1 - q)).mean())


def corrected(steps, key=None, prior=20.0):
    """``(log loss of the reached tokens, est)`` with probabilities corrected
    per ``key`` (None: as drafted, cut where drafted)."""
    hits, predicted = defaultdict(float), defaultdict(float)
    emitted_mean, drafted_mean = 2.0, 4.0  # calibration's starting state
    emitted = drafted = 0
    qs, outcomes = [], []
    history = defaultdict(list)  # per request: (drafted, accepted) of its past steps
    for before, tokens, q, accepted, got, req in steps:
        past = history[req]
        n = len(tokens)
        thr = EST_TOKEN_COST * emitted_mean / (1 + EST_TOKEN_COST * drafted_mean)
        cut = n
        prev, running = before, 1.0
        factors = np.ones(n)
        for i in range(n):
            if key is not None:
                k = key(prev, int(tokens[i]), i, past)
                factors[i] = (hits[k] + prior) / (predicted[k] + prior)
            running *= min(q[i] * factors[i], 0.999)
            if key is not None and running <= thr and cut == n:
                cut = i
            prev = int(tokens[i])
        prev = before
        for i in range(min(n, accepted + 1, got)):  # the reached tokens
            hit = i < accepted
            qs.append(min(q[i] * factors[i], 0.999))
            outcomes.append(hit)
            if key is not None:
                k = key(prev, int(tokens[i]), i, past)
                hits[k] += hit
                predicted[k] += q[i]
            prev = int(tokens[i])
        past.append((n, accepted))  # what the policy drafted (the replay's history)
        step_emitted = min(min(accepted, cut) + 1, got)
        emitted += step_emitted
        drafted += cut
        emitted_mean += 0.01 * (step_emitted - emitted_mean)
        drafted_mean += 0.01 * (cut - drafted_mean)
    mts, per_step = emitted / len(steps), drafted / len(steps)
    return _log_loss(qs, outcomes), mts / (1 + EST_TOKEN_COST * per_step)


def main():
    ap = parser(__doc__)
    ap.add_argument("--only", nargs="*", choices=list(SLICES))
    ap.add_argument("--priors", default="10,30")
    ap.add_argument("--keys", nargs="*", choices=list(KEYS), default=list(KEYS))
    args = ap.parse_args()
    encode = hf_encoder(args.tokenizer)
    warmup()
    for name in args.only or list(SLICES):
        requests = load_slice(args.traces, name, encode)
        proposer = Keeping(make_proposer("suffixspec", requests, cross_pool_tokens=None),
                           requests)
        replay(requests, proposer)
        loss, est = corrected(proposer.steps)
        print(f"{name}: {len(proposer.steps)} steps, log loss {loss:.4f}, est {est:.4f} "
              f"(per-step, as drafted)", flush=True)
        for label, key in ((k, KEYS[k]) for k in args.keys):
            for prior in (float(p) for p in args.priors.split(",")):
                k_loss, k_est = corrected(proposer.steps, key, prior)
                print(f"  {label:8s} a={prior:<4g} log loss {k_loss:.4f} ({k_loss / loss - 1:+.1%})"
                      f"  est {k_est:.4f} ({k_est / est - 1:+.2%})", flush=True)


if __name__ == "__main__":
    main()
