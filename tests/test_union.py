"""Drafting from several indexes at once equals drafting from one index over all their sequences."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.fingerprint import TokenizerId
from suffixspec.index import SuffixIndex
from suffixspec.native import calibration as cal
from suffixspec.native import layout as lay
from suffixspec.native.calibrated import draft_path
from suffixspec.native.union import (NOWHERE, advance, best_next, bound_next, counts_of, position,
                                     table)
from suffixspec.pools.persistent import PersistentPool

SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DEPTH = 8


def _index(seqs):
    ix = SuffixIndex(max_depth=DEPTH)
    tree = ix.add_tree()
    for tokens in seqs:
        s = ix.add_sequence(tree)
        ix.extend(s, np.array(tokens, np.int32))
        ix.close(s)
    ix.check_integrity()
    return ix, tree


def _at(ix, tree, query):
    """The position where ``query`` ends in the tree, or nowhere."""
    m = ix.match(tree, np.array(query, np.int32))
    if m is None or m.length != len(query):
        return NOWHERE
    return position(ix.arrays(), m.node, m.offset)


def _next_counts(ix, tree, query) -> dict[int, int]:
    m = ix.match(tree, np.array(query, np.int32))
    if m is None or m.length != len(query):
        return {}
    tokens, counts = ix.continuations(m)
    return dict(zip(tokens.tolist(), counts.tolist()))


sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=1,
                     max_size=8)
#: Sequences dealt to sides: side 0 and up to three segments (some may be empty).
dealt = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=20),
                           st.integers(0, 3)), min_size=1, max_size=10)


def _sides(items, query):
    """The side table (side 0 first) of ``items`` dealt to the sides, the
    positions of ``query``, and the indexes (the table names their arrays:
    they must outlive its use)."""
    built = [_index([t for t, k in items if k == side]) if any(k == side for _, k in items)
             else _index([]) for side in range(4)]
    pos = np.array([_at(ix, tree, query) for ix, tree in built], np.int64)
    return table([ix.read_only_arrays() for ix, _ in built]), pos, built


@SLOW
@given(dealt, st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_best_next_over_several_indexes_equals_one_index(items, query):
    sides, pos, _held = _sides(items, query)
    c, tc = _index([t for t, _ in items])
    pc = _at(c, tc, query)
    tok, k, n = best_next(sides, pos, 0)
    one = _next_counts(c, tc, query)
    if pc[0] < 0:
        assert (pos[:, 0] < 0).all() and n <= 0
        return
    if not one:  # the string only ends sequences
        assert k <= 0
        return
    assert n == c.nodes[pc[0], lay.COUNT]
    assert k == max(one.values()) and one[tok] == k
    for t in range(5):  # any token's counts, as the reference walks them
        assert counts_of(sides, pos, t, 0) == (one.get(t, 0), n)
    # The bound is one: never below the true count.
    if (pos[:, 0] >= 0).sum() > 1:
        bound, n2 = bound_next(sides, pos, 0)
        assert n2 == n and k <= bound <= n


@SLOW
@given(dealt, st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_path_over_several_indexes_equals_one_index_until_a_tie(items, query):
    sides, pos, _held = _sides(items, query)
    c, tc = _index([t for t, _ in items])
    pc = _at(c, tc, query)
    if pc[0] < 0:
        return
    stats = tuple(cal.new_stats(0.0))
    many, one = lay.candidate(DEPTH), lay.candidate(DEPTH)
    no_ref = np.zeros(1, np.int64)
    last = np.int64(query[-1])  # what the draft follows
    n2, _ = draft_path(sides, pos, DEPTH, 0.0, 0, cal.SRC_CROSS, len(query), stats, -1.0, many,
                       (no_ref, False), last)
    n1, _ = draft_path(table([c.read_only_arrays()]), np.array([pc], np.int64), DEPTH, 0.0, 0,
                       cal.SRC_CROSS, len(query), stats, -1.0, one, (no_ref, False), last)
    # Token by token, as long as the most frequent next token is unique.
    prefix = list(query)
    for i in range(max(n1, n2)):
        counts = _next_counts(c, tc, prefix)
        top = max(counts.values(), default=0)
        if sum(v == top for v in counts.values()) != 1:
            break
        assert i < n1 and i < n2
        assert many.tokens[i] == one.tokens[i] and many.probs[i] == one.probs[i]
        prefix.append(int(one.tokens[i]))
    # The shared position walk agrees with a fresh match.
    p = pc
    for t in one.tokens[:n1].tolist():
        p = advance(c.arrays(), p[0], p[1], p[2], t)
        assert p[0] >= 0


def test_a_pool_drafts_from_its_snapshot_and_new_outputs_counted_together(tmp_path):
    """7 follows twice in the snapshot, 9 twice after it, 8 once in each: together 8 leads."""
    tok = TokenizerId(name="test", fingerprint="0" * 16, vocab_size=100)
    pool = PersistentPool(tmp_path / "p.lmdb", tok, max_depth=16)
    for out in ([1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8]):
        pool.add(np.array(out, np.int32), "default")
    pool.write_snapshot()
    for out in ([1, 2, 3, 9], [1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 3, 8]):
        pool.add(np.array(out, np.int32), "default")
    assert len(pool.view.segments) == 1
    drafts = {}
    for name, cross in (("pool", pool), ("memory", None)):
        p = SuffixProposer(max_depth=16, max_spec_tokens=1, draft_cost=0.0, pool=cross,
                           tokenizer=tok if cross is not None else None, anchors=False,
                           cross_pool_tokens=None)
        if cross is None:
            for n, out in enumerate([[1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 3, 9],
                                     [1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 3, 8]]):
                p.cross.add(np.array(out, np.int32), "default")
        p.start_request("q", [5, 1, 2, 3])
        drafts[name] = p.propose(["q"])[0]
    assert drafts["pool"].token_ids.tolist() == drafts["memory"].token_ids.tolist() == [8]
    assert drafts["pool"].score == drafts["memory"].score
    pool.close()


def test_a_pool_of_several_segments_drafts_as_one_index(tmp_path):
    """Three segments of unlike sizes (never merged) and new outputs, against an in-memory pool."""
    tok = TokenizerId(name="test", fingerprint="0" * 16, vocab_size=100)
    rng = np.random.default_rng(7)
    outs = [rng.integers(0, 6, rng.integers(3, 12)).astype(np.int32) for _ in range(90)]
    pool = PersistentPool(tmp_path / "p.lmdb", tok, max_depth=16)
    memory = SuffixProposer(max_depth=16, max_spec_tokens=1, draft_cost=0.0, anchors=False,
                            cross_pool_tokens=None)
    for lo, hi in ((0, 60), (60, 75), (75, 80), (80, 90)):  # the last stays in memory
        for out in outs[lo:hi]:
            pool.add(out, "default")
            memory.cross.add(out, "default")
        if hi < 90:
            pool.write_snapshot()
    assert len(pool.view.segments) == 3 and pool.store.snapshot().segments[0].last == 60
    assert pool.tokens == memory.cross.tokens
    segmented = SuffixProposer(max_depth=16, max_spec_tokens=1, draft_cost=0.0, pool=pool,
                               tokenizer=tok, anchors=False, cross_pool_tokens=None)
    drafted = 0
    for i in range(40):
        context = rng.integers(0, 6, 6).tolist()
        for p in (segmented, memory):
            p.start_request(i, context)
        a, b = segmented.propose([i])[0], memory.propose([i])[0]
        # Equal counts give equal probabilities; equally frequent tokens may differ.
        assert (a.score, a.match_len, len(a.token_ids)) == (b.score, b.match_len,
                                                            len(b.token_ids))
        drafted += len(a.token_ids)
        for p in (segmented, memory):
            p.finish_request(i)
    assert drafted > 20
    pool.close()
