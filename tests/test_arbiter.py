"""The arbiter: the policy's pick or the reference, learned from both drafts'
outcomes (``native.arbiter``, ``ProposerConfig.arbitrate``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.native import arbiter
from suffixspec.native import calibration as cal
from suffixspec.native import layout as lay

K = 5


def _accepted_brute(draft, truth):
    """Accepted tokens of a path draft, and whether ``truth`` (what followed so
    far) already fixes that number."""
    n = 0
    for want, got in zip(draft, truth):
        if want != got:
            return n, True
        n += 1
    return n, n == len(draft)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=40), st.data())
def test_settle_scores_exactly_the_final_drafts_and_keeps_the_rest(tokens, data):
    """``settle`` against a brute force: every kept pair whose drafts' accepted
    lengths are fixed by the tokens so far is scored (value = accepted less the
    threshold per drafted token) in its cell and freed; the others wait."""
    rows = 2
    pend = lay.pending(rows, K)
    s = data.draw(st.integers(0, rows - 1))
    off = 3
    arena = np.array([7] * off + tokens + [7] * 4, np.int32)
    length = len(tokens)
    thr = data.draw(st.sampled_from([0.0, 0.125]))
    kept = []
    for _ in range(data.draw(st.integers(0, arbiter.ring(K)))):
        start = data.draw(st.integers(0, length))
        pick = data.draw(st.lists(st.integers(0, 2), max_size=K))
        ref = data.draw(st.lists(st.integers(0, 2), max_size=K))
        row = data.draw(st.integers(0, arbiter.ARB_ROWS - 1))
        arbiter.keep(pend.keep_meta, pend.keep_tokens, s, start, row, np.array(pick, np.int32),
                     len(pick), np.array(ref, np.int32), len(ref))
        kept.append((start, row, pick, ref))
    want = np.zeros_like(pend.arbiter)
    waiting = 0
    for start, row, pick, ref in kept:
        truth = tokens[start:length]
        got_p, final_p = _accepted_brute(pick, truth)
        got_r, final_r = _accepted_brute(ref, truth)
        if final_p and final_r:
            want[row] += (got_r - thr * len(ref), got_p - thr * len(pick), 1.0)
        else:
            waiting += 1
    arbiter.settle(pend.arbiter, pend.keep_meta, pend.keep_tokens, s, arena, off, length, thr)
    np.testing.assert_allclose(pend.arbiter, want)
    assert (pend.keep_meta[s, :, arbiter.K_START] >= 0).sum() == waiting
    assert (pend.keep_meta[1 - s, :, arbiter.K_START] < 0).all()  # the other row untouched


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, K + 1), st.integers(0, K), st.integers(0, K)),
                min_size=1, max_size=60))
def test_a_ring_of_k_plus_one_slots_loses_no_pair(steps):
    """Each step keeps a pair of drafts of at most K tokens, then at least one
    token follows: every pair is scored once K tokens have followed it, so no
    pair is ever given up for room."""
    pend = lay.pending(1, K)
    arena = np.zeros(1000, np.int32)  # drafts of 1s never match: each is final at once
    length = 0
    kept = 0
    for emitted, n_pick, n_ref in steps:
        arbiter.settle(pend.arbiter, pend.keep_meta, pend.keep_tokens, 0, arena, 0, length, 0.0)
        assert (pend.keep_meta[0, :, arbiter.K_START] >= 0).sum() < arbiter.ring(K)
        arbiter.keep(pend.keep_meta, pend.keep_tokens, 0, length, 0, np.zeros(K, np.int32),
                     n_pick, np.zeros(K, np.int32), n_ref)  # zeros: they match the arena
        kept += 1
        length += emitted
    arbiter.settle(pend.arbiter, pend.keep_meta, pend.keep_tokens, 0, arena, 0, length + K, 0.0)
    assert pend.arbiter[:, arbiter.A_SCORED].sum() == kept


def test_cells_are_distinct_rows():
    seen = set()
    for source in range(arbiter.N_SOURCES):
        for m in range(arbiter.N_MATCH):
            for r in range(1, arbiter.N_REFERENCE + 1):
                for later in range(arbiter.N_PART):
                    seen.add(arbiter.cell(m, 1, source, r, later))
    for r in range(1, arbiter.N_REFERENCE + 1):
        for later in range(arbiter.N_PART):
            seen.add(arbiter.cell(0, 0, 0, r, later))  # no pick
    assert seen == set(range(arbiter.ARB_ROWS))


# A context whose counts say "1 2 3 -> 4" (three times) while the newest
# occurrence of "1 2 3" went on "5 6": the pick and the reference part at once.
STALE = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 9, 1, 2, 3]


def _proposer(**kw) -> SuffixProposer:
    p = SuffixProposer(max_depth=16, max_spec_tokens=4, draft_cost=0.0, **kw)
    p.start_request("r", STALE)
    return p


def test_the_reference_is_drafted_where_its_cell_leads():
    pick = _proposer().propose(["r"])[0]
    assert pick.token_ids[0] == 4
    p = _proposer()
    p.pending.arbiter[:, arbiter.A_REFERENCE] = 1.0  # the reference leads in every cell
    d = p.propose(["r"])[0]
    assert d.token_ids.tolist()[:2] == [5, 6] and d.source == "request"
    row = p.requests.requests["r"][1]
    assert (p.pending.buckets[row, :len(d)] == -1).all()  # not the policy's pick
    before = p.stats.table.copy()
    p.extend("r", [5, 6, 9])
    np.testing.assert_array_equal(p.stats.table, before)  # the calibration learns none of it
    off = _proposer(arbitrate=False)
    off.pending.arbiter[:, arbiter.A_REFERENCE] = 1.0
    assert off.propose(["r"])[0].token_ids[0] == 4  # no arbiter: the pick


def _first_tokens(arbitrate: bool):
    """First drafted tokens while "1 2 3" keeps going on "5 6" as its newest
    occurrence did, against 60 older "1 2 3 4": the pick (counts: 4) and the
    reference (5) part at their first token.  Returns them and the proposer."""
    context = []
    for i in range(60):
        context += [200 + i, 1, 2, 3, 4]
    context += [300, 1, 2, 3, 5, 6, 301, 1, 2, 3]
    p = SuffixProposer(max_depth=16, max_spec_tokens=4, draft_cost=0.0, arbitrate=arbitrate)
    p.start_request("r", context)
    firsts = []
    for i in range(12):
        d = p.propose(["r"])[0]
        firsts.append(int(d.token_ids[0]) if len(d) else -1)
        p.extend("r", [5, 6, 400 + i, 1, 2, 3])
    return firsts, p


def test_the_arbiter_learns_where_the_reference_wins():
    """One scored step is enough for the pick's cell to prefer the reference,
    which it then drafts; the calibration alone needs two rejections."""
    on, p = _first_tokens(True)
    off, _ = _first_tokens(False)
    assert on[0] == off[0] == 4
    assert on[1] == 5 and off[1] == 4
    assert on[2:] == [5] * 10
    row = arbiter.cell(3, 4, lay.FROM_REQUEST, 3, 0)
    assert arbiter.prefers_reference(p.pending.arbiter, row)
    assert p.pending.arbiter[row, arbiter.A_SCORED] >= 1


def test_without_a_reference_nothing_is_kept():
    p = SuffixProposer(max_depth=16, max_spec_tokens=4, draft_cost=0.0, newest_window=0)
    p.start_request("r", STALE)
    for _ in range(5):
        p.propose(["r"])
        p.extend("r", [5, 6, 9, 1, 2, 3])
    assert (p.pending.keep_meta[:, :, arbiter.K_START] < 0).all()
    assert p.pending.arbiter.sum() == 0


def test_a_new_request_does_not_inherit_kept_drafts():
    p = SuffixProposer(max_depth=16, max_spec_tokens=4)
    p.pending.keep_meta[:, :, arbiter.K_START] = 0  # every row's ring full of a past request's
    p.start_request("q", [4, 4, 4])
    row = p.requests.requests["q"][1]
    assert (p.pending.keep_meta[row, :, arbiter.K_START] < 0).all()


def test_the_arbiter_table_survives_more_requests_than_rows():
    p = _proposer()
    p.pending.arbiter[3] = (2.0, 1.0, 3.0)
    for n in range(200):  # the pending rows grow
        p.start_request(n, [1, 2, 3])
    assert p.pending.arbiter[3].tolist() == [2.0, 1.0, 3.0]
    assert p.pending.keep_meta.shape[0] > 200


def test_calibration_learns_nothing_from_tokens_without_a_bucket():
    stats = cal.new_stats(0.0)
    pend = lay.pending(1, 3)
    pend.n[0] = 2
    pend.tokens[0, :2] = (5, 6)
    pend.parents[0, :2] = (-1, 0)
    pend.buckets[0, :2] = -1
    cal.learn(tuple(stats), tuple(pend), np.array([0]), np.array([5, 7], np.int32),
              np.array([0, 2]), np.empty(3, np.int64), np.empty(3, np.bool_))
    assert stats.table.sum() == 0 and pend.recent[0] == cal.RECENT_PARTLY

