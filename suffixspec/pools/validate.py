"""The structure of a snapshot segment, checked before any kernel reads it.

The drafting kernels index a segment's arrays without bounds checks, follow
its sibling lists to their end and probe its child table until an empty
slot.  A segment's checksums only say its files are the ones its description
names; whoever built the segment (a shard shipped from another host) chose
both.  So before a segment is mapped into a kernel, ``check_segment`` checks
every field a kernel reads: shapes and types, every node id, link, label
reference, sequence offset and root in range, sibling lists that are
well-formed chains (no kernel walk can loop), a child table with an empty
slot whose entries name the right child, the pool's depth, and every token
id a vocabulary id (below ``vocab_size`` when known) or a start anchor.

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
    _check_types(arrays)
    meta, nodes, hkeys, hvals = arrays["meta"], arrays["nodes"], arrays["hkeys"], arrays["hvals"]
    arena, seqs, roots = arrays["arena"], arrays["seqs"], arrays["roots"]
    n = nodes.shape[0]
    _require(meta.shape[0] == lay.META_SIZE, f"meta has {meta.shape[0]} fields, not "
                                             f"{lay.META_SIZE}")
    _require(meta[lay.META_DEPTH] == max_depth, f"depth {meta[lay.META_DEPTH]}, the pool's is "
                                                f"{max_depth}")
    _require(meta[lay.META_TOP] == n, f"meta names {meta[lay.META_TOP]} nodes, nodes holds {n}")
    _require(0 <= meta[lay.META_ARENA_TOP] <= arena.shape[0], "token storage end out of range")
    _require(meta[lay.META_TIES] in (lay.TIES_NEWEST, lay.TIES_ARCTIC), "unknown tie order")
    _check_sequences(seqs, arena.shape[0], n)
    _check_tokens(arena, vocab_size)
    _check_roots(roots, nodes, namespaces)
    for lo in range(0, n, CHUNK):
        _check_nodes(nodes, seqs, arena, lo, min(n, lo + CHUNK), max_depth)
    _check_table(hkeys, hvals, nodes, int(meta[lay.META_HASH_FILL]))


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


def _check_sequences(seqs: np.ndarray, arena_size: int, n: int) -> None:
    off, length, cap = seqs[:, lay.SEQ_OFF], seqs[:, lay.SEQ_LEN], seqs[:, lay.SEQ_CAP]
    _require(np.all((off >= 0) & (length >= 0) & (cap >= length) & (off + cap <= arena_size)),
             "a sequence's tokens lie outside token storage")
    _require(np.all(seqs[:, lay.SEQ_SLOT] == -1), "a sequence is still open")
    _require(np.all(np.isin(seqs[:, lay.SEQ_STATE], (lay.SEQ_FREE, lay.SEQ_LIVE,
                                                      lay.SEQ_REMOVED))), "unknown sequence state")
    root = seqs[:, lay.SEQ_ROOT]
    _require(np.all((root >= -1) & (root < n)), "a sequence's root is out of range")


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
    live = roots[roots >= 0]
    _require(np.all(nodes[live, lay.PARENT] == -1) and np.all(nodes[live, lay.LEN] == 0)
             and np.all(nodes[live, lay.COUNT] >= 0), "a root is not a root node")


def _check_nodes(nodes, seqs, arena, lo: int, hi: int, depth: int) -> None:
    """Nodes ``lo:hi``: links, counts and edge labels."""
    n = nodes.shape[0]
    x = nodes[lo:hi]
    count = x[:, lay.COUNT]
    live = count != lay.FREED
    _require(np.all(live <= (count >= 0)), "a node's count is negative")
    ids = np.arange(lo, hi)
    for field, name in ((lay.PARENT, "parent"), (lay.BEST, "most frequent child"),
                        (lay.FIRST, "first child"), (lay.NEXT, "next sibling"),
                        (lay.PREV, "previous sibling")):
        f = x[:, field]
        _require(np.all(~live | ((f >= -1) & (f < n))), f"a node's {name} is out of range")
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
        _require(np.all(nodes[link[has], lay.COUNT] >= 0), f"a node's {name} is freed")
    _require(np.all(nodes[first[live & (first >= 0)], lay.PREV] == -1), "a sibling list is broken")
    _require(np.all(~inner | (nodes[np.where(inner, parent, 0), lay.COUNT] >= 0)),
             "a node's parent is freed")
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
    key = hkeys[used]
    parent, token = key >> 32, (key & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    _require(np.all((nodes[child, lay.PARENT] == parent) & (nodes[child, lay.TOKEN] == token)),
             "a child table entry names the wrong child")
