"""A conversation's next turn takes over the trie of the turn it continues.

Property: on random multi-turn sessions (interleaved, with aborts and a small
reuse budget), every draft equals the one a proposer without reuse makes, and
the request index stays sound after every call.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer


def make(**kw):
    return SuffixProposer(max_depth=16, max_spec_tokens=8, **kw)


def reused(p, req_id, prompt) -> int:
    """How many of ``prompt``'s tokens the request pool found indexed already."""
    return p.requests.start(req_id, np.asarray(prompt, np.int32))


def test_next_turn_indexes_only_its_new_tokens():
    p = make()
    first = np.arange(40, dtype=np.int32) % 13
    p.start_request("t1", first)
    p.extend("t1", [5, 6, 7])
    p.finish_request("t1")
    assert reused(p, "probe", np.r_[first, 5, 6, 7, 9, 9]) == 43  # reused whole
    p.requests.drop("probe")
    assert not p.requests.finished  # taken over: never shared by two requests


def test_aborted_and_unrelated_requests_are_not_continued():
    p = make()
    p.start_request("a", [1, 2, 3, 4])
    p.abort_request("a")
    p.start_request("b", [1, 2, 3, 4])
    p.finish_request("b")
    assert reused(p, "c", [1, 2, 3, 9, 9]) == 0  # diverges inside b's tokens
    assert reused(p, "d", [1, 2, 3]) == 0        # shorter than b
    assert reused(p, "e", [1, 2, 3, 4, 5]) == 4


def test_the_budget_drops_the_oldest_finished_trees():
    p = make(reuse_tokens=100)
    for i in range(5):
        p.start_request(i, np.full(40, i, np.int32))
        p.finish_request(i)
    assert list(p.requests.finished.values())[0][1] == 40
    assert sum(n for _, n, _, _ in p.requests.finished.values()) <= 100
    assert len(p.requests.finished) == 2
    p.requests.index.check_integrity()


def test_only_the_latest_finished_requests_are_compared_with_a_prompt():
    from suffixspec.pools.memory import KEEP_REQUESTS

    p = make()
    for i in range(KEEP_REQUESTS + 6):
        p.start_request(i, [i, 1, 2])
        p.finish_request(i)
    assert len(p.requests.finished) == KEEP_REQUESTS
    assert reused(p, "next", [0, 1, 2, 7]) == 0      # request 0: dropped
    assert reused(p, "later", [55, 1, 2, 7]) == 3  # request 55: kept
    p.requests.index.check_integrity()


@st.composite
def sessions(draw):
    """Interleaved events of a few conversations: (session, new prompt tokens,
    output tokens, aborted)."""
    events = []
    for _ in range(draw(st.integers(1, 14))):
        session = draw(st.integers(0, 3))
        delta = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
        output = draw(st.lists(st.integers(0, 6), min_size=0, max_size=10))
        events.append((session, delta, output, draw(st.booleans())))
    return events, draw(st.sampled_from([0, 30, 1 << 20]))


@settings(max_examples=60, deadline=None)
@given(sessions())
def test_drafts_equal_those_without_reuse(case):
    events, budget = case
    # without reuse every turn is a new trie, which indexes its family's outputs
    # (test_family_outputs): here reuse alone is compared
    with_reuse = make(reuse_tokens=budget, family_outputs=0)
    without = make(reuse_tokens=0, family_outputs=0)
    history: dict[int, list[int]] = {}
    for n, (session, delta, output, aborted) in enumerate(events):
        prompt = history.get(session, []) + delta
        for p in (with_reuse, without):
            p.start_request(n, prompt)
        for t in output:
            a, b = (p.propose([n])[0] for p in (with_reuse, without))
            assert a.token_ids.tolist() == b.token_ids.tolist()
            assert np.allclose(a.probs, b.probs)
            for p in (with_reuse, without):
                p.extend(n, [t])
            with_reuse.requests.index.check_integrity()
        for p in (with_reuse, without):
            (p.abort_request if aborted else p.finish_request)(n)
        with_reuse.requests.index.check_integrity()
        if not aborted:
            history[session] = prompt + output
