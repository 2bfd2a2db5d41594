"""Crafted snapshot segments: one bound broken at a time, checksums recomputed to match.

A shard built elsewhere carries its own pool file, so whoever builds it sets
the checksums its segments are checked against.  ``MUTATIONS`` break one
field of a segment each; ``craft`` writes the broken arrays into a pool's
segment and rewrites the description so every checksum matches.  Used by the
hostile-input tests and ``bench/fault_bench.py``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import msgpack
import numpy as np

from suffixspec.fingerprint import BYTES
from suffixspec.native import layout as lay
from suffixspec.pools import files
from suffixspec.pools.store import PoolStore

DEPTH = 16
# Every sequence starts so, then random tokens of 20..69: prompts of HEAD draft
# the same tokens whichever way the pool holds them (no ties among continuations).
HEAD = [7, 8, 9, 1, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16]
PROMPTS = ([7, 8, 9], [1, 2, 3], [4, 5])


def make_pool(path: Path, n: int = 60, seed: int = 0) -> None:
    """A pool of ``n`` sequences in namespace "a" with a one-segment snapshot."""
    from suffixspec.pools.segments import write_snapshot

    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    rng = np.random.default_rng(seed)
    store.add_many([(np.concatenate([HEAD, rng.integers(20, 70, 120)]).astype(np.int32),
                     "a", "", f"r{i}") for i in range(n)])
    write_snapshot(store)
    store.close()


def _inner(nodes: np.ndarray, field: int, min_children: int = 0) -> int:
    """A live non-root node (with at least ``min_children`` siblings when asked)."""
    live = np.flatnonzero((nodes[:, lay.COUNT] >= 0) & (nodes[:, lay.PARENT] >= 0))
    if min_children:
        live = [x for x in live if nodes[x, lay.NEXT] >= 0]
    return int(live[len(live) // 2])


def _set(name, row_of, field, value):
    def mutate(arrays, raw):
        a = arrays[name]
        if a.ndim == 2:
            a[row_of(a), field] = value(a, arrays)
        else:
            a[row_of(a)] = value(a, arrays)
        return arrays, raw
    return mutate


def _nodes(field, value):
    return _set("nodes", lambda a: _inner(a, field), field, value)


def _used_slot(arrays) -> int:
    return int(np.flatnonzero(arrays["hkeys"] != lay.EMPTY)[0])


def _table(value):
    def mutate(arrays, raw):
        arrays["hvals"][_used_slot(arrays)] = value(arrays)
        return arrays, raw
    return mutate


def _full_table(arrays, raw):
    keys = arrays["hkeys"]
    empty = np.flatnonzero(keys == lay.EMPTY)
    keys[empty] = (np.int64(1 << 40) + np.arange(empty.shape[0]))  # keys no child has
    arrays["hvals"][empty] = 0
    arrays["meta"][lay.META_HASH_FILL] = keys.shape[0]
    return arrays, raw


def _empty_table(arrays, raw):
    arrays["hkeys"] = np.zeros(0, np.int64)
    arrays["hvals"] = np.zeros(0, np.int32)
    arrays["meta"][lay.META_HASH_FILL] = 0
    return arrays, raw


def _sibling_cycle(arrays, raw):
    nodes = arrays["nodes"]
    x = _inner(nodes, lay.NEXT, min_children=1)
    last = x
    while nodes[last, lay.NEXT] >= 0:
        last = nodes[last, lay.NEXT]
    first = nodes[nodes[x, lay.PARENT], lay.FIRST]
    nodes[last, lay.NEXT] = first  # the walk of the siblings never ends
    return arrays, raw


def _reshaped(arrays, raw):
    arrays["nodes"] = arrays["nodes"].reshape(-1)[: (arrays["nodes"].size // 9) * 9].reshape(-1, 9)
    return arrays, raw


def _short_arena(arrays, raw):
    arrays["arena"] = arrays["arena"][: arrays["arena"].shape[0] // 2].copy()
    return arrays, raw


def _wide_nodes(arrays, raw):
    arrays["nodes"] = arrays["nodes"].astype(np.int64)
    return arrays, raw


def _with_row(arrays, row) -> int:
    """Append node ``row`` (the meta's node count follows); returns its id."""
    arrays["nodes"] = np.vstack([arrays["nodes"], np.asarray(row, np.int32)[None, :]])
    arrays["meta"][lay.META_TOP] = arrays["nodes"].shape[0]
    return arrays["nodes"].shape[0] - 1


def _freed_after_last(wild_next):
    """A freed row that mirrors a list's last sibling, hung after it; its own
    next sibling wild (``wild_next(nodes, first)``)."""
    def mutate(arrays, raw):
        nodes = arrays["nodes"]
        x = _inner(nodes, lay.NEXT, min_children=1)
        while nodes[x, lay.NEXT] >= 0:
            x = nodes[x, lay.NEXT]
        parent = nodes[x, lay.PARENT]
        row = nodes[x].copy()
        row[lay.COUNT], row[lay.PREV] = lay.FREED, x
        row[lay.NEXT] = wild_next(nodes, nodes[parent, lay.FIRST])
        f = _with_row(arrays, row)
        arrays["nodes"][x, lay.NEXT] = f
        return arrays, raw
    return mutate


def _table_to_freed_copy(arrays, raw):
    """A child table entry names a freed copy of its child, whose links run wild."""
    slot = _used_slot(arrays)
    child = arrays["hvals"][slot]
    row = arrays["nodes"][child].copy()
    row[lay.COUNT] = lay.FREED
    row[lay.FIRST] = row[lay.BEST] = arrays["nodes"].shape[0] + 1000
    arrays["hvals"][slot] = _with_row(arrays, row)
    return arrays, raw


def _wild_freed_row(arrays, raw):
    """A freed row, linked from nowhere, whose fields are out of range."""
    _with_row(arrays, [1 << 30, 5, lay.FREED, 3, 1 << 30, 1 << 30, 1 << 30, 1 << 30, -1, 7])
    return arrays, raw


def _describe(key, value):
    def mutate(arrays, raw):
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
        return arrays, raw
    return mutate


#: name -> mutation(arrays, raw description) -> (arrays, raw description)
MUTATIONS = {
    "root out of range": _set("roots", lambda a: 0, None, lambda a, arr: arr["nodes"].shape[0] + 5),
    "parent out of range": _nodes(lay.PARENT, lambda a, arr: a.shape[0] + 7),
    "first child out of range": _nodes(lay.FIRST, lambda a, arr: a.shape[0] + 7),
    "next sibling out of range": _nodes(lay.NEXT, lambda a, arr: a.shape[0] + 7),
    "most frequent child out of range": _nodes(lay.BEST, lambda a, arr: a.shape[0] + 7),
    "previous sibling out of range": _nodes(lay.PREV, lambda a, arr: -9),
    "negative count": _nodes(lay.COUNT, lambda a, arr: -5),
    "label sequence out of range": _nodes(lay.REF_SEQ, lambda a, arr: arr["seqs"].shape[0] + 3),
    "label position out of range": _nodes(lay.REF_POS, lambda a, arr: 1 << 29),
    "edge longer than the depth": _nodes(lay.LEN, lambda a, arr: DEPTH + 5),
    "sequence offset past the tokens": _set("seqs", lambda a: 0, lay.SEQ_OFF,
                                            lambda a, arr: arr["arena"].shape[0] + 10),
    "sequence still open": _set("seqs", lambda a: 0, lay.SEQ_SLOT, lambda a, arr: 0),
    "child table entry out of range": _table(lambda arr: arr["nodes"].shape[0] + 3),
    "child table entry names another node": _table(lambda arr: 0),
    "child table with no empty slot": _full_table,
    "empty child table": _empty_table,
    "sibling list in a loop": _sibling_cycle,
    "node array reshaped": _reshaped,
    "int64 node array": _wide_nodes,
    "token storage cut short": _short_arena,
    "negative token id": _set("arena", lambda a: 5, None, lambda a, arr: -1),
    "most negative token id": _set("arena", lambda a: 5, None, lambda a, arr: -(1 << 31)),
    "depth of another pool": _set("meta", lambda a: lay.META_DEPTH, None, lambda a, arr: 64),
    "another layout version": _describe("layout", 99),
    "description without its namespaces": _describe("namespaces", None),
    "namespace naming no tree": _describe("namespaces", {"a": 99}),
    "freed row after a last sibling, next wild": _freed_after_last(lambda nodes, first: 1 << 29),
    "freed row after a last sibling, next looping": _freed_after_last(lambda nodes, first: first),
    "child table entry naming a freed copy": _table_to_freed_copy,
    "freed row with wild fields": _wild_freed_row,
    "two namespaces sharing a tree": _describe("namespaces", {"a": 0, "b": 0}),
}

#: Edits of a segment's description alone, its files untouched (``edit_description``).
DESCRIPTION_EDITS = {
    "nodes read with another row width": lambda raw: raw["arrays"]["nodes"][1].__setitem__(
        slice(None), [raw["arrays"]["nodes"][1][0] * 2, lay.NODE_FIELDS // 2]),
    "namespace naming a tree past the roots": lambda raw: raw["namespaces"].__setitem__("a", 7),
    "namespace aliased to another's tree": lambda raw: raw["namespaces"].__setitem__(
        "b", raw["namespaces"]["a"]),
    "namespaces dropped": lambda raw: raw["namespaces"].clear(),
}


def craft(path: Path, mutation) -> None:
    """Break the pool's first segment by ``mutation``; checksums made to match."""
    store = PoolStore(path)
    seg = store.snapshot().segments[0]
    folder = store.snapshot_folders / seg.folder
    arrays = {name: np.fromfile(folder / f"{name}.bin", np.dtype(dtype)).reshape(shape)
              for name, (dtype, shape, _) in seg.arrays.items()}
    raw = seg.to_dict()
    arrays, raw = mutation(arrays, raw)
    for name, a in arrays.items():
        (folder / f"{name}.bin").unlink()
        raw["arrays"][name] = files.save(folder / f"{name}.bin", np.ascontiguousarray(a))

    def put(txn):
        snap = store.db("snap")
        meta = msgpack.unpackb(bytes(txn.get(b"meta", db=snap)))
        meta["segments"] = [raw] + meta["segments"][1:]
        packed = msgpack.packb(meta)
        txn.put(b"meta", packed, db=snap)
        txn.put(b"meta_crc", zlib.crc32(packed).to_bytes(4, "big"), db=snap)
        with txn.cursor(db=snap) as cur:  # no stamp of the intact files stays
            for key in [bytes(k) for k in cur.iternext(values=False)]:
                if key.startswith(b"verified:"):
                    txn.delete(key, db=snap)

    store.write(put)
    store.close()


def edit_description(path: Path, edit) -> None:
    """Edit the first segment's description in place (``edit(raw)``), CRC
    mended, its files and their recorded stamps left as they are."""
    store = PoolStore(path)

    def put(txn):
        snap = store.db("snap")
        meta = msgpack.unpackb(bytes(txn.get(b"meta", db=snap)))
        edit(meta["segments"][0])
        packed = msgpack.packb(meta)
        txn.put(b"meta", packed, db=snap)
        txn.put(b"meta_crc", zlib.crc32(packed).to_bytes(4, "big"), db=snap)

    store.write(put)
    store.close()


# Opens each pool path given, drafts PROMPTS from it and prints one JSON line:
# its drafts (tokens, probabilities rounded, match lengths) and what it logged.
DRAFT = r"""
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
from suffixspec.testing.crafted import DEPTH, PROMPTS
pool = PersistentPool(sys.argv[1], tokenizer=BYTES, max_depth=DEPTH)
prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=8, max_spec_factor=8.0, draft_cost=0.0,
                      pool=pool, namespace="a")
drafts = []
for n, prompt in enumerate(PROMPTS):
    prop.start_request(n, prompt)
    d = prop.propose([n])[0]
    drafts.append([d.token_ids.tolist(), d.match_len])
segments = len(pool.view.segments)
prop.close()
print(json.dumps({"drafts": drafts, "segments": segments}), flush=True)
"""
