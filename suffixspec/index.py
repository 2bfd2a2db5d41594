"""``SuffixIndex``: owns the arrays of one native suffix index and grows them.

A ``SuffixIndex`` is a forest.  ``add_tree`` makes an empty tree,
``add_sequence`` an open sequence in it; ``extend`` appends tokens, ``close``
ends a sequence (it stays indexed), ``remove`` takes one out of the counts and
``drop_tree`` frees a whole tree at once.

The arrays are public attributes so batch kernels can take them directly; only
this class resizes them.  Token arrays passed in are assumed valid: the public
API validates once (``suffixspec.tokens.as_token_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from suffixspec.native import query, trie
from suffixspec.native import layout as lay
from suffixspec.native.layout import heap_scratch


class IndexCorruptError(RuntimeError):
    """``check_integrity`` found a broken invariant."""


@dataclass(frozen=True)
class Match:
    """Where a context suffix ends in a tree.

    ``length`` tokens matched; the match ends ``offset`` tokens into ``node``'s
    edge.  ``count`` is how often the matched string occurs.
    """

    length: int
    node: int
    offset: int
    count: int


#: Which of equally frequent continuations a path draft follows (see
#: ``suffixspec.native.layout``): "newest" (suffixspec's) or "arctic"
#: (arctic-inference's order, for drafts identical to it).
TIES = {"newest": lay.TIES_NEWEST, "arctic": lay.TIES_ARCTIC}

#: The arrays the kernels take, in ``Index`` field order.
_ARRAYS = lay.Index._fields


class SuffixIndex:
    def __setattr__(self, name, value):
        # Replacing an array (a growth) drops the tuple made of the old ones,
        # whichever code replaces it: ``plain_arrays`` makes it again.
        if name in _ARRAYS:
            self.__dict__.pop("_arrays", None)
        object.__setattr__(self, name, value)

    def __init__(self, max_depth: int = 64, node_capacity: int = 1024,
                 token_capacity: int = 4096, ties: str = "newest"):
        if not 1 <= max_depth <= 1024:
            raise ValueError(f"max_depth must be in [1, 1024], got {max_depth}")
        if ties not in TIES:
            raise ValueError(f"ties must be one of {', '.join(TIES)}, got {ties!r}")
        self.max_depth = int(max_depth)
        self.ties = ties
        self.meta = np.zeros(lay.META_SIZE, np.int64)
        self.meta[lay.META_DEPTH] = max_depth
        self.meta[lay.META_TIES] = TIES[ties]
        self.meta[lay.META_FREE_HEAD] = -1
        self.nodes = np.full((max(node_capacity, 2 * max_depth + 4), lay.NODE_FIELDS), -1, np.int32)
        hcap = 1 << max(6, int(np.ceil(np.log2(4 * max_depth + 8))))
        self.hkeys = np.full(hcap, lay.EMPTY, np.int64)
        self.hvals = np.full(hcap, -1, np.int32)
        self.arena = np.zeros(token_capacity, np.int32)
        self.seqs = np.zeros((16, lay.SEQ_FIELDS), np.int64)
        self.active = np.zeros((4, max_depth), np.int32)
        self.roots = np.full(4, -1, np.int32)
        self._path = np.zeros(max_depth + 1, np.int32)
        self._progress = np.zeros(2, np.int64)
        self._free_seqs: list[int] = []
        self._next_seq = 0
        self._free_slots: list[int] = list(range(3, -1, -1))
        self._free_trees: list[int] = []
        self._next_tree = 0
        self._tree_seqs: dict[int, set[int]] = {}
        self._garbage = 0  # token storage held by freed sequences

    # ------------------------------------------------------------------ trees
    def add_tree(self) -> int:
        """Create an empty tree and return its id."""
        tree = self._free_trees.pop() if self._free_trees else self._next_tree
        self._open_tree(tree)
        return tree

    def drop_tree(self, tree: int) -> None:
        """Free a tree, its nodes and its sequences."""
        root = self._root(tree)
        trie.drop_tree(self.plain_arrays(), root)
        for s in self._tree_seqs.pop(tree):
            self._release_seq(s)
        self.roots[tree] = -1
        self._free_trees.append(tree)

    # -------------------------------------------------------------- sequences
    def add_sequence(self, tree: int, capacity: int = 64, seq: int | None = None) -> int:
        """Open a new, empty sequence in ``tree`` and return its id.

        ``seq`` asks for that id (one not in use), so a rebuilt index can keep
        the ids its owner hands out.
        """
        if seq is None:
            s = self._free_seqs.pop() if self._free_seqs else self._next_seq
        elif seq < self._next_seq and seq not in self._free_seqs:
            raise ValueError(f"sequence {seq} is in use")
        else:
            s = seq
            if s in self._free_seqs:
                self._free_seqs.remove(s)
        self._open_seq(s, tree, capacity)
        return s

    def _compact(self) -> None:
        order = np.argsort(self.seqs[:, lay.SEQ_OFF], kind="stable")
        trie.compact_arena(self.arena, self.seqs, self.meta, order)

    def extend(self, seq: int, token_ids: np.ndarray) -> None:
        """Append int32 tokens to open sequence ``seq`` and index them."""
        if not token_ids.flags.writeable:  # one kind of array: one compiled kernel
            token_ids = token_ids.copy()
        done = 0
        n = token_ids.shape[0]
        stalled = -1
        while True:
            done += trie.extend(self.plain_arrays(), seq, token_ids[done:])
            if done == n:
                return
            if done == stalled:
                raise _no_room(seq, done)
            stalled = done
            self._make_room(seq, n - done)

    def extend_many(self, seq_ids: np.ndarray, tokens: np.ndarray, offsets: np.ndarray,
                    resume: bool = False) -> None:
        """Append ``tokens[offsets[i]:offsets[i+1]]`` to each open ``seq_ids[i]`` (-1: skip).

        ``seq_ids`` and ``offsets`` are int64, ``tokens`` int32; one native
        call unless a capacity has to grow.  ``resume``: go on from where a
        kernel given ``extend_args`` stopped for want of room.
        """
        progress = self._progress
        if not resume:
            progress[:] = 0
        stalled = None
        while not trie.extend_batch(self.plain_arrays(), seq_ids, tokens, offsets, progress):
            i, done = int(progress[0]), int(progress[1])
            if (i, done) == stalled:
                raise _no_room(int(seq_ids[i]), done)
            stalled = (i, done)
            self._make_room(int(seq_ids[i]), int(offsets[i + 1] - offsets[i]) - done)

    def extend_args(self) -> tuple:
        """What a kernel that appends to this index takes (``propose.learn_and_extend``):
        its arrays as a plain tuple (valid until an array grows) and the
        progress record it leaves where it ran short of room (``extend_many``
        with ``resume`` goes on from there).  The same tuple until an array
        grows, so a caller can tell that nothing changed."""
        return self.plain_arrays(), self._progress

    def close(self, seq: int) -> None:
        """End ``seq``: it stays indexed but takes no more tokens."""
        slot = int(self.seqs[seq, lay.SEQ_SLOT])
        if slot != -1:
            self._free_slots.append(slot)
            self.seqs[seq, lay.SEQ_SLOT] = -1

    def remove(self, seq: int) -> None:
        """Take ``seq`` out of the index (its tokens are reclaimed by ``rebuild``)."""
        self.close(seq)
        trie.remove_seq(self.plain_arrays(), seq, self._path)

    def sequence(self, seq: int) -> np.ndarray:
        """A copy of the tokens of ``seq``."""
        off, n = int(self.seqs[seq, lay.SEQ_OFF]), int(self.seqs[seq, lay.SEQ_LEN])
        return self.arena[off:off + n].copy()

    def arrays(self) -> lay.Index:
        """The index's arrays as the kernels take them (valid until an array grows).

        Kernels that change the index only unpack it and are called per step,
        so they get it as a plain tuple (typed faster, see ``native.layout``).
        """
        return lay.Index(*self.plain_arrays())

    def plain_arrays(self) -> tuple:
        """The arrays as one plain tuple in ``Index`` field order, as an entry
        kernel takes them: the same tuple until one of them is replaced."""
        arrays = self.__dict__.get("_arrays")
        if arrays is None:
            arrays = self._arrays = tuple(getattr(self, name) for name in _ARRAYS)
        return arrays

    def read_only_arrays(self) -> tuple:
        """Read-only views of the index's arrays, a plain tuple in ``Index`` field
        order (how the drafting kernel takes it, see ``native.layout``).

        The drafting kernel takes every index read-only (a snapshot is), so it
        is compiled once.  The views are made again only after an array grew.
        """
        arrays = self.plain_arrays()
        src, views = self.__dict__.get("_read_only", ((), None))
        if src is not arrays:
            views = tuple(lay.read_only(lay.Index(*arrays)))
            self._read_only = (arrays, views)
        return views

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays of a fully closed index, trimmed to what is in use (for a snapshot)."""
        self._compact()
        return {"meta": self.meta, "nodes": self.nodes[: self.meta[lay.META_TOP]],
                "hkeys": self.hkeys, "hvals": self.hvals,
                "arena": self.arena[: self.meta[lay.META_ARENA_TOP]],
                "seqs": self.seqs[: self._next_seq], "roots": self.roots[: self._next_tree]}

    @classmethod
    def over_tokens(cls, max_depth: int, arena: np.ndarray, sequences: int,
                    trees: int) -> SuffixIndex:
        """An index of ``trees`` empty trees over the token storage ``arena``
        (shared, not copied), with rows for ``sequences`` sequences that a
        kernel places over it (``native.partition.index_run``)."""
        ix = cls(max_depth, node_capacity=1 << 16, token_capacity=1)
        ix.arena = arena
        for _ in range(trees):
            ix.add_tree()
        ix.seqs = np.zeros((max(sequences, 1), lay.SEQ_FIELDS), np.int64)
        ix._next_seq = sequences
        return ix

    def grow_for(self, seq: int) -> None:
        """Room for the kernel that stopped at sequence ``seq`` (nodes, child table)."""
        self._make_room(seq, 0)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], max_depth: int) -> SuffixIndex:
        """A query-only index over (read-only) arrays from ``to_arrays``."""
        ix = cls.__new__(cls)
        ix.max_depth = max_depth
        for name in ("meta", "nodes", "hkeys", "hvals", "arena", "seqs", "roots"):
            setattr(ix, name, arrays[name])
        ix.active = np.zeros((1, max_depth), np.int32)  # no open sequences
        # Read-only like the other arrays: one compiled variant of the kernels
        # (the one ``warmup`` builds) serves every snapshot.
        ix.active.setflags(write=False)
        return ix

    def view(self, seq: int) -> np.ndarray:
        """The tokens of ``seq`` without a copy; valid until the index next changes."""
        off, n = int(self.seqs[seq, lay.SEQ_OFF]), int(self.seqs[seq, lay.SEQ_LEN])
        return self.arena[off:off + n]

    def seq_len(self, seq: int) -> int:
        return int(self.seqs[seq, lay.SEQ_LEN])

    def is_open(self, seq: int) -> bool:
        return int(self.seqs[seq, lay.SEQ_SLOT]) != -1

    @property
    def live_tokens(self) -> int:
        return int(self.meta[lay.META_LIVE_TOKENS])

    @property
    def dead_tokens(self) -> int:
        return int(self.meta[lay.META_DEAD_TOKENS])

    # ---------------------------------------------------------------- queries
    def match(self, tree: int, context: np.ndarray, need_continuation: bool = False,
              max_len: int | None = None) -> Match | None:
        """Longest suffix of ``context`` that occurs in ``tree``.

        With ``need_continuation`` it must also be followed by some token.
        Returns None when not even the empty suffix qualifies (empty tree).
        """
        limit = self.max_depth if max_len is None else min(max_len, self.max_depth)
        length, node, off = trie.longest_match(
            self.arrays(), self._root(tree), context, 0, context.shape[0], limit,
            need_continuation, (np.int64(-1), np.int64(0), np.int64(0)))
        if length < 0:
            return None
        return Match(int(length), int(node), int(off), int(self.nodes[node, lay.COUNT]))

    def continuations(self, match: Match) -> tuple[np.ndarray, np.ndarray]:
        """Tokens that follow a match and how often each does."""
        n = trie.continuations(self.arrays(), match.node, match.offset,
                              np.empty(0, np.int32), np.empty(0, np.int64))
        tokens = np.empty(n, np.int32)
        counts = np.empty(n, np.int64)
        trie.continuations(self.arrays(), match.node, match.offset, tokens, counts)
        return tokens, counts

    def occurrence(self, match: Match) -> tuple[int, int]:
        """One ``(seq, start)`` where the matched string occurs.

        The sequence may be a removed one: its tokens stay in storage, and
        edge labels may read them, until ``rebuild``.
        """
        node = match.node
        seq = int(self.nodes[node, lay.REF_SEQ])
        start = int(self.nodes[node, lay.REF_POS]) + match.offset - match.length
        return seq, start

    def draft_path(self, match: Match, max_tokens: int, min_prob: float):
        """Most-frequent-continuation path from ``match``: (tokens, probs, score)."""
        tokens = np.empty(max_tokens, np.int32)
        probs = np.empty(max_tokens, np.float32)
        n, score = query.draft_path(self.arrays(), match.node, match.offset, max_tokens,
                                     min_prob, tokens, probs, 0)
        return tokens[:n], probs[:n], float(score)

    def draft_tree(self, match: Match, max_tokens: int, min_prob: float):
        """Best-first draft tree from ``match``: (tokens, parents, probs, score)."""
        tokens = np.empty(max_tokens, np.int32)
        parents = np.empty(max_tokens, np.int32)
        probs = np.empty(max_tokens, np.float32)
        heap = heap_scratch(max_tokens, min_prob)
        n, score = query.draft_tree(self.arrays(), match.node, match.offset, max_tokens,
                                     min_prob, tokens, parents, probs, heap)
        return tokens[:n], parents[:n], probs[:n], float(score)

    # ------------------------------------------------------------ maintenance
    def check_integrity(self) -> None:
        """Raise ``IndexCorruptError`` if any invariant is broken (slow)."""
        code = trie.check_integrity(self.plain_arrays())
        if code:
            raise IndexCorruptError(trie.CHECK_MESSAGES[code])

    def memory_bytes(self) -> int:
        """Bytes held by the index arrays (allocated capacity, not just used)."""
        return sum(a.nbytes for a in (self.meta, self.nodes, self.hkeys, self.hvals,
                                      self.arena, self.seqs, self.active, self.roots))

    def used_bytes(self) -> int:
        """Bytes of the index arrays in use: nodes, child table slots, token storage."""
        nodes = int(self.meta[lay.META_TOP] - self.meta[lay.META_FREE_COUNT])
        return (nodes * self.nodes.itemsize * lay.NODE_FIELDS
                + int(self.meta[lay.META_HASH_FILL]) * 2 * (8 + 4)
                + int(self.meta[lay.META_ARENA_TOP]) * 4)

    def node_count(self) -> int:
        return int(self.meta[lay.META_TOP] - self.meta[lay.META_FREE_COUNT])

    def rebuild(self) -> None:
        """Re-index live sequences from scratch, reclaiming removed ones' storage.

        Tree and sequence ids stay valid; open sequences stay open.
        """
        fresh = SuffixIndex(self.max_depth, node_capacity=max(1024, self.node_count()),
                            token_capacity=max(4096, self.live_tokens + 1024), ties=self.ties)
        for tree in sorted(self._tree_seqs):
            fresh._open_tree(tree)
        for tree, seqs in self._tree_seqs.items():
            for s in sorted(seqs):
                if self.seqs[s, lay.SEQ_STATE] != lay.SEQ_LIVE:
                    continue
                fresh._open_seq(s, tree, max(self.seq_len(s), 1))
                fresh.extend(s, self.sequence(s))
                if not self.is_open(s):
                    fresh.close(s)
        if self.ties == "arctic":  # keep arctic's order among equal counts
            stack = np.empty((fresh.nodes.shape[0], 3), np.int64)
            for tree in self._tree_seqs:
                if not trie.copy_child_order(self.plain_arrays(), self.roots[tree],
                                             fresh.plain_arrays(), fresh.roots[tree], stack):
                    raise IndexCorruptError("rebuilt tree differs from the old one")
        fresh._free_trees = [t for t in range(fresh._next_tree) if t not in fresh._tree_seqs][::-1]
        used = set().union(*fresh._tree_seqs.values()) if fresh._tree_seqs else set()
        fresh._free_seqs = [s for s in range(fresh._next_seq) if s not in used][::-1]
        for s in fresh._free_seqs:
            fresh.seqs[s, lay.SEQ_STATE] = lay.SEQ_FREE
        for name, value in vars(fresh).items():  # through ``__setattr__``: no stale tuples
            setattr(self, name, value)

    # --------------------------------------------------------------- internal
    def _root(self, tree: int) -> int:
        if not 0 <= tree < self.roots.shape[0] or self.roots[tree] < 0:
            raise KeyError(f"no tree {tree}")
        return int(self.roots[tree])

    def _open_tree(self, tree: int) -> None:
        if tree >= self.roots.shape[0]:
            self.roots = _grown(self.roots, max(2 * self.roots.shape[0], tree + 1), -1)
        self._next_tree = max(self._next_tree, tree + 1)
        self._reserve_nodes(1)
        self.roots[tree] = trie.new_root(self.nodes, self.meta)
        self._tree_seqs[tree] = set()

    def _open_seq(self, s: int, tree: int, capacity: int) -> None:
        root = self._root(tree)
        if s >= self.seqs.shape[0]:
            self.seqs = _grown(self.seqs, max(2 * self.seqs.shape[0], s + 1), 0)
        self._next_seq = max(self._next_seq, s + 1)
        if not self._free_slots:
            old = self.active.shape[0]
            self.active = _grown(self.active, 2 * old, 0)
            self._free_slots.extend(range(2 * old - 1, old - 1, -1))
        row = self.seqs[s]
        row[:] = 0
        row[lay.SEQ_ROOT] = root
        row[lay.SEQ_SLOT] = self._free_slots.pop()
        row[lay.SEQ_STATE] = lay.SEQ_LIVE
        self._place(s, max(int(capacity), 1))
        self._tree_seqs[tree].add(s)

    def _release_seq(self, s: int) -> None:
        self.close(s)
        state = self.seqs[s, lay.SEQ_STATE]
        n = int(self.seqs[s, lay.SEQ_LEN])
        if state == lay.SEQ_LIVE:
            self.meta[lay.META_LIVE_TOKENS] -= n
        elif state == lay.SEQ_REMOVED:
            self.meta[lay.META_DEAD_TOKENS] -= n
        self._garbage += int(self.seqs[s, lay.SEQ_CAP])
        self.seqs[s, lay.SEQ_STATE] = lay.SEQ_FREE
        self.seqs[s, lay.SEQ_LEN] = 0
        self._free_seqs.append(s)

    def _reserve_nodes(self, n: int) -> None:
        spare = self.nodes.shape[0] - self.meta[lay.META_TOP] + self.meta[lay.META_FREE_COUNT]
        if spare < n:
            need = self.nodes.shape[0] + n
            self.nodes = _grown(self.nodes, max(2 * self.nodes.shape[0], need), -1)

    def reserve(self, tokens: int) -> None:
        """Grow now so that about ``tokens`` more tokens index without growing
        (growing rehashes and copies: a cost proportional to the index)."""
        nodes = self.node_count() + 2 * tokens + 2 * self.max_depth + 4
        if nodes > self.nodes.shape[0]:
            self.nodes = _grown(self.nodes, nodes, -1)
        entries = int(self.meta[lay.META_HASH_FILL]) + tokens + 2 * self.max_depth + 2
        size = 1 << int(np.ceil(np.log2(max(2 * entries + 2, self.hkeys.shape[0]))))
        if size > self.hkeys.shape[0]:
            keys = _filled(size, lay.EMPTY, np.int64)
            vals = _filled(size, -1, np.int32)
            trie.rehash(self.hkeys, self.hvals, keys, vals, self.meta)
            self.hkeys, self.hvals = keys, vals
        arena = int(self.meta[lay.META_ARENA_TOP]) + 2 * tokens
        if arena > self.arena.shape[0]:
            self.arena = _grown(self.arena, arena, 0)

    def room(self) -> float:
        """How full the index is, 0 to 1, by whichever of its arrays is fullest."""
        used_nodes = (self.meta[lay.META_TOP] - self.meta[lay.META_FREE_COUNT]) / self.nodes.shape[0]
        used_hash = 2 * self.meta[lay.META_HASH_FILL] / self.hkeys.shape[0]
        used_arena = self.meta[lay.META_ARENA_TOP] / self.arena.shape[0]
        return float(max(used_nodes, used_hash, used_arena))

    def _make_room(self, seq: int, more: int) -> None:
        row = self.seqs[seq]
        if row[lay.SEQ_LEN] >= row[lay.SEQ_CAP]:
            self._place(seq, max(2 * int(row[lay.SEQ_CAP]), int(row[lay.SEQ_LEN]) + more))
        self._reserve_nodes(self.max_depth + 1)
        if self.meta[lay.META_HASH_FILL] + 2 * self.max_depth + 2 > self.hkeys.shape[0] // 2:
            size = 2 * self.hkeys.shape[0]
            keys = _filled(size, lay.EMPTY, np.int64)
            vals = _filled(size, -1, np.int32)
            trie.rehash(self.hkeys, self.hvals, keys, vals, self.meta)
            self.hkeys, self.hvals = keys, vals

    def _place(self, seq: int, cap: int) -> None:
        """Give ``seq`` a storage region of ``cap`` tokens, keeping its tokens."""
        row = self.seqs[seq]
        top = int(self.meta[lay.META_ARENA_TOP])
        end = int(row[lay.SEQ_OFF] + row[lay.SEQ_CAP])
        if row[lay.SEQ_CAP] > 0 and end == top and row[lay.SEQ_OFF] + cap <= self.arena.shape[0]:
            # Last region: grow it in place.
            row[lay.SEQ_CAP] = cap
            self.meta[lay.META_ARENA_TOP] = row[lay.SEQ_OFF] + cap
            return
        if row[lay.SEQ_CAP] > 0:
            self._garbage += int(row[lay.SEQ_CAP])
        if top + cap > self.arena.shape[0] and self._garbage > top // 2:
            self._compact()
            self._garbage = 0
            top = int(self.meta[lay.META_ARENA_TOP])
        if top + cap > self.arena.shape[0]:
            self.arena = _grown(self.arena, max(2 * self.arena.shape[0], top + cap), 0)
        if row[lay.SEQ_CAP] > 0:
            trie.move_seq(self.arena, self.seqs, self.meta, seq, top, cap)
        else:
            row[lay.SEQ_OFF] = top
            row[lay.SEQ_CAP] = cap
            self.meta[lay.META_ARENA_TOP] = top + cap


def _no_room(seq: int, done: int) -> RuntimeError:
    """The error for a kernel that stopped twice at one place: growing the
    index gave it no room (growth always leaves room for a token, so this is
    a bug, and a loop would never end)."""
    return RuntimeError(f"index: no progress appending to sequence {seq} after "
                        f"{done} tokens, although it grew")


def _grown(arr: np.ndarray, rows: int, fill) -> np.ndarray:
    """``arr`` with ``rows`` rows, the new ones ``fill`` (filled in a kernel that
    lets go of the interpreter lock: large arrays take a while)."""
    out = np.empty((rows,) + arr.shape[1:], arr.dtype)
    trie.grow_into(out.reshape(-1), np.ascontiguousarray(arr).reshape(-1), arr.dtype.type(fill))
    return out


def _filled(size: int, fill, dtype) -> np.ndarray:
    out = np.empty(size, dtype)
    trie.grow_into(out, out[:0], out.dtype.type(fill))
    return out
