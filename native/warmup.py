"""Compile every kernel once, on writeable and read-only arrays.

Numba compiles on first call (or loads its on-disk cache, ``cache=True``);
calling ``warmup()`` at start-up keeps that out of the first engine step.
Read-only variants matter because a persistent pool hands the query kernels
views of read-only buffers.
"""

import time

import numpy as np

from . import calibration as cal
from . import ngram
from . import propose as pr
from . import tokens as token_checks
from . import suffix_index as si

_done = False


def _tiny_index(depth=4):
    meta = np.zeros(si.META_SIZE, np.int64)
    meta[si.META_DEPTH] = depth
    meta[si.META_FREE_HEAD] = -1
    nodes = np.full((64, si.NODE_FIELDS), -1, np.int32)
    hkeys = np.full(128, si.EMPTY, np.int64)
    hvals = np.full(128, -1, np.int32)
    arena = np.zeros(64, np.int32)
    seqs = np.zeros((2, si.SEQ_FIELDS), np.int64)
    active = np.zeros((2, depth), np.int32)
    return meta, nodes, hkeys, hvals, arena, seqs, active


def _readonly(*arrays):
    out = []
    for a in arrays:
        a = a.copy()
        a.setflags(write=False)
        out.append(a)
    return out


#: What ``warmup`` compiles, in order (``progress`` is told each as it begins).
STEPS = ("indexing", "queries", "drafting", "learning", "maintenance", "input checks")


def warmup(progress=None) -> float:
    """Compile (or load) every kernel; returns the seconds it took.

    ``progress(step)``, if given, is called as each of ``STEPS`` begins.
    Idempotent: later calls return 0.0 at once.
    """
    global _done
    if _done:
        return 0.0

    def step(name):
        if progress is not None:
            progress(name)

    t0 = time.perf_counter()
    step("indexing")
    depth = 4
    meta, nodes, hkeys, hvals, arena, seqs, active = _tiny_index(depth)
    root = si.new_root(nodes, meta)
    seqs[0, si.SEQ_CAP] = 32
    seqs[0, si.SEQ_ROOT] = root
    seqs[0, si.SEQ_STATE] = si.SEQ_LIVE
    tokens = np.array([1, 2, 3, 1, 2, 4, 1, 2], np.int32)
    si.extend(meta, nodes, hkeys, hvals, arena, seqs, active, 0, tokens)
    si.extend(meta, nodes, hkeys, hvals, arena, seqs, active, 0, _readonly(tokens)[0])
    extended = np.zeros(2, np.int64)
    si.extend_batch(meta, nodes, hkeys, hvals, arena, seqs, active, np.zeros(1, np.int64),
                    tokens[:2], np.array([0, 2], np.int64), extended)
    meta[si.META_ARENA_TOP] = 32
    assert si.check_integrity(meta, nodes, hkeys, hvals, arena, seqs, active) == 0
    k = 4
    heap = si.heap_scratch(k)
    out_t, out_p, out_pr = np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.float32)
    ctx = np.array([1, 2], np.int32)
    step("queries")
    for arrs in ((nodes, hkeys, hvals, arena, seqs, active),
                 _readonly(nodes, hkeys, hvals, arena, seqs, active)):
        n_, hk, hv, ar, sq, ac = arrs
        for c in (ctx, _readonly(ctx)[0]):
            length, x, off = si.longest_match(n_, hk, hv, ar, sq, ac, root, c, 0, 2, depth, True)
            si.draft_path(n_, ar, sq, x, off, k, 0.1, out_t, out_pr)
            si.draft_path(n_, ar, sq, x, off, k, 0.1, out_t, out_pr, 1)
            si.draft_tree(n_, ar, sq, x, off, k, 0.1, out_t, out_p, out_pr, *heap)
            si.continuations(n_, ar, sq, x, off, np.empty(4, np.int32), np.empty(4, np.int64))
    step("drafting")
    # One batched step per policy.  The base index is always read-only (a
    # persistent pool's snapshot, or the proposer's read-only stand-in).
    b = 1
    outs = (np.zeros((b, k), np.int32), np.zeros((b, k), np.int32), np.zeros((b, k), np.float32),
            np.zeros(b, np.int64), np.zeros(b, np.float64), np.zeros(b, np.int64),
            np.zeros(b, np.int64))
    pending = (np.zeros((b, k), np.int32), np.zeros((b, k), np.int32),
               np.zeros((b, k), np.int32), np.zeros(b, np.int64), np.zeros(b, np.int64))
    scratch = (np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.float32)) * 2
    table, state = cal.new_table(), cal.new_state(0.03)
    roots = np.array([root], np.int32)
    req = np.zeros(b, np.int64)
    cross_roots = np.full((b, 1), root, np.int64)
    ro = _readonly(nodes, hkeys, hvals, arena, seqs, active)
    for flags, tree in ((pr.DEFAULT_POLICY, False), (pr.DEFAULT_POLICY, True),
                        (pr.COUNTS_POLICY, False)):
        pr.propose_batch(*ro, roots, *ro, cross_roots, *ro, cross_roots,
                         depth, req, req, np.zeros(b, np.int64), np.full(b, k, np.int64),
                         1.0, 0.0, 0.1, tree, flags, table, state, *outs, *pending,
                         np.zeros((b, k), np.int32), *scratch, np.empty(k, np.int32),
                         *heap)
    step("learning")
    cal.learn(table, state, *pending, req, tokens, np.array([0, 2], np.int64),
              np.empty(k, np.int64), np.empty(k, np.bool_))
    step("maintenance")
    keys2, vals2 = np.full(256, si.EMPTY, np.int64), np.full(256, -1, np.int32)
    si.rehash(hkeys, hvals, keys2, vals2, meta)
    path = np.zeros(depth + 1, np.int32)
    si.remove_seq(meta, nodes, hkeys, hvals, arena, seqs, 0, path)
    si.move_seq(arena, seqs, meta, 0, 40, 8)
    si.compact_arena(arena, seqs, meta)
    si.drop_tree(meta, nodes, hkeys, hvals, root)
    step("input checks")
    for dtype in (np.int32, np.int64, np.uint32, np.int16, np.uint8):
        token_checks.first_bad_token(tokens.astype(dtype))
        token_checks.first_bad_token(_readonly(tokens.astype(dtype))[0])
    lps = np.empty(4, np.int32)
    ngram.ngram_propose(tokens, tokens.shape[0], 1, 3, k, lps, out_t)
    _done = True
    return time.perf_counter() - t0


KERNELS = (si.rehash, si.new_root, si.extend, si.extend_batch, si.remove_seq, si.drop_tree, si.move_seq,
           si.compact_arena, si.longest_match, si.draft_path, si.draft_tree, si.continuations,
           si.check_integrity, pr.propose_batch, cal.learn, ngram.ngram_propose,
           token_checks.first_bad_token)
