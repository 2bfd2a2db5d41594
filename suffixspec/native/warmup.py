"""Compile every kernel once, in named steps, on the arrays serving passes.

Numba compiles on first call (or loads its on-disk cache, ``cache=True``);
calling ``warmup()`` at start-up keeps that out of the first engine step.
Each step compiles the kernels of one job, for exactly the argument types
the package passes them (read-only variants included: a persistent pool
hands the query kernels views of read-only buffers), so serving compiles
nothing more.  A command can ready only the steps it needs.
"""

import time
from contextlib import nullcontext

import numpy as np
from numba.core import event

from . import arbiter, calibration as cal, held, layout as lay, ngram, partition, propose
from . import query, trie, union, vllm_suffix, windows
from . import tokens as token_checks
from .cache import drop_cache, record_cache_files

_done: set[str] = set()

DEPTH, K = 4, 4


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


def _tiny_index() -> tuple[lay.Index, int]:
    """An index with one empty tree and one open sequence in it, and the tree's root."""
    meta = np.zeros(lay.META_SIZE, np.int64)
    meta[lay.META_DEPTH] = DEPTH
    meta[lay.META_FREE_HEAD] = -1
    ix = lay.Index(meta, np.full((64, lay.NODE_FIELDS), -1, np.int32),
                   np.full(128, lay.EMPTY, np.int64), np.full(128, -1, np.int32),
                   np.zeros(64, np.int32), np.zeros((2, lay.SEQ_FIELDS), np.int64),
                   np.zeros((2, DEPTH), np.int32))
    root = trie.new_root(ix.nodes, ix.meta)
    ix.seqs[0, lay.SEQ_CAP] = 32
    ix.seqs[0, lay.SEQ_ROOT] = root
    ix.seqs[0, lay.SEQ_STATE] = lay.SEQ_LIVE
    ix.meta[lay.META_ARENA_TOP] = 32
    return ix, root


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


TOKENS = np.array([1, 2, 3, 1, 2, 4, 1, 2], np.int32)


def _indexing(ix, root):
    # The range check of the engine's own token arrays (``suffixspec.tokens``:
    # writeable int32 only) that precedes indexing them.
    token_checks.first_bad_token(TOKENS)
    flat = tuple(ix)  # kernels that change an index take it plain (see ``layout``)
    trie.extend(flat, 0, TOKENS)  # writeable tokens only (see ``SuffixIndex.extend``)
    trie.extend_batch(flat, np.zeros(1, np.int64), TOKENS[:2], np.array([0, 2], np.int64),
                      np.zeros(2, np.int64))


def _queries(ix, root):
    work = lay.workspace(K)
    ctx = np.array([1, 2], np.int32)
    own = (np.int64(-1), np.int64(0), np.int64(0))
    for index in (ix, lay.read_only(ix)):
        for c in (ctx, _readonly(ctx)):
            length, x, off = trie.longest_match(index, root, c, 0, 2, DEPTH, True, own)
            query.draft_path(index, x, off, K, 0.1, work.cand.tokens, work.cand.probs, 1)
            query.draft_tree(index, x, off, K, 0.1, work.cand.tokens, work.cand.parents,
                             work.cand.probs, work.heap)
            trie.continuations(index, x, off, np.empty(4, np.int32), np.empty(4, np.int64))


def _batch(ix, root, b: int = 2):
    """A read-only index and a step of ``b`` requests, as the proposer passes them."""
    rows = np.zeros((3, b), np.int64)
    rows[2] = -1
    cross_roots = np.full((b, 1, 1 + lay.SEGMENTS), root, np.int64)
    return (tuple(lay.read_only(ix)),
            (rows[1], rows[0], rows[2], np.full(b, K, np.int64), cross_roots))


def _drafting(ix, root):
    # One batched step drafting paths and one drafting trees, for two
    # requests, with records as plain tuples and batch fields as contiguous
    # rows, exactly as the proposer passes them; snapshot segments pass as a
    # side table (``union``).
    b = 2
    ro, batch = _batch(ix, root, b)
    stats = cal.new_stats(0.0)  # any cost: this only compiles
    out, pending, work = lay.outputs(b, K), lay.pending(b, K), lay.flat(lay.workspace(K))
    kept = held.hold(tuple(stats), tuple(out), tuple(pending), work)
    for tree in (False, True):
        knobs = (DEPTH, 1.0, 0.0, 0.1, tree, True, 64, True)
        indexes = held.reading(ro, np.array([root], np.int32), union.table([ro] * lay.SEGMENTS),
                               ro)
        propose.propose_batch(indexes, batch, knobs, kept)


def _windows(ix, root):
    # Candidate windows and one-token paths for the device (``suffixspec.device``),
    # with the records and side tables the proposer passes.
    b = 2
    ro, batch = _batch(ix, root, b)
    knobs = (DEPTH, 1.0, 0.0, 0.1, False, True, 0, False)
    sides = union.table([ro] * lay.SEGMENTS)
    windows.build_batch(ro, np.array([root], np.int32), sides, ro, batch, knobs,
                        tuple(cal.new_stats(0.0)), tuple(lay.pending(b, K)),
                        lay.flat(lay.workspace(K)), tuple(lay.windows(b, 2, 16)), 2)
    w = 4
    windows.one_token_paths(union.table([ro] * (1 + lay.SEGMENTS)),
                            np.full(1 + lay.SEGMENTS, root, np.int64), DEPTH,
                            np.zeros(0, np.int64), np.zeros(8, np.bool_), np.zeros(8, np.int32),
                            np.zeros((8, w), np.int32), np.zeros((8, w), np.int32),
                            np.zeros((8, w), np.int32))
    entries = np.zeros((6, 16), np.int32)  # a finished output for the device corpus
    vllm_suffix.pack_doc(TOKENS, 0, 0, 16, *entries)
    # The host's part of each device step: the threshold shipped with the
    # windows, the table rows its drafts touch, and the device's pairs of
    # drafts adopted (none in range here).
    pending = lay.pending(b, K)
    cal.threshold(cal.new_stats(0.0).state)
    cal.touched_rows(np.zeros((b, K), np.int32), np.zeros((b, K), np.int32),
                     np.zeros(b, np.int32), np.ones(b, np.int32), cal.NO_KINDS,
                     np.zeros(7 * b * K, np.int64))
    arbiter.adopt(pending.arbiter, pending.keep_meta, pending.keep_tokens,
                  np.zeros(b, np.int64), ix.arena, np.zeros(b, np.int64), np.zeros(b, np.int64),
                  0.0, np.full((b, 3), -1, np.int64), np.zeros((b, 2, K), np.int64))
    # The Numba twins of the device's scans and corpus (drafting on CPU tensors,
    # and ``device.replay``), over a small corpus ring.
    ring, state = np.full(64, -1, np.int32), np.zeros(2, np.int64)
    table = np.full((2, vllm_suffix.buckets_for(ring.shape[0]), vllm_suffix.SLOTS), -1, np.int64)
    vllm_suffix.ingest(ring, table, state, TOKENS, 0, TOKENS.shape[0])
    vllm_suffix.local_match(TOKENS, TOKENS.shape[0], DEPTH)
    vllm_suffix.family_match(TOKENS, TOKENS.shape[0], TOKENS, TOKENS.shape[0], DEPTH)
    vllm_suffix.corpus_draft(TOKENS, TOKENS.shape[0], ring, table, DEPTH, K,
                             np.zeros(K, np.int64), np.zeros((K, 2), np.int64))


def _learning(ix, root):
    stats, pending = tuple(cal.new_stats(0.0)), tuple(lay.pending(1, K))
    seqs, offsets = np.zeros(1, np.int64), np.array([0, 2], np.int64)
    scratch = (np.empty(K, np.int64), np.empty(K, np.bool_))
    cal.learn(stats, pending, seqs, TOKENS, offsets, *scratch)
    # A step's scoring and indexing in one call, as the proposer makes it
    # (its own sequence in one index, no output sequence in the other).
    flat = tuple(ix)
    kept = held.hold(stats, tuple(lay.outputs(1, K)), pending, lay.flat(lay.workspace(K)))
    indexes = held.appending(flat, np.zeros(2, np.int64), flat, np.zeros(2, np.int64))
    propose.learn_and_extend(kept, indexes, seqs, np.full(1, -1, np.int64), TOKENS[:2].copy(),
                             offsets, *scratch)


def _maintenance(ix, root):
    flat = tuple(ix)
    trie.extend(flat, 0, TOKENS)
    keys2, vals2 = np.full(256, lay.EMPTY, np.int64), np.full(256, -1, np.int32)
    trie.rehash(ix.hkeys, ix.hvals, keys2, vals2, ix.meta)
    trie.remove_seq(flat, 0, np.zeros(DEPTH + 1, np.int32))
    trie.move_seq(ix.arena, ix.seqs, ix.meta, 0, 40, 8)
    trie.compact_arena(ix.arena, ix.seqs, ix.meta, np.argsort(ix.seqs[:, lay.SEQ_OFF]))
    # A snapshot build: partitions (writable ``keep``), laid together.
    trie.extend_part(flat, 0, TOKENS, np.ones(4, np.bool_))
    partition.index_run(flat, np.int64(1), np.zeros(2, np.int64), np.zeros(1, np.int64),
                        np.ones(4, np.bool_))
    nodes = ix.nodes.copy()
    partition.relabel(nodes, np.int64(0), np.full(nodes.shape[0], -1, np.int64), np.int64(-1))
    partition.copy_entries(_readonly(ix.hkeys), _readonly(ix.hvals),
                           np.zeros(nodes.shape[0], np.bool_), np.int64(0), keys2, vals2)
    partition.join_roots(nodes, np.int64(root), np.full(1, -1, np.int64), keys2, vals2)
    trie.drop_tree(flat, root)
    for dtype in (np.int32, np.int64):  # growing an index's arrays (``index._grown``)
        trie.grow_into(np.empty(4, dtype), np.zeros(2, dtype), dtype(-1))


def _checks(ix, root):
    flat = tuple(ix)
    trie.extend(flat, 0, TOKENS)
    assert trie.check_integrity(flat) == 0
    ngram.ngram_propose(TOKENS, TOKENS.shape[0], 1, 3, K, np.empty(4, np.int32),
                        np.empty(K, np.int32))


_STEPS = {"indexing": _indexing, "queries": _queries, "drafting": _drafting,
          "learning": _learning, "maintenance": _maintenance, "checks": _checks,
          "windows": _windows}

#: What ``warmup`` compiles by default, in order (``progress`` is told each as it
#: begins): all the host needs.  ``DEVICE``: what drafting on the device adds
#: (``suffixspec.device``; compiled when it starts, or by ``suffixspec warmup``).
DEVICE = ("windows",)
STEPS = tuple(name for name in _STEPS if name not in DEVICE)

#: What serving (``SuffixProposer``, the CLI's replay) calls; the rest (the
#: index's query API, integrity checks, the prompt-lookup baseline) compiles
#: on first use, and ``DEVICE`` when drafting on the device starts.
SERVING = ("indexing", "drafting", "learning", "maintenance")


def warmup(progress=None, cached_only: bool = False, steps=STEPS) -> float:
    """Compile (or load) the kernels of ``steps``; returns the seconds it took.

    ``progress(step)``, if given, is called as each step begins.
    ``cached_only``: load from Numba's on-disk cache only, and raise
    ``NotCached`` (at once, compiling nothing) when a kernel is not there;
    the kernels loaded so far stay loaded.  A step done once is not done
    again.  A cache file that cannot be read (cut short, damaged) empties
    this package's cache: the step compiles afresh, or with ``cached_only``
    raises ``NotCached``.
    """
    unknown = set(steps) - set(_STEPS)
    if unknown:
        raise ValueError(f"unknown warmup steps {sorted(unknown)}; they are {', '.join(_STEPS)}")
    t0 = time.perf_counter()
    wrote = False
    with event.install_listener("numba:compile", _RefuseCompiles()) if cached_only \
            else nullcontext():
        for name in _STEPS:
            if name not in steps or name in _done:
                continue
            if progress is not None:
                progress(name)
            try:
                _STEPS[name](*_tiny_index())
            except NotCached:
                raise
            except Exception as e:  # a damaged cache file (Numba raises as it loads it)
                drop_cache()
                if cached_only:
                    raise NotCached(f"a cache file could not be read ({e!r})") from e
                _STEPS[name](*_tiny_index())
            _done.add(name)
            wrote = True
    if wrote and not cached_only:
        record_cache_files()
    return time.perf_counter() - t0


KERNELS = (trie.rehash, trie.new_root, trie.extend, trie.extend_batch, trie.remove_seq,
           trie.drop_tree, trie.move_seq, trie.grow_into, trie.compact_arena, trie.longest_match,
           trie.extend_part, partition.index_run, partition.relabel, partition.copy_entries, partition.join_roots,
           query.draft_path, query.draft_tree, trie.continuations, trie.check_integrity,
           propose.propose_batch, cal.learn, propose.learn_and_extend, held.hold,
           held.reading, held.appending,
           windows.build_batch, windows.one_token_paths, cal.touched_rows,
           ngram.ngram_propose, token_checks.first_bad_token, vllm_suffix.pack_doc)
