"""Drafting from two indexes at once equals drafting from one index over all their sequences."""

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
from suffixspec.native.union import NOWHERE, advance, best_next, position
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


@SLOW
@given(sequences, sequences, st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_best_next_over_two_indexes_equals_one_index(seqs_a, seqs_b, query):
    (a, ta), (b, tb), (c, tc) = _index(seqs_a), _index(seqs_b), _index(seqs_a + seqs_b)
    pa, pb, pc = _at(a, ta, query), _at(b, tb, query), _at(c, tc, query)
    tok, k, n = best_next(a.arrays(), pa, b.arrays(), pb, 0)
    one = _next_counts(c, tc, query)
    if pc[0] < 0:
        assert pa[0] < 0 and pb[0] < 0 and n <= 0
        return
    if not one:  # the string only ends sequences
        assert k <= 0
        return
    assert n == c.nodes[pc[0], lay.COUNT]
    assert k == max(one.values()) and one[tok] == k


@SLOW
@given(sequences, sequences, st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_path_over_two_indexes_equals_one_index_until_a_tie(seqs_a, seqs_b, query):
    (a, ta), (b, tb), (c, tc) = _index(seqs_a), _index(seqs_b), _index(seqs_a + seqs_b)
    pc = _at(c, tc, query)
    if pc[0] < 0:
        return
    stats = tuple(cal.new_stats(0.0))
    two, one = lay.candidate(DEPTH), lay.candidate(DEPTH)
    n2, _ = draft_path(a.arrays(), _at(a, ta, query), b.arrays(), _at(b, tb, query), DEPTH,
                       0.0, 0, cal.SRC_CROSS, len(query), stats, -1.0, two)
    n1, _ = draft_path(c.arrays(), pc, c.arrays(), NOWHERE, DEPTH, 0.0, 0, cal.SRC_CROSS,
                       len(query), stats, -1.0, one)
    # Token by token, as long as the most frequent next token is unique.
    prefix = list(query)
    for i in range(max(n1, n2)):
        counts = _next_counts(c, tc, prefix)
        top = max(counts.values(), default=0)
        if sum(v == top for v in counts.values()) != 1:
            break
        assert i < n1 and i < n2
        assert two.tokens[i] == one.tokens[i] and two.probs[i] == one.probs[i]
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
    assert pool.base is not None
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
