"""native.held: the objects that carry a proposer's arrays into the step kernels."""

import numpy as np
import pytest
from numba import njit

from suffixspec.native import layout as lay
from suffixspec.native.held import Holder, hold


def test_holder_makes_again_only_when_a_part_is_replaced():
    made = []

    def make(*parts):
        made.append(parts)
        return object()

    holder = Holder(make)
    a, b, c, d = np.zeros(3), np.zeros(4), (np.zeros(2),), np.zeros(1)
    first = holder(a, b, c, d)
    assert holder(a, b, c, d) is first and len(made) == 1
    b[0] = 1.0  # written in place: still the same array
    assert holder(a, b, c, d) is first
    second = holder(a, np.zeros(4), c, d)  # an equal array, but another one
    assert second is not first and len(made) == 2
    assert holder(a, made[1][1], c, d) is second
    last = second
    for at in range(4):  # each of the four parts counts
        parts = list(made[-1])
        parts[at] = (np.zeros(2),) if at == 2 else np.zeros(parts[at].shape)
        now = holder(*parts)
        assert now is not last and len(made) == 3 + at
        assert holder(*parts) is now and len(made) == 3 + at
        last = now


@njit
def _parts(held):
    return held.out[3], held.pending[0], held.stats[0]


def test_a_held_keeps_the_very_arrays_it_was_made_of():
    out, pending = lay.outputs(2, 4), lay.pending(2, 4)
    stats = (np.zeros((8, 2)), np.zeros(4), np.full(1, -1, np.int8))
    held = hold(stats, tuple(out), tuple(pending), lay.flat(lay.workspace(4)))
    n, tokens, table = _parts(held)
    n[1] = 7  # no copies: what the kernels write is the proposer's own
    tokens[0, 2] = 9
    table[3, 1] = 2.5
    assert out.n[1] == 7 and pending.tokens[0, 2] == 9 and stats[0][3, 1] == 2.5


def test_an_index_hands_out_its_arrays_anew_after_each_growth():
    from suffixspec.index import SuffixIndex

    ix = SuffixIndex(max_depth=8, node_capacity=32, token_capacity=16)
    tree = ix.add_tree()
    seq = ix.add_sequence(tree, capacity=4)
    flat, views = ix.extend_args()[0], ix.read_only_arrays()
    assert ix.extend_args()[0] is flat and ix.read_only_arrays() is views  # nothing grew
    replaced = 0
    for step in range(40):  # outgrows nodes, child table and arena
        before = tuple(getattr(ix, name) for name in lay.Index._fields)
        ix.extend(seq, np.arange(step, step + 7, dtype=np.int32) % 11)
        now = ix.extend_args()[0]
        grew = not all(x is y for x, y in zip(before, now))
        replaced += grew
        assert (now is flat) is not grew
        assert all(x is getattr(ix, name) for x, name in zip(now, lay.Index._fields))
        read_only = ix.read_only_arrays()
        assert all(np.shares_memory(v, a) for v, a in zip(read_only, now))
        assert (read_only is views) is not grew
        flat, views = now, read_only
    assert replaced >= 3
    ix.remove(seq)
    ix.rebuild()  # takes over the arrays of a new index, one that held nothing
    assert all(x is getattr(ix, name) for x, name in zip(ix.extend_args()[0], lay.Index._fields))
    assert all(np.shares_memory(v, a) for v, a in zip(ix.read_only_arrays(), ix.plain_arrays()))


@pytest.mark.parametrize("batched", [False, True])
def test_an_index_that_grows_without_room_fails_instead_of_looping(monkeypatch, batched):
    """Growth always leaves room for one more token; if it ever did not (a bug:
    the kernel handed arrays older than the index's), appending stops with an
    error at the place it stalled, instead of calling the kernel forever."""
    from suffixspec.index import SuffixIndex

    ix = SuffixIndex(max_depth=8, node_capacity=32, token_capacity=16)
    seq = ix.add_sequence(ix.add_tree(), capacity=4)
    calls = []
    monkeypatch.setattr(ix, "_make_room", lambda s, more: calls.append((s, more)))
    tokens = np.arange(40, dtype=np.int32) % 11
    with pytest.raises(RuntimeError, match=f"sequence {seq} after 4 tokens"):
        if batched:
            ix.extend_many(np.array([seq], np.int64), tokens, np.array([0, 40], np.int64))
        else:
            ix.extend(seq, tokens)
    assert calls == [(seq, 36)]  # grown once at the stall, then the error
    monkeypatch.undo()
    ix.extend(seq, tokens[4:])  # the index is whole: the rest goes in
    assert ix.seqs[seq, lay.SEQ_LEN] == 40
