"""The replay loop: what speculation would have saved on recorded outputs.

Each step drafts from the prompt plus the output so far; the accepted count is
the longest draft prefix (for trees, root-to-node path) equal to the recorded
next tokens; then accepted + 1 tokens are emitted (the target model's own
token; fewer at the end of the output) and fed back with ``extend``.

With ``concurrency`` N, N requests are in flight and each engine step makes one
batched ``propose`` call for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from suffixspec.draft import Draft, Proposer
from suffixspec.replay.traces import Request
from suffixspec.stepcost import StepCost

METRIC_KEYS = ("requests", "output_tokens", "steps", "mean_tokens_per_step", "acceptance_rate",
               "drafted_per_step", "proposer_us_per_step_p50", "proposer_us_per_step_p99",
               "start_us_mean", "index_bytes_per_token", "est",
               "first_step_accepted_mean", "first_step_drafted_mean",
               "no_draft_rate", "first_token_miss_rate", "tokens_per_time")
#: est's discount: verification cost of one drafted token, as a share of a step.  Fixed,
#: so est stays comparable across runs whatever draft cost a proposer drafts with.
EST_TOKEN_COST = 0.03


@dataclass
class ReplayResult:
    requests: int = 0
    output_tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    first_steps: int = 0      # steps at output position 0
    first_accepted: int = 0   # tokens accepted there
    first_drafted: int = 0
    no_draft: int = 0         # steps without a draft
    first_token_miss: int = 0  # steps whose draft's first token was wrong
    step_us: list = field(default_factory=list)        # per request-step
    engine_step_us: list = field(default_factory=list)  # per engine step (whole batch)
    start_us: list = field(default_factory=list)
    finish_us: list = field(default_factory=list)
    index_bytes: int = 0
    indexed_tokens: int = 0
    model_time: float = 0.0   # engine time under the replay's step cost model, if any

    def metrics(self) -> dict:
        """The per-trace figures, under ``METRIC_KEYS``."""
        steps = max(self.steps, 1)
        step_us = np.asarray(self.step_us) if self.step_us else np.zeros(1)
        mts = self.output_tokens / steps
        first = max(self.first_steps, 1)
        return {
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "mean_tokens_per_step": round(self.output_tokens / steps, 4),
            "acceptance_rate": round(self.accepted / max(self.drafted, 1), 4),
            "drafted_per_step": round(self.drafted / steps, 4),
            "proposer_us_per_step_p50": round(float(np.percentile(step_us, 50)), 2),
            "proposer_us_per_step_p99": round(float(np.percentile(step_us, 99)), 2),
            "start_us_mean": round(float(np.mean(self.start_us)) if self.start_us else 0.0, 2),
            "index_bytes_per_token": (round(self.index_bytes / self.indexed_tokens, 1)
                                      if self.indexed_tokens > 0 else None),
            # Tokens per step discounted for verifying the drafted tokens.
            "est": round(mts / (1 + EST_TOKEN_COST * self.drafted / steps), 4),
            "first_step_accepted_mean": round(self.first_accepted / first, 4),
            "first_step_drafted_mean": round(self.first_drafted / first, 4),
            "no_draft_rate": round(self.no_draft / steps, 4),
            "first_token_miss_rate": round(self.first_token_miss / steps, 4),
            # Output tokens per unit of engine time under the step cost model.
            "tokens_per_time": (round(self.output_tokens / self.model_time, 4)
                                if self.model_time > 0 else None),
        }

    def engine_step_summary(self) -> dict:
        """Per engine step (one batched call for all requests in flight)."""
        us = np.asarray(self.engine_step_us) if self.engine_step_us else np.zeros(1)
        return {"engine_steps": len(self.engine_step_us),
                "engine_step_us_p50": round(float(np.percentile(us, 50)), 2),
                "engine_step_us_p99": round(float(np.percentile(us, 99)), 2),
                "engine_step_us_mean": round(float(us.mean()), 2),
                "finish_us_mean": round(float(np.mean(self.finish_us)) if self.finish_us else 0.0, 2)}


def accepted_length(draft: Draft, target: np.ndarray) -> int:
    """Longest draft prefix (path) or root-to-node path (tree) equal to ``target``."""
    n = len(draft)
    if n == 0 or target.shape[0] == 0:
        return 0
    if draft.is_path:
        k = min(n, target.shape[0])
        miss = np.flatnonzero(draft.token_ids[:k] != target[:k])
        return int(miss[0]) if miss.size else k
    depth = np.zeros(n, np.int64)
    ok = np.zeros(n, bool)
    best = 0
    for i in range(n):
        p = draft.parents[i]
        if p >= 0 and not ok[p]:
            continue
        d = 0 if p < 0 else depth[p] + 1
        if d < target.shape[0] and draft.token_ids[i] == target[d]:
            ok[i] = True
            depth[i] = d
            best = max(best, d + 1)
    return best


def replay(requests: list[Request], proposer: Proposer, concurrency: int = 1,
           progress=None, step_cost: StepCost | None = None) -> ReplayResult:
    """Replay ``requests`` in order through ``proposer``; returns the counts.

    ``progress`` (optional) is called with the number of requests finished.
    With ``step_cost``, each engine step is priced at ``step_cost.seconds``
    of the tokens it verifies (one per request plus the drafted ones), which
    gives ``tokens_per_time``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    res = ReplayResult()
    clock = time.perf_counter_ns
    pending = iter(requests)
    active: dict[str, list] = {}  # req_id -> [request, position]

    def admit():
        while len(active) < concurrency:
            req = next(pending, None)
            if req is None:
                return
            t0 = clock()
            if req.anchors is None:
                proposer.start_request(req.req_id, req.prompt)
            else:
                proposer.start_request(req.req_id, req.prompt, anchors=req.anchors)
            res.start_us.append((clock() - t0) / 1e3)
            res.requests += 1
            res.output_tokens += req.output.shape[0]
            active[req.req_id] = [req, 0]

    def retire(req_id):
        t0 = clock()
        proposer.finish_request(req_id)
        res.finish_us.append((clock() - t0) / 1e3)
        del active[req_id]
        if progress is not None:
            progress(1)

    extend_batch = getattr(proposer, "extend_batch", None)
    if extend_batch is None:
        def extend_batch(ids, emits):
            for req_id, emit in zip(ids, emits):
                proposer.extend(req_id, emit)

    admit()
    while active:
        # Requests with an empty recorded output finish without a step.
        for req_id in [r for r, (req, _) in active.items() if req.output.shape[0] == 0]:
            retire(req_id)
        admit()
        if not active:
            break
        ids = list(active)
        t0 = clock()
        drafts = proposer.propose(ids)
        t1 = clock()
        emits = []
        verified = len(ids)
        for req_id, draft in zip(ids, drafts):
            verified += len(draft)
            req, pos = active[req_id]
            target = req.output[pos:]
            acc = accepted_length(draft, target)
            res.drafted += len(draft)
            res.accepted += acc
            if pos == 0:
                res.first_steps += 1
                res.first_accepted += acc
                res.first_drafted += len(draft)
            if len(draft) == 0:
                res.no_draft += 1
            elif acc == 0:
                res.first_token_miss += 1
            emits.append(req.output[pos:pos + min(acc + 1, target.shape[0])])
        t2 = clock()
        extend_batch(ids, emits)
        t3 = clock()
        us = ((t1 - t0) + (t3 - t2)) / 1e3
        res.engine_step_us.append(us)
        res.step_us.extend([us / len(ids)] * len(ids))
        res.steps += len(ids)
        if step_cost is not None:
            res.model_time += step_cost.seconds(verified)
        for req_id, emit in zip(ids, emits):
            entry = active[req_id]
            entry[1] += emit.shape[0]
            if entry[1] >= entry[0].output.shape[0]:
                retire(req_id)
        admit()
    memory = getattr(proposer, "index_memory", None)
    if memory is not None:
        res.index_bytes, res.indexed_tokens = memory()
    return res
