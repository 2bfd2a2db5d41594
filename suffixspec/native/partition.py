"""One index from partitions built apart.

Partition ``p`` of an index indexes, over the same sequences in the same
token storage, only the suffixes whose first token it owns
(``trie.extend_part``).  Below the root the partitions are disjoint subtrees
of the index over every suffix, with the same counts, so laying their node
arrays end to end and joining their roots gives that index: drafts from it
are the single index's (only the order of the root's children, and which of
equally frequent ones is the root's ``BEST``, may differ).

Partition ``p``'s node ``x`` becomes node ``x + offset[p]``.  Each tree's
root is partition 0's root; the other partitions' roots become free nodes.
The child table is rebuilt: every entry is re-keyed, and a root with two or
more children has all of them in it.
"""

from numba import njit

from .layout import (BEST, COUNT, EMPTY, FIRST, FREED, META_ARENA_TOP, NEXT, PARENT, PREV,
                     SEQ_CAP, SEQ_LEN, SEQ_LIVE, SEQ_OFF, SEQ_ROOT, SEQ_SLOT, SEQ_STATE, TOKEN)
from .trie import _hkey, _hslot, extend_part


@njit(cache=True, nogil=True)
def index_run(index, first, offsets, roots, keep):
    """Index sequences ``first``, ``first + 1``, ... of one partition; returns where it stopped.

    Sequence ``i`` is already in token storage at ``offsets[i]:offsets[i + 1]``
    and joins the tree whose root is ``roots[i]``; ``keep`` as for
    ``trie.extend_part``.  Stops at the sequence whose indexing ran short of
    node or table capacity: grow them and call again from there (it goes on
    where it stopped).  Every sequence ends closed.
    """
    meta, _, _, _, arena, seqs, _ = index
    n = roots.shape[0]
    for i in range(first, n):
        lo, hi = offsets[i], offsets[i + 1]
        if seqs[i, SEQ_STATE] != SEQ_LIVE:
            for f in range(seqs.shape[1]):
                seqs[i, f] = 0
            seqs[i, SEQ_OFF] = lo
            seqs[i, SEQ_CAP] = hi - lo
            seqs[i, SEQ_ROOT] = roots[i]
            seqs[i, SEQ_STATE] = SEQ_LIVE
            meta[META_ARENA_TOP] = hi
        seqs[i, SEQ_SLOT] = 0  # one sequence open at a time
        extend_part(index, i, arena[lo + seqs[i, SEQ_LEN]:hi], keep)
        seqs[i, SEQ_SLOT] = -1
        if seqs[i, SEQ_LEN] < hi - lo:
            return i
    return n


@njit(cache=True, nogil=True)
def relabel(nodes, offset, root_of, free_head):
    """Shift partition node ids by ``offset`` in place; returns the new free-list head.

    ``root_of[x]`` (-1: not a root) is the combined tree root standing for
    partition root ``x``.  A partition root that is not the combined root
    becomes free, as do the partition's free nodes; every free node is
    chained through ``NEXT`` onto ``free_head`` (combined ids).  The links of
    the combined roots and of their children's sibling lists are fixed
    afterwards (``join_roots``).
    """
    for x in range(nodes.shape[0]):
        g = x + offset
        if nodes[x, COUNT] == FREED or (root_of[x] >= 0 and root_of[x] != g):
            for f in range(nodes.shape[1]):
                nodes[x, f] = -1
            nodes[x, COUNT] = FREED
            nodes[x, NEXT] = free_head
            free_head = g
            continue
        for f in (PARENT, BEST, FIRST, NEXT, PREV):
            v = nodes[x, f]
            if v >= 0:
                r = root_of[v]
                nodes[x, f] = r if r >= 0 else v + offset
    return free_head


@njit(cache=True, nogil=True)
def put(hkeys, hvals, parent, token, node):
    """Insert into a child table with room (no resizing)."""
    mask = hkeys.shape[0] - 1
    key = _hkey(parent, token)
    i = _hslot(key, mask)
    while hkeys[i] != EMPTY and hkeys[i] != key:
        i = (i + 1) & mask
    hkeys[i] = key
    hvals[i] = node


@njit(cache=True, nogil=True)
def copy_entries(src_keys, src_vals, is_root, offset, hkeys, hvals):
    """Re-key a partition's child table into the combined one; returns entries copied.

    Entries under a partition root are left out: ``join_roots`` enters the
    combined roots' children.
    """
    n = 0
    for i in range(src_keys.shape[0]):
        k = src_keys[i]
        if k == EMPTY:
            continue
        parent = k >> 32
        if is_root[parent]:
            continue
        put(hkeys, hvals, parent + offset, k & 0xFFFFFFFF, src_vals[i] + offset)
        n += 1
    return n


@njit(cache=True, nogil=True)
def join_roots(nodes, root, firsts, hkeys, hvals):
    """Chain the children of one tree's partition roots under combined ``root``.

    ``nodes`` is the combined node array; ``firsts`` holds each partition
    root's first child (combined ids, -1: none), in partition order.  Sets the
    root's ``FIRST`` and ``BEST`` and, when it has two or more children, enters
    all of them in the child table.  Returns how many entries were added.
    """
    last = -1
    best = -1
    children = 0
    nodes[root, FIRST] = -1
    for p in range(firsts.shape[0]):
        c = firsts[p]
        if c < 0:
            continue
        if last == -1:
            nodes[root, FIRST] = c
        else:
            nodes[last, NEXT] = c
        nodes[c, PREV] = last
        while c != -1:
            nodes[c, PARENT] = root
            if best == -1 or nodes[c, COUNT] > nodes[best, COUNT]:
                best = c
            children += 1
            last = c
            c = nodes[c, NEXT]
    nodes[root, BEST] = best
    if children < 2:
        return 0
    c = nodes[root, FIRST]
    while c != -1:
        put(hkeys, hvals, root, nodes[c, TOKEN], c)
        c = nodes[c, NEXT]
    return children
