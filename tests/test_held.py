"""native.held: the objects that carry a proposer's arrays into the step kernels."""

import numpy as np
from numba import njit

from suffixspec.native import layout as lay
from suffixspec.native.held import Holder, hold


def test_holder_makes_again_only_when_a_part_is_replaced():
    made = []

    def make(*parts):
        made.append(parts)
        return object()

    holder = Holder(make)
    a, b = np.zeros(3), np.zeros(4)
    first = holder(a, b)
    assert holder(a, b) is first and len(made) == 1
    b[0] = 1.0  # written in place: still the same array
    assert holder(a, b) is first
    second = holder(a, np.zeros(4))  # an equal array, but another one
    assert second is not first and len(made) == 2
    assert holder(a, made[1][1]) is second


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
