"""Continuations of one string in several indexes at once, counts added up.

A persistent pool drafts from its snapshot segments and its in-memory part.
Each holds some of the pool's sequences, so the occurrences of a string in
the pool are those in all of them: counted together, a draft is the one a
single index over every sequence would give (up to the order of equally
frequent tokens).

The indexes are *sides*, named by a side table: an int64 array of shape
``(n, FIELDS, 3)`` whose row ``k`` gives, per ``Index`` field, the address
of side ``k``'s array and its shape (``table``, ``put``).  Side 0 is the
in-memory part (or a request's own tree); the others are segments.  A side is
looked up as a record of arrays over those addresses (``side``), with no
reference count: the caller keeps the arrays alive while the kernel runs.
One small array passes from call to call and from Python to the kernel at
the cost of one argument, where a tuple of records costs a few hundred ns
to pass, or to index at run time.

A *position* is ``(x, off, length)``: the string ends ``off`` tokens into node
``x``'s edge of ``length`` tokens; ``x == -1`` when the index does not hold
the string.  The positions of a string on every side are the rows of an
int64 array of shape ``(n, 3)``: sides ``0 .. n - 1`` take part, the others
hold no tree (so a pool with few segments pays for no more).
"""

import numpy as np
from numba import carray, njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .layout import COUNT, FIRST, NEXT, TOKEN, Index
from .trie import _find_child, edge_len, label, step_best


NOWHERE = (np.int64(-1), np.int64(0), np.int64(0))

#: Per ``Index`` field: (address, rows, columns; 0 for a one-dimensional array).
FIELDS = len(Index._fields)

#: The type of each ``Index`` field's array, as ``side`` reads it.
TYPES = Index((np.int64, 1), (np.int32, 2), (np.int64, 1), (np.int32, 1), (np.int32, 1),
              (np.int64, 2), (np.int32, 2))


def table(indexes) -> np.ndarray:
    """The side table of ``indexes`` (each a tuple of arrays in ``Index`` field
    order), made in Python: the caller keeps the arrays alive while it is used."""
    t = np.zeros((len(indexes), FIELDS, 3), np.int64)
    for k, index in enumerate(indexes):
        for a, (dtype, ndim) in zip(index, TYPES):
            if a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
                raise ValueError("a side's arrays must be contiguous, typed as an index's")
        put(t, k, Index(*index))
    return t


@intrinsic
def _pointer(typingctx, address):
    """The address ``address`` (an integer) as a pointer."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(address), codegen


@njit(cache=True)
def _row(a, t):
    t[0] = a.ctypes.data
    t[2] = 0
    for d in range(a.ndim):
        t[1 + d] = a.shape[d]


@njit(cache=True, nogil=True)
def put(sides, k, index):
    """Make side ``k`` of the table ``sides`` name ``index`` (the caller keeps it alive)."""
    _row(index.meta, sides[k, 0])
    _row(index.nodes, sides[k, 1])
    _row(index.hkeys, sides[k, 2])
    _row(index.hvals, sides[k, 3])
    _row(index.arena, sides[k, 4])
    _row(index.seqs, sides[k, 5])
    _row(index.active, sides[k, 6])


@njit(cache=True)
def side(sides, k):
    """Side ``k``: an ``Index`` over the addresses the table gives."""
    t = sides[k]
    return Index(carray(_pointer(t[0, 0]), t[0, 1], np.int64),
                 carray(_pointer(t[1, 0]), (t[1, 1], t[1, 2]), np.int32),
                 carray(_pointer(t[2, 0]), t[2, 1], np.int64),
                 carray(_pointer(t[3, 0]), t[3, 1], np.int32),
                 carray(_pointer(t[4, 0]), t[4, 1], np.int32),
                 carray(_pointer(t[5, 0]), (t[5, 1], t[5, 2]), np.int64),
                 carray(_pointer(t[6, 0]), (t[6, 1], t[6, 2]), np.int32))


@njit(cache=True, nogil=True)
def position(index, x, off):
    """The position ``(x, off)`` with its edge length (``x`` -1: none)."""
    if x < 0:
        return NOWHERE
    return np.int64(x), np.int64(off), np.int64(edge_len(index.nodes, index.seqs, x))


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def advance_all(sides, pos, tok):
    """Move every side's position past ``tok`` (in place)."""
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            x, off, length = advance(side(sides, k), pos[k, 0], pos[k, 1], pos[k, 2], tok)
            pos[k, 0] = x
            pos[k, 1] = off
            pos[k, 2] = length


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _count_all(sides, pos, tok):
    """Occurrences on every side that continue with ``tok``."""
    total = 0
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            total += count_next(side(sides, k), pos[k, 0], pos[k, 1], pos[k, 2], tok)
    return total


@njit(cache=True, nogil=True)
def counts_of(sides, pos, tok, discount):
    """``(c, n)`` for ``tok`` as ``best_next`` gives them for its token: ``c`` of
    the ``n`` occurrences (all sides, less ``discount``) continue with it."""
    n, _, _ = occurrences(sides, pos)
    n -= discount
    c = _count_all(sides, pos, tok)
    if c > n:
        c = n
    return c, n


@njit(cache=True, nogil=True)
def occurrences(sides, pos):
    """``(n, held, most)``: occurrences of the string on every side, how many
    sides hold it, and the side with the most (the last of equals; -1: none)."""
    n = 0
    held = 0
    most = -1
    top = -1
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            c = side(sides, k).nodes[pos[k, 0], COUNT]
            n += c
            held += 1
            if c >= top:
                top = c
                most = k
    return n, held, most


@njit(cache=True, nogil=True)
def best_next(sides, pos, discount):
    """The most frequent next token over every side's position.

    Returns ``(token, c, n)``: ``c`` of the ``n`` occurrences (all sides,
    less ``discount``) continue with it; ``n <= 0`` when nothing follows.  The
    token is the most frequent among the next tokens of every side but the
    one with the most occurrences, and that side's most frequent one: a token
    only that side holds is never more frequent there than its most frequent.
    """
    n, held, many = occurrences(sides, pos)
    if held == 0:
        return -1, 0, 0
    m = side(sides, many)
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
        best_c = _count_all(sides, pos, top)
    for k in range(pos.shape[0]):
        if k == many or pos[k, 0] < 0:
            continue
        few = side(sides, k)
        xf, of, lf = pos[k, 0], pos[k, 1], pos[k, 2]
        if of < lf:
            tok = label(few.arena, few.seqs, few.nodes, xf, of)
            c = _count_all(sides, pos, tok)
            if c > best_c:
                best, best_c = tok, c
        else:
            y = few.nodes[xf, FIRST]
            while y != -1:
                tok = few.nodes[y, TOKEN]
                c = _count_all(sides, pos, tok)
                if c > best_c:
                    best, best_c = tok, c
                y = few.nodes[y, NEXT]
    if best_c > n:
        best_c = n
    return best, best_c, n


@njit(cache=True, nogil=True)
def bound_next(sides, pos, discount):
    """``(c, n)`` as ``best_next`` gives, with ``c`` an upper bound: the sum of
    every side's most frequent count.  One lookup per side, where
    ``best_next`` visits the next tokens of all sides but one."""
    n = -discount
    c = 0
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            ix = side(sides, k)
            _, ck, _, _ = step_best(ix.nodes, ix.arena, ix.seqs, pos[k, 0], pos[k, 1],
                                    pos[k, 2], 0)
            c += ck
            n += ix.nodes[pos[k, 0], COUNT]
    if c > n:
        c = n
    return c, n
