"""What the V1 runner's drafter does each step (vLLM <= 0.33).

``DraftService`` follows the requests an engine runs, one ``Tracked`` record
each, and drafts for them with one ``SuffixProposer``.  Each step the
drafter (``v1_runner.drafter``) hands it a ``Step``: per decoding request its id, its token count, how many
draft tokens the engine verified for it, and how to read its tokens.  The
service catches every request up (a request seen for the first time, or
whose tokens were taken back, starts over from its tokens, which also covers
a request resumed after preemption), then drafts for all of them in one
native call.

Until the kernels are ready (an empty Numba cache compiles in the background,
``suffixspec.kernels.BackgroundStart``) there is no proposer and steps get no
draft; what requests emit meanwhile is kept in their records, and those that
finish join the cross-request pool once the proposer exists.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from suffixspec.config import DEFAULT_DRAFT_COST
from suffixspec.integrations.vllm.metrics import DrafterMetrics
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.native.calibration import ST_COST
from suffixspec.stepcost import StepCost, StepCostEstimator

logger = logging.getLogger("vllm.suffixspec")

#: Most tokens (prompts and outputs) kept while the kernels compile; requests
#: beyond it are not kept for the pool.
EARLY_TOKENS = 1 << 22
#: The key of a request's ``vllm_xargs`` (``SamplingParams.extra_args``) that
#: names its namespace (one of ``Settings.request_namespaces``).
NAMESPACE_ARG = "suffixspec_namespace"


@dataclass
class Tracked:
    """What the drafter knows of one request the engine runs."""

    indexed: int                   # its tokens (prompt, output) the drafter holds
    prompt_len: int
    draft: np.ndarray | None = None  # the draft handed to the engine for its next step
    probs: np.ndarray | None = None  # its tokens' calibrated probabilities
    source: str = ""               # the pool ``draft`` came from
    early: list[np.ndarray] | None = None  # its tokens, kept while there is no proposer
    namespace: str | None = None   # the namespace it named (None: the server's)


@dataclass
class Step:
    """One engine step's decoding requests, as a runner adapter sees them.

    ``tokens(i, lo, hi)`` is request ``i``'s tokens ``lo:hi`` (its prompt
    first); ``verified[i]`` how many tokens of its last draft the engine
    verified this step; ``end(i, have, tokens)`` where its output ends if it
    ends within ``tokens`` (which start at position ``have``), None if not.
    ``decode_only``: no request of the step was prefilling (only such steps
    time the model's decode step).  ``named(i)``: what request ``i`` named as
    its namespace (``NAMESPACE_ARG``; None: nothing), read when it starts.
    """

    req_ids: Sequence[str]
    totals: np.ndarray
    prompt_lens: np.ndarray
    verified: np.ndarray
    tokens: Callable[[int, int, int], np.ndarray]
    end: Callable[[int, int, np.ndarray], int | None] = lambda i, have, tokens: None
    decode_only: bool = True
    named: Callable[[int], object] = lambda i: None


class DraftService:
    """Drafts for an engine's requests; see the module docstring.

    ``k`` caps every draft, ``max_model_len`` the tokens a request may hold,
    ``vocab_size`` the token ids a draft may hold (a shared pool may know
    others).  ``measured``: learn the draft cost from step times.  ``ranks``:
    tensor-parallel ranks that verify these drafts (only the log says it).
    """

    def __init__(self, k: int, max_model_len: int, vocab_size: int, settings: Settings,
                 measured: bool, ranks: int = 1):
        self.k = k
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.settings = settings
        self.measured = measured
        self.ranks = ranks
        self.requests: dict[str, Tracked] = {}
        self.finished_early: list[Tracked] = []  # finished before the proposer existed
        self.early_tokens = 0
        self.handed_over = False  # the early records went to the proposer
        self.metrics = DrafterMetrics(settings.log_interval)
        self.proposer = None
        self.step_cost = None
        self._step_end = None  # when the last step's drafts were handed over
        self._warned = False
        self.allowed_namespaces = settings.allowed_namespaces()
        self._refused_names: set = set()  # names refused so far (each logged once)

    # ------------------------------------------------------------ lifecycle
    def ready(self, proposer) -> None:
        """The kernels are ready: draft with ``proposer`` from the next step on."""
        if self.measured:
            self.step_cost = StepCostEstimator(StepCost.from_draft_cost(DEFAULT_DRAFT_COST))
            proposer.step_cost = self.step_cost
        self.metrics.step_cost = self.step_cost
        proposer.vocab_size = self.vocab_size
        cost = (f"draft cost measured from step times (prior {DEFAULT_DRAFT_COST})"
                if self.measured else f"draft cost {proposer.config.draft_cost:.3f}")
        extra = "".join([f", spec factor {proposer.max_spec_factor:.2f}"
                         if proposer.max_spec_factor >= 0 else "",
                         f", min token prob {proposer.min_token_prob:.2f}"
                         if proposer.min_token_prob > 0 else ""])
        pool = self.settings.pool or ("in memory" if proposer.cross is not None else "off")
        ranks = f", drafting for {self.ranks} ranks" if self.ranks > 1 else ""
        logger.info("suffixspec drafter: up to %d tokens, depth %d, %s%s, cross-request pool "
                    "%s%s", self.k, proposer.max_depth, cost, extra, pool, ranks)
        self.proposer = proposer  # last: a step sees a proposer only once it is complete

    def removed(self, req_id: str) -> None:
        """The engine dropped ``req_id`` (finished or aborted, never preempted):
        its output joins the cross-request pool."""
        rec = self.requests.pop(req_id, None)
        if rec is None:
            return
        if not self.handed_over:  # the proposer, if any, has not seen it yet
            if rec.early is not None:
                self.finished_early.append(rec)
            return
        try:
            self.proposer.finish_request(req_id)
            self.metrics.finished += 1
        except Exception as exc:
            self.failed(exc, [])

    def close(self) -> None:
        """Engine shutdown: what in-flight requests emitted is genuine model
        output, so it joins the pool like finished requests; the calibration
        is kept and the pool closed."""
        if self.proposer is not None:
            if not self.handed_over:  # what ran while compiling joins the pool too
                self.finished_early += [r for r in self.requests.values() if r.early is not None]
                self._hand_over()
            for req_id in list(self.requests):
                self.removed(req_id)
            try:
                self.proposer.close()
            except Exception as exc:
                self.failed(exc, [])
        logger.info("suffixspec metrics at shutdown: %s", self.metrics.summary())

    # -------------------------------------------------------------- per step
    def step(self, step: Step, k: int, budget: int) -> list[np.ndarray | None]:
        """Catch every request of ``step`` up and draft for it: at most ``k``
        tokens each, ``budget`` in all (the step's token budget); None for a
        request that gets no draft."""
        start = time.perf_counter()
        n = len(step.req_ids)
        drafts: list[np.ndarray | None] = [None] * n
        if self.proposer is None:
            self.metrics.steps_before_ready += 1
            self._keep_early(step)
        else:
            if not self.handed_over:
                self._hand_over()
            if self.step_cost is not None:
                self._time_step(start, step)
            try:
                self._draft(step, min(k, self.k), budget, drafts)
            except Exception as exc:  # a drafting bug must never stop the engine
                self.failed(exc, step.req_ids)
                drafts = [None] * n
            self._step_end = time.perf_counter()
            self.metrics.seconds += self._step_end - start
        self.metrics.steps += 1
        self.metrics.maybe_log(logger)
        return drafts

    def namespace(self, named) -> str | None:
        """The namespace of a request that named ``named``: it, where
        ``Settings.request_namespaces`` lists it; else None (the server's),
        and a name refused is logged once (at most 64 names)."""
        if named is None:
            return None
        if isinstance(named, str) and named in self.allowed_namespaces:
            return named
        key = repr(named)[:100]
        if key not in self._refused_names and len(self._refused_names) < 64:
            self._refused_names.add(key)
            logger.warning("suffixspec: a request names namespace %s (vllm_xargs %r), which "
                           "SUFFIXSPEC_REQUEST_NAMESPACES does not list (%s); it joins and "
                           "drafts from the server's namespace %r", key, NAMESPACE_ARG,
                           ", ".join(sorted(self.allowed_namespaces)) or "empty",
                           self.settings.namespace)
        return None

    def _catch_up(self, step: Step, i: int) -> tuple[Tracked, np.ndarray, bool]:
        """Request ``i``'s record, its tokens since the last step, and whether it starts over
        (seen for the first time, or tokens were taken back)."""
        req = step.req_ids[i]
        total = int(step.totals[i])
        rec = self.requests.get(req)
        fresh = rec is None or rec.indexed > total
        if fresh:
            prompt_len = int(step.prompt_lens[i])
            rec = self.requests[req] = Tracked(indexed=prompt_len, prompt_len=prompt_len,
                                               namespace=self.namespace(step.named(i)))
        tokens = step.tokens(i, rec.indexed, total) if total > rec.indexed else _NONE
        return rec, tokens, fresh

    def _draft(self, step: Step, k: int, budget: int, drafts: list) -> None:
        prop = self.proposer
        grown_ids, grown = [], []
        rows, ids, limits = [], [], []
        for i, req in enumerate(step.req_ids):
            known = self.requests.get(req)
            rec, tokens, fresh = self._catch_up(step, i)
            if fresh:
                if known is not None:
                    prop.abort_request(req)
                prop.start_request(req, step.tokens(i, 0, rec.prompt_len),
                                   namespace=rec.namespace)
            have, rec.indexed = rec.indexed, rec.indexed + tokens.shape[0]
            if tokens.shape[0]:
                self.metrics.emitted(rec, tokens, int(step.verified[i]))
                grown_ids.append(req)
                end = step.end(i, have, tokens)
                if end is not None:
                    # The request ends in this step.  What the last accepted
                    # draft ran past the end is never output: it is left out,
                    # so the request's trie holds exactly its prompt and
                    # output (a next turn can continue it).  No draft.
                    grown.append(tokens[:max(end - have, 0)])
                    continue
                grown.append(tokens)
            room = min(k, self.max_model_len - rec.indexed - 1)
            if room > 0:
                rows.append(i)
                ids.append(req)
                limits.append(room)
        prop.extend_batch(grown_ids, grown)
        if not ids:
            return
        self.metrics.request_steps += len(ids)
        for i, req, draft in zip(rows, ids, prop.propose(ids, np.asarray(limits, np.int64))):
            tokens = draft.token_ids[:max(budget, 0)]
            if tokens.shape[0]:
                budget -= tokens.shape[0]
                drafts[i] = tokens
                rec = self.requests[req]
                rec.draft, rec.source = tokens, draft.source
                rec.probs = draft.probs[:tokens.shape[0]]

    def _keep_early(self, step: Step) -> None:
        """A step without a proposer: keep what each request emitted, within ``EARLY_TOKENS``."""
        for i, req in enumerate(step.req_ids):
            known = self.requests.get(req)
            rec, tokens, fresh = self._catch_up(step, i)
            if fresh:
                if known is not None and known.early is not None:
                    self.early_tokens -= sum(t.shape[0] for t in known.early)
                if self.early_tokens + int(step.totals[i]) > EARLY_TOKENS:
                    rec.early = None
                else:
                    rec.early = [step.tokens(i, 0, rec.prompt_len).copy()]
                    self.early_tokens += rec.prompt_len
            rec.indexed += tokens.shape[0]
            if rec.early is not None and tokens.shape[0]:
                rec.early.append(tokens.copy())
                self.early_tokens += tokens.shape[0]

    def _hand_over(self) -> None:
        """The first step with a proposer: requests that finished while the kernels
        compiled join the pools, as if it had seen them finish; those still
        running start over from their tokens at this step."""
        done, self.finished_early = self.finished_early, []
        self.requests.clear()
        self.early_tokens = 0
        self.handed_over = True
        prop = self.proposer
        try:
            for n, rec in enumerate(done):
                req = f"early-{n}"
                prop.start_request(req, rec.early[0], namespace=rec.namespace)
                output = np.concatenate(rec.early[1:]) if len(rec.early) > 1 else _NONE
                if output.shape[0]:
                    prop.extend(req, output)
                prop.finish_request(req)
        except Exception as exc:
            self.failed(exc, [])
            return
        self.metrics.finished += len(done)
        self.metrics.finished_before_ready = len(done)
        if done:
            logger.info("suffixspec: %d requests that finished while the kernels compiled "
                        "joined the cross-request pool", len(done))

    def _time_step(self, now: float, step: Step) -> None:
        """Feed the step that just ran to the cost estimator: the time since the
        last drafts were handed over, against the tokens the step verified
        (one per request plus its scheduled draft).  Only steps where every
        request was decoding and known count: prefill chunks cost differently."""
        if self._step_end is None or not step.decode_only or not len(step.req_ids):
            return
        if any(req not in self.requests for req in step.req_ids):
            return
        self.step_cost.observe(len(step.req_ids) + int(np.sum(step.verified)),
                               now - self._step_end)

    def last_probs(self, req_id: str) -> np.ndarray:
        """The calibrated probabilities of the draft last handed out for ``req_id``."""
        rec = self.requests.get(req_id)
        return _NO_PROBS if rec is None or rec.probs is None else rec.probs

    # ------------------------------------------------------------- failures
    def failed(self, exc: Exception, req_ids) -> None:
        """Log the first failure with its cause; the affected requests start over."""
        self.metrics.failures += 1
        if not self._warned:
            self._warned = True
            logger.warning("suffixspec: drafting failed, the affected requests get no draft "
                           "this step and are indexed again from their tokens next step; "
                           "later failures are only counted in the metrics line: %r", exc,
                           exc_info=exc)
        for req in list(req_ids):
            if self.requests.pop(req, None) is None:
                continue
            try:
                self.proposer.abort_request(req)
            except Exception:
                pass  # state for req is gone either way; it restarts next step

    def stats(self) -> dict:
        """Counters for tests and tools: steps, per-pool drafts and acceptance."""
        out = self.metrics.as_dict()
        out["active_requests"] = len(self.requests)
        if self.proposer is None:
            return out
        cross = self.proposer.cross
        out["cross_tokens"] = 0 if cross is None else int(cross.tokens)
        out["draft_cost"] = float(self.proposer.stats.state[ST_COST])  # last step's, its batch's
        if self.step_cost is not None:
            cost = self.step_cost.estimate()
            out["step_fixed_seconds"], out["step_token_seconds"] = cost.fixed, cost.per_token
            out["step_cost_steps"] = self.step_cost.steps
        out["reused_prompt_tokens"] = self.proposer.reused_tokens
        return out


_NONE = np.empty(0, np.int32)
_NO_PROBS = np.empty(0, np.float32)


