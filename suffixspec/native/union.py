"""Continuations of one string in several indexes at once, counts added up.

A persistent pool drafts from its snapshot segments and its in-memory part.
Each holds some of the pool's sequences, so the occurrences of a string in
the pool are those in all of them: counted together, a draft is the one a
single index over every sequence would give (up to the order of equally
frequent tokens).

The indexes are *sides*: side 0 is ``first`` (the in-memory part, or a
request's own tree), side ``k > 0`` is ``segs[k - 1]``, a plain tuple in
``Index`` field order.  All are typed alike, so one compiled variant serves
every side.

A *position* is ``(x, off, length)``: the string ends ``off`` tokens into node
``x``'s edge of ``length`` tokens; ``x == -1`` when the index does not hold
the string.  The positions of a string on every side are the rows of an
int64 array of shape ``(n, 3)``: sides ``0 .. n - 1`` take part, the others
hold no tree (so a pool with few segments pays for no more).
"""

import numpy as np
from numba import njit

from .layout import COUNT, FIRST, NEXT, TOKEN, Index
from .trie import _find_child, edge_len, label, step_best


NOWHERE = (np.int64(-1), np.int64(0), np.int64(0))


@njit(cache=True)
def sides(segs):
    """How many sides ``first`` and ``segs`` make."""
    return len(segs) + 1


@njit(cache=True, inline="always")
def side(first, segs, k):
    """Side ``k``'s index (inlined: a call would pass every segment's arrays)."""
    if k == 0:
        return first
    return Index(*segs[k - 1])


@njit(cache=True)
def position(index, x, off):
    """The position ``(x, off)`` with its edge length (``x`` -1: none)."""
    if x < 0:
        return NOWHERE
    return np.int64(x), np.int64(off), np.int64(edge_len(index.nodes, index.seqs, x))


@njit(cache=True)
def advance(index, x, off, length, tok):
    """The position after ``tok``: ``(x, off, length)``, ``x`` -1 when ``tok`` never follows."""
    if x < 0:
        return NOWHERE
    if off < length:
        if label(index.arena, index.seqs, index.nodes, x, off) == tok:
            return x, off + 1, length
        return NOWHERE
    c = _find_child(index.nodes, index.hkeys, index.hvals, x, tok)
    if c < 0:
        return NOWHERE
    return np.int64(c), np.int64(1), np.int64(edge_len(index.nodes, index.seqs, c))


@njit(cache=True)
def advance_all(first, segs, pos, tok):
    """Move every side's position past ``tok`` (in place)."""
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            x, off, length = advance(side(first, segs, k), pos[k, 0], pos[k, 1], pos[k, 2], tok)
            pos[k, 0] = x
            pos[k, 1] = off
            pos[k, 2] = length


@njit(cache=True)
def count_next(index, x, off, length, tok):
    """How many occurrences of the string at the position continue with ``tok``."""
    if x < 0:
        return 0
    if off < length:
        if label(index.arena, index.seqs, index.nodes, x, off) == tok:
            return index.nodes[x, COUNT]
        return 0
    c = _find_child(index.nodes, index.hkeys, index.hvals, x, tok)
    return 0 if c < 0 else index.nodes[c, COUNT]


@njit(cache=True)
def _count_all(first, segs, pos, tok):
    """Occurrences on every side that continue with ``tok``."""
    total = 0
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            total += count_next(side(first, segs, k), pos[k, 0], pos[k, 1], pos[k, 2], tok)
    return total


@njit(cache=True)
def occurrences(first, segs, pos):
    """``(n, held, most)``: occurrences of the string on every side, how many
    sides hold it, and the side with the most (the last of equals; -1: none)."""
    n = 0
    held = 0
    most = -1
    top = -1
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            c = side(first, segs, k).nodes[pos[k, 0], COUNT]
            n += c
            held += 1
            if c >= top:
                top = c
                most = k
    return n, held, most


@njit(cache=True)
def best_next(first, segs, pos, discount):
    """The most frequent next token over every side's position.

    Returns ``(token, c, n)``: ``c`` of the ``n`` occurrences (all sides,
    less ``discount``) continue with it; ``n <= 0`` when nothing follows.  The
    token is the most frequent among the next tokens of every side but the
    one with the most occurrences, and that side's most frequent one: a token
    only that side holds is never more frequent there than its most frequent.
    """
    n, held, many = occurrences(first, segs, pos)
    if held == 0:
        return -1, 0, 0
    m = side(first, segs, many)
    xm, om, lm = pos[many, 0], pos[many, 1], pos[many, 2]
    if held == 1:
        tok, c, n, _ = step_best(m.nodes, m.arena, m.seqs, xm, om, lm, discount)
        return tok, c, n
    n -= discount
    if n <= 0:
        return -1, 0, 0
    top, _, _, _ = step_best(m.nodes, m.arena, m.seqs, xm, om, lm, 0)
    best = top
    best_c = 0
    if top >= 0:
        best_c = _count_all(first, segs, pos, top)
    for k in range(pos.shape[0]):
        if k == many or pos[k, 0] < 0:
            continue
        few = side(first, segs, k)
        xf, of, lf = pos[k, 0], pos[k, 1], pos[k, 2]
        if of < lf:
            tok = label(few.arena, few.seqs, few.nodes, xf, of)
            c = _count_all(first, segs, pos, tok)
            if c > best_c:
                best, best_c = tok, c
        else:
            y = few.nodes[xf, FIRST]
            while y != -1:
                tok = few.nodes[y, TOKEN]
                c = _count_all(first, segs, pos, tok)
                if c > best_c:
                    best, best_c = tok, c
                y = few.nodes[y, NEXT]
    if best_c > n:
        best_c = n
    return best, best_c, n


@njit(cache=True)
def bound_next(first, segs, pos, discount):
    """``(c, n)`` as ``best_next`` gives, with ``c`` an upper bound: the sum of
    every side's most frequent count.  One lookup per side, where
    ``best_next`` visits the next tokens of all sides but one."""
    n = -discount
    c = 0
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            ix = side(first, segs, k)
            _, ck, _, _ = step_best(ix.nodes, ix.arena, ix.seqs, pos[k, 0], pos[k, 1],
                                    pos[k, 2], 0)
            c += ck
            n += ix.nodes[pos[k, 0], COUNT]
    if c > n:
        c = n
    return c, n
