"""The calibrated policy: start anchors, online calibration, cost-aware length."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.anchors import BOS, anchor_count, start_anchors
from suffixspec.native import calibration as cal
from suffixspec.native.tokens import SYNTHETIC_BASE
from suffixspec.pools.memory import CrossPool

import naive_device as naive

SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_anchors_are_synthetic_and_keyed_by_the_prompt():
    a = start_anchors(np.arange(100, dtype=np.int32))
    b = start_anchors(np.concatenate([np.arange(64, dtype=np.int32), [7, 7]]).astype(np.int32))
    assert a.dtype == np.int32 and (a >= SYNTHETIC_BASE).all() and a[-1] == BOS
    assert a[1] == b[1] and a[0] != b[0]  # same first 64 tokens, different prompts
    assert start_anchors(None).tolist() == [BOS]
    assert anchor_count(np.concatenate([a, [1, 2]]).astype(np.int32)) == 3


@SLOW
@given(st.data())
def test_anchored_query_finds_exactly_the_outputs_with_that_start(data):
    """[keys, BOS, out[:i]] is followed by output[i] of exactly the outputs starting with out[:i]."""
    prompts = data.draw(st.lists(st.lists(st.integers(0, 3), max_size=70), min_size=1,
                                 max_size=3))
    items = data.draw(st.lists(st.tuples(st.integers(0, len(prompts) - 1),
                                         st.lists(st.integers(0, 3), min_size=1, max_size=12)),
                               min_size=1, max_size=12))
    pool = CrossPool(max_depth=16, max_tokens=None)
    keyed = [(start_anchors(np.asarray(prompts[p], np.int32)), np.asarray(o, np.int32))
             for p, o in items]
    for anchors, out in keyed:
        pool.add(out, "ns", anchors)
        pool.delta.index.check_integrity()
    ix = pool.delta.index
    tree = pool.delta.trees["ns"]
    q_anchors, q_out = data.draw(st.sampled_from(keyed))
    i = data.draw(st.integers(0, q_out.shape[0]))
    prefix = q_out[:i]
    for level in (3, 2, 1):  # whole-prompt key, prompt-start key, BOS only
        query = np.concatenate([q_anchors[3 - level:], prefix]).astype(np.int32)
        match = ix.match(tree, query)
        assert match is not None and match.length == query.shape[0]
        tokens, counts = ix.continuations(match)
        expect: dict[int, int] = {}
        for anchors, out in keyed:
            if (anchors[3 - level:].tolist() == q_anchors[3 - level:].tolist()
                    and out[:i].tolist() == prefix.tolist() and out.shape[0] > i):
                expect[int(out[i])] = expect.get(int(out[i]), 0) + 1
        assert dict(zip(tokens.tolist(), counts.tolist())) == expect
        assert all(t < SYNTHETIC_BASE for t in tokens.tolist())


@pytest.mark.slow
@SLOW
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), max_size=20),
                          st.lists(st.integers(0, 4), min_size=1, max_size=30)),
                min_size=1, max_size=10),
       st.booleans(), st.sampled_from([0.0, 0.03]))
def test_no_draft_ever_holds_a_synthetic_id(requests, tree, cost):
    p = SuffixProposer(max_depth=8, max_spec_tokens=6, tree=tree, draft_cost=cost)
    for n, (prompt, output) in enumerate(requests):
        # Every other request shares a prompt, so anchored queries match.
        p.start_request(n, prompt if n % 2 else requests[0][0])
        for t in output:
            d = p.propose([n])[0]
            assert all(0 <= x < SYNTHETIC_BASE for x in d.token_ids.tolist()), d
            p.extend(n, [t])
        p.finish_request(n)
    p.requests.index.check_integrity()
    p.cross.delta.index.check_integrity()


def _reference_update(table, draft, emitted, buckets, kinds=None, last=-1):
    """What one verification outcome must add to the table, from first
    principles; ``last`` is the context's last token, before the draft."""
    table = table.copy()
    state = cal.new_state(0.0)
    weights = (state[cal.ST_W_SHARED], state[cal.ST_W_COARSE], state[cal.ST_W_FINE])
    ok = []
    depth = []
    for t, parent in enumerate(draft.parents.tolist()):
        reached = parent < 0 or ok[parent]
        d = 0 if parent < 0 else depth[parent] + 1
        depth.append(d)
        if not reached or d >= len(emitted):
            ok.append(False)
            continue
        hit = int(draft.token_ids[t]) == int(emitted[d])
        ok.append(hit)
        if buckets[t] < 0:  # the arbiter's reference: not the policy's pick
            continue
        rows = [buckets[t], cal.coarse_of(buckets[t]), cal.shared_of(buckets[t])]
        token = int(draft.token_ids[t])
        kind = naive.kind_of(kinds, token)
        before = naive.kind_of(kinds, last if parent < 0 else int(draft.token_ids[parent]))
        # its token row: accepted against what the table said, the shared
        # row's own rate as the prior
        shared = rows[2]
        own = (table[shared, 0] + 1) / (table[shared, 1] + 2)
        token_row = cal.TOKEN_BASE + token % cal.TOKEN_ROWS
        expected = naive.estimate(table, weights, int(buckets[t]), own, kind, before)
        prev = last if parent < 0 else int(draft.token_ids[parent])
        for row in [token_row] + ([naive.bigram_row(prev, token)] if prev >= 0 else []):
            table[row, 1] += expected  # its token row, and its bigram row after ``prev``
            table[row, 0] += hit
        if kind >= 0:
            rows.append(naive.lift_row(int(buckets[t]), kind))
            if before >= 0:
                rows.append(naive.pair_row(int(buckets[t]), before, kind))
        for row in rows:
            table[row, 1] += 1
            table[row, 0] += hit
    return table


@pytest.mark.parametrize("tree, kinds", [
    (False, None), (True, [2, 0, 5]),
    *(pytest.param(tree, kinds, marks=pytest.mark.slow)
      for tree, kinds in [(True, None), (False, [2, -1, 5]), (True, [2, -1, 5]),
                          (False, [2, 0, 5])])])
def test_calibration_counts_exactly_what_the_engine_emitted(tree, kinds):
    rng = np.random.default_rng(1)
    p = SuffixProposer(max_depth=8, max_spec_tokens=6, tree=tree, draft_cost=0.0,
                       token_kinds=kinds)
    text = rng.integers(0, 3, 400).astype(np.int32)
    p.start_request("r", text[:200])
    pos = 200
    checked = 0
    while pos < text.shape[0] - 8:
        d = p.propose(["r"])[0]
        buckets = p.pending.buckets[p.requests.requests["r"][1], :len(d)].copy()
        emitted = text[pos:pos + int(rng.integers(1, 5))]
        expect = _reference_update(p.stats.table, d, emitted, buckets, kinds, int(text[pos - 1]))
        p.extend("r", emitted)
        np.testing.assert_allclose(p.stats.table, expect, rtol=1e-12, atol=0)
        checked += len(d) > 0
        pos += emitted.shape[0]
    assert checked > 20
    assert p.stats.table[:, 1].sum() > 0
    assert p.stats.table[cal.BASE_ROWS:cal.TOKEN_BASE, 1].any() == (kinds is not None)
    pairs = p.stats.table[cal.BASE_ROWS + cal.LIFT_ROWS:cal.TOKEN_BASE, 1].sum()
    assert (pairs > 0) == (kinds is not None)  # each kind follows a kind here
    assert p.stats.table[cal.TOKEN_BASE:, 1].any()  # with kinds or without


def test_calibration_learns_that_a_pattern_stopped_repeating():
    """Past outputs say "1 2 is always followed by 3"; the engine keeps saying no."""
    p = SuffixProposer(max_depth=8, max_spec_tokens=4)
    for n in range(50):
        p.start_request(n, [7])
        p.extend(n, [1, 2, 3, 4])
        p.finish_request(n)
    p.start_request("r", [8])
    p.extend("r", [1, 2])
    first = p.propose(["r"])[0]
    assert first.source == "cross" and first.token_ids.tolist()[:2] == [3, 4]
    for i in range(300):
        p.extend("r", [1000 + i])  # never what was drafted
        p.extend("r", [1, 2])
        p.propose(["r"])
    later = p.propose(["r"])[0]
    assert len(later) == 0 or later.probs[0] < first.probs[0] / 2, (first, later)


def test_a_lower_draft_cost_drafts_more():
    rng = np.random.default_rng(3)
    texts = [rng.integers(0, 5, 60) for _ in range(30)]
    drafted = {}
    for cost in (0.0, 0.2):
        p = SuffixProposer(max_depth=8, max_spec_tokens=8, draft_cost=cost)
        total = 0
        for n, text in enumerate(texts):
            p.start_request(n, text[:20])
            for t in text[20:]:
                total += len(p.propose([n])[0])
                p.extend(n, [t])
            p.finish_request(n)
        drafted[cost] = total
    assert drafted[0.0] > 2 * drafted[0.2] > 0


def test_output_start_is_drafted_from_past_outputs_of_the_same_prompt():
    p = SuffixProposer(max_depth=16, max_spec_tokens=8)
    prompt = [5, 6, 7, 8]
    output = [40, 41, 42, 43, 44]
    for n in range(3):
        p.start_request(n, prompt)
        p.extend(n, output)
        p.finish_request(n)
    p.start_request("new", prompt)
    d = p.propose(["new"])[0]
    # Nothing in the prompt precedes 40 anywhere; only the anchors do.
    assert d.source == "anchor" and d.token_ids.tolist()[:3] == output[:3]
    plain = SuffixProposer(max_depth=16, max_spec_tokens=8, anchors=False)
    for n in range(3):
        plain.start_request(n, prompt)
        plain.extend(n, output)
        plain.finish_request(n)
    plain.start_request("new", prompt)
    assert len(plain.propose(["new"])[0]) == 0


def test_bad_and_removed_settings_are_refused_in_one_line():
    for removed in ("policy", "recency", "merge_trees", "long_match_bias", "all_match_lengths",
                    "self_discount"):
        with pytest.raises(ValueError, match=f"'{removed}' was removed in suffixspec 0.2") as e:
            SuffixProposer(**{removed: True})
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="unknown setting 'greedy'"):
        SuffixProposer(greedy=True)
    with pytest.raises(ValueError, match="draft_cost"):
        SuffixProposer(draft_cost=-0.1)
    with pytest.raises(ValueError, match="max_spec_factor"):
        SuffixProposer(max_spec_factor=float("nan"))
    with pytest.raises(ValueError, match="max_spec_factor"):
        SuffixProposer(max_spec_factor=float("inf"))
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="arbitrate must be True or False") as e:
            SuffixProposer(arbitrate=bad)
        assert "\n" not in str(e.value)


def test_table_rows_cover_every_bucket():
    top = cal.bucket(cal.N_SRC * cal.N_STATE - 1, 10_000, 10_000, 10_000, 10_000)
    assert top == cal.PLANE_ROWS - 1
    assert cal.coarse_of(top) == cal.N_SHARED + cal.N_COARSE - 1
    assert cal.shared_of(top) == cal.N_SHARED - 1
    low = cal.bucket(0, 0, 0, 0, 1)
    assert low == cal.N_SHARED + cal.N_COARSE
    assert cal.coarse_of(low) == cal.N_SHARED and cal.shared_of(low) == 0
    last = cal.bucket(cal.with_agreement(cal.N_SRC * cal.N_STATE - 1, cal.N_AGREE - 1),
                      10_000, 10_000, 10_000, 10_000)
    assert last == cal.BASE_ROWS - 1  # the lift rows follow, then the pair rows
    assert cal.lift_row(last, cal.N_KIND - 1) == cal.BASE_ROWS + cal.LIFT_ROWS - 1
    assert cal.lift_row(low, 0) == cal.BASE_ROWS
    assert cal.pair_row(last, cal.N_KIND - 1, cal.N_KIND - 1) == cal.TOKEN_BASE - 1
    assert cal.pair_row(low, 0, 0) == cal.BASE_ROWS + cal.LIFT_ROWS
    assert cal.token_row(0) == cal.TOKEN_BASE  # then the token rows
    assert cal.token_row(cal.TOKEN_ROWS - 1) == cal.BIGRAM_BASE - 1  # then the bigram rows
    assert cal.token_row(cal.TOKEN_ROWS + 5) == cal.token_row(5)  # past them: modulo
    rng = np.random.default_rng(4)
    prev, tok = rng.integers(0, 1 << 24, (2, 5000))  # ids past the rows too
    rows = [cal.bigram_row(int(a), int(b)) for a, b in zip(prev, tok)]
    assert rows == [naive.bigram_row(int(a), int(b)) for a, b in zip(prev, tok)]
    assert cal.BIGRAM_BASE <= min(rows) and max(rows) < cal.TABLE_ROWS
    assert len(set(rows)) > 0.95 * len(rows)  # 5,000 pairs in 2^18 rows: few share one


def test_every_bucket_has_one_row_and_each_plane_shares_the_shared_level():
    seen = {}
    for agree in range(cal.N_AGREE):
        for src in range(cal.N_SRC * cal.N_STATE):
            for n in (1, 2, 3, 5, 9, 17):
                for c in range(0, n + 1):
                    for m in (0, 1, 2, 3, 4, 6, 9, 16, 32):
                        for d in (0, 1, 2, 3, 5, 9):
                            fine = cal.bucket(cal.with_agreement(src, agree), m, d, c, n)
                            key = (agree, src, cal.bucket(src, m, d, c, n))
                            assert seen.setdefault(fine, key) == key
                            assert cal.agreement_of(fine) == agree
                            plain = cal.bucket(src, m, d, c, n)
                            assert cal.shared_of(fine) == cal.shared_of(plain)
                            assert 0 <= cal.shared_of(fine) < cal.N_SHARED
                            coarse = cal.coarse_of(fine)
                            assert cal.N_SHARED <= coarse < cal.TABLE_ROWS
                            assert (coarse - cal.coarse_of(plain)) == (
                                0 if agree == 0 else cal.PLANE_ROWS - cal.N_SHARED
                                + (agree - 1) * cal.PLANE)
    fines = set(seen)
    coarse = {cal.coarse_of(f) for f in fines}
    assert not fines & coarse and max(fines) < cal.BASE_ROWS
    # one lift row per coarse row and kind, all of them after the planes
    one_fine = {cal.coarse_of(f): f for f in fines}
    lifts = {cal.lift_row(f, kind) for f in one_fine.values() for kind in range(cal.N_KIND)}
    assert len(lifts) == len(one_fine) * cal.N_KIND
    assert cal.BASE_ROWS <= min(lifts) and max(lifts) < cal.BASE_ROWS + cal.LIFT_ROWS
    # and one pair row per lift row and kind before, after the lift rows
    pairs = {cal.pair_row(f, before, kind) for f in one_fine.values()
             for before in range(cal.N_KIND) for kind in range(cal.N_KIND)}
    assert len(pairs) == len(one_fine) * cal.N_KIND ** 2
    assert cal.BASE_ROWS + cal.LIFT_ROWS <= min(pairs) and max(pairs) < cal.TOKEN_BASE


def test_an_empty_table_trusts_a_long_match_more_than_a_short_one():
    table, state = cal.new_table(), cal.new_state(0.03)

    def p(c, n, match):
        return cal.probability(table, state, cal.bucket(cal.SRC_CROSS, match, 0, c, n), c, n,
                               match, -1, -1, cal.NO_TOKEN, -1)

    assert p(1, 1, 1) == pytest.approx(0.5)  # seen once after one matching token
    assert p(1, 1, 1) < p(1, 1, 4) < p(1, 1, 30)
    assert p(1, 1, 30) > 0.8
    assert p(9, 9, 1) == pytest.approx(0.9)  # seen 9 times in 9
    assert p(1, 2, 30) < 0.5  # two continuations seen once each


def test_outcomes_in_one_source_inform_another_at_the_same_match():
    table, state = cal.new_table(), cal.new_state(0.03)
    request = cal.bucket(cal.SRC_REQUEST, 2, 0, 1, 1)
    cross = cal.bucket(cal.SRC_CROSS, 2, 0, 1, 1)
    before = cal.probability(table, state, cross, 1, 1, 2, -1, -1, cal.NO_TOKEN, -1)
    for row in (request, cal.coarse_of(request), cal.shared_of(request)):
        table[row] = (0.0, 50.0)  # 50 request-tree tries, none accepted
    after = cal.probability(table, state, cross, 1, 1, 2, -1, -1, cal.NO_TOKEN, -1)
    assert cal.shared_of(request) == cal.shared_of(cross)
    assert after < 0.5 * before


@pytest.mark.parametrize("version", sorted(cal.EARLIER_LAYOUTS))
def test_a_table_kept_by_an_earlier_version_keeps_the_rows_of_the_sources_it_shares(version):
    old_src, planes, kept, positions, kind_rows = cal.EARLIER_LAYOUTS[version]
    old = np.random.default_rng(0).random(
        (cal.layout_rows(old_src, planes, positions, kind_rows), 2)) + 1.0
    new = cal.upgrade_table(old)
    assert new.shape == (cal.TABLE_ROWS, 2)
    if kind_rows == 0:
        assert not new[cal.BASE_ROWS:].any()  # no lift, pair or token rows
    assert not new[cal.BIGRAM_BASE:].any()  # no earlier table had bigram rows
    old_coarse = old_src * cal.N_SHARED
    old_plane = old_coarse * (1 + cal.N_RECENT * positions * cal.N_DEPTH)
    old_lift = cal.layout_rows(old_src, planes, positions)
    old_pair = old_lift + cal.N_AGREE * cal.N_KIND * old_coarse
    old_token = old_pair + cal.N_AGREE * cal.N_KIND * cal.N_KIND * old_coarse
    rng = np.random.default_rng(1)
    for _ in range(1000):  # a bucket's rows hold what the old table kept for it, at its rows
        src, recent = rng.integers(cal.N_SRC), rng.integers(cal.N_RECENT)
        state = cal.request_state(recent, rng.integers(0, 400))
        agree = rng.integers(cal.N_AGREE)
        kind, before = (int(x) for x in rng.integers(cal.N_KIND, size=2))
        n = rng.integers(1, 40)
        fine = cal.bucket(cal.with_agreement(src + cal.N_SRC * state, agree),
                          rng.integers(0, 40), rng.integers(0, 12), rng.integers(1, n + 1), n)
        shared, depth = cal.shared_of(fine), (fine - cal.N_SHARED - cal.N_COARSE) % cal.N_DEPTH
        tok = int(rng.integers(0, cal.TOKEN_ROWS))
        assert np.array_equal(new[shared], old[shared])
        assert np.array_equal(new[cal.token_row(tok)],
                              old[old_token + tok] if kind_rows >= 3 else (0.0, 0.0))
        rows = (fine, cal.coarse_of(fine), cal.lift_row(fine, kind),
                cal.pair_row(fine, before, kind))
        if src >= kept or agree >= planes:  # rows the old table did not have
            assert not new[list(rows)].any()
            continue
        base = cal.N_SHARED + agree * old_plane
        position = state // cal.N_RECENT if positions > 1 else 0  # one row for all, or its own
        coarse = src * cal.N_SHARED + shared
        old_fine = (base + old_coarse
                    + ((coarse * positions + position) * cal.N_RECENT + recent) * cal.N_DEPTH
                    + depth)
        assert np.array_equal(new[fine], old[old_fine])
        assert np.array_equal(new[cal.coarse_of(fine)], old[base + coarse])
        lift = old_lift + (agree * cal.N_KIND + kind) * old_coarse + coarse
        pair = old_pair + ((agree * cal.N_KIND + before) * cal.N_KIND + kind) * old_coarse + coarse
        assert np.array_equal(new[rows[2]], old[lift] if kind_rows >= 1 else (0.0, 0.0))
        assert np.array_equal(new[rows[3]], old[pair] if kind_rows >= 2 else (0.0, 0.0))
    # Every old row kept (a fine one of a table without positions at every
    # position): only the rows of a source no longer drafted are gone.
    old_fine_rows = old_src * cal.N_SHARED * cal.N_RECENT * positions * cal.N_DEPTH * planes
    kind_blocks = cal.N_AGREE * cal.N_KIND * ((kind_rows >= 1) + (kind_rows >= 2) * cal.N_KIND)
    lost = (old_plane * planes + kind_blocks * old_coarse) // old_src * (old_src - kept)
    assert (new[:, 1] > 0).sum() == old.shape[0] - lost + (
        old_fine_rows * kept // old_src * (cal.N_POSITION // positions - 1))


def test_a_request_state_is_how_its_last_draft_fared_and_how_far_into_its_output_it_is():
    for recent in range(cal.N_RECENT):
        got = [cal.request_state(recent, n) for n in range(600)]
        position = [sum(n >= edge for edge in cal.POSITION_EDGES) for n in range(600)]
        assert got == [recent + cal.N_RECENT * p for p in position]
    assert {cal.request_state(r, n) for r in range(cal.N_RECENT) for n in range(600)} == set(
        range(cal.N_STATE))


def test_a_token_row_may_hold_more_accepted_than_expected_and_no_other_row_may():
    table = cal.new_table()
    table[cal.token_row(7)] = (9.0, 2.5)  # accepted more often than estimated
    table[cal.bigram_row(3, 7)] = (4.0, 1.5)  # and after token 3 too
    assert cal.table_problem(table) is None
    table[cal.TOKEN_BASE - 1] = (3.0, 2.0)
    assert "more accepted" in cal.table_problem(table)
    table[cal.TOKEN_BASE - 1] = (0.0, 0.0)
    table[cal.token_row(7)] = (-1.0, 2.5)
    assert "out of range" in cal.table_problem(table)


def test_a_table_of_no_known_layout_is_not_upgraded():
    assert cal.upgrade_table(np.zeros((3, 2))) is None
    assert cal.upgrade_table(np.zeros((cal.TABLE_ROWS + 1, 2))) is None
    assert cal.upgrade_table(np.zeros((cal.TABLE_ROWS, 3))) is None


def test_a_kinds_lift_is_its_rate_over_the_coarse_rate_and_nothing_while_empty():
    """The lift of a token's kind, after the kind of the token before it."""
    rng = np.random.default_rng(5)
    table = np.zeros((cal.TABLE_ROWS, 2))
    state = cal.new_state(0.03)
    weights = (state[cal.ST_W_SHARED], state[cal.ST_W_COARSE], state[cal.ST_W_FINE])
    for empty in (True, False):
        if not empty:
            tried = rng.integers(0, 40, cal.TABLE_ROWS).astype(np.float64)
            table = np.stack([np.floor(tried * rng.random(cal.TABLE_ROWS)), tried], axis=1)
        for _ in range(3000):
            n = int(rng.integers(1, 40))
            c, m, d = int(rng.integers(1, n + 1)), int(rng.integers(0, 70)), int(rng.integers(16))
            src = cal.with_agreement(int(rng.integers(cal.N_SRC * cal.N_STATE)),
                                     int(rng.integers(cal.N_AGREE)))
            kind, before = (int(x) for x in rng.integers(-1, cal.N_KIND, 2))
            fine = cal.bucket(src, m, d, c, n)
            token = int(rng.integers(-1, 2 * cal.TOKEN_ROWS))  # -1: no token row
            prev = int(rng.integers(-1, 2 * cal.TOKEN_ROWS))  # -1: no bigram row
            got = cal.probability(table, state, fine, c, n, m, kind, before, token, prev)
            want, _ = naive.probability(table, weights, src, m, d, c, n, kind, before, token,
                                        prev)
            assert got == pytest.approx(want, rel=1e-12)
            if empty:  # nothing has been seen: the lift and the token's ratio are exactly 1
                plain = cal.probability(table, state, fine, c, n, m, -1, -1, cal.NO_TOKEN, -1)
                assert got == pytest.approx(plain, rel=1e-12)
            # a token not known yet is bounded by the largest its rows may say
            bound = cal.probability(table, state, fine, c, n, m, kind, before, cal.ANY_TOKEN,
                                    prev)
            assert got <= bound


def test_a_fresh_proposer_drafts_the_same_with_kinds_and_without():
    rng = np.random.default_rng(2)
    text = rng.integers(0, 5, 300).astype(np.int32)
    drafts = []
    for kinds in (None, rng.integers(-1, cal.N_KIND, 5)):
        p = SuffixProposer(max_depth=16, max_spec_tokens=8, token_kinds=kinds)
        p.start_request("r", text)
        drafts.append(p.propose(["r"])[0])
    assert len(drafts[0]) > 0
    np.testing.assert_array_equal(drafts[0].token_ids, drafts[1].token_ids)
    np.testing.assert_allclose(drafts[0].probs, drafts[1].probs, rtol=1e-12)


@pytest.mark.parametrize("kinds", [[[0, 1]], [0, 7], [-2, 0], [], [0.5, 1], [300]])
def test_kinds_a_kernel_cannot_take_are_refused_in_one_line(kinds):
    with pytest.raises(ValueError, match="token_kinds must"):
        SuffixProposer(token_kinds=kinds)
