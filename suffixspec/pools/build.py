"""Build a pool's snapshot index in bounded memory, in parallel processes.

The index over every stored sequence is built as partitions: partition ``p``
indexes only the suffixes whose first token it owns (tokens are dealt to
partitions by frequency, so their work is about even).  Partitions are built
apart, ``jobs`` at a time in worker processes, each holding the token storage
and its own nodes only, then laid end to end into one index
(``native.partition``) that equals the index built in one piece.  How many
partitions follows from the pool's size, so a worker's nodes stay bounded
whatever the pool holds.

Everything goes to files in one folder (``files``): the token storage first,
streamed from the store, then each partition's arrays, then the combined
index, whose node array is written one partition at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from suffixspec.index import SuffixIndex
from suffixspec.native import layout as lay
from suffixspec.native import partition as part
from suffixspec.pools import files

#: Partitions own first tokens by ``token & (BUCKETS - 1)``: every token of a
#: real vocabulary apart, anchors (``native.tokens``) spread among them.
BUCKETS = 1 << 18

#: Partitions per worker process, at least: taken as workers get free, so
#: partitions that cost more than others even out.
WORKER_PARTITIONS = 4

#: Suffixes (tokens) per partition: a partition's nodes and child table take
#: about 60 bytes per token it indexes, so about 0.5 GB at this size.
PARTITION_TOKENS = 8_000_000


def deal(freq: np.ndarray, parts: int) -> np.ndarray:
    """Token bucket -> partition, the most frequent first onto the lightest partition."""
    owner = np.zeros(freq.shape[0], np.int32)
    load = np.zeros(parts, np.int64)
    for t in np.argsort(-freq, kind="stable"):
        if freq[t] == 0:
            break
        p = int(np.argmin(load))
        owner[t] = p
        load[p] += freq[t]
    return owner


def _bucket_counts(arrays: list[np.ndarray]) -> np.ndarray:
    if not arrays:
        return np.zeros(BUCKETS, np.int64)
    return np.bincount(np.concatenate(arrays) & (BUCKETS - 1), minlength=BUCKETS)


def _write_tokens(sequences, folder: Path, work: Path, progress) -> dict:
    """Stream the stored sequences into ``folder/arena.bin`` and a table of sequences in ``work``.

    Returns the sequence table (lengths, trees), namespace -> tree, token
    frequencies, the highest id and the number of output tokens.
    """
    lengths: list[int] = []
    trees: list[int] = []
    namespaces: dict[str, int] = {}
    freq = np.zeros(BUCKETS, np.int64)
    pending: list[np.ndarray] = []
    pending_tokens = 0
    watermark = tokens = done = 0
    with files.Writer(folder / "arena.bin") as arena:
        for seq in sequences:
            tree = namespaces.setdefault(seq.namespace, len(namespaces))
            watermark = max(watermark, seq.seq_id)
            if not seq.length:
                continue  # nothing to index
            toks = seq.tokens
            arena.write(toks)
            lengths.append(seq.length)
            trees.append(tree)
            pending.append(toks)
            pending_tokens += toks.shape[0]
            if pending_tokens >= 1 << 20:
                freq += _bucket_counts(pending)
                pending, pending_tokens = [], 0
            tokens += seq.length - seq.anchors
            done += seq.length - seq.anchors
            if progress is not None and len(lengths) % 1000 == 0:
                progress(done)
                done = 0
        arena_checksum = arena.checksum
    freq += _bucket_counts(pending)
    if progress is not None:
        progress(done)
    lengths_a = np.asarray(lengths, np.int64)
    np.savez(work / "table.npz", lengths=lengths_a, trees=np.asarray(trees, np.int32),
             n_trees=len(namespaces))
    return {"namespaces": namespaces, "freq": freq, "watermark": watermark, "tokens": tokens,
            "stored": int(lengths_a.sum()), "arena_checksum": arena_checksum,
            "distinct": int((freq > 0).sum())}


def build_partitions(folder: str, max_depth: int, parts: list[int]) -> dict[int, dict]:
    """Build those of ``parts`` that no other process took; returns their sizes.

    A partition is taken by creating ``build/taken-<p>``, so workers given
    the same list share it out as they go (a worker that got lighter
    partitions takes more).  Partition -1 is the only one: every suffix.
    Writes each partition's arrays as ``build/part-<p>-<name>.npy``.
    """
    folder = Path(folder)
    work = folder / "build"
    table = np.load(work / "table.npz")
    owner = np.load(work / "owner.npy")
    arena = np.fromfile(folder / "arena.bin", np.int32)
    sizes = {}
    for p in parts:
        try:
            os.close(os.open(work / f"taken-{p}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        keep = np.zeros(0, np.bool_) if p < 0 else owner == p
        sizes[p] = _build_one(work, max_depth, max(p, 0), table, keep, arena)
    return sizes


def _build_one(work: Path, max_depth: int, p: int, table, keep: np.ndarray,
               arena: np.ndarray) -> dict:
    """Index the suffixes ``keep`` selects over the token file ``arena``."""
    lengths, trees = table["lengths"], table["trees"]
    n = lengths.shape[0]
    # Sequences are placed in order, exactly over their tokens, which
    # indexing writes again unchanged: every partition shares ``arena``.
    ix = SuffixIndex.over_tokens(max_depth, arena, n, int(table["n_trees"]))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    roots = ix.roots[trees].astype(np.int64)
    i = 0
    while i < n:
        i = part.index_run(tuple(ix.arrays()), np.int64(i), offsets, roots, keep)
        if i < n:
            ix.grow_for(int(i))  # nodes or child table ran short
    arrays = ix.to_arrays()
    # Every partition has the same token storage and sequences: only the
    # first one's sequences are kept, and the token file is written already.
    for name in ("meta", "nodes", "hkeys", "hvals", "roots") + (("seqs",) if p == 0 else ()):
        np.save(work / f"part-{p}-{name}.npy", arrays[name])
    return {"nodes": int(arrays["nodes"].shape[0]), "fill": int(ix.meta[lay.META_HASH_FILL])}


def _partition(work: Path, p: int, name: str, writable: bool = False) -> np.ndarray:
    """One array of a built partition: memory-mapped, or read whole when ``writable``."""
    path = work / f"part-{p}-{name}.npy"
    return np.load(path) if writable else np.load(path, mmap_mode="r").view(np.ndarray)


def build(sequences: Iterable, max_depth: int, folder: Path, jobs: int = 1,
          progress: Callable[[int], None] | None = None,
          partition_tokens: int = PARTITION_TOKENS, hold_fds: tuple[int, ...] = ()) -> dict:
    """Index ``sequences`` into snapshot files in the new folder ``folder``.

    ``jobs`` partitions are built at a time, in worker processes when more
    than one (at most one per half partition of tokens).  Returns the
    snapshot's description: ``watermark``, ``tokens``, ``namespaces`` (name
    -> tree) and ``arrays`` (``files.describe``).  ``progress(tokens)``
    follows the reading of the store.  Worker processes inherit
    ``hold_fds`` (a lock the caller holds).
    """
    folder = Path(folder)
    folder.mkdir(mode=0o700)
    work = folder / "build"
    work.mkdir()
    info = _write_tokens(sequences, folder, work, progress)
    # As few partitions as bound a worker's memory; with workers, enough
    # that they end together.
    parts = -(-info["stored"] // partition_tokens) if info["stored"] else 1
    if jobs > 1:
        parts = max(parts, WORKER_PARTITIONS * jobs)
    # A worker process for every half partition of tokens at most: each costs
    # an interpreter (about 0.2 GB) and a second to start, more than it saves
    # on a small pool (1M tokens: 1.0 s in this process, 1.5 s with two).  The
    # partitions stay as ``jobs`` asks: the same index whoever builds them.
    workers = max(1, min(jobs, -(-info["stored"] // max(partition_tokens // 2, 1))))
    owner = deal(info["freq"], parts) if parts > 1 else np.zeros(0, np.int32)
    np.save(work / "owner.npy", owner)
    todo = list(range(parts)) if parts > 1 else [-1]
    if workers > 1 and len(todo) > 1:
        found = _in_workers(folder, max_depth, todo, workers, hold_fds)
    else:
        found = build_partitions(str(folder), max_depth, todo)
    sizes = [found[p] for p in todo]
    described = combine(work, folder, len(todo), sizes, info)
    shutil.rmtree(work)
    return {"watermark": info["watermark"], "tokens": info["tokens"],
            "namespaces": info["namespaces"], "arrays": described, "partitions": len(todo)}


def combine(work: Path, folder: Path, parts: int, sizes: list[dict], info: dict) -> dict:
    """Lay the partitions in ``work`` end to end into one index's files in ``folder``."""
    meta = _partition(work, 0, "meta", writable=True)
    seqs = _partition(work, 0, "seqs", writable=True)
    roots0 = _partition(work, 0, "roots", writable=True)
    arena_items = int(meta[lay.META_ARENA_TOP])
    offsets = np.cumsum([0] + [s["nodes"] for s in sizes])
    # Each root may gain a table entry per distinct first token.
    entries = sum(s["fill"] for s in sizes) + info["distinct"] * len(roots0)
    slots = 1 << max(6, int(np.ceil(np.log2(2 * entries + 2))))
    hkeys = np.full(slots, lay.EMPTY, np.int64)
    hvals = np.full(slots, -1, np.int32)
    fill = 0
    free_head = -1
    free_count = 0
    firsts = np.full((len(roots0), parts), -1, np.int64)
    with files.Writer(folder / "nodes.bin") as out:
        for p in range(parts):
            nodes = _partition(work, p, "nodes", writable=True)
            roots = _partition(work, p, "roots", writable=True)
            root_of = np.full(nodes.shape[0], -1, np.int64)
            root_of[roots[roots >= 0]] = roots0[roots >= 0]
            for t, r in enumerate(roots):
                if r >= 0:
                    c = nodes[r, lay.FIRST]
                    firsts[t, p] = c + offsets[p] if c >= 0 else -1
            free_count += int((nodes[:, lay.COUNT] == lay.FREED).sum()) + (
                int((roots >= 0).sum()) if p > 0 else 0)
            free_head = part.relabel(nodes, np.int64(offsets[p]), root_of, np.int64(free_head))
            fill += part.copy_entries(_partition(work, p, "hkeys"), _partition(work, p, "hvals"),
                                      root_of >= 0, np.int64(offsets[p]), hkeys, hvals)
            out.write(nodes)
            del nodes
            for name in ("nodes", "hkeys", "hvals"):
                (work / f"part-{p}-{name}.npy").unlink()
    # The roots' children: a few rows spread over the file, fixed in place.
    if offsets[-1] > 0:
        mapped = np.memmap(folder / "nodes.bin", np.int32, "r+",
                           shape=(int(offsets[-1]), lay.NODE_FIELDS))
        all_nodes = mapped.view(np.ndarray)
        for t, r in enumerate(roots0):
            if r >= 0:
                fill += part.join_roots(all_nodes, np.int64(r), firsts[t], hkeys, hvals)
        mapped.flush()
        del all_nodes, mapped
    meta[lay.META_TOP] = offsets[-1]
    meta[lay.META_FREE_HEAD] = free_head
    meta[lay.META_FREE_COUNT] = free_count
    meta[lay.META_HASH_FILL] = fill
    arrays = {"meta": meta, "hkeys": hkeys, "hvals": hvals, "seqs": seqs, "roots": roots0}
    described = {name: files.save(folder / f"{name}.bin", a) for name, a in arrays.items()}
    described["nodes"] = files.describe(folder / "nodes.bin", np.int32,
                                        (int(offsets[-1]), lay.NODE_FIELDS))
    if arena_items * 4 != os.stat(folder / "arena.bin").st_size:
        raise RuntimeError("the token storage differs from what the partitions indexed")
    described["arena"] = ["<i4", [arena_items], info["arena_checksum"]]
    return described


_WORKER = "from suffixspec.pools.build import worker_main; worker_main()"


def _in_workers(folder: Path, max_depth: int, todo: list[int], jobs: int,
                hold_fds: tuple[int, ...]) -> dict[int, dict]:
    """Build the partitions ``todo`` in ``jobs`` worker processes (``build_partitions``).

    Workers are fresh interpreters (``python -c``), so nothing of this
    process (open pool files, threads, the caller's ``__main__``) goes with
    them.  A worker that fails fails the build, and the others are stopped.
    """
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(folder), str(max_depth),
                               *map(str, todo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              pass_fds=hold_fds)
             for _ in range(jobs)]
    sizes: dict[int, dict] = {}
    try:
        for proc in procs:
            out, err = proc.communicate()
            if proc.returncode != 0:
                last = err.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
                raise RuntimeError(f"a snapshot build worker failed: {last[0]}")
            sizes.update((int(p), v) for p, v in json.loads(out).items())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sizes


def worker_main() -> None:
    """A worker process: build partitions named in its arguments, print their sizes as JSON."""
    folder, max_depth = sys.argv[1], int(sys.argv[2])
    print(json.dumps(build_partitions(folder, max_depth, [int(p) for p in sys.argv[3:]])))
