"""Proposers the replay can drive, all behind the ``Proposer`` protocol.

``suffixspec`` is ours; ``suffixspec-device`` drafts as ``suffixspec.device``
does on a GPU (windows one step old; needs torch); ``arctic`` runs arctic-inference's SuffixDecodingCache
with the same knobs; ``vllm-gpu`` drafts as vLLM's own GPU suffix drafter
(``native.vllm_suffix``); ``ngram`` is prompt lookup; ``oracle`` drafts the
recorded output itself (the ceiling).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from suffixspec.config import ARCTIC_MIN_TOKEN_PROB, ARCTIC_SPEC_FACTOR
from suffixspec.draft import Draft
from suffixspec.native import vllm_suffix as gpu
from suffixspec.native.ngram import ngram_propose
from suffixspec.proposer import SuffixProposer
from suffixspec.stepcost import H100_8B, Roofline
from suffixspec.tokens import as_token_ids

ENGINES = ("suffixspec", "suffixspec-device", "arctic", "vllm-gpu", "ngram", "oracle")


class _Contexts:
    """Growing per-request token buffers, for proposers that need the context."""

    def __init__(self):
        self.buf: dict[Hashable, np.ndarray] = {}
        self.len: dict[Hashable, int] = {}

    def start(self, req_id, tokens: np.ndarray) -> None:
        buf = np.empty(max(2 * tokens.shape[0], 256), np.int32)
        buf[: tokens.shape[0]] = tokens
        self.buf[req_id] = buf
        self.len[req_id] = tokens.shape[0]

    def extend(self, req_id, tokens: np.ndarray) -> None:
        n = self.len[req_id]
        buf = self.buf[req_id]
        if n + tokens.shape[0] > buf.shape[0]:
            new = np.empty(2 * (n + tokens.shape[0]), np.int32)
            new[:n] = buf[:n]
            self.buf[req_id] = buf = new
        buf[n:n + tokens.shape[0]] = tokens
        self.len[req_id] = n + tokens.shape[0]

    def tail(self, req_id, k: int) -> np.ndarray:
        n = self.len[req_id]
        return self.buf[req_id][max(0, n - k):n]

    def drop(self, req_id) -> None:
        del self.buf[req_id], self.len[req_id]


def _limits(max_spec_tokens, b: int, default: int) -> list[int]:
    if max_spec_tokens is None:
        return [default] * b
    if np.isscalar(max_spec_tokens):
        return [min(int(max_spec_tokens), default)] * b
    return [min(int(k), default) for k in max_spec_tokens]


def _path(tokens: np.ndarray, probs=None, score=None) -> Draft:
    n = tokens.shape[0]
    probs = np.ones(n, np.float32) if probs is None else probs
    return Draft(tokens, np.arange(-1, n - 1, dtype=np.int32), probs,
                 float(probs.sum()) if score is None else score)


class ArcticProposer:
    """arctic-inference's SuffixDecodingCache behind the proposer protocol."""

    def __init__(self, max_depth: int = 64, max_spec_tokens: int = 16,
                 max_spec_factor: float = ARCTIC_SPEC_FACTOR, max_spec_offset: float = 0.0,
                 min_token_prob: float = ARCTIC_MIN_TOKEN_PROB, tree: bool = False,
                 max_cached_requests: int = -1):
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                "the arctic engine needs arctic-inference; see bench/setup_arctic.sh") from e
        self.cache = SuffixDecodingCache(max_tree_depth=max_depth,
                                         max_cached_requests=max_cached_requests)
        self.max_depth = max_depth
        self.max_spec_tokens = max_spec_tokens
        self.knobs = (max_spec_factor, max_spec_offset, min_token_prob, tree)
        self.ctx = _Contexts()
        self._global_tokens = 0

    def start_request(self, req_id, prompt_token_ids) -> None:
        prompt = as_token_ids(prompt_token_ids)
        self.cache.start_request(req_id, prompt)
        self.ctx.start(req_id, prompt)

    def extend(self, req_id, token_ids) -> None:
        tokens = as_token_ids(token_ids)
        self.cache.add_active_response(req_id, tokens)
        self.ctx.extend(req_id, tokens)
        self._global_tokens += tokens.shape[0]

    def propose(self, req_ids: Sequence[Hashable], max_spec_tokens=None) -> list[Draft]:
        factor, offset, min_prob, tree = self.knobs
        out = []
        for req_id, k in zip(req_ids, _limits(max_spec_tokens, len(req_ids), self.max_spec_tokens)):
            d = self.cache.speculate(req_id, self.ctx.tail(req_id, self.max_depth), k,
                                     factor, offset, min_prob, tree)
            out.append(Draft(np.asarray(d.token_ids, np.int32), np.asarray(d.parents, np.int32),
                             np.asarray(d.probs, np.float32), d.score, d.match_len,
                             "arctic" if d.token_ids else ""))
        return out

    def finish_request(self, req_id) -> None:
        self.cache.stop_request(req_id)
        self.ctx.drop(req_id)

    def abort_request(self, req_id) -> None:
        self.cache.stop_request(req_id)
        if req_id in self.cache.cached_requests:
            self.cache.evict_cached_response(req_id)
        self.ctx.drop(req_id)

    def index_memory(self) -> tuple[int, int]:
        """(bytes, indexed tokens) of the cross-request tree.

        Exact while nothing was evicted or aborted (the replay does neither).
        """
        return self.cache._global_tree.estimate_memory(), self._global_tokens


class NgramProposer:
    """Prompt lookup over the request's own context (vLLM's ``ngram`` method)."""

    def __init__(self, max_spec_tokens: int = 16, n_min: int = 2, n_max: int = 5):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
        self.max_spec_tokens = max_spec_tokens
        self.n_min, self.n_max = n_min, n_max
        self.ctx = _Contexts()
        self._lps = np.empty(n_max, np.int32)
        self._out = np.empty(max(max_spec_tokens, 1), np.int32)

    def start_request(self, req_id, prompt_token_ids) -> None:
        self.ctx.start(req_id, as_token_ids(prompt_token_ids))

    def extend(self, req_id, token_ids) -> None:
        self.ctx.extend(req_id, as_token_ids(token_ids))

    def propose(self, req_ids, max_spec_tokens=None) -> list[Draft]:
        out = []
        for req_id, k in zip(req_ids, _limits(max_spec_tokens, len(req_ids), self.max_spec_tokens)):
            n = ngram_propose(self.ctx.buf[req_id], self.ctx.len[req_id], self.n_min,
                              self.n_max, k, self._lps, self._out)
            out.append(_path(self._out[:n].copy()))
        return out

    def finish_request(self, req_id) -> None:
        self.ctx.drop(req_id)

    abort_request = finish_request


class VllmGpuProposer:
    """vLLM's GPU suffix drafter (Model Runner V2, ``method: "suffix"``), as
    ``native.vllm_suffix`` models it, behind the proposer protocol.

    Every draft is ``max_spec_tokens`` long (slots past the valid tokens hold
    the last token; vLLM verifies them all).  ``corpus_tokens`` is its ring of
    finished responses (vLLM's ``suffix_decoding_corpus_tokens``, 1M by
    default; 0: none), ``max_depth`` its ``suffix_decoding_max_tree_depth``
    (24 by default).

    ``adaptive``: vLLM's adaptive verification.  Each slot gets a confidence
    from acceptance counted per (source, match-length bucket, position)
    (halved every 1,024 steps); a step's batch admits the number of slots
    that maximises expected accepted tokens per second under ``step_cost``
    (a ``Roofline``), judged on each request's previous draft's confidences
    (vLLM reads them one step late), and gives them to the slots of the
    highest survival (running product of confidences) of this step's drafts.
    """

    HALF_LIFE = 1024

    def __init__(self, max_spec_tokens: int = 16, max_depth: int = 24,
                 corpus_tokens: int = 1 << 20, adaptive: bool = False,
                 step_cost: Roofline = H100_8B):
        self.max_spec_tokens = self.k = max(int(max_spec_tokens), 1)
        self.depth = int(max_depth)
        self.adaptive = adaptive
        self.step_cost = step_cost
        self.corpus = np.full(max(corpus_tokens, 0), -1, np.int32)
        self.table = np.full((2, gpu.buckets_for(corpus_tokens) if corpus_tokens else 1,
                              gpu.SLOTS), -1, np.int64)
        self.head = np.zeros(2, np.int64)  # next write offset, documents so far
        self.ctx = _Contexts()
        self.prompt_len: dict[Hashable, int] = {}
        self.stats = np.zeros((2 * gpu.LEN_BUCKETS, self.k, 2), np.int64)
        self.steps = 0
        self.last: dict[Hashable, tuple[int, int, int]] = {}  # (bucket, valid, verified)
        self.stale: dict[Hashable, np.ndarray] = {}  # the previous draft's confidences
        self._out = np.empty(self.k, np.int32)

    def start_request(self, req_id, prompt_token_ids) -> None:
        prompt = as_token_ids(prompt_token_ids)
        self.ctx.start(req_id, prompt)
        self.prompt_len[req_id] = prompt.shape[0]
        self.stale[req_id] = np.ones(self.k, np.float32)

    def extend(self, req_id, token_ids) -> None:
        tokens = as_token_ids(token_ids)
        last = self.last.pop(req_id, None)
        if last is not None and tokens.shape[0]:
            bucket, valid, verified = last
            gpu.observe(self.stats, bucket, valid, verified, min(tokens.shape[0] - 1, verified))
        self.ctx.extend(req_id, tokens)

    def propose(self, req_ids: Sequence[Hashable], max_spec_tokens=None) -> list[Draft]:
        limits = _limits(max_spec_tokens, len(req_ids), self.k)
        drafts, confs, stale = [], [], []
        for req_id in req_ids:
            n = self.ctx.len[req_id]
            valid, length, source = gpu.propose(self.ctx.buf[req_id], n, self.corpus,
                                                self.table, self.depth, self.k, self._out)
            drafts.append((self._out.copy(), valid, length, source))
            if self.adaptive:
                conf = np.empty(self.k, np.float32)
                bucket = gpu.confidences(self.stats, valid, length, source, conf)
                confs.append((conf, bucket if valid > 0 else -1))
                stale.append(self.stale[req_id])
        admitted = (self._admit([c for c, _ in confs], stale, limits) if self.adaptive
                    else limits)
        out = []
        for i, (req_id, (tokens, valid, length, source)) in enumerate(zip(req_ids, drafts)):
            m = int(admitted[i])
            if self.adaptive:
                conf, bucket = confs[i]
                self.last[req_id] = (bucket, valid, m)
                self.stale[req_id] = conf
            d = tokens[:m]
            out.append(Draft(d, np.arange(-1, m - 1, dtype=np.int32), np.ones(m, np.float32),
                             float(min(valid, m)), length, ("request", "cross")[source])
                       if m else Draft(match_len=length))
        self.steps += 1
        if self.adaptive and self.steps % self.HALF_LIFE == 0:
            self.stats >>= 1
        return out

    def _admit(self, confs: list[np.ndarray], stale: list[np.ndarray],
               limits: list[int]) -> list[int]:
        """Slots admitted per request: the batch's budget from the previous
        confidences, given to this step's most likely slots."""
        b = len(confs)
        cap = np.asarray(limits)
        slots = np.arange(self.k)
        past = np.cumprod(np.asarray(stale, np.float64), axis=1)
        scores = np.sort(past[slots[None, :] < cap[:, None]])[::-1]
        budget = self.step_cost.admit(b, scores)
        if budget >= int(cap.sum()):
            return list(cap)
        now = np.cumprod(np.asarray(confs, np.float64), axis=1)
        now[slots[None, :] >= cap[:, None]] = -np.inf
        winners = np.argsort(-now, axis=None, kind="stable")[:budget]
        return list(np.bincount(winners // self.k, minlength=b))

    def finish_request(self, req_id) -> None:
        if self.corpus.shape[0]:
            start = max(self.prompt_len[req_id] - gpu.PROMPT_CONTEXT, 0)
            gpu.ingest(self.corpus, self.table, self.head, self.ctx.buf[req_id], start,
                       self.ctx.len[req_id])
        self.abort_request(req_id)

    def abort_request(self, req_id) -> None:
        self.ctx.drop(req_id)
        for d in (self.prompt_len, self.last, self.stale):
            d.pop(req_id, None)

    def index_memory(self) -> tuple[int, int]:
        """(bytes, corpus tokens) of the corpus and its tables."""
        used = int(self.head[0]) if self.head[1] else 0
        return self.corpus.nbytes + self.table.nbytes, used


class OracleProposer:
    """Drafts the recorded continuation: the most any proposer could accept."""

    def __init__(self, outputs: dict[Hashable, np.ndarray], max_spec_tokens: int = 16):
        self.outputs = outputs
        self.max_spec_tokens = max_spec_tokens
        self.pos: dict[Hashable, int] = {}

    def start_request(self, req_id, prompt_token_ids) -> None:
        self.pos[req_id] = 0

    def extend(self, req_id, token_ids) -> None:
        self.pos[req_id] += len(token_ids)

    def propose(self, req_ids, max_spec_tokens=None) -> list[Draft]:
        out = []
        for req_id, k in zip(req_ids, _limits(max_spec_tokens, len(req_ids), self.max_spec_tokens)):
            p = self.pos[req_id]
            out.append(_path(self.outputs[req_id][p:p + k].copy()))
        return out

    def finish_request(self, req_id) -> None:
        del self.pos[req_id]

    abort_request = finish_request


def make_proposer(engine: str, requests=None, max_depth: int = 64, max_spec_tokens: int = 16,
                  max_spec_factor: float | None = None, max_spec_offset: float = 0.0,
                  min_token_prob: float | None = None, tree: bool = False, ngram_min: int = 2,
                  ngram_max: int = 5, adaptive: bool = False,
                  corpus_tokens: int = 1 << 20, step_cost=H100_8B, **suffixspec_options):
    """Build the proposer named ``engine`` with the shared knobs.

    Unset ``max_spec_factor`` and ``min_token_prob`` take each engine's own
    defaults (arctic's: ``config.ARCTIC_*``; suffixspec: see ``ProposerConfig``).
    ``vllm-gpu`` takes ``max_depth`` (vLLM's default is 24), ``corpus_tokens``,
    ``adaptive`` and ``step_cost`` (what adaptive verification weighs).
    """
    if engine == "suffixspec":
        return SuffixProposer(max_depth=max_depth, max_spec_tokens=max_spec_tokens,
                              max_spec_factor=max_spec_factor, max_spec_offset=max_spec_offset,
                              min_token_prob=min_token_prob, tree=tree, **suffixspec_options)
    if engine == "suffixspec-device":
        from suffixspec.device.replay import DeviceWindowsProposer

        return DeviceWindowsProposer(max_depth=max_depth, max_spec_tokens=max_spec_tokens,
                                     max_spec_factor=max_spec_factor,
                                     max_spec_offset=max_spec_offset,
                                     min_token_prob=min_token_prob, corpus_tokens=corpus_tokens,
                                     **suffixspec_options)
    if engine == "arctic":
        return ArcticProposer(max_depth, max_spec_tokens,
                              ARCTIC_SPEC_FACTOR if max_spec_factor is None else max_spec_factor,
                              max_spec_offset,
                              ARCTIC_MIN_TOKEN_PROB if min_token_prob is None else min_token_prob,
                              tree)
    if engine == "vllm-gpu":
        return VllmGpuProposer(max_spec_tokens, max_depth, corpus_tokens, adaptive, step_cost)
    if engine == "ngram":
        return NgramProposer(max_spec_tokens, ngram_min, ngram_max)
    if engine == "oracle":
        if requests is None:
            raise ValueError("the oracle engine needs the recorded requests")
        return OracleProposer({r.req_id: r.output for r in requests}, max_spec_tokens)
    raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
