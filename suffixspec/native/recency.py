"""The recency candidate: what followed the latest earlier occurrence of the match.

The tries rank continuations by how often they followed.  An agent that edits
a file or retries a call often repeats what it did last, not what it did
most.  This candidate takes the request's longest match in its own tree, finds
the latest earlier place in the request where that string ends (looking back
at most ``WINDOW`` tokens) and drafts what followed there.  Its tokens are
scored with the trie's counts along that path, in their own calibration source
(``calibration.SRC_RECENT``), so the table learns how far to trust recency.
"""

from numba import njit

from . import calibration as cal
from .layout import COUNT
from .tokens import SYNTHETIC_BASE
from .union import advance, count_next, position

#: Most tokens looked back for the latest occurrence.
WINDOW = 4096


@njit(cache=True)
def latest_occurrence(arena, start, end, length):
    """Where the latest earlier occurrence of ``arena[end - length:end]`` ends, or -1.

    Only occurrences inside ``arena[start:end - 1]`` that end at most
    ``WINDOW`` tokens back count; the returned position is exclusive, so the
    continuation starts there.
    """
    lo = end - WINDOW
    if lo < start + length:
        lo = start + length
    last = arena[end - 1]
    for e in range(end - 1, lo - 1, -1):
        if arena[e - 1] != last:
            continue
        t = 1
        while t < length and arena[e - 1 - t] == arena[end - 1 - t]:
            t += 1
        if t == length:
            return e
    return -1


@njit(cache=True)
def draft_recent(index, x, off, span, cap, thr, discount, src, match_len, stats, cand):
    """Path from ``(x, off)`` along ``index.arena[span[0]:span[1]]`` while it beats ``thr``.

    Each token's probability uses the counts of that continuation in the tree.
    Returns ``(n, gain)``, the gain being ``sum(p - thr)``.
    """
    pos, stop = span
    at = position(index, x, off)
    n = 0
    prob = 1.0
    gain = 0.0
    while n < cap and pos + n < stop and at[0] >= 0:
        tok = index.arena[pos + n]
        if tok >= SYNTHETIC_BASE:
            break
        cnt = index.nodes[at[0], COUNT] - (discount if n == 0 else 0)
        c = min(count_next(index, at[0], at[1], at[2], tok), cnt)
        if c <= 0:
            break
        fine, q = cal.token_probability(stats, src, match_len, n, c, cnt)
        p = prob * q
        if p <= thr:
            break
        prob = p
        cand.tokens[n] = tok
        cand.parents[n] = n - 1
        cand.probs[n] = p
        cand.buckets[n] = fine
        gain += p - thr
        n += 1
        at = advance(index, at[0], at[1], at[2], tok)
    return n, gain
