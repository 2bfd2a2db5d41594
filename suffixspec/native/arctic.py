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
equal probabilities come out in arctic's order too (``heap.std_push``).

The same best draft costs fewer walks here than arctic's loop: two binary
searches find the longest match and the longest one that something follows
(longer ones draft nothing), the lengths are tried from there down with one
child lookup per edge (``trie.walk_occurring``), and the search stops once
no shorter length's token budget could beat the best score.
"""

import numpy as np
from numba import njit

from .heap import std_pop, std_push
from .layout import COUNT, FIRST, NEXT, Candidate, Heap, Index
from .trie import edge_len, label, longest_match, step_best, walk_occurring


@njit(cache=True)
def draft_path(index, x, off, max_tokens, min_prob, out):
    """Most-frequent-continuation path from ``(x, off)``, float32 as arctic.

    ``min_prob`` is a float32.  Returns (tokens written, float32 score).
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    n = 0
    prob = np.float32(1.0)
    score = np.float32(0.0)
    length = edge_len(nodes, seqs, x)
    while n < max_tokens and prob >= min_prob:
        tok, c, cnt, nx = step_best(nodes, arena, seqs, x, off, length, 0)
        if cnt <= 0:
            break
        if nx != x:
            prob *= np.float32(c) / np.float32(cnt)
            x = nx
            off = 1
            length = edge_len(nodes, seqs, x)
            if prob < min_prob:
                break
        else:
            off += 1
        out.tokens[n] = tok
        out.probs[n] = prob
        score += prob
        n += 1
    return n, score


@njit(cache=True)
def draft_tree(index, x, off, max_tokens, min_prob, out, heap):
    """Best-first draft tree from ``(x, off)``, float32 and heap order as arctic.

    ``heap`` holds float32 probabilities.  Returns (tokens written, float32
    score), or (-1, 0) when the heap ran short (call again with a larger one).
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    n = 0
    score = np.float32(0.0)
    size = std_push(heap, 0, np.float32(1.0), x, off, -1)
    cap = heap.prob.shape[0]
    while n < max_tokens and size > 0:
        prob = heap.prob[0]
        y = heap.node[0]
        i = heap.off[0]
        parent = heap.parent[0]
        size = std_pop(heap, size)
        if i < edge_len(nodes, seqs, y):
            out.tokens[n] = label(arena, seqs, nodes, y, i)
            out.parents[n] = parent
            out.probs[n] = prob
            score += prob
            n += 1
            if size == cap:
                return -1, np.float32(0.0)
            size = std_push(heap, size, prob, y, i + 1, n - 1)
        else:
            total = np.float32(nodes[y, COUNT])
            c = nodes[y, FIRST]
            while c != -1:
                p = prob * np.float32(nodes[c, COUNT]) / total
                if p < min_prob:
                    break
                if size == cap:
                    return -1, np.float32(0.0)
                size = std_push(heap, size, p, c, 0, parent)
                c = nodes[c, NEXT]
    return n, score


@njit(cache=True)
def _best(index, root, ctx, max_spec_tokens, knobs, tree, out, cand, heap, best_n, best_score,
          best_len):
    """arctic's best draft over one tree, written to ``out``.

    ``best_n >= 0``: ``out`` already holds a draft of that many tokens, that
    score and match length (another tree's), which a draft here replaces
    only by scoring more.  Returns (tokens, float32 score, match length);
    tokens is -1 when the heap (tree drafts) ran short.
    """
    factor, offset, min_prob = knobs
    nodes, seqs = index.nodes, index.seqs
    m = ctx.shape[0]
    none = (-1, 0, 0)  # no ring of open suffixes: every length is walked
    # arctic tries every length from 1 up and stops at the first that does
    # not occur.  Every suffix of an occurring string occurs, so that is the
    # longest occurring length; and every suffix of one that something
    # follows is followed too.  Binary searches find both.  A longer match
    # than the longest followed one drafts nothing and scores 0.
    longest, _, _ = longest_match(index, root, ctx, 0, m, m - 1, False, none)
    followed, _, _ = longest_match(index, root, ctx, 0, m, longest, True, none)
    # arctic keeps the best score, a longer match winning a tie: going down
    # from the longest, a shorter one must score strictly more.  A draft of
    # at most ``limit`` tokens scores at most ``limit`` (float32 sums of
    # probabilities of at most 1), so a length whose limit is not above the
    # best score is skipped, and with ``factor >= 0`` so is every shorter one.
    fresh = best_n < 0
    for length in range(followed, 0, -1):
        cap = np.float32(np.float32(length) * factor + offset)
        limit = int(np.float64(cap) + 1e-6)
        if limit > max_spec_tokens:
            limit = max_spec_tokens
        if limit < 0:
            limit = 0
        if best_n >= 0 and np.float32(limit) <= best_score:
            if factor >= 0:
                break
            continue
        x, off = walk_occurring(nodes, index.hkeys, index.hvals, seqs, root, ctx, m - length, m)
        if x == -1:
            break  # not a suffix tree of its sequences; arctic's walk would stop here too
        if tree:
            n, score = draft_tree(index, x, off, limit, min_prob, cand, heap)
            if n < 0:
                return -1, np.float32(0.0), 0
        else:
            n, score = draft_path(index, x, off, limit, min_prob, cand)
            for i in range(n):
                cand.parents[i] = i - 1
        if best_n < 0 or score > best_score:
            for i in range(n):
                out.tokens[i] = cand.tokens[i]
                out.parents[i] = cand.parents[i]
                out.probs[i] = cand.probs[i]
            best_n = n
            best_score = score
            best_len = length
    if fresh and (best_n < 0 or (best_score == 0 and longest > followed)):
        return 0, np.float32(0.0), max(longest, 0)  # nothing scored: the longest match ties
    return best_n, best_score, best_len


@njit(cache=True)
def speculate(arrays, root, ctx, max_spec_tokens, knobs, tree, out_arrays, cand_arrays,
              heap_arrays):
    """arctic's speculation over one tree; see the module docstring.

    ``arrays``, ``out_arrays``, ``cand_arrays`` and ``heap_arrays`` hold the
    fields of an ``Index``, two ``Candidate`` and a ``Heap`` record; ``knobs``
    is ``(factor, offset, min_prob)``, float32; ``out`` and ``cand`` hold at
    least ``max_spec_tokens`` tokens.
    Returns (tokens, float32 score, match length) of the best draft, in
    ``out``; tokens is -1 when the heap (tree drafts) ran short.
    """
    # Records arrive as plain tuples (see ``layout``).
    return _best(Index(*arrays), root, ctx, max_spec_tokens, knobs, tree, Candidate(*out_arrays),
                 Candidate(*cand_arrays), Heap(*heap_arrays), -1, np.float32(0.0), 0)


@njit(cache=True)
def speculate_pair(own_arrays, own_root, other_arrays, other_root, ctx, max_spec_tokens, knobs,
                   tree, out_arrays, cand_arrays, heap_arrays):
    """``speculate`` over the request's own tree, then over another (arctic's
    global tree), whose draft is taken only where it scores more: arctic's
    choice between the two, in one call."""
    out = Candidate(*out_arrays)
    cand = Candidate(*cand_arrays)
    heap = Heap(*heap_arrays)
    n, score, length = _best(Index(*own_arrays), own_root, ctx, max_spec_tokens, knobs, tree,
                             out, cand, heap, -1, np.float32(0.0), 0)
    if n < 0:
        return n, score, length
    return _best(Index(*other_arrays), other_root, ctx, max_spec_tokens, knobs, tree, out, cand,
                 heap, n, score, length)
