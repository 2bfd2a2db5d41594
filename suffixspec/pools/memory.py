"""The pools a proposer drafts from.

``RequestPool``: one tree per active request over its prompt and output.
``CrossPool``: outputs of many requests, one tree per namespace, bounded by a
token budget with oldest-first eviction.  ``suffixspec.pools.persistent`` adds a pool
kept in LMDB.  All wrap ``SuffixIndex``; the batch kernel reads their arrays.

A cross pool offers the batch kernel ``delta`` (``Delta``), the appendable
part, and ``view`` (``suffixspec.pools.view``), its read-only snapshot
segments (none for in-memory pools).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Hashable

import numpy as np

from suffixspec.config import (DEFAULT_CROSS_POOL_TOKENS, DEFAULT_NAMESPACE, DEFAULT_REUSE_TOKENS,
                               check_namespace)
from suffixspec.index import SuffixIndex
from suffixspec.pools.view import EMPTY_VIEW


KEEP_REQUESTS = 64  # finished trees ``start`` compares a prompt with, at most
FAMILY_TOKENS = 1 << 20  # tokens all families' kept outputs hold, at most (least recent dropped)
FAMILY_OUTPUT_TOKENS = 1024  # the most of one output a family keeps


class RequestPool:
    """One tree per active request, over its prompt and its output so far.

    A finished request's tree is kept a while (the last ``KEEP_REQUESTS``
    requests, ``keep_tokens`` tokens in all, oldest dropped first): an
    agent's next turn usually arrives soon, as a new
    request whose prompt is the previous turn's prompt and output plus a few
    new tokens, and ``start`` then takes over that tree and indexes only the
    new tokens.  Only a request of the same namespace takes a tree over:
    a namespace never drafts another's outputs.

    With ``family_outputs``, the outputs of the latest requests of each
    *family* (a key the caller gives ``start``) are kept too, and a new tree
    indexes its family's as sequences of their own beside the request's.
    """

    def __init__(self, max_depth: int, keep_tokens: int = DEFAULT_REUSE_TOKENS,
                 family_outputs: int = 0):
        self.index = SuffixIndex(max_depth=max_depth, node_capacity=1 << 14,
                                 token_capacity=1 << 16)
        self.keep_tokens = keep_tokens
        # req_id -> (tree, seq)
        self.requests: dict[Hashable, tuple[int, int]] = {}
        # Prompt family -> its latest outputs, oldest first; req_id -> (family, prompt length)
        self.family_outputs = family_outputs
        self.families: OrderedDict[Hashable, list[np.ndarray]] = OrderedDict()
        self._family_tokens = 0
        self._family_of: dict[Hashable, tuple[Hashable, int]] = {}
        self._tree_family: dict[int, tuple[np.ndarray, ...]] = {}  # tree -> outputs it indexed
        self._family_seqs: dict[int, list[int]] = {}  # tree -> their sequences
        # Finished requests' trees, oldest first: seq -> (tree, tokens, last token, namespace)
        self.finished: OrderedDict[int, tuple[int, int, int, Hashable]] = OrderedDict()
        self._finished_tokens = 0
        self._namespace_of: dict[Hashable, Hashable] = {}  # active request -> its namespace

    def start(self, req_id: Hashable, prompt: np.ndarray, family: Hashable | None = None,
              namespace: Hashable = DEFAULT_NAMESPACE) -> int:
        """Index ``prompt`` for ``req_id``, whose output joins ``namespace``;
        returns how many of its tokens were already indexed (the finished
        request of that namespace it continues), else 0.  A new tree also
        indexes the latest outputs of the prompt's ``family``."""
        reused = self._continued(prompt, namespace)
        if reused is None:
            tree = self.index.add_tree()
            outputs = tuple(self.families.get(family, ()))
            for output in outputs:
                s = self.index.add_sequence(tree, capacity=output.shape[0])
                self.index.extend(s, output)
                self._family_seqs.setdefault(tree, []).append(s)
            if outputs:
                self._tree_family[tree] = outputs
            seq = self.index.add_sequence(tree, capacity=prompt.shape[0] + 256)
            have = 0
        else:
            seq, have = reused
            tree = self.finished.pop(seq)[0]
            self._finished_tokens -= have
        self.index.extend(seq, prompt[have:])
        self.requests[req_id] = (tree, seq)
        self._namespace_of[req_id] = namespace
        if family is not None and self.family_outputs > 0:
            self._family_of[req_id] = (family, prompt.shape[0])
        return have

    def extend(self, req_id: Hashable, tokens: np.ndarray) -> None:
        self.index.extend(self.requests[req_id][1], tokens)

    def family_of(self, req_id: Hashable) -> tuple[np.ndarray, ...]:
        """The family outputs ``req_id``'s tree indexed beside it, oldest first
        (a request that continues a finished one keeps those of its tree)."""
        return self._tree_family.get(self.requests[req_id][0], ())

    def _drop_tree(self, tree: int) -> None:
        self._tree_family.pop(tree, None)
        self._family_seqs.pop(tree, None)
        self.index.drop_tree(tree)

    def drop(self, req_id: Hashable) -> None:
        tree, _ = self.requests.pop(req_id)
        self._family_of.pop(req_id, None)
        self._namespace_of.pop(req_id, None)
        self._drop_tree(tree)

    def retire(self, req_id: Hashable) -> None:
        """The request finished: keep its tree for a request that continues it,
        and its output among its family's latest."""
        tree, seq = self.requests.pop(req_id)
        namespace = self._namespace_of.pop(req_id, DEFAULT_NAMESPACE)
        n = self.index.seq_len(seq)
        family = self._family_of.pop(req_id, None)
        if family is not None and n > family[1]:
            self._keep_output(family[0], self.index.view(seq)[family[1]:n])
        if n > self.keep_tokens:
            self._drop_tree(tree)
            return
        self.finished[seq] = (tree, n, int(self.index.view(seq)[n - 1]) if n else -1, namespace)
        self._finished_tokens += n
        while (self._finished_tokens > self.keep_tokens
               or len(self.finished) > KEEP_REQUESTS):
            _, (old_tree, old_n, _, _) = self.finished.popitem(last=False)
            self._finished_tokens -= old_n
            self._drop_tree(old_tree)

    def forget_finished(self) -> None:
        """Drop every finished request's tree and every family's outputs, also
        from the trees of active requests (what ``forget`` deleted from the
        pool may be among them); active requests keep their own tokens."""
        for tree, _, _, _ in self.finished.values():
            self._drop_tree(tree)
        self.finished.clear()
        self._finished_tokens = 0
        self.families.clear()
        self._family_tokens = 0
        for tree, seqs in self._family_seqs.items():
            for s in seqs:
                self.index.remove(s)
            self._tree_family.pop(tree, None)
        self._family_seqs.clear()

    def _keep_output(self, family: Hashable, output: np.ndarray) -> None:
        """``output`` joins its family's latest; the least recent family goes
        first when they hold more than ``FAMILY_TOKENS``."""
        outputs = self.families.pop(family, [])
        outputs.append(np.array(output[:FAMILY_OUTPUT_TOKENS], np.int32))
        self._family_tokens += outputs[-1].shape[0]
        for old in outputs[:-self.family_outputs]:
            self._family_tokens -= old.shape[0]
        self.families[family] = outputs[-self.family_outputs:]
        while self._family_tokens > FAMILY_TOKENS:
            _, dropped = self.families.popitem(last=False)
            self._family_tokens -= sum(o.shape[0] for o in dropped)

    def _continued(self, prompt: np.ndarray, namespace: Hashable) -> tuple[int, int] | None:
        """(seq, length) of the longest finished sequence of ``namespace`` that
        ``prompt`` starts with.

        Most are told apart by the token at their end, kept with them: only
        those whose last token the prompt has there are compared whole."""
        best = None
        size = prompt.shape[0]
        for seq, (_, n, last, ns) in self.finished.items():
            if (ns == namespace and 0 < n <= size and (best is None or n > best[1])
                    and prompt[n - 1] == last
                    and np.array_equal(self.index.view(seq), prompt[:n])):
                best = (seq, n)
        return best


class Delta:
    """The appendable, in-memory part of a cross-request pool: one tree per namespace.

    ``begin`` opens a sequence for a request's output, ``extend`` appends,
    ``close`` ends it and keeps it committed (oldest first, for eviction),
    ``remove`` takes one out.  ``generation`` bumps whenever a tree's root may
    have changed (a new namespace, a rebuild).
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.index = SuffixIndex(max_depth=max_depth, node_capacity=1 << 14,
                                 token_capacity=1 << 16)
        self.trees: dict[str, int] = {}
        self.committed: OrderedDict[int, None] = OrderedDict()
        self.generation = 0

    @property
    def tokens(self) -> int:
        return self.index.live_tokens

    def tree(self, namespace: str) -> int:
        """The tree of ``namespace``, created on first use."""
        tree = self.trees.get(namespace)
        if tree is None:
            tree = self.trees[namespace] = self.index.add_tree()
            self.generation += 1  # cached root lists may now be incomplete
        return tree

    def root(self, namespace: str) -> int:
        """``namespace``'s root node (-1: none yet)."""
        tree = self.trees.get(namespace)
        return -1 if tree is None else int(self.index.roots[tree])

    def begin(self, namespace: str, anchors: np.ndarray | None = None,
              capacity: int = 256, seq: int | None = None) -> int:
        """Open a sequence that starts with ``anchors`` (see ``suffixspec.anchors``)."""
        s = self.index.add_sequence(self.tree(namespace), capacity=capacity, seq=seq)
        if anchors is not None and anchors.shape[0]:
            self.index.extend(s, anchors)
        return s

    def extend(self, seq: int, tokens: np.ndarray) -> None:
        self.index.extend(seq, tokens)

    def add(self, tokens: np.ndarray, namespace: str) -> int:
        """Index a finished sequence in one call and keep it committed."""
        seq = self.begin(namespace, capacity=max(tokens.shape[0], 1))
        self.index.extend(seq, tokens)
        self.close(seq)
        return seq

    def close(self, seq: int) -> None:
        self.index.close(seq)
        self.committed[seq] = None

    def remove(self, seq: int) -> None:
        self.committed.pop(seq, None)
        self.index.remove(seq)

    def evict(self, over) -> list[int]:
        """Remove committed sequences, oldest first, while ``over()``; returns them."""
        gone = []
        while self.committed and over():
            seq, _ = self.committed.popitem(last=False)
            self.index.remove(seq)
            gone.append(seq)
        return gone

    def maybe_rebuild(self) -> None:
        """Removed sequences keep their tokens while labels may read them;
        rebuilding reclaims them once they outweigh the live ones."""
        if self.index.dead_tokens > max(self.index.live_tokens, 1 << 16):
            self.index.rebuild()
            self.generation += 1


class CrossPool:
    """Outputs of past and in-flight requests, in memory, one tree per namespace.

    ``begin(namespace)`` opens a sequence for a request's output, ``extend``
    appends to it, ``commit`` keeps it and ``discard`` removes it.  Committed
    sequences are evicted oldest first once ``max_tokens`` tokens or
    ``max_sequences`` sequences are exceeded (None: unbounded).  It has no
    snapshot: its ``view`` is empty.
    """

    view = EMPTY_VIEW

    def __init__(self, max_depth: int, max_tokens: int | None = DEFAULT_CROSS_POOL_TOKENS,
                 max_sequences: int | None = None):
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if max_sequences is not None and max_sequences < 0:
            raise ValueError(f"max_sequences must be >= 0, got {max_sequences}")
        self.max_depth = max_depth
        self.max_tokens = max_tokens
        self.max_sequences = max_sequences
        self.delta = Delta(max_depth)
        self._lock = threading.RLock()  # shared with the proposer drafting from it

    @property
    def tokens(self) -> int:
        return self.delta.tokens

    def want(self, namespaces) -> None:
        """Namespaces requests draw from; an in-memory pool indexes everything anyway."""

    def begin(self, namespace: str = DEFAULT_NAMESPACE, anchors: np.ndarray | None = None) -> int:
        """Open a sequence for an output; it starts with ``anchors`` (see
        ``suffixspec.anchors``).  Returns its handle: here its delta sequence."""
        return self.delta.begin(check_namespace(namespace), anchors)

    @staticmethod
    def seq_of(handle: int) -> int:
        """The delta sequence of an open output (its handle, in memory)."""
        return handle

    def extend(self, seq: int, tokens: np.ndarray) -> None:
        self.delta.extend(seq, tokens)

    def add(self, tokens: np.ndarray, namespace: str = DEFAULT_NAMESPACE,
            anchors: np.ndarray | None = None) -> int:
        """Index a finished output (after its ``anchors``) in one call and commit it."""
        seq = self.begin(namespace, anchors)
        self.delta.extend(seq, tokens)
        self.commit(seq)
        return seq

    def commit(self, seq: int, request_id: str = "") -> None:
        self.delta.close(seq)
        self.delta.evict(self._over)
        self.delta.maybe_rebuild()

    def discard(self, seq: int) -> None:
        self.delta.remove(seq)
        self.delta.maybe_rebuild()

    def refresh(self) -> None:
        """In-memory pools have nothing to pick up from other processes."""

    def close(self) -> None:
        """Nothing to let go of."""

    def _over(self) -> bool:
        return ((self.max_tokens is not None and self.delta.tokens > self.max_tokens)
                or (self.max_sequences is not None
                    and len(self.delta.committed) > self.max_sequences))
