"""``SuffixProposer``: the standalone proposer API over the two pools."""

from __future__ import annotations

from itertools import accumulate
from typing import Hashable, Sequence

import numpy as np

from suffixspec.draft import Draft
from suffixspec.index import heap_scratch
from suffixspec.native import suffix_index as nat
from suffixspec.native import warmup
from suffixspec.pools import CrossPool, RequestPool
from suffixspec.tokens import as_token_ids


_SOURCES = ("request", "cross")


class SuffixProposer:
    """Drafts continuations from suffix tries over the request and past outputs.

    Parameters
    ----------
    max_depth:
        Longest indexed substring, and so the longest usable context match.
    max_spec_tokens:
        Upper bound on draft length (engines may pass lower per-request limits
        to ``propose``).
    max_spec_factor, max_spec_offset:
        A draft from a ``match_len``-token match holds at most
        ``match_len * max_spec_factor + max_spec_offset`` tokens.
    min_token_prob:
        Drafting stops before a token whose estimated probability (product of
        continuation frequencies along the path) falls below this.
    tree:
        Draft best-first token trees instead of single paths.
    cross_pool_tokens:
        Token budget of the cross-request pool (oldest outputs are evicted
        first); 0 disables the pool, None leaves it unbounded.
    cross_pool:
        Use this pool (for example a persistent one) instead of a new one.
    all_match_lengths:
        Draft from every match length and keep the best-scoring draft, instead
        of only from the longest match.
    self_discount:
        Leave the context's own occurrence (which has no continuation yet) out
        of the first token's probability.
    long_match_bias:
        Rank a draft from an L-token match by ``score * (1 + L / (4 *
        max_depth))``, a mild preference for longer matches.

    The three policy options are on by default because the replay over the
    shared traces measured each as helping; ``bench/policy_bench.py``
    re-measures them.
    """

    def __init__(self, max_depth: int = 64, max_spec_tokens: int = 16,
                 max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, tree: bool = False,
                 cross_pool_tokens: int | None = 4_000_000, cross_pool: CrossPool | None = None,
                 all_match_lengths: bool = True, self_discount: bool = True,
                 long_match_bias: bool = True):
        if not 2 <= max_depth <= 1024:
            raise ValueError(f"max_depth must be in [2, 1024], got {max_depth}")
        if max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {max_spec_tokens}")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob}")
        self.max_depth = int(max_depth)
        self.max_spec_tokens = int(max_spec_tokens)
        self.max_spec_factor = float(max_spec_factor)
        self.max_spec_offset = float(max_spec_offset)
        self.min_token_prob = float(min_token_prob)
        self.tree = bool(tree)
        self.flags = ((nat.ALL_LENGTHS if all_match_lengths else 0)
                      | (nat.SELF_DISCOUNT if self_discount else 0)
                      | (nat.LONG_BIAS if long_match_bias else 0))
        self.requests = RequestPool(self.max_depth)
        if cross_pool is not None and cross_pool.index.max_depth != self.max_depth:
            raise ValueError(f"cross pool has max_depth {cross_pool.index.max_depth}, "
                             f"proposer has {self.max_depth}")
        if cross_pool is None and cross_pool_tokens != 0:
            cross_pool = CrossPool(self.max_depth, cross_pool_tokens)
        self.cross = cross_pool
        self._cross_seq: dict[Hashable, int] = {}
        warmup()
        k = max(self.max_spec_tokens, 1)
        self._scratch = (np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.float32),
                         np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.float32))
        self._heap = heap_scratch(k, self.min_token_prob)
        self._out = self._outputs(8)
        self._default_limits = np.full(8, self.max_spec_tokens, np.int64)

    # ----------------------------------------------------------- lifecycle
    def start_request(self, req_id: Hashable, prompt_token_ids) -> None:
        """Index the prompt of a new request."""
        if req_id in self.requests.requests:
            raise ValueError(f"request {req_id!r} is already active")
        prompt = as_token_ids(prompt_token_ids, "prompt_token_ids")
        self.requests.start(req_id, prompt)
        if self.cross is not None:
            self._cross_seq[req_id] = self.cross.begin()

    def extend(self, req_id: Hashable, token_ids) -> None:
        """Append the tokens the engine emitted for ``req_id`` this step."""
        self._check_active(req_id)
        tokens = as_token_ids(token_ids)
        if tokens.shape[0] == 0:
            return
        self.requests.extend(req_id, tokens)
        seq = self._cross_seq.get(req_id)
        if seq is not None:
            self.cross.extend(seq, tokens)

    def extend_batch(self, req_ids: Sequence[Hashable], token_ids: Sequence) -> None:
        """``extend`` for every request of an engine step, in one native call per pool.

        ``token_ids[i]`` are the tokens emitted for ``req_ids[i]``.  All input
        is validated before anything is appended.
        """
        b = len(req_ids)
        if len(token_ids) != b:
            raise ValueError(f"{len(token_ids)} token lists for {b} requests")
        if b <= 1:
            if b:
                self.extend(req_ids[0], token_ids[0])
            return
        rows = np.array([self._row(r) for r in req_ids], np.int64).reshape(b, 3)
        arrays = [as_token_ids(t) for t in token_ids]
        offsets = np.fromiter(accumulate((a.shape[0] for a in arrays), initial=0), np.int64, b + 1)
        tokens = np.concatenate(arrays)
        self.requests.index.extend_many(rows[:, 1], tokens, offsets)
        if self.cross is not None:
            self.cross.index.extend_many(rows[:, 2], tokens, offsets)

    def finish_request(self, req_id: Hashable) -> None:
        """The request ended normally: its output stays in the cross pool."""
        self._check_active(req_id)
        self.requests.drop(req_id)
        seq = self._cross_seq.pop(req_id, None)
        if seq is not None:
            self.cross.commit(seq)

    def abort_request(self, req_id: Hashable) -> None:
        """The request was cancelled: forget it entirely."""
        self._check_active(req_id)
        self.requests.drop(req_id)
        seq = self._cross_seq.pop(req_id, None)
        if seq is not None:
            self.cross.discard(seq)

    def index_memory(self) -> tuple[int, int]:
        """(bytes held, tokens indexed) of the cross-request pool."""
        if self.cross is None:
            return 0, 0
        return self.cross.index.memory_bytes(), self.cross.tokens

    @property
    def active_requests(self):
        return self.requests.requests.keys()

    # ------------------------------------------------------------- drafting
    def propose(self, req_ids: Sequence[Hashable],
                max_spec_tokens: int | Sequence[int] | None = None) -> list[Draft]:
        """One draft per request, computed in one native call.

        ``max_spec_tokens`` lowers the draft limit, for all requests (an int)
        or per request (a sequence as long as ``req_ids``); engines use it for
        the room left in the context window.
        """
        b = len(req_ids)
        if b == 0:
            return []
        rows = np.array([self._row(r) for r in req_ids], np.int64).reshape(b, 3)
        limits = self._limits(max_spec_tokens, b)
        if self._out[0].shape[0] < b:
            self._out = self._outputs(max(b, 2 * self._out[0].shape[0]))
        tokens, parents, probs, n, score, match, source = self._out
        local = self.requests.index
        if self.cross is not None:
            c = self.cross.index
            c_arrays = (c.nodes, c.hkeys, c.hvals, c.arena, c.seqs, c.active, self.cross.root)
        else:
            c_arrays = (local.nodes, local.hkeys, local.hvals, local.arena, local.seqs,
                        local.active, -1)
        nat.propose_batch(local.nodes, local.hkeys, local.hvals, local.arena, local.seqs,
                          local.active, local.roots, *c_arrays, self.max_depth, rows[:, 1],
                          rows[:, 0], rows[:, 2], limits, self.max_spec_factor,
                          self.max_spec_offset, self.min_token_prob, self.tree, self.flags,
                          tokens, parents, probs, n, score, match, source, *self._scratch,
                          *self._heap)
        drafts = []
        for i in range(b):
            k = int(n[i])
            if k == 0:
                drafts.append(Draft(match_len=int(match[i])))
            else:
                drafts.append(Draft(tokens[i, :k].copy(), parents[i, :k].copy(),
                                    probs[i, :k].copy(), float(score[i]), int(match[i]),
                                    _SOURCES[source[i]]))
        return drafts

    # ------------------------------------------------------------ internals
    def _check_active(self, req_id: Hashable) -> None:
        if req_id not in self.requests.requests:
            raise ValueError(f"unknown request {req_id!r}: not started, or already finished")

    def _row(self, req_id: Hashable) -> tuple[int, int, int]:
        """(tree, sequence) in the request pool and its cross-pool sequence (-1: none)."""
        try:
            tree, seq = self.requests.requests[req_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request {req_id!r}: not started, or already finished") from None
        return tree, seq, self._cross_seq.get(req_id, -1)

    def _limits(self, max_spec_tokens, b: int) -> np.ndarray:
        if max_spec_tokens is None:
            if self._default_limits.shape[0] < b:
                self._default_limits = np.full(2 * b, self.max_spec_tokens, np.int64)
            return self._default_limits[:b]
        if np.isscalar(max_spec_tokens):
            limits = np.full(b, max_spec_tokens)
        else:
            limits = np.asarray(max_spec_tokens)
            if limits.shape != (b,):
                raise ValueError(f"max_spec_tokens has {limits.size} limits for {b} requests")
        if limits.dtype.kind not in "iu":
            raise ValueError(f"max_spec_tokens must be integers, got {limits.dtype}")
        if b and limits.min() < 0:
            raise ValueError("max_spec_tokens must not be negative")
        return np.minimum(limits, self.max_spec_tokens).astype(np.int64)

    def _outputs(self, b: int):
        k = max(self.max_spec_tokens, 1)
        return (np.zeros((b, k), np.int32), np.zeros((b, k), np.int32),
                np.zeros((b, k), np.float32), np.zeros(b, np.int64),
                np.zeros(b, np.float64), np.zeros(b, np.int64), np.zeros(b, np.int64))
