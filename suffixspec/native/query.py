"""Raw-count drafts from one position of one index (``SuffixIndex``'s query API).

A token's probability is the product of ``count(child) / count(node)`` along
the path; drafting stops before one below ``min_prob``.  The proposer drafts
with the calibrated policy (``calibrated``); these serve queries and tests.
"""

from numba import njit

from .heap import heap_push, heap_take
from .layout import COUNT, FIRST, NEXT
from .trie import edge_len, label, step_best


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
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
