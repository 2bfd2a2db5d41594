"""Merged tree drafts: the merge kernels against a brute-force reference, and the proposer."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.native import layout as lay
from suffixspec.native.merge import merge_in, merge_out, merge_reset

SLOW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def candidate_trees(draw):
    """A candidate tree: parents before children, probabilities falling along a path."""
    n = draw(st.integers(0, 10))
    tokens, parents, probs = [], [], []
    for i in range(n):
        parent = draw(st.integers(-1, i - 1))
        top = 1.0 if parent < 0 else probs[parent]
        tokens.append(draw(st.integers(0, 3)))
        parents.append(parent)
        probs.append(float(np.float32(top * draw(st.sampled_from([1.0, 0.9, 0.5, 0.25])))))
    # The same token twice under one parent is not a tree draft: keep the first.
    seen, keep = set(), []
    for i in range(n):
        key = (parents[i], tokens[i])
        ok = key not in seen and (parents[i] < 0 or parents[i] in keep)
        if ok:
            seen.add(key)
            keep.append(i)
    where = {old: new for new, old in enumerate(keep)}
    return ([tokens[i] for i in keep], [where.get(parents[i], -1) for i in keep],
            [probs[i] for i in keep])


def _paths(tokens, parents):
    out = []
    for i, t in enumerate(tokens):
        out.append((out[parents[i]] if parents[i] >= 0 else ()) + (t,))
    return out


def reference(cands, room, limit, thr):
    """Path -> (prob, bucket) over every candidate, the first ``room`` paths, top ``limit``."""
    nodes: dict[tuple, list] = {}
    for c, (tokens, parents, probs) in enumerate(cands):
        for i, path in enumerate(_paths(tokens, parents)):
            if path in nodes:
                if probs[i] > nodes[path][0]:
                    nodes[path] = [probs[i], 100 * c + i]
            elif len(nodes) < room and (len(path) == 1 or path[:-1] in nodes):
                nodes[path] = [probs[i], 100 * c + i]
    order = list(nodes)  # first appearance
    kept = sorted(range(len(order)), key=lambda j: (-nodes[order[j]][0], j))[:limit]
    return {order[j]: tuple(nodes[order[j]]) for j in sorted(kept)}


@SLOW
@given(st.lists(candidate_trees(), max_size=5), st.integers(1, 12), st.sampled_from([2, 4]))
def test_merged_tree_equals_brute_force(cands, limit, room_factor):
    k = 12
    m = lay.merged(k)
    m = lay.Merged(*(a[: room_factor * limit] if a.shape[0] == lay.MERGE_ROOM * k else a
                     for a in m))
    merge_reset(m)
    for c, (tokens, parents, probs) in enumerate(cands):
        n = len(tokens)
        cand = lay.candidate(k)
        cand.tokens[:n] = tokens
        cand.parents[:n] = parents
        cand.probs[:n] = probs
        cand.buckets[:n] = [100 * c + i for i in range(n)]
        merge_in(m, cand, n)
    row = lay.candidate(k)
    n, gain = merge_out(m, limit, 0.1, row)
    got_tokens, got_parents = row.tokens[:n].tolist(), row.parents[:n].tolist()
    assert all(got_parents[i] < i for i in range(n))
    got = {path: (float(row.probs[i]), int(row.buckets[i]))
           for i, path in enumerate(_paths(got_tokens, got_parents))}
    expect = reference(cands, room_factor * limit, limit, 0.1)
    assert got == expect
    assert list(got) == list(expect)  # parents first, in first-appearance order
    assert abs(gain - sum(p - 0.1 for p, _ in expect.values())) < 1e-5


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=25), min_size=1, max_size=6),
       st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_merged_draft_is_a_tree_scoring_at_least_the_best_path(outputs, prompt):
    """The merged tree holds every candidate's best-first tree, so it scores at least
    the best candidate's path draft, and it stays a sound tree."""
    drafts = []
    for tree in (False, True):
        p = SuffixProposer(max_depth=8, max_spec_tokens=8, tree=tree, draft_cost=0.01)
        for n, out in enumerate(outputs):
            p.start_request(n, [0])
            p.extend(n, out)
            p.finish_request(n)
        p.start_request("q", prompt)
        drafts.append(p.propose(["q"])[0])
        p.requests.index.check_integrity()
        p.cross.delta.index.check_integrity()
    best, merged = drafts
    assert merged.score >= best.score - 1e-4
    pairs = set()
    for i in range(len(merged)):
        up = merged.parents[i]
        assert up < i
        if up >= 0:
            assert merged.probs[i] <= merged.probs[up] + 1e-6
        assert (int(up), int(merged.token_ids[i])) not in pairs
        pairs.add((int(up), int(merged.token_ids[i])))


def test_merged_tree_holds_branches_of_two_match_lengths():
    # After "1 2", the 2-token match saw 3 and 4; after "2" alone, 5 also followed.
    p = SuffixProposer(max_depth=8, max_spec_tokens=8, tree=True, min_token_prob=0.01,
                       draft_cost=0.0, max_spec_factor=8.0)
    p.start_request("r", [1, 2, 3, 1, 2, 4, 9, 2, 5, 9, 2, 5, 1, 2])
    d = p.propose(["r"])[0]
    assert set(d.token_ids[d.parents == -1].tolist()) == {3, 4, 5}
