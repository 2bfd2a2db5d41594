"""The native suffix index against a brute-force scan, under random edits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from naive import NaiveIndex
from suffixspec.index import SuffixIndex
from suffixspec.native import layout as nat
from suffixspec.native import trie

SETTINGS = settings(max_examples=60, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=12) | st.lists(
    st.integers(0, 40), min_size=0, max_size=12)


def arr(x):
    return np.asarray(x, np.int32)


def assert_arctic_order(ix: SuffixIndex) -> None:
    """In arctic's tie order every sibling list runs by falling count and the
    first child is the one path drafts follow."""
    nodes = ix.nodes
    for x in range(int(ix.meta[nat.META_TOP])):
        if nodes[x, nat.COUNT] < 0 or nodes[x, nat.FIRST] == -1:
            continue  # free, or no children
        assert nodes[x, nat.BEST] == nodes[x, nat.FIRST]
        c = nodes[x, nat.FIRST]
        while nodes[c, nat.NEXT] != -1:
            assert nodes[c, nat.COUNT] >= nodes[nodes[c, nat.NEXT], nat.COUNT]
            c = nodes[c, nat.NEXT]


def child_orders(ix: SuffixIndex) -> dict:
    """For every tree, each branching string -> its continuations in sibling order."""
    nodes = ix.nodes
    out = {}
    for tree, root in enumerate(ix.roots):
        if root < 0:
            continue
        stack = [(int(root), ())]
        while stack:
            x, prefix = stack.pop()
            kids = []
            c = nodes[x, nat.FIRST]
            while c != -1:
                kids.append(int(nodes[c, nat.TOKEN]))
                n = trie.edge_len(nodes, ix.seqs, c)
                label = tuple(int(trie.label(ix.arena, ix.seqs, nodes, c, i)) for i in range(n))
                stack.append((int(c), prefix + label))
                c = nodes[c, nat.NEXT]
            if len(kids) > 1:
                out[(tree, prefix)] = kids
    return out


class IndexMachine(RuleBasedStateMachine):
    """Random trees and sequences: add, extend, close, remove, drop, rebuild."""

    @initialize(depth=st.integers(1, 7), ties=st.sampled_from(["newest", "arctic"]))
    def setup(self, depth, ties):
        self.depth = depth
        # Tiny capacities force every growth path.
        self.ix = SuffixIndex(max_depth=depth, node_capacity=4, token_capacity=4, ties=ties)
        self.ref = NaiveIndex(depth)
        self.open: dict[int, tuple[int, int]] = {}  # seq -> (tree, ref key)
        self.closed: dict[int, tuple[int, int]] = {}

    def _tree_ids(self):
        return sorted(self.ref.trees)

    @rule()
    def add_tree(self):
        t = self.ix.add_tree()
        assert t not in self.ref.trees
        self.ref.trees[t] = {}

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data(), toks=tokens)
    def add_sequence(self, data, toks):
        tree = data.draw(st.sampled_from(self._tree_ids()))
        s = self.ix.add_sequence(tree, capacity=data.draw(st.integers(1, 8)))
        self.ix.extend(s, arr(toks))
        self.ref.trees[tree][s] = list(toks)
        self.open[s] = (tree, s)

    @precondition(lambda self: self.open)
    @rule(data=st.data(), toks=tokens)
    def extend(self, data, toks):
        s = data.draw(st.sampled_from(sorted(self.open)))
        tree, _ = self.open[s]
        self.ix.extend(s, arr(toks))
        self.ref.trees[tree][s].extend(toks)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def close(self, data):
        s = data.draw(st.sampled_from(sorted(self.open)))
        self.ix.close(s)
        self.closed[s] = self.open.pop(s)

    @precondition(lambda self: self.open or self.closed)
    @rule(data=st.data())
    def remove(self, data):
        s = data.draw(st.sampled_from(sorted(self.open) + sorted(self.closed)))
        tree, _ = self.open.pop(s, None) or self.closed.pop(s)
        self.ix.remove(s)
        del self.ref.trees[tree][s]

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data())
    def drop_tree(self, data):
        tree = data.draw(st.sampled_from(self._tree_ids()))
        self.ix.drop_tree(tree)
        for s in self.ref.trees.pop(tree):
            self.open.pop(s, None)
            self.closed.pop(s, None)

    @rule()
    def rebuild(self):
        before = child_orders(self.ix)
        self.ix.rebuild()
        if self.ix.ties == "arctic":  # arctic's order among equal counts survives
            assert child_orders(self.ix) == before

    @invariant()
    def sound(self):
        if hasattr(self, "ix"):
            self.ix.check_integrity()
            if self.ix.ties == "arctic":
                assert_arctic_order(self.ix)

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data(), ctx=tokens, need=st.booleans())
    def longest_match(self, data, ctx, need):
        tree = data.draw(st.sampled_from(self._tree_ids()))
        max_len = data.draw(st.integers(0, self.depth))
        m = self.ix.match(tree, arr(ctx), need_continuation=need, max_len=max_len)
        want = self.ref.longest_match(tree, ctx, need, max_len)
        got = -1 if m is None else m.length
        assert got == want
        if m is None or m.length == 0:
            return
        x = ctx[len(ctx) - m.length:]
        occ = self.ref.occurrences(tree, x)
        assert m.count == len(occ)
        # One stored occurrence: live, or in a removed sequence whose tokens
        # are kept until rebuild() because edge labels still read them.
        seq, start = self.ix.occurrence(m)
        assert self.ix.sequence(seq)[start:start + m.length].tolist() == x
        if seq in self.ref.trees[tree]:
            assert (seq, start) in occ
        else:
            assert self.ix.dead_tokens > 0
        toks, counts = self.ix.continuations(m)
        assert dict(zip(toks.tolist(), counts.tolist())) == dict(self.ref.continuations(tree, x))

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data(), ctx=tokens)
    def walk_occurring(self, data, ctx):
        """The suffixes that occur are the shortest ones (what the arctic rule's
        search for the longest and the policy's lengths rely on), and the
        lookup-per-edge walk places each of them where the comparing walk does."""
        tree = data.draw(st.sampled_from(self._tree_ids()))
        ix, c = self.ix, arr(ctx)
        root = int(ix.roots[tree])
        args = (ix.nodes, ix.hkeys, ix.hvals)
        occurs = [bool(self.ref.occurrences(tree, ctx[len(ctx) - n:])) if n else True
                  for n in range(len(ctx) + 1)]
        assert occurs == sorted(occurs, reverse=True)
        for n in range(len(ctx) + 1):
            want = trie.walk(*args, ix.arena, ix.seqs, root, c, len(ctx) - n, len(ctx))
            assert (want[0] != -1) == occurs[n]
            if occurs[n]:
                got = trie.walk_occurring(*args, ix.seqs, root, c, len(ctx) - n, len(ctx))
                assert got == want
                assert trie.occurring_position(ix.arrays(), root, c, len(ctx), n,
                                               (-1, 0, 0)) == want

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data(), ctx=tokens, k=st.integers(0, 8),
          min_prob=st.sampled_from([0.0, 0.1, 0.34, 0.5, 0.9]))
    def path_draft(self, data, ctx, k, min_prob):
        tree = data.draw(st.sampled_from(self._tree_ids()))
        m = self.ix.match(tree, arr(ctx), need_continuation=True)
        if m is None:
            return
        toks, probs, score = self.ix.draft_path(m, k, min_prob)
        x = ctx[len(ctx) - m.length:]
        prob = 1.0
        for i in range(k + 1):
            conts = self.ref.continuations(tree, x)
            nxt = prob * max(conts.values()) / self.ref.count(tree, x) if conts else -1.0
            if i == len(toks):
                # The draft stopped: the budget ran out or nothing qualified.
                assert i == k or nxt < min_prob
                break
            tok = int(toks[i])
            assert conts[tok] == max(conts.values()), "not a most frequent continuation"
            prob = nxt
            assert probs[i] == pytest.approx(prob, rel=1e-5)
            x = x + [tok]
        assert score == pytest.approx(float(np.sum(probs, dtype=np.float64)), rel=1e-5)

    @precondition(lambda self: self.ref.trees)
    @rule(data=st.data(), ctx=tokens, k=st.integers(0, 8),
          min_prob=st.sampled_from([0.05, 0.2, 0.5]))
    def tree_draft(self, data, ctx, k, min_prob):
        tree = data.draw(st.sampled_from(self._tree_ids()))
        m = self.ix.match(tree, arr(ctx), need_continuation=True)
        if m is None:
            return
        toks, parents, probs, score = self.ix.draft_tree(m, k, min_prob)
        x = ctx[len(ctx) - m.length:]
        cands = self.ref.tree_candidates(tree, x, min_prob, self.depth - m.length)
        # Every drafted token is a real continuation path with its probability.
        paths = []
        for i in range(len(toks)):
            assert parents[i] < i
            path = (paths[parents[i]] if parents[i] >= 0 else ()) + (int(toks[i]),)
            paths.append(path)
            assert cands[path] == pytest.approx(float(probs[i]), rel=1e-5)
        assert len(set(paths)) == len(paths)
        # Best-first: the draft holds the k most probable candidates.
        want = sorted(cands.values(), reverse=True)[:k]
        assert np.allclose(sorted(probs.tolist(), reverse=True), want, rtol=1e-5)
        assert score == pytest.approx(sum(want), rel=1e-4)


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = SETTINGS


@pytest.mark.parametrize("seed", range(4))
def test_long_sequences_match_reference(seed):
    """Longer streams than hypothesis draws: deeper edges, more splits and merges."""
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(3, 12))
    ix = SuffixIndex(max_depth=depth, node_capacity=8, token_capacity=8)
    ref = NaiveIndex(depth)
    tree = ix.add_tree()
    ref.trees[tree] = {}
    motif = rng.integers(0, 6, size=20)
    seqs = []
    for _ in range(8):
        parts = [motif[: rng.integers(1, 20)] if rng.random() < 0.5
                 else rng.integers(0, 6, size=rng.integers(1, 15)) for _ in range(8)]
        toks = np.concatenate(parts).astype(np.int32)
        s = ix.add_sequence(tree)
        for chunk in np.array_split(toks, 5):
            ix.extend(s, chunk)
        ref.trees[tree][s] = toks.tolist()
        seqs.append(s)
        if rng.random() < 0.5:
            ix.close(s)
        if len(seqs) > 3 and rng.random() < 0.4:
            gone = seqs.pop(int(rng.integers(len(seqs))))
            ix.remove(gone)
            del ref.trees[tree][gone]
        ix.check_integrity()
        for _ in range(30):
            src = ref.trees[tree][seqs[int(rng.integers(len(seqs)))]]
            i = int(rng.integers(len(src)))
            ctx = src[max(0, i - 10):i] + ([int(rng.integers(6))] if rng.random() < 0.3 else [])
            m = ix.match(tree, np.asarray(ctx, np.int32), need_continuation=True)
            want = ref.longest_match(tree, ctx, True, depth)
            assert (m.length if m else -1) == want
            if m is not None and m.length:
                x = ctx[len(ctx) - m.length:]
                toks, counts = ix.continuations(m)
                assert dict(zip(toks.tolist(), counts.tolist())) == dict(ref.continuations(tree, x))
    ix.rebuild()
    ix.check_integrity()
    assert ix.dead_tokens == 0
    assert ix.live_tokens == sum(len(t) for t in ref.trees[tree].values())


@pytest.mark.parametrize("seed", range(4))
def test_interleaved_open_sequences_in_one_tree(seed):
    """Requests in flight together append to one cross-pool tree in turns.

    One sequence can then reach a leaf that another is still growing, the case
    that closes open leaves and pulls the owner's SEQ_FRONT back.
    """
    rng = np.random.default_rng(100 + seed)
    depth = int(rng.integers(2, 10))
    ix = SuffixIndex(max_depth=depth, node_capacity=8, token_capacity=8)
    ref = NaiveIndex(depth)
    tree = ix.add_tree()
    ref.trees[tree] = {}
    motif = rng.integers(0, 4, size=12)
    live = []
    for step in range(60):
        if len(live) < 3:
            s = ix.add_sequence(tree)
            ref.trees[tree][s] = []
            live.append(s)
        s = live[int(rng.integers(len(live)))]
        start = int(rng.integers(0, 8))
        chunk = (motif[start:start + int(rng.integers(1, 5))] if rng.random() < 0.7
                 else rng.integers(0, 4, size=int(rng.integers(1, 4))))
        ix.extend(s, chunk.astype(np.int32))
        ref.trees[tree][s].extend(chunk.tolist())
        r = rng.random()
        if r < 0.08:
            ix.close(s)
            live.remove(s)
        elif r < 0.12:
            ix.remove(s)
            live.remove(s)
            del ref.trees[tree][s]
        ix.check_integrity()
        ctx = rng.integers(0, 4, size=6).tolist()
        m = ix.match(tree, np.asarray(ctx, np.int32), need_continuation=True)
        assert (m.length if m else -1) == ref.longest_match(tree, ctx, True, depth)
        if m is not None and m.length:
            toks, counts = ix.continuations(m)
            want = ref.continuations(tree, ctx[len(ctx) - m.length:])
            assert dict(zip(toks.tolist(), counts.tolist())) == dict(want)
