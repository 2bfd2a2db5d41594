"""arctic-inference's suffix-decoding API, served by suffixspec.

vLLM's own ``SuffixDecodingProposer``, Arctic's vLLM plugin and other engines
import ``arctic_inference.suffix_decoding.SuffixDecodingCache``.  This module
has the same public API as arctic-inference 0.3.0 (the class, its methods,
their argument checks and error messages), so such code runs on suffixspec
by importing it from here instead (or through ``install()``).

Two modes:

* ``"suffixspec"`` (default): a ``SuffixProposer`` with suffixspec's
  calibrated policy drafts.  The prompt and response of each request form its
  own trie, responses join the cross-request pool as arctic's global tree
  does.  ``max_spec_tokens`` and ``use_tree_spec`` are honoured per call;
  ``max_spec_factor``, ``max_spec_offset`` and ``min_token_prob`` only where
  they differ from arctic's defaults (1.0, 0.0, 0.1), since callers such as
  vLLM pass them whether or not a user set them.  A ``context`` that is not
  the tail of the request's own prompt and response is drafted by arctic's
  rule on the same tries.
* ``"arctic"``: arctic's rule (``suffixspec.native.arctic``) on tries kept
  in arctic's tie order: the same path drafts as arctic-inference, step for
  step, as long as no cached response has been evicted (after an eviction,
  equally frequent continuations may be ordered differently).  Tree drafts
  (``use_tree_spec``) too.

One difference: ``speculate(max_spec_tokens=None)`` drafts up to
``max_tree_depth`` tokens, as arctic documents (arctic 0.3.0 raises
AttributeError there).
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import Hashable, List, Optional, Sequence

import numpy as np

from suffixspec.index import IndexCorruptError, SuffixIndex
from suffixspec.config import ARCTIC_MIN_TOKEN_PROB, ARCTIC_SPEC_FACTOR
from suffixspec.native import arctic as rule
from suffixspec.native.layout import Candidate, Heap, candidate, flat
from suffixspec.tokens import as_token_ids

MODES = ("suffixspec", "arctic")
_ARCTIC_DEFAULTS = (ARCTIC_SPEC_FACTOR, 0.0, ARCTIC_MIN_TOKEN_PROB)  # factor, offset, min prob


@dataclass
class SuffixDecodingDraft:
    """A speculation: ``token_ids[i]``'s parent is ``token_ids[parents[i]]``
    (-1: none), ``probs`` their estimated probabilities, ``score`` their sum,
    ``match_len`` the context tokens matched."""

    token_ids: List[int] = field(default_factory=list)
    parents: List[int] = field(default_factory=list)
    probs: List[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixDecodingCache:
    """arctic-inference's ``SuffixDecodingCache``; see the module docstring.

    ``max_cached_requests``: responses kept for other requests, evicted in
    the order their requests started (-1: no limit, 0: none kept).
    """

    def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = -1, *,
                 mode: str = "suffixspec"):
        if max_cached_requests > 0x7FFFFFFF:
            raise ValueError("max_cached_requests must be at most 2^31")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self._max_tree_depth = max_tree_depth
        self._max_cached_requests = max_cached_requests
        self.mode = mode
        keep = max_cached_requests != 0
        self._trees = (_ProposerTries(max_tree_depth, keep) if mode == "suffixspec"
                       else _ArcticTries(max_tree_depth, keep))
        self._active: dict[Hashable, None] = {}
        # Requests whose response is cached, oldest first -> its sequence.
        self._cached: dict[Hashable, int] = {}

    @property
    def max_tree_depth(self) -> int:
        return self._max_tree_depth

    @property
    def max_cached_requests(self) -> int:
        return self._max_cached_requests

    @property
    def active_requests(self) -> KeysView:
        """Requests started and not yet stopped."""
        return self._active.keys()

    @property
    def cached_requests(self) -> KeysView:
        """Requests whose response other requests may draft from."""
        return self._cached.keys()

    @property
    def _global_tree(self) -> "_TreeReport":
        """What arctic's simulator reads off arctic's global tree:
        ``check_integrity()`` ("" when sound) and ``estimate_memory()``."""
        return _TreeReport(self._trees.global_index())

    def start_request(self, req_id: Hashable, prompt_token_ids: np.ndarray | Sequence[int]):
        """Index ``prompt_token_ids`` for ``req_id``; with a global cache,
        its response will be cached (evicting the oldest beyond the limit)."""
        if req_id in self._active:
            raise ValueError(f"Request '{req_id}' is already active")
        prompt = _tokens(prompt_token_ids)
        if self._max_cached_requests != 0 and req_id in self._cached:
            self.evict_cached_response(req_id)
        seq = self._trees.start(req_id, prompt)
        self._active[req_id] = None
        if self._max_cached_requests != 0:
            self._cached[req_id] = seq
            while 0 < self._max_cached_requests < len(self._cached):
                self.evict_cached_response(next(r for r in self._cached if r != req_id))

    def stop_request(self, req_id: Hashable):
        """The request is done: its prompt is dropped, its response stays cached."""
        if req_id not in self._active:
            raise ValueError(f"Request '{req_id}' is not active")
        del self._active[req_id]
        self._trees.stop(req_id)

    def add_active_response(self, req_id: Hashable, token_ids: np.ndarray | Sequence[int]):
        """Append response tokens of an active request."""
        if req_id not in self._active:
            raise ValueError(f"Request '{req_id}' is not active")
        self._trees.extend(req_id, _tokens(token_ids))

    def evict_cached_response(self, req_id: Hashable):
        """Remove ``req_id``'s response from the global cache."""
        if req_id not in self._cached:
            raise ValueError(f"Request '{req_id}' is not cached")
        self._trees.evict(self._cached.pop(req_id))

    def speculate(self, req_id: Hashable, context: np.ndarray | Sequence[int],
                  max_spec_tokens: Optional[int] = None,
                  max_spec_factor: float = ARCTIC_SPEC_FACTOR, max_spec_offset: float = 0.0,
                  min_token_prob: float = ARCTIC_MIN_TOKEN_PROB,
                  use_tree_spec: bool = False) -> SuffixDecodingDraft:
        """The likeliest continuation of ``context`` from the request's own
        prompt and response and from cached responses."""
        if req_id not in self._active:
            raise ValueError(f"Request '{req_id}' is not active")
        ctx = _tokens(context)
        if max_spec_tokens is None:
            max_spec_tokens = self._max_tree_depth
        if ctx.shape[0] > self._max_tree_depth:
            ctx = ctx[-self._max_tree_depth:]
        knobs = (float(max_spec_factor), float(max_spec_offset), float(min_token_prob))
        return self._trees.speculate(req_id, ctx, max(int(max_spec_tokens), 0), knobs,
                                     bool(use_tree_spec))


class _TreeReport:
    def __init__(self, index: SuffixIndex | None):
        self.index = index

    def check_integrity(self) -> str:
        if self.index is None:
            return ""
        try:
            self.index.check_integrity()
        except IndexCorruptError as e:
            return str(e)
        return ""

    def estimate_memory(self) -> int:
        return 0 if self.index is None else self.index.memory_bytes()


def _tokens(values) -> np.ndarray:
    """arctic's checks on arrays (1-D, int32, contiguous), then suffixspec's."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"ndarray input must have ndim=1, got ndim={values.ndim}")
        if values.dtype != np.int32:
            raise ValueError(f"ndarray input must have dtype=int32, "
                             f"got dtype={values.dtype.name}")
        if not values.flags["CONTIGUOUS"]:
            raise ValueError("ndarray input must be contiguous")
    return as_token_ids(values)


def _draft(tokens, parents, probs, score, match_len) -> SuffixDecodingDraft:
    """arctic's draft (Python lists) from int32 and float32 arrays."""
    return SuffixDecodingDraft(tokens.tolist(), parents.tolist(), probs.tolist(), float(score),
                               int(match_len))


def _float32(knobs: tuple[float, float, float]) -> tuple:
    """``(factor, offset, min_prob)`` as the float32 the kernel computes with."""
    factor, offset, min_prob = knobs
    return np.float32(factor), np.float32(offset), np.float32(min_prob)


class _ArcticTries:
    """arctic's trees: one per active request (prompt and response) and one
    global tree of cached responses, in arctic's tie order."""

    def __init__(self, depth: int, keep_responses: bool):
        self.depth = max(int(depth), 1)
        self.keep = keep_responses
        self.scratch = _Scratch()
        self.local = SuffixIndex(self.depth, node_capacity=1 << 12, ties="arctic")
        self.glob = SuffixIndex(self.depth, node_capacity=1 << 12, ties="arctic")
        self.glob_tree = self.glob.add_tree()
        self.requests: dict[Hashable, tuple[int, int, int | None]] = {}  # tree, seq, global seq

    def global_index(self) -> SuffixIndex:
        return self.glob

    def start(self, req_id, prompt: np.ndarray) -> int:
        tree = self.local.add_tree()
        seq = self.local.add_sequence(tree, capacity=prompt.shape[0] + 64)
        self.local.extend(seq, prompt)
        out = self.glob.add_sequence(self.glob_tree) if self.keep else None
        self.requests[req_id] = (tree, seq, out)
        return out

    def stop(self, req_id) -> None:
        tree, _, out = self.requests.pop(req_id)
        self.local.drop_tree(tree)
        if out is not None and self.glob.is_open(out):
            self.glob.close(out)

    def extend(self, req_id, tokens: np.ndarray) -> None:
        _, seq, out = self.requests[req_id]
        self.local.extend(seq, tokens)
        if out is not None:
            self.glob.extend(out, tokens)

    def evict(self, out: int) -> None:
        for req_id, (tree, seq, own) in self.requests.items():
            if own == out:  # evicted while active: its response stops going there
                self.requests[req_id] = (tree, seq, None)
        self.glob.remove(out)
        if self.glob.dead_tokens > max(self.glob.live_tokens, 1 << 16):
            self.glob.rebuild()

    def speculate(self, req_id, ctx, limit, knobs, tree_spec) -> SuffixDecodingDraft:
        tree = self.requests[req_id][0]
        return _best_of(self.local, tree, ctx, limit, _float32(knobs), tree_spec, self.scratch,
                        (self.glob, self.glob_tree))


class _Scratch:
    """Output and heap arrays of arctic's speculation, kept between calls,
    with the plain tuples the kernel takes them as (``native.layout.flat``)."""

    def __init__(self):
        self.size = -1
        self.heap = 0

    def out(self, limit: int) -> Candidate:
        """The best draft's arrays, at least ``limit`` tokens."""
        if limit > self.size:
            self.size = limit
            self.best = candidate(limit)
            self.plain = flat(self.best), flat(candidate(limit))  # the best, the one tried
            self.grow(4 * limit + 64)
        return self.best

    def grow(self, size: int) -> None:
        """A frontier of ``size`` entries, float32 probabilities as arctic's."""
        self.heap = size
        self.plain_heap = flat(Heap(np.empty(size, np.float32),
                                    *(np.empty(size, np.int64) for _ in range(3)),
                                    np.empty(0, np.int32), np.empty(0, np.int32)))


def _best_of(index: SuffixIndex, tree: int, ctx, limit, knobs, tree_spec, scratch: _Scratch,
             other: tuple[SuffixIndex, int] | None = None) -> SuffixDecodingDraft:
    """arctic's speculation over one tree (``suffixspec.native.arctic``), or
    over it and ``other`` (index, tree) as arctic chooses between its request's
    tree and its global one; ``knobs`` as ``_float32`` makes them."""
    out = scratch.out(limit)
    while True:
        if other is None:
            n, score, length = rule.speculate(index.plain_arrays(), index.roots[tree], ctx, limit,
                                              knobs, tree_spec, *scratch.plain,
                                              scratch.plain_heap)
        else:
            n, score, length = rule.speculate_pair(
                index.plain_arrays(), index.roots[tree], other[0].plain_arrays(),
                other[0].roots[other[1]], ctx, limit, knobs, tree_spec, *scratch.plain,
                scratch.plain_heap)
        if n >= 0:
            return _draft(out.tokens[:n], out.parents[:n], out.probs[:n], score, length)
        scratch.grow(4 * scratch.heap)  # a tree draft's frontier outgrew the heap


class _ProposerTries:
    """A ``SuffixProposer`` (calibrated policy) behind arctic's calls."""

    def __init__(self, depth: int, keep_responses: bool):
        from suffixspec.proposer import SuffixProposer

        self.depth = max(int(depth), 2)
        self.proposer = SuffixProposer(max_depth=self.depth, max_spec_tokens=self.depth,
                                       cross_pool_tokens=None if keep_responses else 0)
        self.defaults = (self.proposer.max_spec_factor, self.proposer.max_spec_offset,
                         self.proposer.min_token_prob)
        self.scratch = _Scratch()

    def global_index(self) -> SuffixIndex | None:
        return None if self.proposer.cross is None else self.proposer.cross.delta.index

    def start(self, req_id, prompt: np.ndarray) -> int | None:
        self.proposer.start_request(req_id, prompt)
        return self.proposer.output_sequence(req_id)

    def stop(self, req_id) -> None:
        self.proposer.finish_request(req_id)

    def extend(self, req_id, tokens: np.ndarray) -> None:
        self.proposer.extend(req_id, tokens)

    def evict(self, out: int | None) -> None:
        if out is not None:
            self.proposer.discard_output(out)

    def speculate(self, req_id, ctx, limit, knobs, tree_spec) -> SuffixDecodingDraft:
        prop = self.proposer
        limit = min(limit, prop.max_spec_tokens)
        tree, seq = prop.requests.requests[req_id]
        own = prop.requests.index.view(seq)
        if ctx.shape[0] > own.shape[0] or not np.array_equal(own[own.shape[0] - ctx.shape[0]:],
                                                             ctx):
            # Not the request's own tokens: arctic's rule, on its trie and the pool.
            pool = prop.cross
            other = None
            if pool is not None and pool.delta.trees:
                other = pool.delta.index, pool.delta.trees[next(iter(pool.delta.trees))]
            return _best_of(prop.requests.index, tree, ctx, limit, _float32(knobs), tree_spec,
                            self.scratch, other)
        factor, offset, min_prob = (default if given == arctic else given
                                    for given, arctic, default in zip(knobs, _ARCTIC_DEFAULTS,
                                                                      self.defaults))
        prop.knobs = prop.knobs._replace(factor=factor, offset=offset, min_prob=min_prob,
                                         tree=tree_spec)
        draft = prop.propose([req_id], limit)[0]
        return _draft(draft.token_ids, draft.parents, draft.probs, draft.score, draft.match_len)


def install(mode: str = "suffixspec") -> types.ModuleType:
    """Make ``import arctic_inference.suffix_decoding`` load this module's
    classes (for code that imports arctic's API, e.g. vLLM's own proposer),
    their caches in ``mode``.  Returns the stand-in module."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")

    class Cache(SuffixDecodingCache):
        __doc__ = SuffixDecodingCache.__doc__

        def __init__(self, max_tree_depth: int = 64, max_cached_requests: int = -1):
            super().__init__(max_tree_depth, max_cached_requests, mode=mode)

    Cache.__name__ = Cache.__qualname__ = "SuffixDecodingCache"
    module = types.ModuleType("arctic_inference.suffix_decoding")
    module.SuffixDecodingCache = Cache
    module.SuffixDecodingDraft = SuffixDecodingDraft
    module.__doc__ = "suffixspec's stand-in for arctic-inference's suffix decoding API"
    try:
        package = importlib.import_module("arctic_inference")
    except ImportError:  # not installed (or its import blocked)
        package = sys.modules["arctic_inference"] = types.ModuleType("arctic_inference")
        package.__path__ = []
    package.suffix_decoding = module
    sys.modules["arctic_inference.suffix_decoding"] = module
    return module
