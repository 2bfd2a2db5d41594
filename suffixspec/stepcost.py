"""What a target-model step costs, and what one more drafted token costs it.

An engine step that verifies ``n`` tokens (one per request, plus every drafted
token) takes about ``fixed + per_token * n`` seconds.  Drafting one more token
for one request adds ``per_token`` to a step that all ``b`` requests of the
batch wait for, so it raises the batch's emitted tokens per second exactly
when its probability of being accepted beats::

    per_token * emitted_per_step_of_the_batch / step_seconds

The length rule (``calibration.threshold``) prices a drafted token at
``cost * e / (1 + cost * d)`` with ``e`` and ``d`` the emitted and drafted
tokens per request-step; with ``cost = per_token * b / (fixed + per_token *
b)`` (``StepCost.draft_cost``) that is this goodput bar for the whole batch.
At ``b = 1`` the cost is the share of a one-token step that a drafted token
adds, the meaning ``draft_cost`` always had.

``StepCostEstimator`` learns ``fixed`` and ``per_token`` online from an
engine's step timings: a least-squares fit whose older steps weigh less
(half-life ``half_life`` steps), with the prior given as pseudo-steps so a
fresh estimator answers with the prior until enough steps disagree with it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepCost:
    """Step time ``fixed + per_token * tokens`` (seconds, or any unit)."""

    fixed: float
    per_token: float

    def __post_init__(self):
        if not (self.fixed > 0 and self.per_token >= 0 and math.isfinite(self.fixed)
                and math.isfinite(self.per_token)):
            raise ValueError(f"a step cost needs fixed > 0 and per_token >= 0, got "
                             f"{self.fixed}, {self.per_token}")

    @classmethod
    def parse(cls, text: str) -> StepCost:
        """``"FIXED,PER_TOKEN"``, e.g. ``"1,0.1"``."""
        try:
            fixed, per_token = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(f"step cost {text!r}: expected FIXED,PER_TOKEN, e.g. 1,0.1") from None
        return cls(fixed, per_token)

    @classmethod
    def from_draft_cost(cls, draft_cost: float) -> StepCost:
        """The step whose one drafted token costs ``draft_cost`` of a one-token step."""
        return cls(1.0 - draft_cost, draft_cost)

    def seconds(self, tokens: float) -> float:
        return self.fixed + self.per_token * tokens

    def draft_cost(self, batch: int = 1, drafted: float = 0.0) -> float:
        """The length rule's cost for a batch of ``batch`` requests (see the module;
        ``drafted``, what each drafts now, plays no part in a linear step)."""
        load = self.per_token * max(batch, 1)
        return load / (self.fixed + load)


class StepCostEstimator:
    """Online fit of ``StepCost`` from ``observe(tokens, seconds)`` per engine step."""

    def __init__(self, prior: StepCost, prior_steps: float = 50.0, half_life: float = 2000.0,
                 prior_tokens: float = 1.0):
        if prior_steps <= 0 or half_life <= 0:
            raise ValueError("prior_steps and half_life must be positive")
        self.prior = prior
        self.decay = 0.5 ** (1.0 / half_life)
        self.steps = 0
        # Weighted sums: weight, tokens, seconds, tokens², tokens × seconds.
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        # The prior as pseudo-steps at two loads, so it pins both coefficients.
        for x in (prior_tokens, prior_tokens + 16.0):
            self._add(x, prior.seconds(x), prior_steps / 2)
        self._scale = None  # seconds of the first observed step: the prior's unit
        self.recent: deque[tuple[int, float]] = deque(maxlen=4096)  # (tokens, seconds)

    def _add(self, x: float, y: float, w: float = 1.0) -> None:
        self._w += w
        self._x += w * x
        self._y += w * y
        self._xx += w * x * x
        self._xy += w * x * y

    def observe(self, tokens: int, seconds: float) -> None:
        """One engine step that verified ``tokens`` tokens in ``seconds``."""
        if not (seconds > 0 and math.isfinite(seconds)) or tokens <= 0:
            return
        if self._scale is None:
            # The prior is unit-free (a share of a step): put it in this engine's seconds.
            self._scale = seconds / self.prior.seconds(tokens)
            for name in ("_y", "_xy"):
                setattr(self, name, getattr(self, name) * self._scale)
        d = self.decay
        self._w *= d
        self._x *= d
        self._y *= d
        self._xx *= d
        self._xy *= d
        self._add(float(tokens), float(seconds))
        self.steps += 1
        self.recent.append((int(tokens), float(seconds)))

    def estimate(self) -> StepCost:
        """The current fit (the prior, in the engine's unit once a step was seen)."""
        var = self._w * self._xx - self._x * self._x
        if var <= 0:
            return self.prior
        per_token = (self._w * self._xy - self._x * self._y) / var
        fixed = (self._y - per_token * self._x) / self._w
        scale = self._scale or 1.0
        per_token = max(per_token, 0.0)
        if fixed <= 0:  # more than the data can say: keep the prior's shape
            fixed = self.prior.fixed * scale
        return StepCost(fixed, per_token)

    def draft_cost(self, batch: int = 1, drafted: float = 0.0) -> float:
        return self.estimate().draft_cost(batch)


@dataclass(frozen=True)
class Roofline:
    """A GPU step: flat while memory-bound, then growing per verified token.

    ``seconds(n) = max(flat, per_token * n)``: a decode step reads the
    weights once whatever it verifies, so it costs ``flat`` until ``n``
    tokens make it compute-bound (``ridge = flat / per_token``); past that,
    each token adds ``per_token``.  ``host`` is added to every step (host work
    on the critical path).  See ``H100_8B``.
    """

    flat: float
    per_token: float
    host: float = 0.0

    def __post_init__(self):
        if not (self.flat > 0 and self.per_token > 0 and self.host >= 0):
            raise ValueError("a roofline needs flat > 0, per_token > 0 and host >= 0")

    @property
    def ridge(self) -> float:
        return self.flat / self.per_token

    def seconds(self, tokens: float) -> float:
        return max(self.flat, self.per_token * tokens) + self.host

    def admit(self, batch: int, probs: np.ndarray) -> int:
        """How many drafted tokens a step of ``batch`` requests should verify, the
        candidates' acceptance probabilities ``probs`` sorted high to low: the
        count that maximises expected emitted tokens per second.  A knee is
        what a per-request length rule cannot price (below it a token is free,
        past it not), so a proposer with this step cost fits the whole batch."""
        expected = batch + np.concatenate([[0.0], np.cumsum(probs, dtype=np.float64)])
        tokens = batch + np.arange(expected.shape[0], dtype=np.float64)
        seconds = np.maximum(self.flat, self.per_token * tokens) + self.host
        return int(np.argmax(expected / seconds))


#: An 8B model (bf16, about 16 GB of weights) on one H100 SXM: a batch-1 decode
#: step of 6.5 ms (about 154 tokens/s, what published vLLM and TensorRT-LLM
#: single-stream runs of Llama-3-8B report on an H100), and 0.027 ms per
#: verified token once compute-bound (2 x 8e9 FLOPs per token at about 600
#: TFLOP/s, 60% of the card's 990 dense bf16 TFLOP/s), so the ridge is at
#: about 240 tokens.  Seconds.
H100_8B = Roofline(flat=6.5e-3, per_token=2.7e-5)
