"""The structure of a snapshot segment, checked before any kernel reads it.

The drafting kernels index a segment's arrays without bounds checks, follow
its sibling lists to their end and probe its child table until an empty
slot.  A segment's checksums only say its files are the ones its description
names; whoever built the segment (a shard shipped from another host) chose
both.  So before a segment is mapped into a kernel, ``check_segment`` proves
the invariant the kernels rely on: every index a kernel can read, from any
row it can reach, is in range, and every walk ends.

Kernels enter a segment at a root (``roots``, a sequence's root) or a child
table entry and move only along links (first child, next and previous
sibling, most frequent child, parent).  So the check is: every entry point
names a live node; every link of a live node names a live node (or none);
every field of a live node is in range (counts, labels inside their
sequence, tokens); sibling lists are chains (every link mirrored, each
starting at its parent's first child, so no walk loops); the child table has
an empty slot and names the right child.  No row reachable from an entry
point is then freed, and a freed row must also be inert (every field -1 but
its count and its free-list link, itself a freed row): whatever a kernel
does, it cannot read a field a builder left wild.  Also: shapes and types,
the pool's depth, and every token id a vocabulary id (below ``vocab_size``
when known) or a start anchor.

Vectorised NumPy, linear in the segment, in chunks of nodes so memory stays
bounded.  A segment that fails raises ``SegmentError`` naming the first
broken field.
"""

from __future__ import annotations

import numpy as np

from suffixspec.native import layout as lay
from suffixspec.native.tokens import MAX_TOKEN_ID, SYNTHETIC_BASE

#: What a segment's arrays must be: name -> (dtype, dimensions, columns or None).
ARRAYS = {"meta": (np.int64, 1, None), "nodes": (np.int32, 2, lay.NODE_FIELDS),
          "hkeys": (np.int64, 1, None), "hvals": (np.int32, 1, None),
          "arena": (np.int32, 1, None), "seqs": (np.int64, 2, lay.SEQ_FIELDS),
          "roots": (np.int32, 1, None)}

#: Nodes checked at once: bounds the temporaries, and how long one NumPy call
#: holds the interpreter (a serving thread of the process runs between them).
CHUNK = 1 << 18


class SegmentError(ValueError):
    """A segment's arrays break the index's structure; the message names how."""


def check_segment(arrays: dict[str, np.ndarray], max_depth: int, namespaces: dict[str, int],
                  vocab_size: int | None = None) -> None:
    """Raise ``SegmentError`` unless ``arrays`` form a closed index every kernel may read.

    ``namespaces`` maps each namespace to its tree (a row of ``roots``).
    """
    check_entry_points(arrays, namespaces)
    meta, nodes, hkeys, hvals = arrays["meta"], arrays["nodes"], arrays["hkeys"], arrays["hvals"]
    arena, seqs = arrays["arena"], arrays["seqs"]
    n = nodes.shape[0]
    _require(meta[lay.META_DEPTH] == max_depth, f"depth {meta[lay.META_DEPTH]}, the pool's is "
                                                f"{max_depth}")
    _require(meta[lay.META_TOP] == n, f"meta names {meta[lay.META_TOP]} nodes, nodes holds {n}")
    _require(0 <= meta[lay.META_ARENA_TOP] <= arena.shape[0], "token storage end out of range")
    _require(meta[lay.META_TIES] in (lay.TIES_NEWEST, lay.TIES_ARCTIC), "unknown tie order")
    head = meta[lay.META_FREE_HEAD]
    _require(head == -1 or (0 <= head < n and nodes[head, lay.COUNT] == lay.FREED),
             "the free list starts at a live node")
    _check_sequences(seqs, arena.shape[0], nodes)
    _check_tokens(arena, vocab_size)
    for lo in range(0, n, CHUNK):
        _check_nodes(nodes, seqs, arena, lo, min(n, lo + CHUNK), max_depth)
    _check_table(hkeys, hvals, nodes, int(meta[lay.META_HASH_FILL]))


def check_entry_points(arrays: dict[str, np.ndarray], namespaces: dict[str, int]) -> None:
    """What every open checks, stamped or not (cheap: no pass over the nodes):
    the arrays' types and shapes, and the namespaces' trees.

    Namespaces and trees pair one to one: each namespace names its own row of
    ``roots``, holding a live root, and every root is named.
    """
    _check_types(arrays)
    meta = arrays["meta"]
    _require(meta.shape[0] == lay.META_SIZE, f"meta has {meta.shape[0]} fields, not "
                                             f"{lay.META_SIZE}")
    _check_roots(arrays["roots"], arrays["nodes"], namespaces)


def _require(ok, what: str) -> None:
    if not ok:
        raise SegmentError(what)


def _check_types(arrays: dict) -> None:
    missing = set(ARRAYS) - set(arrays)
    _require(not missing, f"arrays missing: {', '.join(sorted(missing))}")
    for name, (dtype, ndim, columns) in ARRAYS.items():
        a = arrays[name]
        _require(isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim,
                 f"{name} is not a {ndim}-dimensional {np.dtype(dtype).name} array")
        if columns is not None:
            _require(a.shape[1] == columns, f"{name} has {a.shape[1]} fields, not {columns}")
    size = arrays["hkeys"].shape[0]
    _require(size >= 2 and size & (size - 1) == 0, "the child table's size is not a power of two")
    _require(arrays["hvals"].shape[0] == size, "child table keys and values differ in size")


def _check_sequences(seqs: np.ndarray, arena_size: int, nodes: np.ndarray) -> None:
    off, length, cap = seqs[:, lay.SEQ_OFF], seqs[:, lay.SEQ_LEN], seqs[:, lay.SEQ_CAP]
    _require(np.all((off >= 0) & (length >= 0) & (cap >= length) & (off + cap <= arena_size)),
             "a sequence's tokens lie outside token storage")
    _require(np.all(seqs[:, lay.SEQ_SLOT] == -1), "a sequence is still open")
    _require(np.all(np.isin(seqs[:, lay.SEQ_STATE], (lay.SEQ_FREE, lay.SEQ_LIVE,
                                                      lay.SEQ_REMOVED))), "unknown sequence state")
    root = seqs[:, lay.SEQ_ROOT]
    _require(np.all((root >= -1) & (root < nodes.shape[0])), "a sequence's root is out of range")
    _require(np.all(nodes[root[root >= 0], lay.COUNT] >= 0), "a sequence's root is freed")


def _check_tokens(arena: np.ndarray, vocab_size: int | None) -> None:
    top = MAX_TOKEN_ID if vocab_size is None else min(MAX_TOKEN_ID, vocab_size - 1)
    for lo in range(0, arena.shape[0], 4 * CHUNK):
        a = arena[lo:lo + 4 * CHUNK]
        _require(np.all(((a >= 0) & (a <= top)) | (a >= SYNTHETIC_BASE)),
                 f"a token id is negative or past the vocabulary ({top + 1} ids)")


def _check_roots(roots: np.ndarray, nodes: np.ndarray, namespaces: dict[str, int]) -> None:
    n = nodes.shape[0]
    _require(np.all((roots >= -1) & (roots < n)), "a root is out of range")
    for ns, tree in namespaces.items():
        _require(isinstance(tree, int) and 0 <= tree < roots.shape[0] and roots[tree] >= 0,
                 f"namespace {ns!r} names no tree")
    trees = list(namespaces.values())
    _require(len(set(trees)) == len(trees), "two namespaces name one tree")
    _require(set(trees) == set(np.flatnonzero(roots >= 0).tolist()),
             "a tree is named by no namespace")
    live = roots[roots >= 0]
    _require(np.all(nodes[live, lay.PARENT] == -1) and np.all(nodes[live, lay.LEN] == 0)
             and np.all(nodes[live, lay.COUNT] >= 0), "a root is not a root node")
    _require(len(np.unique(live)) == len(live), "two trees share a root")


def _check_nodes(nodes, seqs, arena, lo: int, hi: int, depth: int) -> None:
    """Nodes ``lo:hi``: freed rows inert, links of live rows to live rows, counts, edge labels."""
    n = nodes.shape[0]
    x = nodes[lo:hi]
    count = x[:, lay.COUNT]
    freed = count == lay.FREED
    live = ~freed
    _require(np.all(live <= (count >= 0)), "a node's count is negative")
    # A freed row: every field -1 but its count and its link on the free list.
    others = np.delete(x[freed], [lay.COUNT, lay.NEXT], axis=1)
    _require(np.all(others == -1), "a freed node holds links or a label")
    free_next = x[freed, lay.NEXT]
    _require(np.all((free_next >= -1) & (free_next < n)), "the free list is out of range")
    _require(np.all(nodes[free_next[free_next >= 0], lay.COUNT] == lay.FREED),
             "the free list runs into a live node")
    ids = np.arange(lo, hi)
    for field, name in ((lay.PARENT, "parent"), (lay.BEST, "most frequent child"),
                        (lay.FIRST, "first child"), (lay.NEXT, "next sibling"),
                        (lay.PREV, "previous sibling")):
        f = x[:, field]
        _require(np.all(~live | ((f >= -1) & (f < n))), f"a node's {name} is out of range")
        linked = f[live & (f >= 0)]
        _require(np.all(nodes[linked, lay.COUNT] >= 0), f"a node's {name} is freed")
    parent, first, nxt, prev, best = (x[:, f] for f in (lay.PARENT, lay.FIRST, lay.NEXT,
                                                        lay.PREV, lay.BEST))
    inner = live & (parent >= 0)
    # Sibling lists are chains: every link is mirrored, a chain starts at its
    # parent's first child, so a walk from a first child ends without a loop.
    has_next = live & (nxt >= 0)
    _require(np.all(nodes[nxt[has_next], lay.PREV] == ids[has_next])
             & np.all(nodes[nxt[has_next], lay.PARENT] == parent[has_next]),
             "a sibling list is broken")
    has_prev = live & (prev >= 0)
    _require(np.all(nodes[prev[has_prev], lay.NEXT] == ids[has_prev]), "a sibling list is broken")
    head = inner & (prev < 0)
    _require(np.all(nodes[parent[head], lay.FIRST] == ids[head]), "a sibling list is broken")
    for link, name in ((first, "first child"), (best, "most frequent child")):
        has = live & (link >= 0)
        _require(np.all(nodes[link[has], lay.PARENT] == ids[has]),
                 f"a node's {name} is not its child")
    _require(np.all(nodes[first[live & (first >= 0)], lay.PREV] == -1), "a sibling list is broken")
    # Edge labels: within their sequence's tokens, at most the depth long.
    ref, pos, length = (x[inner, f].astype(np.int64) for f in (lay.REF_SEQ, lay.REF_POS, lay.LEN))
    _require(np.all((ref >= 0) & (ref < seqs.shape[0])), "a label names no sequence")
    seq_len = seqs[ref, lay.SEQ_LEN]
    edge = np.where(length >= 0, length, np.minimum(-length, seq_len - pos))
    _require(np.all((length != 0) & (length >= -depth) & (length <= depth)),
             "an edge is empty or longer than the depth")
    _require(np.all((pos >= 0) & (edge >= 1) & (pos + edge <= seq_len)),
             "a label lies outside its sequence")
    first_token = arena[seqs[ref, lay.SEQ_OFF] + pos]
    _require(np.all(first_token == x[inner, lay.TOKEN]), "a node's token is not its label's")


def _check_table(hkeys: np.ndarray, hvals: np.ndarray, nodes: np.ndarray, fill: int) -> None:
    used = hkeys != lay.EMPTY
    _require(int(used.sum()) == fill and fill < hkeys.shape[0],
             "the child table has no empty slot, or another fill than recorded")
    child = hvals[used].astype(np.int64)
    _require(np.all((child >= 0) & (child < nodes.shape[0])), "a child table entry is out of range")
    _require(np.all(nodes[child, lay.COUNT] >= 0), "a child table entry is freed")
    key = hkeys[used]
    parent, token = key >> 32, (key & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    _require(np.all((nodes[child, lay.PARENT] == parent) & (nodes[child, lay.TOKEN] == token)),
             "a child table entry names the wrong child")
