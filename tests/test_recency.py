"""The recency candidate: the latest earlier occurrence, its path, and the proposer option."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.index import SuffixIndex
from suffixspec.native import calibration as cal
from suffixspec.native import layout as lay
from suffixspec.native.recency import WINDOW, draft_recent, latest_occurrence

SLOW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(st.lists(st.integers(0, 2), min_size=1, max_size=60), st.integers(0, 5),
       st.integers(1, 6))
def test_latest_occurrence_equals_a_backward_scan(tokens, start, length):
    arena = np.array(tokens, np.int32)
    end = arena.shape[0]
    start = min(start, end)
    expect = -1
    if end - length >= start:
        pattern = tokens[end - length:]
        for e in range(end - 1, start + length - 1, -1):
            if tokens[e - length:e] == pattern and end - e <= WINDOW:
                expect = e
                break
    assert latest_occurrence(arena, start, end, length) == expect


@SLOW
@given(st.lists(st.integers(0, 3), min_size=2, max_size=50))
def test_recent_path_follows_the_latest_occurrence_in_the_trie(tokens):
    ix = SuffixIndex(max_depth=8)
    tree = ix.add_tree()
    s = ix.add_sequence(tree)
    ix.extend(s, np.array(tokens, np.int32))
    ix.check_integrity()
    end = len(tokens)
    for length in range(1, min(7, end)):
        e = latest_occurrence(ix.arena, 0, end, length)
        match = ix.match(tree, np.array(tokens[end - length:], np.int32))
        if e < 0 or match is None:
            continue
        cand = lay.candidate(8)
        stats = cal.new_stats(0.0)
        n, gain = draft_recent(ix.arrays(), match.node, match.offset, (e, end), 8, 0.0, 0,
                               cal.SRC_RECENT, length, tuple(stats), cand)
        # What followed there, cut only by the end and the depth bound (the
        # trie holds strings of at most 8 tokens; the cap of 8 never binds).
        follow = tokens[e:end][:8 - length]
        assert cand.tokens[:n].tolist() == follow
        assert cand.parents[:n].tolist() == list(range(-1, n - 1))
        assert all(cand.probs[i + 1] <= cand.probs[i] for i in range(n - 1))
        assert abs(gain - float(cand.probs[:n].sum())) < 1e-5


def test_a_trusted_recency_source_drafts_what_followed_last():
    # "1 2 3" was followed by 7, 7, then 8: the counts pick 7, recency 8.
    tokens = [1, 2, 3, 7, 9, 1, 2, 3, 7, 9, 1, 2, 3, 8, 9, 1, 2, 3]
    drafts = []
    for recency in (False, True):
        p = SuffixProposer(max_depth=16, max_spec_tokens=4, recency=recency,
                           cross_pool_tokens=0)
        # Outcomes so far said: recency's tokens are always accepted.
        table = p.stats.table
        for c in range(1, 7):
            for n in range(c, 7):
                for m in range(1, 8):
                    fine = cal.bucket(cal.SRC_RECENT, m, 0, c, n)
                    table[cal.coarse_of(fine)] = (1000.0, 1000.0)
        p.start_request("r", tokens)
        drafts.append(p.propose(["r"])[0].token_ids.tolist())
    assert drafts[0][0] == 7
    assert drafts[1] == [8, 9, 1, 2]
