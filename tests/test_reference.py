"""The reference: what followed the newest earlier occurrence of a request's
longest own match, as a calibration feature and as a candidate
(``ProposerConfig.newest_window``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.native import calibration as cal
from suffixspec.index import SuffixIndex
from suffixspec.native import layout as lay
from suffixspec.native.calibrated import (SCAN, agreement, listed_newest, longest,
                                          newest_occurrence, own_reference, reference)
from suffixspec.native.trie import longest_match
from suffixspec.native.union import side, table
from suffixspec.native.tokens import SYNTHETIC_BASE


def _newest_brute(arena, start, end, length, window):
    key = list(arena[end - length:end])
    for e in range(end - 1, start + length - 1, -1):
        if end - e > window:
            break
        if list(arena[e - length:e]) == key:
            return e
    return -1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.data())
def test_newest_occurrence_and_reference_equal_a_brute_force_scan(tokens, data):
    arena = np.array([9, 9] + tokens, np.int64)  # a region that starts at 2
    start, end = 2, len(arena)
    length = data.draw(st.integers(1, end - start))
    window = data.draw(st.integers(1, 70))
    want = _newest_brute(arena, start, end, length, window)
    assert newest_occurrence(arena, start, end, length, window) == want
    ref = np.full(6, -7, np.int64)
    reference(arena, start, end, length, window, ref)
    follow = [] if want < 0 else list(arena[want:end][:5])
    assert ref[0] == len(follow) and list(ref[1:1 + ref[0]]) == follow


def _own_tree(others, chunks, depth):
    """An index of depth ``depth`` with closed sequences ``others`` and the
    request's open sequence, extended chunk by chunk, in one tree."""
    ix = SuffixIndex(max_depth=depth)
    tree = ix.add_tree()
    for tokens in others:
        o = ix.add_sequence(tree)
        ix.extend(o, np.array(tokens, np.int32))
        ix.close(o)
    s = ix.add_sequence(tree)
    for chunk in chunks:
        ix.extend(s, np.array(chunk, np.int32))
    return ix, tree, s


def _trees(ix, tree, s):
    n = int(ix.seqs[s, lay.SEQ_LEN])
    return table([ix.read_only_arrays()]), np.array([tree], np.int64), \
        (int(ix.seqs[s, lay.SEQ_SLOT]), n, n)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), max_size=3),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=15), min_size=1, max_size=4),
       st.integers(1, 60), st.sampled_from([4, 6, 8]))
def test_own_reference_equals_the_longest_own_match_and_the_scan(others, chunks, window, depth):
    """The own tree's list of occurrences (``listed_newest``) gives what the scan gives."""
    ix, tree, s = _own_tree(others, chunks, depth)
    trees = _trees(ix, tree, s)
    arena = ix.read_only_arrays()[4]
    start, end = int(ix.seqs[s, lay.SEQ_OFF]), int(ix.seqs[s, lay.SEQ_OFF] + ix.seqs[s, lay.SEQ_LEN])
    ctx_start = max(start, end - depth)
    got = np.full(6, -7, np.int64)
    length = own_reference(trees, s, arena, ctx_start, end, depth, window, got)
    reach = np.zeros(1, np.int64)
    assert length == longest(trees, arena, ctx_start, end, depth, reach)
    assert reach[0] == length  # the one side's own longest
    want = np.full(6, -7, np.int64)
    reference(arena, start, end, length, window, want)
    assert got[0] == want[0] and list(got[1:1 + got[0]]) == list(want[1:1 + want[0]])


def _listed(others, own, depth=8):
    """``listed_newest`` at the longest own match of ``own`` (its length too)."""
    ix, tree, s = _own_tree(others, [own], depth)
    trees = _trees(ix, tree, s)
    arena = ix.read_only_arrays()[4]
    off = int(ix.seqs[s, lay.SEQ_OFF])
    end = off + len(own)
    length, x, at = longest_match(side(trees[0], 0), tree, arena, off, end, depth - 1, True,
                                  trees[2])
    e = listed_newest(side(trees[0], 0), x, at, s, arena, end, length, 100)
    return length, e - off if e >= 0 else e


def test_the_own_tree_lists_the_occurrences_of_a_match():
    own = [1, 2, 3, 2, 0, 1, 2, 3]  # "1 2 3" once before, then 2
    assert _listed([[5, 5]], own) == (3, 3)
    assert _listed([], [1, 2, 3, 7, 1, 2, 3]) == (3, 3)
    assert _listed([[1, 2, 3, 7]], [1, 2, 3]) == (3, -1)  # only in another sequence
    assert _listed([[1, 2, 3, 7]], [1, 2, 3, 5, 1, 2, 3]) == (3, 3)
    # Three earlier occurrences: the newest.
    assert _listed([], [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 6, 0, 1, 2, 3]) == (3, 11)
    # "1 2 3 4" runs into the depth (4) twice: the tree cannot tell them apart.
    assert _listed([], [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3], depth=4) == (3, SCAN)


def test_reference_stops_before_a_synthetic_token():
    arena = np.array([1, 2, 5, SYNTHETIC_BASE + 1, 6, 1, 2], np.int64)
    ref = np.zeros(5, np.int64)
    reference(arena, 0, arena.shape[0], 2, 100, ref)
    assert ref[0] == 1 and ref[1] == 5


def test_agreement_follows_the_reference_until_the_draft_leaves_it():
    ref = np.array([2, 5, 6], np.int64)
    assert agreement(ref, 0, 5, True) == cal.AGREE_SAME
    assert agreement(ref, 1, 7, True) == cal.AGREE_DIFF
    assert agreement(ref, 1, 6, False) == cal.AGREE_NONE  # left it earlier
    assert agreement(ref, 2, 6, True) == cal.AGREE_NONE   # past its end


def _shifting_blocks(seed, pairs):
    """Blocks ``1 2 x``, each ``x`` twice in a row and then never again: after
    ``1 2`` the newest continuation is right on every second block, the most
    frequent one never."""
    rng = np.random.default_rng(seed)
    xs = rng.permutation(np.arange(10, 10 + pairs))
    return [t for x in xs for t in (1, 2, int(x)) * 2]


def _first_tokens_accepted(newest_window, tree=False):
    p = SuffixProposer(max_depth=8, max_spec_tokens=4, draft_cost=0.0,
                       newest_window=newest_window, tree=tree, cross_pool_tokens=0)
    text = _shifting_blocks(0, 200)
    p.start_request("r", text[:6])
    hits = planes = 0
    for pos in range(6, len(text)):
        d = p.propose(["r"])[0]
        row = p.requests.requests["r"][1]
        planes += int((p.pending.buckets[row, :len(d)] >= cal.PLANE_ROWS).any())
        if pos >= len(text) // 2 and len(d) and d.token_ids[0] == text[pos]:
            hits += 1
        p.extend("r", [text[pos]])
    return hits, planes


def test_calibration_learns_to_draft_the_newest_where_it_is_right():
    off, off_planes = _first_tokens_accepted(0)
    on, on_planes = _first_tokens_accepted(4096)
    assert off_planes == 0 and on_planes > 0  # no reference: no agreement rows
    # Every second block's third token is the newest's; the counts miss it.
    assert on >= off + 80, (off, on)
    tree_on, _ = _first_tokens_accepted(4096, tree=True)
    tree_off, _ = _first_tokens_accepted(0, tree=True)
    assert tree_on >= tree_off + 80, (tree_off, tree_on)


def test_newest_window_is_checked_in_one_line():
    for bad in (-1, 1 << 25, 2.5, True):
        try:
            SuffixProposer(newest_window=bad)
        except ValueError as e:
            assert "newest_window" in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"newest_window={bad!r} was taken")
