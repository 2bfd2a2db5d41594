"""Depth-bounded suffix trie over int32 token sequences, in flat arrays.

The index is a forest: every tree has its own root node, and every sequence
belongs to one tree.  A tree indexes every substring of its sequences of at most
``depth`` tokens; the node for a string ``x`` carries ``count(x)``, the number
of positions where ``x`` occurs in the tree's sequences.  Continuation
probabilities are ``count(x + a) / count(x)``.

Representation (all chosen by measurement, docs/findings.md, "Index speed and memory"):

* Path compression.  A node stands for an edge of tokens whose label is read
  from token storage at ``(REF_SEQ, REF_POS)``.  ``LEN > 0`` is its length.
  ``LEN < 0`` marks an *open leaf*: a leaf that one occurrence reaches, whose
  label runs on to the end of its own sequence, capped at ``-LEN`` tokens by
  the depth bound.  Appends never touch open leaves ("once a leaf, always a
  leaf"), and each open sequence skips the leading run of its suffixes that
  sit in open leaves (``SEQ_FRONT``).  Positions inside one
  edge share one count.  Invariant: a non-root node's children have a strictly
  smaller count than the node, otherwise the two would be one edge.  Hence a
  string where some occurrence *ends* (end of a sequence, or the depth bound)
  is always a node boundary.
* Children are chained in a sibling list.  A node with two or more children
  also has them in one open-addressing table keyed by ``(parent, first
  token)``; an only child is simply ``FIRST``, which keeps the frequent
  boundary moves along repeated text free of table work.  ``BEST`` caches the
  most frequent child (ties go to the child whose count rose last), so a path
  draft never scans siblings.
* Refs are *occurrence-consistent*: the label at ``(REF_SEQ, REF_POS)`` is
  preceded in that sequence by the labels of all ancestors.  So a child can
  absorb its parent by moving its ref back by the parent's length.
* Removing a sequence decrements counts but keeps its tokens in storage,
  because labels of surviving nodes may still point into them.  The Python
  owner rebuilds the index when such dead tokens outweigh live ones.
* An open (appendable) sequence has a ring of ``depth`` active nodes: entry
  ``q % depth`` is the node whose end is the suffix starting at ``q``.

All kernels are pure functions over the arrays of one index state.  They never
raise and never allocate storage: growth is the caller's job.  ``extend``
stops early and returns the number of tokens consumed when a capacity would
run out; the caller grows and calls again.
"""


import numpy as np
from numba import njit

from .layout import (BEST, COUNT, EMPTY, FIRST, FREED, LEN, META_ARENA_TOP, META_DEAD_TOKENS,
                     META_DEPTH, META_FREE_COUNT, META_FREE_HEAD, META_HASH_FILL,
                     META_LIVE_TOKENS, META_TIES, META_TOP, NEXT, PARENT, PREV, REF_POS,
                     REF_SEQ, SEQ_CAP, SEQ_FREE, SEQ_FRONT, SEQ_LEN, SEQ_OFF, SEQ_REMOVED,
                     SEQ_LIVE, SEQ_ROOT, SEQ_SLOT, SEQ_STATE, TIES_ARCTIC, TIES_NEWEST, TOKEN)
from .tokens import SYNTHETIC_BASE

# Codes returned by check_integrity (0 means sound).
CHECK_MESSAGES = {
    1: "child table entry points to a freed or mismatched node",
    2: "child table entry missing, or present for an only child",
    3: "node label disagrees with its first token",
    4: "child count not smaller than its parent's",
    5: "children counts exceed the parent's count",
    6: "BEST is not a most frequent child",
    7: "sibling list is broken",
    8: "stored count differs from a recount of all suffixes",
    9: "child table fill differs from the number of children with siblings",
    10: "active node of an open sequence is not at the right suffix",
    11: "node has no label or no count",
    12: "free-node bookkeeping is wrong",
    13: "open leaf is not a single-occurrence leaf of its sequence",
    14: "an open suffix before SEQ_FRONT is not in an open leaf",
}


# --------------------------------------------------------------------------
# Child table: open addressing, linear probing, backward-shift deletion.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _hkey(parent, token):
    return (np.int64(parent) << 32) | np.int64(token)


@njit(cache=True, nogil=True)
def _hslot(key, mask):
    # Murmur3 finalizer: every key bit reaches the low bits used as the slot.
    h = np.uint64(key)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True)
def _child(hkeys, hvals, parent, token):
    mask = hkeys.shape[0] - 1
    key = _hkey(parent, token)
    i = _hslot(key, mask)
    while True:
        k = hkeys[i]
        if k == key:
            return hvals[i]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _find_child(nodes, hkeys, hvals, parent, token):
    """Child of ``parent`` starting with ``token``, or -1.

    The most frequent and the newest child are checked first: they answer
    most lookups in repetitive text without touching the child table, which
    only holds children that have siblings.
    """
    c = nodes[parent, BEST]
    if c != -1 and nodes[c, TOKEN] == token:
        return c
    c = nodes[parent, FIRST]
    if c == -1 or nodes[c, TOKEN] == token:
        return c
    if nodes[c, NEXT] == -1:
        return -1
    return _child(hkeys, hvals, parent, token)


@njit(cache=True, nogil=True)
def _has_siblings(nodes, p):
    """True when ``p`` has two or more children (they are in the table)."""
    f = nodes[p, FIRST]
    return f != -1 and nodes[f, NEXT] != -1


@njit(cache=True, nogil=True)
def _hput(hkeys, hvals, meta, parent, token, node):
    mask = hkeys.shape[0] - 1
    key = _hkey(parent, token)
    i = _hslot(key, mask)
    while True:
        k = hkeys[i]
        if k == key:
            hvals[i] = node
            return
        if k == EMPTY:
            hkeys[i] = key
            hvals[i] = node
            meta[META_HASH_FILL] += 1
            return
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _hdel(hkeys, hvals, meta, parent, token):
    mask = hkeys.shape[0] - 1
    key = _hkey(parent, token)
    i = _hslot(key, mask)
    while hkeys[i] != key:
        if hkeys[i] == EMPTY:
            return
        i = (i + 1) & mask
    hkeys[i] = EMPTY
    meta[META_HASH_FILL] -= 1
    # Shift back later entries of the probe run that can no longer be reached.
    j = i
    while True:
        j = (j + 1) & mask
        k = hkeys[j]
        if k == EMPTY:
            return
        home = _hslot(k, mask)
        # The entry at j stays if its home lies cyclically in (i, j].
        if i <= j:
            stays = i < home <= j
        else:
            stays = home > i or home <= j
        if not stays:
            hkeys[i] = k
            hvals[i] = hvals[j]
            hkeys[j] = EMPTY
            i = j


@njit(cache=True, nogil=True)
def rehash(old_keys, old_vals, new_keys, new_vals, meta):
    """Move every entry of a child table into an empty, larger one."""
    meta[META_HASH_FILL] = 0
    for i in range(old_keys.shape[0]):
        k = old_keys[i]
        if k != EMPTY:
            _hput(new_keys, new_vals, meta, np.int32(k >> 32),
                  np.int32(k & 0xFFFFFFFF), old_vals[i])


# --------------------------------------------------------------------------
# Node bookkeeping.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _alloc(nodes, meta):
    head = meta[META_FREE_HEAD]
    if head != -1:
        meta[META_FREE_HEAD] = nodes[head, NEXT]
        meta[META_FREE_COUNT] -= 1
        x = head
    else:
        x = meta[META_TOP]
        meta[META_TOP] = x + 1
    nodes[x, :] = -1
    return x


@njit(cache=True, nogil=True)
def _free(nodes, meta, x):
    nodes[x, :] = -1
    nodes[x, COUNT] = FREED
    nodes[x, NEXT] = meta[META_FREE_HEAD]
    meta[META_FREE_HEAD] = x
    meta[META_FREE_COUNT] += 1


@njit(cache=True, nogil=True)
def _link_child(nodes, hkeys, hvals, meta, p, c):
    first = nodes[p, FIRST]
    if first != -1:
        if nodes[first, NEXT] == -1:
            # p goes from one child to two: both enter the table.
            _hput(hkeys, hvals, meta, p, nodes[first, TOKEN], first)
        _hput(hkeys, hvals, meta, p, nodes[c, TOKEN], c)
        if meta[META_TIES] == TIES_ARCTIC:
            # arctic's order: a new child joins the end of the list.
            last = first
            while nodes[last, NEXT] != -1:
                last = nodes[last, NEXT]
            nodes[last, NEXT] = c
            nodes[c, PREV] = last
            nodes[c, NEXT] = -1
            return
    nodes[c, NEXT] = first
    nodes[c, PREV] = -1
    if first != -1:
        nodes[first, PREV] = c
    nodes[p, FIRST] = c


@njit(cache=True, nogil=True)
def _detach(nodes, p, c):
    """Take child ``c`` out of ``p``'s sibling list (the child table is untouched)."""
    prev = nodes[c, PREV]
    nxt = nodes[c, NEXT]
    if prev != -1:
        nodes[prev, NEXT] = nxt
    else:
        nodes[p, FIRST] = nxt
    if nxt != -1:
        nodes[nxt, PREV] = prev


@njit(cache=True, nogil=True)
def _unlink_child(nodes, hkeys, hvals, meta, p, c):
    if _has_siblings(nodes, p):
        _hdel(hkeys, hvals, meta, p, nodes[c, TOKEN])
    _detach(nodes, p, c)
    f = nodes[p, FIRST]
    if f != -1 and nodes[f, NEXT] == -1:
        # Back to an only child: it leaves the table.
        _hdel(hkeys, hvals, meta, p, nodes[f, TOKEN])


@njit(cache=True, nogil=True)
def _replace_child(nodes, hkeys, hvals, meta, p, old, new):
    """Put ``new`` where ``old`` stands among ``p``'s children.

    Both must start with the same token.
    """
    if _has_siblings(nodes, p):
        _hput(hkeys, hvals, meta, p, nodes[old, TOKEN], new)
    prev = nodes[old, PREV]
    nxt = nodes[old, NEXT]
    nodes[new, PREV] = prev
    nodes[new, NEXT] = nxt
    if prev != -1:
        nodes[prev, NEXT] = new
    else:
        nodes[p, FIRST] = new
    if nxt != -1:
        nodes[nxt, PREV] = new
    if nodes[p, BEST] == old:
        nodes[p, BEST] = new


@njit(cache=True, nogil=True)
def _move_after(nodes, p, x, before):
    """Move child ``x`` of ``p`` in its sibling list to just after ``before``
    (-1: to the front)."""
    _detach(nodes, p, x)
    after = nodes[p, FIRST] if before == -1 else nodes[before, NEXT]
    nodes[x, PREV] = before
    nodes[x, NEXT] = after
    if before != -1:
        nodes[before, NEXT] = x
    else:
        nodes[p, FIRST] = x
    if after != -1:
        nodes[after, PREV] = x


@njit(cache=True, nogil=True)
def _arctic_rise(nodes, p, x):
    """``x``'s count just rose by one: reorder ``p``'s children as arctic does.

    arctic keeps children by falling count, equal counts in groups.  A child
    whose previous sibling's count is at most its new count moves to just
    before the first node of that sibling's group: the head of the next
    higher group if it led its own group, else the tail of that group.
    """
    prev = nodes[x, PREV]
    if prev != -1 and nodes[prev, COUNT] <= nodes[x, COUNT]:
        k = nodes[prev, COUNT]
        g = prev
        while nodes[g, PREV] != -1 and nodes[nodes[g, PREV], COUNT] == k:
            g = nodes[g, PREV]
        _move_after(nodes, p, x, nodes[g, PREV])
    nodes[p, BEST] = nodes[p, FIRST]


@njit(cache=True, nogil=True)
def _arctic_fall(nodes, p, x):
    """``x``'s count just fell by one (still > 0): reorder as arctic does,
    moving it behind the siblings that still have its old count."""
    nxt = nodes[x, NEXT]
    if nxt != -1 and nodes[nxt, COUNT] > nodes[x, COUNT]:
        k = nodes[nxt, COUNT]
        g = nxt
        while nodes[g, NEXT] != -1 and nodes[nodes[g, NEXT], COUNT] == k:
            g = nodes[g, NEXT]
        _move_after(nodes, p, x, g)
    nodes[p, BEST] = nodes[p, FIRST]


@njit(cache=True, nogil=True)
def _rescan_best(nodes, p):
    best = -1
    c = nodes[p, FIRST]
    while c != -1:
        if best == -1 or nodes[c, COUNT] > nodes[best, COUNT]:
            best = c
        c = nodes[c, NEXT]
    nodes[p, BEST] = best


@njit(cache=True, nogil=True)
def label(arena, seqs, nodes, x, i):
    """Token ``i`` of node ``x``'s edge label."""
    return arena[seqs[nodes[x, REF_SEQ], SEQ_OFF] + nodes[x, REF_POS] + i]


@njit(cache=True, nogil=True)
def edge_len(nodes, seqs, x):
    """Length of node ``x``'s edge (open leaves end where their sequence does)."""
    n = nodes[x, LEN]
    if n >= 0:
        return n
    n2 = seqs[nodes[x, REF_SEQ], SEQ_LEN] - nodes[x, REF_POS]
    return n2 if n2 < -n else -n


@njit(cache=True, nogil=True)
def _shift_front(nodes, x, k):
    """Move the start of ``x``'s edge ``k`` tokens later (k < 0: earlier)."""
    nodes[x, REF_POS] += k
    if nodes[x, LEN] > 0:
        nodes[x, LEN] -= k
    else:
        nodes[x, LEN] += k  # an open leaf's cap shrinks with its parent's depth growing


@njit(cache=True, nogil=True)
def _close_leaf(nodes, seqs, x, depth):
    """Fix an open leaf's length, before a second occurrence reaches it.

    Its owner sequence may have skipped the suffix that sits there
    (``SEQ_FRONT``); pull the owner's front back so the suffix is visited again.
    """
    owner = nodes[x, REF_SEQ]
    q = nodes[x, REF_POS] - (depth + nodes[x, LEN])  # start of the occurrence
    nodes[x, LEN] = edge_len(nodes, seqs, x)
    if seqs[owner, SEQ_SLOT] != -1 and seqs[owner, SEQ_FRONT] > q:
        seqs[owner, SEQ_FRONT] = q


@njit(cache=True, nogil=True)
def _absorb_parent(nodes, hkeys, hvals, meta, y):
    """Merge ``y`` with its parent ``x``; ``y`` keeps its id, ``x`` is freed.

    Call only when ``x`` is not a root, ``y`` is its only child and both have
    the same count (no occurrence ends at ``x``).
    """
    x = nodes[y, PARENT]
    p = nodes[x, PARENT]
    nodes[y, TOKEN] = nodes[x, TOKEN]
    _replace_child(nodes, hkeys, hvals, meta, p, x, y)
    nodes[y, PARENT] = p
    _shift_front(nodes, y, -nodes[x, LEN])
    _free(nodes, meta, x)


# --------------------------------------------------------------------------
# Building: roots, appends, removal.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def new_root(nodes, meta):
    """Allocate the root of a new tree and return its node id."""
    r = _alloc(nodes, meta)
    nodes[r, COUNT] = 0
    nodes[r, LEN] = 0
    return r


@njit(cache=True, nogil=True)
def _extend_suffix(nodes, hkeys, hvals, meta, arena, seqs, a, t, s, p, d):
    """Extend the occurrence ending at node ``a`` by token ``t`` (general case).

    ``a`` ends at the string ``seq[s][q:p]`` of ``d = p - q`` tokens, and is
    not a single-occurrence leaf (the caller handles those); the token at
    ``p`` is ``t``.  Returns the node that ends at ``seq[s][q:p+1]``.
    """
    depth = meta[META_DEPTH]
    c = _find_child(nodes, hkeys, hvals, a, t)
    if c == -1:
        # A new open leaf: it will follow the sequence from here on.
        c = _alloc(nodes, meta)
        nodes[c, PARENT] = a
        nodes[c, TOKEN] = t
        nodes[c, COUNT] = 1
        nodes[c, LEN] = -(depth - d)
        nodes[c, REF_SEQ] = s
        nodes[c, REF_POS] = p
        _link_child(nodes, hkeys, hvals, meta, a, c)
        b = nodes[a, BEST]
        if b == -1 or (nodes[b, COUNT] <= 1 and meta[META_TIES] == TIES_NEWEST):
            nodes[a, BEST] = c
        # No merge is possible: a node reached by this occurrence alone was
        # a single-occurrence leaf, which the caller handled.
        return c
    if nodes[c, LEN] < 0:
        _close_leaf(nodes, seqs, c, depth)
    if nodes[c, LEN] > 1 and nodes[a, PARENT] != -1 and nodes[c, COUNT] + 1 == nodes[a, COUNT]:
        # After this step every occurrence of a continues into c: instead of
        # splitting c and merging its head into a, move the boundary down one
        # token.  a's ref is re-derived from c's, whose occurrence is known to
        # continue with t.
        nodes[a, REF_SEQ] = nodes[c, REF_SEQ]
        nodes[a, REF_POS] = nodes[c, REF_POS] - nodes[a, LEN]
        nodes[a, LEN] += 1
        # c is a's only child, so it has no table entry to re-key.
        _shift_front(nodes, c, 1)
        nodes[c, TOKEN] = label(arena, seqs, nodes, c, 0)
        return a
    if nodes[c, LEN] > 1:
        # Split c after its first token; m becomes the one-token upper part.
        m = _alloc(nodes, meta)
        nodes[m, PARENT] = a
        nodes[m, TOKEN] = t
        nodes[m, COUNT] = nodes[c, COUNT]
        nodes[m, LEN] = 1
        nodes[m, REF_SEQ] = nodes[c, REF_SEQ]
        nodes[m, REF_POS] = nodes[c, REF_POS]
        _replace_child(nodes, hkeys, hvals, meta, a, c, m)
        nodes[c, PARENT] = m
        _shift_front(nodes, c, 1)
        nodes[c, TOKEN] = label(arena, seqs, nodes, c, 0)
        nodes[c, NEXT] = -1
        nodes[c, PREV] = -1
        nodes[m, FIRST] = c
        nodes[m, BEST] = c
        c = m
    nodes[c, COUNT] += 1
    b = nodes[a, BEST]
    if meta[META_TIES] == TIES_ARCTIC:
        _arctic_rise(nodes, a, c)
    elif nodes[c, COUNT] >= nodes[b, COUNT]:
        nodes[a, BEST] = c
    if nodes[a, PARENT] != -1 and nodes[c, COUNT] == nodes[a, COUNT]:
        # Every occurrence of a now continues with t: one edge again.
        _absorb_parent(nodes, hkeys, hvals, meta, c)
    return c


_KEEP_ALL = np.zeros(0, np.bool_)


@njit(cache=True, nogil=True)
def extend(index, s, tokens):
    """Append ``tokens`` to open sequence ``s`` and index them.

    Returns how many tokens were consumed.  Fewer than ``len(tokens)`` means a
    capacity ran short (sequence region, nodes or child table); grow it and
    call again with the rest.
    """
    return extend_part(index, s, tokens, _KEEP_ALL)


@njit(cache=True, nogil=True)
def extend_part(index, s, tokens, keep):
    """``extend``, indexing only the suffixes whose first token ``t`` has ``keep[t & mask]``.

    ``keep``'s size is a power of two, ``mask`` one less (token ids beyond
    it, such as anchors, share entries).  An empty ``keep`` keeps every suffix.  Indexes built with complementary
    ``keep`` arrays over the same sequences hold disjoint subtrees of the one
    index over all suffixes (``partition``); the root's count is every token
    in each.  Kept open suffixes are listed apart, so a partition's work is
    about its own suffixes only.
    """
    meta, nodes, hkeys, hvals, arena, seqs, active = index
    every = keep.shape[0] == 0
    mask = keep.shape[0] - 1
    depth = meta[META_DEPTH]
    root = seqs[s, SEQ_ROOT]
    slot = seqs[s, SEQ_SLOT]
    off = seqs[s, SEQ_OFF]
    hash_limit = hkeys.shape[0] // 2
    # Open suffixes that this index keeps, oldest first: a ring of positions.
    ring = 1  # a power of two, at least depth, when filtering
    while not every and ring < depth:
        ring *= 2
    kept = np.empty(0 if every else ring, np.int64)
    head = 0
    size = 0
    if not every:
        p = seqs[s, SEQ_LEN]
        for q in range(max(p - depth + 1, seqs[s, SEQ_FRONT], 0), p):
            if keep[arena[off + q] & mask]:
                kept[size] = q
                size += 1
    # Each indexed token creates at most one node per open suffix.
    for i in range(tokens.shape[0]):
        p = seqs[s, SEQ_LEN]
        if p >= seqs[s, SEQ_CAP]:
            return i
        spare = nodes.shape[0] - meta[META_TOP] + meta[META_FREE_COUNT]
        if spare < depth + 1 or meta[META_HASH_FILL] + 2 * depth + 2 > hash_limit:
            return i
        t = tokens[i]
        arena[off + p] = t
        seqs[s, SEQ_LEN] = p + 1
        meta[META_LIVE_TOKENS] += 1
        nodes[root, COUNT] += 1
        # Open suffixes start at q0..p; those before SEQ_FRONT sit in open
        # leaves, which grew with the sequence just now.
        q0 = p - depth + 1
        if q0 < 0:
            q0 = 0
        if seqs[s, SEQ_FRONT] > q0:
            q0 = seqs[s, SEQ_FRONT]
        if not every:
            while size > 0 and kept[head] < q0:
                head = (head + 1) & (ring - 1)
                size -= 1
            if keep[t & mask]:
                kept[(head + size) & (ring - 1)] = p
                size += 1
            if size == 0:
                seqs[s, SEQ_FRONT] = p + 1
                continue
            f0 = seqs[s, SEQ_FRONT]
            _grow(index, s, p, t, q0, kept, head, size)
            if seqs[s, SEQ_FRONT] < f0:
                # A leaf of this sequence was closed: its suffix is open again.
                head = 0
                size = 0
                for q in range(max(p - depth + 2, seqs[s, SEQ_FRONT], 0), p + 1):
                    if keep[arena[off + q] & mask]:
                        kept[size] = q
                        size += 1
            # The front: the first kept suffix not in an open leaf.
            while size > 0 and nodes[active[slot, kept[head] % depth], LEN] < 0:
                head = (head + 1) & (ring - 1)
                size -= 1
            seqs[s, SEQ_FRONT] = kept[head] if size > 0 else p + 1
            continue
        _grow(index, s, p, t, q0, kept, head, 0)
        # Advance the front over suffixes now sitting in open leaves.
        front = seqs[s, SEQ_FRONT]
        lo = p + 2 - depth
        if front < lo:
            front = lo
        if front < 0:
            front = 0
        while front <= p and nodes[active[slot, front % depth], LEN] < 0:
            front += 1
        seqs[s, SEQ_FRONT] = front
    return tokens.shape[0]


@njit(cache=True, nogil=True)
def _grow(index, s, p, t, q0, kept, head, size):
    """Extend sequence ``s``'s open suffixes by token ``t`` at position ``p``.

    The suffixes are those starting at ``q0..p``, or with a non-empty
    ``kept`` (a ring, its size a power of two) the ``size`` positions in it
    from ``head``.
    """
    meta, nodes, hkeys, hvals, arena, seqs, active = index
    depth = meta[META_DEPTH]
    root = seqs[s, SEQ_ROOT]
    slot = seqs[s, SEQ_SLOT]
    every = kept.shape[0] == 0
    n = p + 1 - q0 if every else size
    r = q0 % depth
    for j in range(n):
        q = q0 + j
        if not every:
            q = kept[(head + j) & (kept.shape[0] - 1)]
            r = q % depth
        a = root if q == p else active[slot, r]
        la = nodes[a, LEN]
        if q != p and la < 0:
            pass  # an open leaf: it grew with the sequence
        elif q != p and nodes[a, FIRST] == -1 and nodes[a, COUNT] == 1:
            # A closed leaf that only this suffix reaches (a removal left
            # it so): re-open it on this sequence.
            nodes[a, REF_SEQ] = s
            nodes[a, REF_POS] = p - la
            nodes[a, LEN] = -(depth - (p - q) + la)
        else:
            c = nodes[a, BEST]
            if c != -1 and nodes[c, TOKEN] != t:
                c = _find_child(nodes, hkeys, hvals, a, t)
            lc = 0
            if c != -1:
                lc = nodes[c, LEN]
            if (lc == 1 and (q == p or nodes[c, COUNT] + 1 < nodes[a, COUNT])):
                # An existing one-token child continues and no edge
                # merges: it gains a count, and may become the most
                # frequent.
                nodes[c, COUNT] += 1
                if meta[META_TIES] == TIES_ARCTIC:
                    _arctic_rise(nodes, a, c)
                elif nodes[c, COUNT] >= nodes[nodes[a, BEST], COUNT]:
                    nodes[a, BEST] = c
                active[slot, r] = c
            elif (lc > 1 and q != p and nodes[c, COUNT] + 1 == nodes[a, COUNT]):
                # c is a's only child and every other occurrence of a
                # goes into it: move the boundary between them down one
                # token (the suffix stays at a).  a's ref is re-derived
                # from c's, whose occurrence is known to continue with t.
                nodes[a, REF_SEQ] = nodes[c, REF_SEQ]
                nodes[a, REF_POS] = nodes[c, REF_POS] - nodes[a, LEN]
                nodes[a, LEN] += 1
                nodes[c, LEN] -= 1
                nodes[c, REF_POS] += 1
                nodes[c, TOKEN] = arena[seqs[nodes[c, REF_SEQ], SEQ_OFF] + nodes[c, REF_POS]]
            else:
                active[slot, r] = _extend_suffix(nodes, hkeys, hvals, meta, arena,
                                                 seqs, a, t, s, p, p - q)
        r += 1
        if r == depth:
            r = 0


@njit(cache=True, nogil=True)
def extend_batch(index, seq_ids, tokens, offsets, progress):
    """Append ``tokens[offsets[i]:offsets[i + 1]]`` to sequence ``seq_ids[i]``.

    One call for a whole engine step.  Entries with ``seq_ids[i] < 0`` are
    skipped.  ``progress`` holds ``(request index, tokens of it done)`` to
    resume from and is updated in place.  Returns True when every request is
    done, False when a capacity ran short at ``progress``; grow it and call
    again.
    """
    for i in range(progress[0], seq_ids.shape[0]):
        s = seq_ids[i]
        lo = offsets[i] + progress[1]
        hi = offsets[i + 1]
        if s >= 0 and lo < hi:
            done = extend(index, s, tokens[lo:hi])
            if lo + done < hi:
                progress[0] = i
                progress[1] = lo + done - offsets[i]
                return False
        progress[1] = 0
    progress[0] = seq_ids.shape[0]
    return True


@njit(cache=True, nogil=True)
def remove_seq(index, s, path):
    """Take every suffix of sequence ``s`` out of the counts.

    ``path`` is scratch space of at least ``depth + 1`` int32.  The tokens stay
    in storage (state SEQ_REMOVED) because surviving labels may use them.
    """
    meta, nodes, hkeys, hvals, arena, seqs, _ = index
    depth = meta[META_DEPTH]
    root = seqs[s, SEQ_ROOT]
    off = seqs[s, SEQ_OFF]
    n = seqs[s, SEQ_LEN]
    for q in range(n):
        end = q + depth
        if end > n:
            end = n
        # Collect the nodes on the path of seq[q:end]; it ends on a boundary.
        k = 0
        x = root
        d = q
        while d < end:
            x = _find_child(nodes, hkeys, hvals, x, arena[off + d])
            path[k] = x
            k += 1
            d += edge_len(nodes, seqs, x)
        for j in range(k - 1, -1, -1):
            x = path[j]
            p = nodes[x, PARENT]
            nodes[x, COUNT] -= 1
            if nodes[x, COUNT] == 0:
                _unlink_child(nodes, hkeys, hvals, meta, p, x)
                if nodes[p, BEST] == x:
                    _rescan_best(nodes, p)
                _free(nodes, meta, x)
                continue
            if meta[META_TIES] == TIES_ARCTIC:
                _arctic_fall(nodes, p, x)
            elif nodes[p, BEST] == x:
                _rescan_best(nodes, p)
            y = nodes[x, FIRST]
            if y != -1 and nodes[y, NEXT] == -1 and nodes[y, COUNT] == nodes[x, COUNT]:
                _absorb_parent(nodes, hkeys, hvals, meta, y)
        nodes[root, COUNT] -= 1
    meta[META_LIVE_TOKENS] -= n
    meta[META_DEAD_TOKENS] += n
    seqs[s, SEQ_STATE] = SEQ_REMOVED


@njit(cache=True, nogil=True)
def copy_child_order(old, old_root, index, root, stack):
    """Give every node under ``root`` its children in the order the same
    string's children have under ``old_root``, and BEST its first child.

    For a rebuild in arctic's tie order: the rebuilt tree holds the same
    strings with the same counts, so the same children, but arctic's order
    among equal counts comes from the old tree's history.  ``stack`` is
    scratch of shape (nodes, 3).  Returns False if the trees differ.
    """
    _, old_nodes, old_hkeys, old_hvals, _, old_seqs, _ = old
    _, nodes, hkeys, hvals, arena, seqs, _ = index
    top = 0
    stack[0, 0] = root
    stack[0, 1] = old_root
    stack[0, 2] = 0
    top = 1
    while top > 0:
        top -= 1
        x = stack[top, 0]
        y = stack[top, 1]
        off = stack[top, 2]
        first = nodes[x, FIRST]
        if first == -1:
            continue
        if nodes[first, NEXT] != -1:  # x branches: so must y, at its end
            if off != edge_len(old_nodes, old_seqs, y):
                return False
            prev = -1
            oc = old_nodes[y, FIRST]
            while oc != -1:
                c = _find_child(nodes, hkeys, hvals, x, old_nodes[oc, TOKEN])
                if c == -1:
                    return False
                _move_after(nodes, x, c, prev)
                prev = c
                oc = old_nodes[oc, NEXT]
            nodes[x, BEST] = nodes[x, FIRST]
        c = nodes[x, FIRST]
        while c != -1:
            # Where the string of c ends in the old tree.
            yo = y
            o = off
            for i in range(edge_len(nodes, seqs, c)):
                t = label(arena, seqs, nodes, c, i)
                if o == edge_len(old_nodes, old_seqs, yo):
                    yo = _find_child(old_nodes, old_hkeys, old_hvals, yo, t)
                    if yo == -1:
                        return False
                    o = 1
                else:
                    o += 1
            if top == stack.shape[0]:
                return False
            stack[top, 0] = c
            stack[top, 1] = yo
            stack[top, 2] = o
            top += 1
            c = nodes[c, NEXT]
    return True


@njit(cache=True, nogil=True)
def drop_tree(index, root):
    """Free every node of the tree under ``root``, root included.

    Sequences of that tree are the caller's to release.  Returns the number of
    tokens the tree had indexed.
    """
    meta, nodes, hkeys, hvals, _, _, _ = index
    tokens = nodes[root, COUNT]
    x = nodes[root, FIRST]
    # Iterative post-order walk over the sibling lists.
    while x != -1:
        c = nodes[x, FIRST]
        if c != -1:
            x = c
            continue
        p = nodes[x, PARENT]
        nxt = nodes[x, NEXT]
        # Siblings leave one by one, so the table may or may not hold x;
        # deleting a missing key is a no-op.
        _hdel(hkeys, hvals, meta, p, nodes[x, TOKEN])
        nodes[p, FIRST] = nxt
        if nxt != -1:
            nodes[nxt, PREV] = -1
        _free(nodes, meta, x)
        if nxt != -1:
            x = nxt
        elif p == root:
            x = -1
        else:
            x = p
    _free(nodes, meta, root)
    return tokens


@njit(cache=True, nogil=True)
def move_seq(arena, seqs, meta, s, new_off, new_cap):
    """Copy sequence ``s`` to a fresh region of token storage."""
    off = seqs[s, SEQ_OFF]
    n = seqs[s, SEQ_LEN]
    # A loop in the direction that is safe where the regions overlap (a slice
    # copy would compile a costly error path).
    if new_off <= off:
        for j in range(n):
            arena[new_off + j] = arena[off + j]
    else:
        for j in range(n - 1, -1, -1):
            arena[new_off + j] = arena[off + j]
    seqs[s, SEQ_OFF] = new_off
    seqs[s, SEQ_CAP] = new_cap
    end = new_off + new_cap
    if end > meta[META_ARENA_TOP]:
        meta[META_ARENA_TOP] = end


@njit(cache=True, nogil=True)
def compact_arena(arena, seqs, meta, order):
    """Pack the regions of all sequences that are not free to the front.

    ``order``: the sequences by offset (``np.argsort``, taken by the caller:
    a sort inside a kernel compiles for seconds).
    """
    top = 0
    for i in order:
        if seqs[i, SEQ_STATE] == SEQ_FREE:
            continue
        off = seqs[i, SEQ_OFF]
        n = seqs[i, SEQ_LEN]
        cap = seqs[i, SEQ_CAP]
        if seqs[i, SEQ_SLOT] == -1:
            cap = n  # closed sequences never grow again
        for j in range(n):
            arena[top + j] = arena[off + j]
        seqs[i, SEQ_OFF] = top
        seqs[i, SEQ_CAP] = cap
        top += cap
    meta[META_ARENA_TOP] = top


# --------------------------------------------------------------------------
# Queries.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def suffix_position(index, root, ctx, end, length, own):
    """Where ``ctx[end - length:end]`` ends in the tree, or ``(-1, 0)``.

    ``own`` is ``(slot, own_len, own_valid)``: when the tree holds the
    request's own open sequence (ring row ``slot``, ``own_len`` tokens, of
    which the last ``own_valid`` are the context's last tokens), its ring of
    open suffixes already names the node, with no walk from the root.  Slot
    -1: the tree does not hold it.
    """
    _, nodes, hkeys, hvals, arena, seqs, active = index
    x = _ring_node(active, length, own)
    if x >= 0:
        return x, edge_len(nodes, seqs, x)
    return walk(nodes, hkeys, hvals, arena, seqs, root, ctx, end - length, end)


@njit(cache=True, nogil=True)
def occurring_position(index, root, ctx, end, length, own):
    """``suffix_position`` of a suffix known to occur in the tree (a suffix of
    one it holds): placed with ``walk_occurring``, one lookup per edge."""
    _, nodes, hkeys, hvals, arena, seqs, active = index
    x = _ring_node(active, length, own)
    if x >= 0:
        return x, edge_len(nodes, seqs, x)
    return walk_occurring(nodes, hkeys, hvals, seqs, root, ctx, end - length, end)


@njit(cache=True)
def _ring_node(active, length, own):
    """The node the open sequence ``own`` (see ``suffix_position``) names for
    its suffix of ``length`` tokens, or -1 where its ring does not."""
    slot, own_len, own_valid = own
    depth = active.shape[1]
    if slot >= 0 and length <= own_valid and length < depth:
        return active[slot, (own_len - length) % depth]
    return -1


@njit(cache=True, nogil=True)
def walk(nodes, hkeys, hvals, arena, seqs, root, ctx, start, end):
    """Walk ``ctx[start:end]`` down from ``root``.

    Returns ``(node, offset)``: the string ends ``offset`` tokens into
    ``node``'s edge (``offset == LEN`` at the node's end; ``(root, 0)`` for an
    empty string), or ``(-1, 0)`` if it does not occur.
    """
    x = root
    off = 0
    for i in range(start, end):
        t = ctx[i]
        if off == edge_len(nodes, seqs, x):
            x = _find_child(nodes, hkeys, hvals, x, t)
            if x == -1:
                return -1, 0
            off = 1
        else:
            if label(arena, seqs, nodes, x, off) != t:
                return -1, 0
            off += 1
    return x, off


@njit(cache=True, nogil=True)
def walk_occurring(nodes, hkeys, hvals, seqs, root, ctx, start, end):
    """``walk`` for a string known to occur: one child lookup per edge.

    Along an edge the labels are not compared (the string occurs, so they
    match: the skip/count walk of suffix-tree construction).  Every suffix of
    an occurring string occurs too, so once a walk found a length, this one
    places every shorter one.  On a string that does not occur it may return
    a wrong node, but it reads only nodes the lookups return, and returns
    ``(-1, 0)`` where a lookup fails or an edge is empty.
    """
    x = root
    off = 0
    i = start
    while i < end:
        n = edge_len(nodes, seqs, x)
        if off == n:
            x = _find_child(nodes, hkeys, hvals, x, ctx[i])
            if x == -1:
                return -1, 0
            off = 0
            n = edge_len(nodes, seqs, x)
        step = n - off
        if step <= 0:
            return -1, 0
        if step > end - i:
            step = end - i
        off += step
        i += step
    return x, off


@njit(cache=True, nogil=True)
def _continues(nodes, seqs, x, off):
    return off < edge_len(nodes, seqs, x) or nodes[x, FIRST] != -1


@njit(cache=True, nogil=True)
def longest_match(index, root, ctx, start, end, max_len, need_continuation, own):
    """Longest suffix of ``ctx[start:end]`` found in the tree.

    Only suffixes of at most ``max_len`` tokens are tried.  With
    ``need_continuation`` the suffix must also be followed by some token in
    the index.  Both properties shrink monotonically with the suffix length,
    so a binary search finds the longest.  ``own`` names the request's own
    open sequence, if the tree holds it (see ``suffix_position``).  Returns
    ``(length, node, offset)``, length -1 when not even the empty suffix
    qualifies.
    """
    nodes, seqs = index.nodes, index.seqs
    hi = end - start
    if hi > max_len:
        hi = max_len
    lo = 0
    best_x = root
    best_off = 0
    if need_continuation and nodes[root, FIRST] == -1:
        return -1, -1, 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        x, off = suffix_position(index, root, ctx, end, mid, own)
        if x != -1 and (not need_continuation or _continues(nodes, seqs, x, off)):
            lo = mid
            best_x = x
            best_off = off
        else:
            hi = mid - 1
    return lo, best_x, best_off


@njit(cache=True, nogil=True)
def step_best(nodes, arena, seqs, x, off, length, discount):
    """The forced or most frequent next token at ``(x, off)``.

    ``length`` is ``x``'s edge length; ``discount`` occurrences are taken out
    of the count (the context's own, which has no continuation yet).  Returns
    ``(token, c, n, next_node)``: ``c`` of the ``n`` occurrences of the
    string continue with it; ``n <= 0`` when nothing follows.  Inside an edge
    ``c == n`` and ``next_node == x``.
    """
    if off < length:
        n = nodes[x, COUNT] - discount
        return label(arena, seqs, nodes, x, off), n, n, x
    b = nodes[x, BEST]
    if b == -1:
        return -1, 0, 0, -1
    n = nodes[x, COUNT] - discount
    c = nodes[b, COUNT]
    if c > n:
        c = n
    return nodes[b, TOKEN], c, n, b


@njit(cache=True, nogil=True)
def tail(index, s, length):
    """``(start, end)`` of sequence ``s``'s last ``length`` tokens in token storage."""
    off = index.seqs[s, SEQ_OFF]
    end = off + index.seqs[s, SEQ_LEN]
    start = end - length
    if start < off:
        start = off
    return start, end


@njit(cache=True, nogil=True)
def anchors(index, s):
    """Leading synthetic tokens of sequence ``s`` (its start anchors)."""
    arena, seqs = index.arena, index.seqs
    off = seqs[s, SEQ_OFF]
    n = seqs[s, SEQ_LEN]
    a = 0
    while a < n and arena[off + a] >= SYNTHETIC_BASE:
        a += 1
    return a


@njit(cache=True, nogil=True)
def continuations(index, x, off, out_tokens, out_counts):
    """Next tokens after position ``(x, off)`` with their counts.

    Returns how many; at most ``len(out_tokens)`` are written.
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    if off < edge_len(nodes, seqs, x):
        if out_tokens.shape[0] > 0:
            out_tokens[0] = label(arena, seqs, nodes, x, off)
            out_counts[0] = nodes[x, COUNT]
        return 1
    n = 0
    c = nodes[x, FIRST]
    while c != -1:
        if n < out_tokens.shape[0]:
            out_tokens[n] = nodes[c, TOKEN]
            out_counts[n] = nodes[c, COUNT]
        n += 1
        c = nodes[c, NEXT]
    return n


# --------------------------------------------------------------------------
# Self-check.
# --------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def check_integrity(index):
    """Verify every invariant of the index; returns 0 or a CHECK_MESSAGES code.

    Slow (it recounts every suffix); meant for tests and debugging.
    """
    meta, nodes, hkeys, hvals, arena, seqs, active = index
    top = meta[META_TOP]
    depth = meta[META_DEPTH]
    # Free list.
    free = 0
    x = meta[META_FREE_HEAD]
    while x != -1:
        if nodes[x, COUNT] != FREED:
            return 12
        free += 1
        x = nodes[x, NEXT]
    if free != meta[META_FREE_COUNT]:
        return 12
    edges = 0
    for x in range(top):
        if nodes[x, COUNT] == FREED:
            continue
        p = nodes[x, PARENT]
        # Sibling list, children counts, BEST.
        total = 0
        prev = -1
        c = nodes[x, FIRST]
        best = -1
        while c != -1:
            if nodes[c, PARENT] != x or nodes[c, PREV] != prev:
                return 7
            total += nodes[c, COUNT]
            if p != -1 and nodes[c, COUNT] >= nodes[x, COUNT]:
                return 4
            if best == -1 or nodes[c, COUNT] > nodes[best, COUNT]:
                best = c
            prev = c
            c = nodes[c, NEXT]
        if total > nodes[x, COUNT]:
            return 5
        b = nodes[x, BEST]
        if (b == -1) != (best == -1):
            return 6
        if b != -1 and (nodes[b, PARENT] != x or nodes[b, COUNT] != nodes[best, COUNT]):
            return 6
        if p == -1:
            continue
        if nodes[x, LEN] == 0 or nodes[x, COUNT] < 1:
            return 11
        if nodes[x, LEN] < 0 and (nodes[x, COUNT] != 1 or nodes[x, FIRST] != -1
                                  or seqs[nodes[x, REF_SEQ], SEQ_STATE] != SEQ_LIVE
                                  or edge_len(nodes, seqs, x) < 1):
            return 13
        if _has_siblings(nodes, p):
            edges += 1
            if _child(hkeys, hvals, p, nodes[x, TOKEN]) != x:
                return 2
        elif _child(hkeys, hvals, p, nodes[x, TOKEN]) != -1:
            return 2
        if label(arena, seqs, nodes, x, 0) != nodes[x, TOKEN]:
            return 3
    if edges != meta[META_HASH_FILL]:
        return 9
    for i in range(hkeys.shape[0]):
        k = hkeys[i]
        if k == EMPTY:
            continue
        v = hvals[i]
        if v < 0 or v >= top or nodes[v, COUNT] == FREED:
            return 1
        if nodes[v, PARENT] != (k >> 32) or nodes[v, TOKEN] != (k & 0xFFFFFFFF):
            return 1
        if not _has_siblings(nodes, nodes[v, PARENT]):
            return 1
    # Recount: every suffix of every live sequence walks its path.
    recount = np.zeros(top, np.int64)
    for s in range(seqs.shape[0]):
        if seqs[s, SEQ_STATE] != SEQ_LIVE:
            continue
        root = seqs[s, SEQ_ROOT]
        off = seqs[s, SEQ_OFF]
        n = seqs[s, SEQ_LEN]
        recount[root] += n
        for q in range(n):
            end = min(q + depth, n)
            x = root
            d = q
            while d < end:
                x = _find_child(nodes, hkeys, hvals, x, arena[off + d])
                if x == -1:
                    return 8
                length = edge_len(nodes, seqs, x)
                for j in range(length):
                    if d + j >= end or label(arena, seqs, nodes, x, j) != arena[off + d + j]:
                        return 8
                if nodes[x, LEN] < 0 and d + length != min(q + depth, n):
                    return 13
                recount[x] += 1
                d += length
        slot = seqs[s, SEQ_SLOT]
        if slot != -1:
            for q in range(max(0, n - depth + 1), n):
                x = active[slot, q % depth]
                if x < 0 or x >= top or nodes[x, COUNT] == FREED:
                    return 10
                if q < seqs[s, SEQ_FRONT] and nodes[x, LEN] >= 0:
                    return 14
                # The path from the root to x must spell seq[q:n].
                d = n
                while nodes[x, PARENT] != -1:
                    d -= edge_len(nodes, seqs, x)
                    x = nodes[x, PARENT]
                if d != q or x != root:
                    return 10
    for x in range(top):
        if nodes[x, COUNT] != FREED and nodes[x, COUNT] != recount[x]:
            return 8
    return 0


@njit(cache=True, nogil=True)
def grow_into(out, old, fill):
    """``out[:len(old)] = old``, the rest ``fill`` (flat arrays): an index's array
    grown without holding the interpreter lock (a loader thread grows a large
    index beside the serving thread)."""
    n = old.shape[0]
    for i in range(n):
        out[i] = old[i]
    for i in range(n, out.shape[0]):
        out[i] = fill
