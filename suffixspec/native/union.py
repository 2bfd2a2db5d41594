"""Continuations of one string in two indexes at once, counts added up.

A persistent pool drafts from its snapshot and from its in-memory part.  Each
holds some of the pool's sequences, so the occurrences of a string in the pool
are those in both: counted together, a draft is the one a single index over
every sequence would give (up to the order of equally frequent tokens).

A *position* is ``(x, off, length)``: the string ends ``off`` tokens into node
``x``'s edge of ``length`` tokens; ``x == -1`` when the index does not hold
the string.
"""

import numpy as np
from numba import njit

from .layout import COUNT, FIRST, NEXT, TOKEN
from .trie import _find_child, edge_len, label, step_best


NOWHERE = (np.int64(-1), np.int64(0), np.int64(0))


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
def best_next(a, pa, b, pb, discount):
    """The most frequent next token over positions ``pa`` in ``a`` and ``pb`` in ``b``.

    Returns ``(token, c, n)``: ``c`` of the ``n`` occurrences (both indexes,
    less ``discount``) continue with it; ``n <= 0`` when nothing follows.  The
    token is the most frequent among the fewer-occurrence side's next tokens
    and the other side's most frequent one: a token only the other side holds
    is never more frequent there than that side's most frequent.
    """
    xa, oa, la = pa
    xb, ob, lb = pb
    if xb < 0 or xa < 0:
        if xa < 0 and xb < 0:
            return -1, 0, 0
        if xa < 0:
            tok, c, n, _ = step_best(b.nodes, b.arena, b.seqs, xb, ob, lb, discount)
        else:
            tok, c, n, _ = step_best(a.nodes, a.arena, a.seqs, xa, oa, la, discount)
        return tok, c, n
    n = a.nodes[xa, COUNT] + b.nodes[xb, COUNT] - discount
    if n <= 0:
        return -1, 0, 0
    # Enumerate the side with fewer occurrences ("few"), add the other's counts.
    few, pf, many, pm = a, pa, b, pb
    if b.nodes[xb, COUNT] < a.nodes[xa, COUNT]:
        few, pf, many, pm = b, pb, a, pa
    xf, of, lf = pf
    xm, om, lm = pm
    top, _, _, _ = step_best(many.nodes, many.arena, many.seqs, xm, om, lm, 0)
    best = top
    best_c = 0
    if top >= 0:
        best_c = count_next(many, xm, om, lm, top) + count_next(few, xf, of, lf, top)
    if of < lf:
        tok = label(few.arena, few.seqs, few.nodes, xf, of)
        k = few.nodes[xf, COUNT] + count_next(many, xm, om, lm, tok)
        if k > best_c:
            best, best_c = tok, k
    else:
        c = few.nodes[xf, FIRST]
        while c != -1:
            tok = few.nodes[c, TOKEN]
            k = few.nodes[c, COUNT] + count_next(many, xm, om, lm, tok)
            if k > best_c:
                best, best_c = tok, k
            c = few.nodes[c, NEXT]
    if best_c > n:
        best_c = n
    return best, best_c, n


@njit(cache=True)
def bound_next(a, pa, b, pb, discount):
    """``(c, n)`` as ``best_next`` gives, with ``c`` an upper bound: the two most frequent's counts.

    Costs two lookups where ``best_next`` visits every next token of one side.
    """
    xa, oa, la = pa
    xb, ob, lb = pb
    _, ca, _, _ = step_best(a.nodes, a.arena, a.seqs, xa, oa, la, 0)
    _, cb, _, _ = step_best(b.nodes, b.arena, b.seqs, xb, ob, lb, 0)
    n = a.nodes[xa, COUNT] + b.nodes[xb, COUNT] - discount
    c = ca + cb
    if c > n:
        c = n
    return c, n
