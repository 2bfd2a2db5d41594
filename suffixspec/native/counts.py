"""The counts policy: raw count ratios, as arctic-inference drafts (plus flags).

A draft from an L-token match holds at most ``L * factor + offset`` tokens and
stops before a token whose probability (the product of ``count(child) /
count(node)`` along the path) is below ``min_prob``; the draft with the
highest sum of probabilities wins, a mild bias for long matches with
``LONG_BIAS``.
"""

import numpy as np
from numba import njit

from .heap import heap_push, heap_take
from .layout import (ALL_LENGTHS, BEST, COUNT, FIRST, FROM_CROSS, FROM_NONE, FROM_REQUEST,
                     LONG_BIAS, NEXT, SELF_DISCOUNT, SEQ_LEN, SEQ_ROOT, SEQ_SLOT)
from .trie import anchors, edge_len, tail, label, longest_match, step_best, suffix_position
from .union import NOWHERE, side


@njit(cache=True)
def draft_path(index, x, off, max_tokens, min_prob, out_tokens, out_probs, discount):
    """Follow the most frequent continuation from position ``(x, off)``.

    Each token's probability is the product of ``count(child)/count(node)``
    along the path; drafting stops before a token whose probability would be
    below ``min_prob``.  ``discount`` occurrences are taken out of the starting
    node's count (the context's own occurrence, which has no continuation
    yet).  Writes at most ``max_tokens`` tokens; returns how many, and the
    score (the sum of the probabilities).
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    n = 0
    prob = 1.0
    score = 0.0
    length = edge_len(nodes, seqs, x)
    while n < max_tokens:
        tok, c, cnt, nx = step_best(nodes, arena, seqs, x, off, length, discount if n == 0 else 0)
        if cnt <= 0:
            break
        if nx != x:
            p = prob * c / cnt
            if p < min_prob:
                break
            prob = p
            x = nx
            off = 1
            length = edge_len(nodes, seqs, x)
        else:
            off += 1
        out_tokens[n] = tok
        out_probs[n] = prob
        score += prob
        n += 1
    return n, score


@njit(cache=True)
def draft_tree(index, x, off, max_tokens, min_prob, out_tokens, out_parents, out_probs, heap):
    """Best-first expansion from position ``(x, off)``.

    Repeatedly takes the frontier position with the highest probability, so
    the draft holds the ``max_tokens`` most probable continuations (each at
    least ``min_prob``) and is closed under prefixes.  ``out_parents[i]`` is
    the index of token i's parent in the draft, -1 for a first token.  When
    the frontier (``heap``) is full, further entries are dropped.  Returns
    the number of tokens and the score.
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    cap = heap.prob.shape[0]
    size = heap_push(heap, 0, 1.0, x, off, -1, 0, 0)
    n = 0
    score = 0.0
    while n < max_tokens and size > 0:
        prob, x, off, parent, _, _, size = heap_take(heap, size)
        if off < edge_len(nodes, seqs, x):
            out_tokens[n] = label(arena, seqs, nodes, x, off)
            out_parents[n] = parent
            out_probs[n] = prob
            score += prob
            if size < cap:
                size = heap_push(heap, size, prob, x, off + 1, n, 0, 0)
            n += 1
        else:
            c = nodes[x, FIRST]
            while c != -1:
                p = prob * nodes[c, COUNT] / nodes[x, COUNT]
                if p >= min_prob and size < cap:
                    size = heap_push(heap, size, p, c, 0, parent, 0, 0)
                c = nodes[c, NEXT]
    return n, score


@njit(cache=True)
def _tree_best(index, root, ctx, start, end, limit, knobs, own, out, work):
    """Draft from one tree for context ``ctx[start:end]`` by count ratios.

    ``own`` describes the request's own open sequence in this tree (see
    ``trie.suffix_position``).  The best draft goes to ``out`` (a
    ``Candidate``).  Returns ``(n, score, rank, match_len)``: the score is
    the sum of the probabilities, the rank what drafts were compared by; n is
    0 when nothing matched.
    """
    nodes, seqs = index.nodes, index.seqs
    depth = knobs.depth
    flags = knobs.flags
    cand = work.cand
    match_len, x, off = longest_match(index, root, ctx, start, end, depth - 1, True, own)
    if match_len <= 0:
        return 0, 0.0, 0.0, 0
    shortest = 1 if flags & ALL_LENGTHS else match_len
    best_n = 0
    best_score = 0.0
    best_rank = -1.0
    best_len = match_len
    for length in range(match_len, shortest - 1, -1):
        cap = int(length * knobs.factor + knobs.offset + 1e-6)
        if cap > limit:
            cap = limit
        bias = 1.0 + length / (4.0 * depth) if flags & LONG_BIAS else 1.0
        # A draft scores at most its length: shorter matches cannot win now.
        if cap * bias <= best_rank:
            break
        x, off = suffix_position(index, root, ctx, end, length, own)
        discount = 0
        at_end = off == edge_len(nodes, seqs, x)
        if flags & SELF_DISCOUNT and own[0] >= 0 and length <= own[2] and at_end:
            discount = 1
        if at_end:
            b = nodes[x, BEST]
            if b == -1:
                continue
            # Every later token is at most as probable as the first one.
            if cap * bias * nodes[b, COUNT] / (nodes[x, COUNT] - discount) <= best_rank:
                continue
        if knobs.tree:
            n, score = draft_tree(index, x, off, cap, knobs.min_prob, cand.tokens, cand.parents,
                                  cand.probs, work.heap)
        else:
            n, score = draft_path(index, x, off, cap, knobs.min_prob, cand.tokens, cand.probs,
                                  discount)
            for i in range(n):
                cand.parents[i] = i - 1
        rank = score * bias
        # Longer matches are tried first and win ties.
        if n > 0 and rank > best_rank:
            best_n = n
            best_score = score
            best_rank = rank
            best_len = length
            for j in range(n):  # loops, not slice copies: those compile a costly error path
                out.tokens[j] = cand.tokens[j]
                out.parents[j] = cand.parents[j]
                out.probs[j] = cand.probs[j]
    if best_n == 0:
        return 0, 0.0, 0.0, match_len
    return best_n, best_score, best_rank, best_len


@njit(cache=True)
def draft_request(i, local, local_roots, delta, cross, batch, knobs, out, work):
    """The counts policy for request ``i``: each tree's best draft, the highest rank wins.

    ``cross`` is the cross pool's side table (``union``): ``delta``, then the
    snapshot segments.
    """
    l_seqs = local.seqs
    s = batch.seqs[i]
    start, end = tail(local, s, knobs.depth)
    limit = batch.limits[i]
    ctx = local.arena
    row = (out.tokens[i], out.parents[i], out.probs[i])
    own = (l_seqs[s, SEQ_SLOT], l_seqs[s, SEQ_LEN], l_seqs[s, SEQ_LEN])
    n, score, best, m = _tree_best(local, np.int64(local_roots[batch.trees[i]]), ctx, start, end, limit,
                                   knobs, own, work.best, work)
    for j in range(n):
        row[0][j] = work.best.tokens[j]
        row[1][j] = work.best.parents[j]
        row[2][j] = work.best.probs[j]
    out.n[i] = n
    out.score[i] = score
    out.match[i] = m
    out.source[i] = FROM_REQUEST if n > 0 else FROM_NONE
    cs = batch.cross_seqs[i]
    # Each tree of the in-memory part (side 0) and the snapshot segments
    # apart, segments first (``union`` names the sides).
    n_sides = cross.shape[0]
    for j in range(batch.cross_roots.shape[1]):
        for t in range(1, n_sides + 1):
            k = t % n_sides
            root = batch.cross_roots[i, j, k]
            if root < 0:
                continue
            own = NOWHERE
            if k == 0 and cs >= 0 and delta.seqs[cs, SEQ_ROOT] == root:
                own_len = delta.seqs[cs, SEQ_LEN]
                own = (delta.seqs[cs, SEQ_SLOT], own_len, own_len - anchors(delta, cs))
            n2, score2, rank2, m2 = _tree_best(side(cross, k), root, ctx, start, end, limit,
                                               knobs, own, work.best, work)
            if n2 > 0 and rank2 > best:
                best = rank2
                for q in range(n2):
                    row[0][q] = work.best.tokens[q]
                    row[1][q] = work.best.parents[q]
                    row[2][q] = work.best.probs[q]
                out.n[i] = n2
                out.score[i] = score2
                out.match[i] = m2
                out.source[i] = FROM_CROSS
