"""One tree draft from every candidate's tree (the ``MERGE_TREES`` policy flag).

In tree mode each candidate (one match length in one tree of one pool) drafts a
tree.  Without merging the draft is the best candidate's tree; with it, the
draft holds the union of all their token paths.  A path that several
candidates draft is one node, with the highest of their probabilities and that
candidate's calibration bucket.  The ``limit`` most probable nodes are kept:
no node is more probable than its parent (each candidate's probabilities fall
along a path, and the maximum keeps that) and ties go to the earlier node, so
the kept nodes form a tree.

A ``Merged`` record holds the nodes; ``size[0]`` is how many are in use and
``size[1]`` the first of the first-level nodes (-1: none), chained through
``next`` as every node's children are from ``first``.
"""

from numba import njit


@njit(cache=True, nogil=True)
def merge_reset(merged):
    merged.size[0] = 0
    merged.size[1] = -1


@njit(cache=True, nogil=True)
def merge_in(merged, cand, n):
    """Add the ``n``-token tree ``cand`` (parents before children) to ``merged``.

    A token that does not fit is left out with all its descendants.
    """
    tokens, parents, probs, buckets, first, nxt, where, size = merged
    used = size[0]
    room = tokens.shape[0]
    for j in range(n):
        up = -1
        if cand.parents[j] >= 0:
            up = where[cand.parents[j]]
            if up < 0:
                where[j] = -1
                continue
        tok = cand.tokens[j]
        c = size[1] if up < 0 else first[up]
        while c >= 0 and tokens[c] != tok:
            c = nxt[c]
        if c >= 0:
            if cand.probs[j] > probs[c]:
                probs[c] = cand.probs[j]
                buckets[c] = cand.buckets[j]
            where[j] = c
        elif used < room:
            tokens[used] = tok
            parents[used] = up
            probs[used] = cand.probs[j]
            buckets[used] = cand.buckets[j]
            first[used] = -1
            if up < 0:
                nxt[used] = size[1]
                size[1] = used
            else:
                nxt[used] = first[up]
                first[up] = used
            where[j] = used
            used += 1
        else:
            where[j] = -1
    size[0] = used


@njit(cache=True, nogil=True)
def merge_out(merged, limit, thr, row):
    """Write the ``limit`` most probable nodes to ``row``, parents first.

    Returns ``(n, gain)``, the gain being ``sum(p - thr)``.  Uses ``first``
    and ``next`` as scratch: the merged tree takes no more tokens after this.
    """
    tokens, parents, probs, buckets, first, nxt, where, size = merged
    used = size[0]
    keep = limit if limit < used else used
    for c in range(used):
        nxt[c] = 0  # 1: kept
    for _ in range(keep):
        top = -1
        for c in range(used):
            if nxt[c] == 0 and (top < 0 or probs[c] > probs[top]):
                top = c
        nxt[top] = 1
    n = 0
    gain = 0.0
    for c in range(used):
        if nxt[c] == 1:
            first[c] = n  # the node's row in the draft
            row.tokens[n] = tokens[c]
            row.parents[n] = -1 if parents[c] < 0 else first[parents[c]]
            row.probs[n] = probs[c]
            row.buckets[n] = buckets[c]
            gain += probs[c] - thr
            n += 1
    return n, gain
