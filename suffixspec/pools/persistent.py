"""``PersistentPool``: a cross-request pool kept in LMDB.

It drafts from its snapshot *segments* and the *delta* at once, their counts
added up (``native.union``).  A segment is an index over the sequences of one
id range, kept as files beside the pool and memory-mapped read-only, so
opening a large pool costs no re-indexing (``segments``).  The delta is an
in-memory index over what no segment covers: this process's requests (in
flight and finished), what other processes committed since, picked up by
``refresh()``, and a range whose segment is being rebuilt after a
``forget``.

Sequences are committed to the store when a request finishes.  Snapshots are
written by ``write_snapshot()`` (the ``ingest``, ``snapshot``, ``prune`` and
``forget`` commands call it, and a pool may call it itself every
``snapshot_every`` committed tokens); that is also when ``max_tokens`` and
``ttl`` are enforced, so between snapshots a pool may hold more.  Readers see
others' commits within ``refresh_interval`` seconds, or at once on
``refresh(force=True)``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from suffixspec.anchors import anchor_count
from suffixspec.config import DEFAULT_NAMESPACE
from suffixspec.fingerprint import TokenizerId
from suffixspec.index import SuffixIndex
from suffixspec.locking import locked
from suffixspec.native import layout as lay
from suffixspec.pools import files, segments
from suffixspec.pools.memory import CrossPool
from suffixspec.pools.segments import write_snapshot
from suffixspec.pools.store import CorruptPoolError, PoolStore, StoredSequence


WATCH_INTERVAL = 0.2  # seconds between the watcher's looks at the gate
logger = logging.getLogger(__name__)


def _let_go_when_asked(ref, stop: threading.Event) -> None:
    """Close the pool's file whenever a compaction asks, until ``stop``."""
    while not stop.wait(WATCH_INTERVAL):
        pool = ref()
        if pool is None or pool._watch_pid != os.getpid():
            return
        with pool._lock:  # never during a proposer call or a pool operation
            if not stop.is_set():
                pool.store.yield_to_compaction()  # the next operation reopens
        del pool


class PersistentPool(CrossPool):
    """A cross-request pool in an LMDB file; see the module docstring.

    ``path`` names the pool file; creating one needs ``tokenizer`` and
    ``max_depth``, and opening one with another tokenizer is refused.
    """

    def __init__(self, path: str | Path | PoolStore, tokenizer: TokenizerId | None = None,
                 max_depth: int | None = None, max_tokens: int | None = None,
                 ttl: float | None = None, refresh_interval: float = 1.0,
                 snapshot_every: int | None = None, durable: bool = True,
                 catch_up_tokens: int = 1 << 17, snapshot_jobs: int = 1):
        self.store = path if isinstance(path, PoolStore) else PoolStore(
            path, tokenizer, max_depth, durable=durable)
        super().__init__(self.store.max_depth, max_tokens=None)
        self.budget = max_tokens
        self.ttl = ttl
        self.refresh_interval = refresh_interval
        self.snapshot_every = snapshot_every
        self.snapshot_jobs = snapshot_jobs
        self.segments: tuple[SuffixIndex, ...] = ()  # drafted, oldest first
        self._segment_trees: list[dict[str, int]] = []
        self._covered: list[tuple[int, int]] = []  # id ranges the segments cover
        self._mapped: dict[str, SuffixIndex] = {}  # folder -> its segment, mapped and checked
        self._txn = None
        self._snapshot_generation = 0
        self._inode = None
        self._seen = 0            # highest store id indexed (base or delta)
        self._own: set[int] = set()  # ids this process committed and indexed already
        self._open: dict[int, str] = {}  # open delta sequence -> namespace
        self._since_snapshot = 0
        self._last_refresh = 0.0
        self._stale = False
        self.wanted: set[str] | None = None  # namespaces to index (None: all)
        self.catch_up_tokens = catch_up_tokens
        self.behind = False  # other processes' commits are still being indexed
        self.compacted = True  # False while a forget's compaction is pending
        self.store.remap_listeners.append(self._drop_snapshot_view)
        self._snapshot_warned = None  # generation of the unusable snapshot last logged
        self._watch_stop = threading.Event()
        self._watch_pid = None
        self._load()
        if not self.store.readonly:
            self.store.remove_leftovers()
            self._remove_stale_snapshots()
            if self.store.compaction_pending():
                self._finish_forget(timeout=0.0)  # a forget was cut short: finish it
        self._watch()

    # ----------------------------------------------------------- cross pool
    @property
    def tokens(self) -> int:
        return (sum(int(seg.meta[lay.META_LIVE_TOKENS]) for seg in self.segments)
                + self.delta.live_tokens)

    def roots(self, namespaces) -> list[list[int]]:
        rows = super().roots(namespaces)
        for row, ns in zip(rows, namespaces):
            for k, (seg, trees) in enumerate(zip(self.segments, self._segment_trees)):
                if ns in trees:
                    row[1 + k] = int(seg.roots[trees[ns]])
        return rows

    @locked
    def want(self, namespaces) -> None:
        """Index only these namespaces (and any asked for later) of what others commit.

        Until the first call every namespace is indexed.  A namespace asked
        for later is picked up at the next ``refresh``.
        """
        new = set(namespaces) if self.wanted is None else set(namespaces) - self.wanted
        if new:
            self.wanted = new | (self.wanted or set())
            self._stale = True

    @locked
    def begin(self, namespace: str = DEFAULT_NAMESPACE, anchors: np.ndarray | None = None) -> int:
        seq = super().begin(namespace, anchors)
        self._open[seq] = namespace
        return seq

    @locked
    def commit(self, seq: int, request_id: str = "") -> None:
        """Store the finished sequence (one transaction) and keep it indexed."""
        namespace = self._open.pop(seq)
        tokens = self.delta.sequence(seq)
        self.delta.close(seq)
        if tokens.shape[0] == anchor_count(tokens):
            return  # no output
        store_id = self.store.add(tokens, namespace, source="engine", request_id=str(request_id))
        self._own.add(store_id)
        self._committed[seq] = None
        self._evict()
        if self._stale:
            self._load()  # the map grew: map the snapshot again
        self._since_snapshot += tokens.shape[0]
        if self.snapshot_every is not None and self._since_snapshot >= self.snapshot_every:
            self.write_snapshot()

    @locked
    def discard(self, seq: int) -> None:
        self._open.pop(seq, None)
        self.delta.remove(seq)

    @locked
    def add(self, tokens: np.ndarray, namespace: str = DEFAULT_NAMESPACE,
            anchors: np.ndarray | None = None) -> int:
        seq = self.begin(namespace, anchors)
        self.delta.extend(seq, tokens)
        self.commit(seq)
        return seq

    # -------------------------------------------------------------- refresh
    @locked
    def refresh(self, force: bool = False) -> None:
        """Pick up what other processes committed, or a newer snapshot."""
        self._watch()
        now = time.monotonic()
        if self.store.yield_to_compaction() or self._stale:
            self._load()  # waits for the compaction, then maps the new file
            return
        if not force and not self.behind and now - self._last_refresh < self.refresh_interval:
            return
        self._last_refresh = now
        if self._file_replaced():
            self.store.close()
            self._load()
            return
        info = self.store.snapshot_info()
        if (info["generation"] if info else 0) != self._snapshot_generation:
            self._load()
            return
        self._catch_up(self.catch_up_tokens)
        self._own = {i for i in self._own if i > self._seen}

    def _catch_up(self, budget: int | None) -> None:
        """Index what others committed in the namespaces wanted.

        Stops after about ``budget`` tokens (None: all); ``behind`` says the
        next refresh goes on at once, so no single call does unbounded work.
        """
        self.behind = False
        spent = 0
        for seq in self.store.sequences(after=self._seen):
            if seq.seq_id not in self._own and (self.wanted is None
                                                or seq.namespace in self.wanted):
                self._index_stored(seq)
            self._seen = max(self._seen, seq.seq_id)
            spent += seq.length + 64  # reading a record costs too, indexed or not
            if budget is not None and spent >= budget:
                self.behind = True
                break
        self._evict()

    def _evict(self) -> None:
        """Keep the indexed tokens within the budget by dropping the oldest from memory.

        The store keeps them until the next snapshot applies the budget there.
        """
        while self._committed and self.budget is not None and self.tokens > self.budget:
            seq, _ = self._committed.popitem(last=False)
            self.delta.remove(seq)
        self._maybe_rebuild()

    # ------------------------------------------------------------ snapshots
    @locked
    def write_snapshot(self, progress=None, jobs: int | None = None) -> int:
        """Enforce ``max_tokens`` and ``ttl``, bring the segments up to date, reload.

        Returns the snapshot generation.  ``progress(tokens)`` follows the
        reading of the store; ``jobs`` (default ``snapshot_jobs``) processes
        build each segment (``segments.write_snapshot``).
        """
        self.prune(max_tokens=self.budget, older_than=self.ttl, snapshot=False)
        generation = write_snapshot(self.store, self.snapshot_jobs if jobs is None else jobs,
                                    progress)
        self._load()
        return generation

    def _remove_stale_snapshots(self) -> None:
        """Remove snapshot folders the pool no longer names, unless a snapshot is being written."""
        root = self.store.snapshot_folders
        if not root.is_dir():
            return
        with files.folder_lock(root, wait=False) as lock:
            if lock is not None:
                segments.remove_unnamed(self.store)

    @locked
    def prune(self, max_tokens: int | None = None, older_than: float | None = None,
              namespace: str | None = None, snapshot: bool = True) -> int:
        """Delete sequences older than ``older_than`` seconds and the oldest
        beyond ``max_tokens`` (within ``namespace`` if given); returns how many."""
        now = time.time()
        metas = list(self.store.sequences(namespace=namespace, with_tokens=False))
        doomed = {m.seq_id for m in metas if older_than is not None and now - m.added > older_than}
        if max_tokens is not None:
            total = sum(m.length for m in metas if m.seq_id not in doomed)
            for m in metas:  # oldest first
                if total <= max_tokens:
                    break
                if m.seq_id not in doomed:
                    doomed.add(m.seq_id)
                    total -= m.length
        deleted = self.store.delete(doomed)
        if deleted and snapshot:
            self.write_snapshot()
        return deleted

    @locked
    def forget(self, request_id: str | None = None, namespace: str | None = None,
               timeout: float = 10.0) -> int:
        """Delete a request's or a namespace's sequences for real.

        One transaction deletes them and drops the snapshot segments that
        hold them, so from then on no process drafts them, even if this one
        is killed.  Those segments are rebuilt (``segments``) and the file
        compacted, so their tokens are gone from disk;
        other processes let go of the file at their next pool operation.  If
        one holds on past ``timeout`` seconds, ``compacted`` is False and the
        compaction stays pending: the next forget, ``snapshot`` or open that
        can, finishes it.  Returns how many sequences were deleted.
        """
        if (request_id is None) == (namespace is None):
            raise ValueError("forget needs exactly one of request_id and namespace")
        doomed = [m.seq_id for m in self.store.sequences(namespace=namespace, with_tokens=False)
                  if request_id is None or m.request_id == str(request_id)]
        deleted = self.store.delete(doomed, forget=True)
        self._finish_forget(timeout)
        return deleted

    def _finish_forget(self, timeout: float) -> None:
        """Rebuild the dropped segments and compact the file; sets ``compacted``."""
        self.write_snapshot()
        self._close_snapshot()
        self.compacted = self.store.compact(timeout)
        self._load()

    def save_calibration(self, table: np.ndarray) -> None:
        """Keep the proposer's calibration table, for the next process to open the pool."""
        with self._lock:
            self.store.save_table("calibration", table)

    def load_calibration(self) -> np.ndarray | None:
        """The calibration table last kept here, as it was kept (None: none)."""
        with self._lock:
            return self.store.load_table("calibration")

    def close(self) -> None:
        self._watch_stop.set()
        with self._lock:
            self._close_snapshot()
            self.store.close()

    def __enter__(self) -> PersistentPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- internal
    def _watch(self) -> None:
        """Run the watcher thread in this process (once; again after a fork).

        A process that holds the pool open but is idle (a server without
        requests) makes no pool operation, so it would never let go of the
        file for another process's compaction.  The watcher lets go for it.
        """
        if self._watch_pid == os.getpid() or self._watch_stop.is_set():
            return
        self._watch_pid = os.getpid()
        threading.Thread(target=_let_go_when_asked, args=(weakref.ref(self), self._watch_stop),
                         name="suffixspec-pool-watcher", daemon=True).start()

    def _load(self) -> None:
        """Map the current snapshot segments and index what they do not cover into a new delta.

        Open (in-flight) sequences keep their ids and tokens.
        """
        self._map_segments()
        self._inode = os.stat(self.store.path).st_ino
        old, self.delta, self.trees = self.delta, SuffixIndex(
            self.max_depth, node_capacity=1 << 14, token_capacity=1 << 16), {}
        for seq, namespace in sorted(self._open.items()):
            self.delta.add_sequence(self.tree(namespace), max(old.seq_len(seq), 1), seq=seq)
            self.delta.extend(seq, old.sequence(seq))
        self._committed.clear()
        self._own = set()  # the new delta holds none of them: index them from the store
        self._seen = 0
        for first, last in self._covered:
            self._index_range(self._seen, first)
            self._seen = max(self._seen, last)
        self._catch_up(None)
        self._since_snapshot = 0
        self._last_refresh = time.monotonic()
        self._stale = False
        self.generation += 1

    def _map_segments(self) -> None:
        """Map the snapshot's segments; those mapped already stay as they are.

        A segment whose files are damaged or missing is logged once and not
        drafted from: its stored sequences are indexed instead, so nothing is
        lost (``suffixspec snapshot`` writes it anew).  So are the smallest
        segments beyond ``layout.SEGMENTS`` (a pool cut off between adding
        segments and merging them).
        """
        if self._txn is not None:
            self._close_snapshot()  # arrays inside the pool file: map them again
        for attempt in range(3):
            txn = self.store.read(buffers=True)
            try:
                info = self.store.snapshot_info(txn)
                found, problems = self._open_segments(txn, info)
            except FileNotFoundError:
                txn.abort()  # a newer snapshot replaced a segment just now: read again
                continue
            except BaseException:
                txn.abort()
                raise
            break
        else:
            info, found, problems = None, [], ["its folders keep being replaced"]
            txn = None
        if any("folder" not in seg for seg, _ in found):
            self._txn = txn  # arrays in the pool file: valid while it is open
        elif txn is not None:
            txn.abort()  # files stay mapped without it
        generation = info["generation"] if info else 0
        if problems and self._snapshot_warned != generation:
            self._snapshot_warned = generation
            logger.warning("suffixspec: %d snapshot segment(s) of %s are not used (%s); drafting "
                           "from their stored sequences until `suffixspec snapshot` writes them "
                           "anew", len(problems), self.store.path, "; ".join(problems))
        if len(found) > lay.SEGMENTS:
            largest = sorted(found, key=lambda f: -int(f[0].get("tokens", 0)))[:lay.SEGMENTS]
            found = [f for f in found if any(f is g for g in largest)]
        self.segments = tuple(ix for _, ix in found)
        self._segment_trees = [dict(seg["namespaces"]) for seg, _ in found]
        self._covered = [(int(seg["first"]), int(seg["last"])) for seg, _ in found]
        self._mapped = {seg["folder"]: ix for seg, ix in found if "folder" in seg}
        self._snapshot_generation = generation

    def _open_segments(self, txn, info) -> tuple[list, list[str]]:
        """``(segment, index)`` of every usable segment of ``info``, and what was wrong with the others."""
        found, problems = [], []
        for seg in info["segments"] if info else []:
            ix = self._mapped.get(seg.get("folder"))
            if ix is None:
                try:
                    ix = SuffixIndex.from_arrays(self.store.snapshot_arrays(txn, seg),
                                                 self.max_depth)
                except CorruptPoolError as e:
                    if "folder" not in seg:
                        raise  # the pool file itself is damaged
                    problems.append(str(e))
                    continue
            found.append((seg, ix))
        return found, problems

    def _index_range(self, after: int, upto: int) -> None:
        """Index the stored sequences with ids in ``(after, upto]`` in the namespaces wanted."""
        for seq in self.store.sequences(after=after):
            if seq.seq_id > upto:
                break
            if self.wanted is None or seq.namespace in self.wanted:
                self._index_stored(seq)

    def _index_stored(self, seq: StoredSequence) -> None:
        s = self.delta.add_sequence(self.tree(seq.namespace), capacity=max(seq.length, 1))
        self.delta.extend(s, seq.tokens)
        self.delta.close(s)
        self._committed[s] = None

    def _drop_snapshot_view(self) -> None:
        """The store is about to re-map the file: let go of views into it.

        Snapshot files are mapped apart from the pool file and stay.
        """
        if self._txn is not None:
            self._close_snapshot()
            self._stale = True

    def _close_snapshot(self) -> None:
        self.segments, self._segment_trees, self._covered, self._mapped = (), [], [], {}
        if self._txn is not None:
            self._txn.abort()
            self._txn = None

    def _file_replaced(self) -> bool:
        try:
            return os.stat(self.store.path).st_ino != self._inode
        except FileNotFoundError:
            return False
