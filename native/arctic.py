"""arctic-inference's drafting rule, on suffixspec's trie.

``suffixspec.compat.arctic`` offers arctic-inference's ``SuffixDecodingCache``
API; in its ``arctic`` mode it drafts exactly as arctic-inference 0.3.0 does.
That rule: for every match length ``L`` from 1 up to ``len(context) - 1``
(stopping at the first length that does not occur), follow the most frequent
continuation for at most ``min(max_spec_tokens, int(L * factor + offset +
1e-6))`` tokens while the running probability stays at or above
``min_prob``, and keep the best-scoring draft (a later, longer match wins a
tie).  Probabilities and scores are float32, as arctic computes them, so
ties and thresholds fall the same way.  The tree must be built with the
``TIES_ARCTIC`` tie order for the followed continuation to be arctic's.
Tree drafts expand the likeliest frontier entry first through a binary heap
that works as the C++ standard library's ``priority_queue`` (libstdc++), so
equal probabilities come out in arctic's order too.
"""

import numpy as np
from numba import njit

from .suffix_index import BEST, COUNT, FIRST, NEXT, _elen, _label, _walk


@njit(cache=True)
def arctic_path(nodes, arena, seqs, x, off, max_tokens, min_prob, out_tokens, out_probs):
    """Most-frequent-continuation path from ``(x, off)``, float32 as arctic.

    ``min_prob`` is a float32.  Returns (tokens written, float32 score).
    """
    n = 0
    prob = np.float32(1.0)
    score = np.float32(0.0)
    length = _elen(nodes, seqs, x)
    while n < max_tokens and prob >= min_prob:
        if off < length:
            out_tokens[n] = _label(arena, seqs, nodes, x, off)
            out_probs[n] = prob
            score += prob
            n += 1
            off += 1
        else:
            b = nodes[x, BEST]
            if b == -1:
                break
            prob *= np.float32(nodes[b, COUNT]) / np.float32(nodes[x, COUNT])
            x = b
            off = 0
            length = _elen(nodes, seqs, x)
    return n, score


@njit(cache=True)
def _sift_up(hp, hx, hi, hpar, hole, prob, x, i, parent):
    """Place an entry at ``hole`` or above it (libstdc++'s ``__push_heap``)."""
    up = (hole - 1) // 2
    while hole > 0 and hp[up] < prob:
        hp[hole] = hp[up]
        hx[hole] = hx[up]
        hi[hole] = hi[up]
        hpar[hole] = hpar[up]
        hole = up
        up = (hole - 1) // 2
    hp[hole] = prob
    hx[hole] = x
    hi[hole] = i
    hpar[hole] = parent


@njit(cache=True)
def _heap_push(hp, hx, hi, hpar, size, prob, x, i, parent):
    """libstdc++ ``push_heap`` on a max-heap of probabilities."""
    _sift_up(hp, hx, hi, hpar, size, prob, x, i, parent)
    return size + 1


@njit(cache=True)
def _heap_pop(hp, hx, hi, hpar, size):
    """libstdc++ ``pop_heap`` (the top moves out; the caller read it first)."""
    n = size - 1
    prob = hp[n]
    x = hx[n]
    i = hi[n]
    parent = hpar[n]
    hole = 0
    second = 0
    while second < (n - 1) // 2:
        second = 2 * (second + 1)
        if hp[second] < hp[second - 1]:
            second -= 1
        hp[hole] = hp[second]
        hx[hole] = hx[second]
        hi[hole] = hi[second]
        hpar[hole] = hpar[second]
        hole = second
    if (n & 1) == 0 and second == (n - 2) // 2:
        second = 2 * (second + 1)
        hp[hole] = hp[second - 1]
        hx[hole] = hx[second - 1]
        hi[hole] = hi[second - 1]
        hpar[hole] = hpar[second - 1]
        hole = second - 1
    _sift_up(hp, hx, hi, hpar, hole, prob, x, i, parent)  # the moved last entry
    return n


@njit(cache=True)
def arctic_tree(nodes, arena, seqs, x, off, max_tokens, min_prob, out_tokens, out_parents,
                out_probs, hp, hx, hi, hpar):
    """Best-first draft tree from ``(x, off)``, float32 and heap order as arctic.

    Returns (tokens written, float32 score), or (-1, 0) when the heap arrays
    ran short (call again with larger ones).
    """
    n = 0
    score = np.float32(0.0)
    size = _heap_push(hp, hx, hi, hpar, 0, np.float32(1.0), x, off, -1)
    cap = hp.shape[0]
    while n < max_tokens and size > 0:
        prob = hp[0]
        y = hx[0]
        i = hi[0]
        parent = hpar[0]
        size = _heap_pop(hp, hx, hi, hpar, size)
        if i < _elen(nodes, seqs, y):
            out_tokens[n] = _label(arena, seqs, nodes, y, i)
            out_parents[n] = parent
            out_probs[n] = prob
            score += prob
            n += 1
            if size == cap:
                return -1, np.float32(0.0)
            size = _heap_push(hp, hx, hi, hpar, size, prob, y, i + 1, n - 1)
        else:
            total = np.float32(nodes[y, COUNT])
            c = nodes[y, FIRST]
            while c != -1:
                p = prob * np.float32(nodes[c, COUNT]) / total
                if p < min_prob:
                    break
                if size == cap:
                    return -1, np.float32(0.0)
                size = _heap_push(hp, hx, hi, hpar, size, p, c, 0, parent)
                c = nodes[c, NEXT]
    return n, score


@njit(cache=True)
def arctic_speculate(nodes, hkeys, hvals, arena, seqs, root, ctx, max_spec_tokens,
                     factor, offset, min_prob, tree, out_tokens, out_parents, out_probs,
                     tmp_tokens, tmp_parents, tmp_probs, hp, hx, hi, hpar):
    """arctic's speculation over one tree; see the module docstring.

    ``factor``, ``offset`` and ``min_prob`` are float32; the out and tmp
    arrays hold at least ``max_spec_tokens``.  Returns (tokens, float32
    score, match length) of the best draft; tokens is -1 when the heap
    arrays (tree drafts) ran short.
    """
    best_n = 0
    best_score = np.float32(0.0)
    best_len = 0
    m = ctx.shape[0]
    for length in range(1, m):
        x, off = _walk(nodes, hkeys, hvals, arena, seqs, root, ctx, m - length, m)
        if x == -1:
            break
        cap = np.float32(np.float32(length) * factor + offset)
        limit = int(np.float64(cap) + 1e-6)
        if limit > max_spec_tokens:
            limit = max_spec_tokens
        if limit < 0:
            limit = 0
        if tree:
            n, score = arctic_tree(nodes, arena, seqs, x, off, limit, min_prob, tmp_tokens,
                                   tmp_parents, tmp_probs, hp, hx, hi, hpar)
            if n < 0:
                return -1, np.float32(0.0), 0
        else:
            n, score = arctic_path(nodes, arena, seqs, x, off, limit, min_prob, tmp_tokens,
                                   tmp_probs)
            for i in range(n):
                tmp_parents[i] = i - 1
        if score >= best_score:
            for i in range(n):
                out_tokens[i] = tmp_tokens[i]
                out_parents[i] = tmp_parents[i]
                out_probs[i] = tmp_probs[i]
            best_n = n
            best_score = score
            best_len = length
    return best_n, best_score, best_len
