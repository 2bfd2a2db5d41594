"""Per-pool draft and acceptance figures, logged next to vLLM's own.

vLLM's ``SpecDecoding metrics`` line counts drafted and accepted tokens for
the whole proposer.  This splits them by where a draft came from (the
request's own tokens, past outputs, or past outputs' starts matched through
the start anchors) and adds the proposer's own time.
Like vLLM, it counts what the engine scheduled: a draft counts (cut to the
tokens scheduled) when the next step shows how many of its tokens were
verified, so a draft the scheduler dropped or cut (the request finished, the
step's token budget) counts only as far as it was used.  Its accepted length
is read off the tokens the engine emitted: the longest common prefix of the
scheduled draft and the emitted tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

POOLS = ("request", "cross", "anchor")  # Draft.source values


@dataclass
class PoolCounts:
    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class DrafterMetrics:
    log_interval: float = 10.0
    steps: int = 0                 # propose calls
    steps_before_ready: int = 0    # of them, while the kernels were compiling (no drafts)
    request_steps: int = 0         # requests asked for a draft
    seconds: float = 0.0           # time inside propose
    failures: int = 0
    finished: int = 0              # requests committed to the cross pool
    finished_before_ready: int = 0  # of them, requests that finished while the kernels compiled
    step_cost: object = None       # the drafter's StepCostEstimator, when it measures
    pools: dict[str, PoolCounts] = field(default_factory=lambda: {p: PoolCounts() for p in POOLS})
    _last_log: float = field(default_factory=time.monotonic)

    def emitted(self, request, tokens: np.ndarray, scheduled: int) -> None:
        """The engine verified ``scheduled`` tokens of the draft it was handed for
        ``request`` (its ``draft``, from pool ``source``) and emitted ``tokens``."""
        draft, request.draft = request.draft, None
        if draft is None or scheduled <= 0:
            return
        draft = draft[:scheduled]
        counts = self.pools[request.source]
        counts.drafts += 1
        counts.drafted_tokens += int(draft.shape[0])
        k = min(draft.shape[0], tokens.shape[0])
        differs = draft[:k] != tokens[:k]
        counts.accepted_tokens += int(differs.argmax()) if differs.any() else k

    def as_dict(self) -> dict:
        return {"steps": self.steps, "steps_before_ready": self.steps_before_ready,
                "request_steps": self.request_steps,
                "seconds": self.seconds, "failures": self.failures, "finished": self.finished,
                "finished_before_ready": self.finished_before_ready,
                **{f"{p}_{k}": v for p, c in self.pools.items() for k, v in vars(c).items()}}

    def maybe_log(self, logger: logging.Logger) -> None:
        if self.log_interval <= 0:
            return
        now = time.monotonic()
        if now - self._last_log < self.log_interval:
            return
        self._last_log = now
        logger.info("suffixspec metrics: %s", self.summary())

    def summary(self) -> str:
        asked = max(self.request_steps, 1)
        drafting = self.steps - self.steps_before_ready
        parts = [f"{self.request_steps} draft requests in {drafting} steps, "
                 f"{1e6 * self.seconds / max(drafting, 1):.0f} us/step"]
        if self.steps_before_ready:
            parts.append(f"{self.steps_before_ready} steps without drafts while compiling")
        for name, c in self.pools.items():
            rate = 100.0 * c.accepted_tokens / max(c.drafted_tokens, 1)
            parts.append(f"{name} pool: hit {100.0 * c.drafts / asked:.1f}%, accepted "
                         f"{c.accepted_tokens}/{c.drafted_tokens} drafted tokens ({rate:.1f}%)")
        if self.step_cost is not None:
            cost = self.step_cost.estimate()
            parts.append(f"measured step {1e3 * cost.fixed:.1f} ms + {1e3 * cost.per_token:.2f} "
                         f"ms/token over {self.step_cost.steps} decode steps, draft cost "
                         f"{cost.draft_cost(1):.3f} for one request")
        parts.append(f"finished {self.finished}, failures {self.failures}")
        return "; ".join(parts)
