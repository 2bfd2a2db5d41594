"""The two pools a proposer drafts from.

``RequestPool``: one tree per active request over its prompt and output.
``CrossPool``: one tree over the outputs of many requests, bounded by a token
budget with oldest-first eviction.  Both wrap a ``SuffixIndex``; the batch
kernel reads their arrays directly.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

import numpy as np

from suffixspec.index import SuffixIndex


class RequestPool:
    def __init__(self, max_depth: int):
        self.index = SuffixIndex(max_depth=max_depth, node_capacity=1 << 14,
                                 token_capacity=1 << 16)
        # req_id -> (tree, seq)
        self.requests: dict[Hashable, tuple[int, int]] = {}

    def start(self, req_id: Hashable, prompt: np.ndarray) -> None:
        tree = self.index.add_tree()
        seq = self.index.add_sequence(tree, capacity=prompt.shape[0] + 256)
        self.index.extend(seq, prompt)
        self.requests[req_id] = (tree, seq)

    def extend(self, req_id: Hashable, tokens: np.ndarray) -> None:
        self.index.extend(self.requests[req_id][1], tokens)

    def drop(self, req_id: Hashable) -> None:
        tree, _ = self.requests.pop(req_id)
        self.index.drop_tree(tree)


class CrossPool:
    """Outputs of past (and in-flight) requests in one tree.

    ``begin`` opens a sequence for a request's output, ``extend`` appends to
    it, ``commit`` keeps it and ``discard`` removes it.  Committed sequences
    are evicted oldest first once ``max_tokens`` is exceeded.
    """

    def __init__(self, max_depth: int, max_tokens: int | None = 4_000_000):
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.index = SuffixIndex(max_depth=max_depth, node_capacity=1 << 14,
                                 token_capacity=1 << 16)
        self.tree = self.index.add_tree()
        self._committed: OrderedDict[int, None] = OrderedDict()

    @property
    def root(self) -> int:
        return int(self.index.roots[self.tree])

    @property
    def tokens(self) -> int:
        return self.index.live_tokens

    def begin(self) -> int:
        return self.index.add_sequence(self.tree, capacity=256)

    def extend(self, seq: int, tokens: np.ndarray) -> None:
        self.index.extend(seq, tokens)

    def add(self, tokens: np.ndarray) -> int:
        """Index a finished sequence in one call and commit it."""
        seq = self.index.add_sequence(self.tree, capacity=max(tokens.shape[0], 1))
        self.index.extend(seq, tokens)
        self.commit(seq)
        return seq

    def commit(self, seq: int) -> None:
        self.index.close(seq)
        self._committed[seq] = None
        self._evict()

    def discard(self, seq: int) -> None:
        self._committed.pop(seq, None)
        self.index.remove(seq)
        self._maybe_rebuild()

    def _evict(self) -> None:
        while (self.max_tokens is not None and self.index.live_tokens > self.max_tokens
               and self._committed):
            seq, _ = self._committed.popitem(last=False)
            self.index.remove(seq)
        self._maybe_rebuild()

    def _maybe_rebuild(self) -> None:
        # Removed sequences keep their tokens while labels may read them;
        # rebuilding reclaims them once they outweigh the live ones.
        if self.index.dead_tokens > max(self.index.live_tokens, 1 << 16):
            self.index.rebuild()
