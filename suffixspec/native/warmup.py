"""Compile every kernel once, on writeable and read-only arrays.

Numba compiles on first call (or loads its on-disk cache, ``cache=True``);
calling ``warmup()`` at start-up keeps that out of the first engine step.
Read-only variants matter because a persistent pool hands the query kernels
views of read-only buffers.
"""

import time
from contextlib import nullcontext

import numpy as np
from numba.core import event

from . import calibration as cal, counts, layout as lay, ngram, propose, trie
from . import tokens as token_checks

_done = False


def _tiny_index(depth=4) -> lay.Index:
    meta = np.zeros(lay.META_SIZE, np.int64)
    meta[lay.META_DEPTH] = depth
    meta[lay.META_FREE_HEAD] = -1
    return lay.Index(meta, np.full((64, lay.NODE_FIELDS), -1, np.int32),
                     np.full(128, lay.EMPTY, np.int64), np.full(128, -1, np.int32),
                     np.zeros(64, np.int32), np.zeros((2, lay.SEQ_FIELDS), np.int64),
                     np.zeros((2, depth), np.int32))


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


#: What ``warmup`` compiles, in order (``progress`` is told each as it begins).
STEPS = ("indexing", "queries", "drafting", "learning", "maintenance", "input checks")


class NotCached(Exception):
    """A kernel is missing from Numba's on-disk cache (``warmup(cached_only=True)``)."""


class _RefuseCompiles(event.Listener):
    """Stops a compile of one of this package's kernels before it begins."""

    def on_start(self, ev):
        func = ev.data["dispatcher"].py_func
        if func.__module__.startswith(__package__ + "."):
            raise NotCached(f"{func.__module__}.{func.__qualname__} is not cached")

    def on_end(self, ev):
        pass


def warmup(progress=None, cached_only: bool = False) -> float:
    """Compile (or load) every kernel; returns the seconds it took.

    ``progress(step)``, if given, is called as each of ``STEPS`` begins.
    ``cached_only``: load from Numba's on-disk cache only, and raise
    ``NotCached`` (at once, compiling nothing) when a kernel is not there;
    the kernels loaded so far stay loaded.
    Idempotent: later calls return 0.0 at once.
    """
    if _done:
        return 0.0
    with event.install_listener("numba:compile", _RefuseCompiles()) if cached_only \
            else nullcontext():
        return _warmup(progress)


def _warmup(progress) -> float:
    global _done

    def step(name):
        if progress is not None:
            progress(name)

    t0 = time.perf_counter()
    step("indexing")
    depth = 4
    ix = _tiny_index(depth)
    root = trie.new_root(ix.nodes, ix.meta)
    ix.seqs[0, lay.SEQ_CAP] = 32
    ix.seqs[0, lay.SEQ_ROOT] = root
    ix.seqs[0, lay.SEQ_STATE] = lay.SEQ_LIVE
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2], np.int32)
    flat = tuple(ix)  # kernels that change an index take it plain (see ``layout``)
    trie.extend(flat, 0, tokens)
    trie.extend(flat, 0, _readonly(tokens))
    trie.extend_batch(flat, np.zeros(1, np.int64), tokens[:2], np.array([0, 2], np.int64),
                      np.zeros(2, np.int64))
    ix.meta[lay.META_ARENA_TOP] = 32
    assert trie.check_integrity(flat) == 0
    k = 4
    work = lay.workspace(k)
    ctx = np.array([1, 2], np.int32)
    ro = lay.read_only(ix)
    own = (np.int64(-1), np.int64(0), np.int64(0))
    step("queries")
    for index in (ix, ro):
        for c in (ctx, _readonly(ctx)):
            length, x, off = trie.longest_match(index, root, c, 0, 2, depth, True, own)
            counts.draft_path(index, x, off, k, 0.1, work.cand.tokens, work.cand.probs, 1)
            counts.draft_tree(index, x, off, k, 0.1, work.cand.tokens, work.cand.parents,
                              work.cand.probs, work.heap)
            trie.continuations(index, x, off, np.empty(4, np.int32), np.empty(4, np.int64))
    step("drafting")
    # One batched step per policy.  The base index is always read-only (a
    # persistent pool's snapshot, or the proposer's read-only stand-in).
    b = 2
    out = lay.outputs(b, k)
    pending = lay.pending(b, k)
    stats = cal.new_stats(0.0)  # any cost: this only compiles
    req = np.zeros(b, np.int64)
    rows = np.zeros((3, b), np.int64)  # as the proposer passes them: rows of one array
    rows[2] = -1
    cross_roots = np.full((b, 1), root, np.int64)
    batch = (rows[1], rows[0], rows[2], np.full(b, k, np.int64), cross_roots, cross_roots)
    # Plain tuples, exactly as the proposer passes them (see ``layout``).
    for flags, tree in ((lay.DEFAULT_POLICY, False), (lay.DEFAULT_POLICY, True),
                        (lay.COUNTS_POLICY, False)):
        knobs = (depth, 1.0, 0.0, 0.1, tree, flags)
        propose.propose_batch(tuple(ro), np.array([root], np.int32), tuple(ro), tuple(ro), batch,
                              knobs, tuple(stats), tuple(out), tuple(pending), lay.flat(work))
    step("learning")
    cal.learn(tuple(stats), tuple(pending), req, tokens, np.array([0, 2], np.int64),
              np.empty(k, np.int64), np.empty(k, np.bool_))
    step("maintenance")
    keys2, vals2 = np.full(256, lay.EMPTY, np.int64), np.full(256, -1, np.int32)
    trie.rehash(ix.hkeys, ix.hvals, keys2, vals2, ix.meta)
    trie.remove_seq(flat, 0, np.zeros(depth + 1, np.int32))
    trie.move_seq(ix.arena, ix.seqs, ix.meta, 0, 40, 8)
    trie.compact_arena(ix.arena, ix.seqs, ix.meta)
    trie.drop_tree(flat, root)
    step("input checks")
    token_checks.first_bad_token(tokens)  # writeable int32 only (see ``suffixspec.tokens``)
    lps = np.empty(4, np.int32)
    ngram.ngram_propose(tokens, tokens.shape[0], 1, 3, k, lps, work.cand.tokens)
    _done = True
    return time.perf_counter() - t0


KERNELS = (trie.rehash, trie.new_root, trie.extend, trie.extend_batch, trie.remove_seq,
           trie.drop_tree, trie.move_seq, trie.compact_arena, trie.longest_match,
           counts.draft_path, counts.draft_tree, trie.continuations, trie.check_integrity,
           propose.propose_batch, cal.learn,
           ngram.ngram_propose, token_checks.first_bad_token)
