"""``PersistentPool``: a cross-request pool kept in LMDB, shared by every process on a host.

It drafts from its snapshot *segments* (``view``, memory-mapped, read-only)
and the *delta* (an in-memory ``Delta``) at once, their counts added up
(``native.union``).  The delta holds what no segment covers: this process's
requests (in flight and finished), what other processes committed since,
picked up by ``refresh``, and ranges whose segment is being rebuilt.

Serving calls (``refresh``, ``begin``, ``extend``, ``commit``, ``discard``)
return in bounded time whatever maintenance runs beside them:

* commits go to the pool file from a writer thread (``writer``), so a commit
  never waits for the file (a compaction holds it while it rewrites it);
* ``refresh`` picks up others' commits ``catch_up_tokens`` at a time, and
  only when it can read the file without waiting;
* when the snapshot changes (a merge, a ``forget``, an ``add-segment``), or
  a namespace is asked for, a loader thread (``loader``) maps and checks the new segments
  and indexes what they leave uncovered into a new delta, which the next
  ``refresh`` swaps in; segments a ``forget`` dropped, and sequences it
  deleted, stop being drafted at once;
* with ``snapshot_every``, the snapshot is written by a child process.

``write_snapshot``, ``prune`` and ``forget`` (the CLI's maintenance) run in
the calling thread.  Readers see others' commits within
``refresh_interval`` seconds, or at once on ``refresh(force=True)``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from suffixspec.anchors import anchor_count
from suffixspec.config import DEFAULT_NAMESPACE, REFRESH_INTERVAL, check_namespace, check_range
from suffixspec.fingerprint import TokenizerId
from suffixspec.pools import files, segments
from suffixspec.pools.memory import Delta
from suffixspec.pools.store import FileBusy, PoolError, PoolStore
from suffixspec.pools.background import in_background
from suffixspec.native import layout as lay
from suffixspec.pools.loader import FULL, OPEN_ROOM_TOKENS, Loader, Prepared
from suffixspec.pools.writer import Writer
from suffixspec.pools.view import PoolView

logger = logging.getLogger(__name__)

#: Tokens of others' commits one ``refresh`` indexes at most (about 5 ms here).
CATCH_UP_TOKENS = 1 << 11
#: Another process's commit longer than this is indexed by the loader thread, not a
#: serving call (see ``PersistentPool._catch_up``).
LONG = 1 << 14
#: Deleted tokens a serving call takes out of the delta itself; past this the
#: delta starts afresh and the loader indexes again (``_drop_deleted``).
DROP_TOKENS = 1 << 15



class PersistentPool:
    """A cross-request pool in an LMDB file; see the module docstring.

    ``path`` names the pool file (or is a ``PoolStore``); creating one needs
    ``tokenizer`` and ``max_depth``, and opening one with another tokenizer
    is refused.  Pools of one file in one process share its ``PoolStore`` and
    lock, and each has its own delta and view, as separate processes would.
    ``max_tokens`` and ``ttl`` bound the pool at each snapshot (``max_tokens``
    bounds the tokens indexed in memory too).
    """

    def __init__(self, path: str | Path | PoolStore, tokenizer: TokenizerId | None = None,
                 max_depth: int | None = None, max_tokens: int | None = None,
                 ttl: float | None = None, refresh_interval: float = REFRESH_INTERVAL,
                 snapshot_every: int | None = None, durable: bool = True,
                 catch_up_tokens: int = CATCH_UP_TOKENS, snapshot_jobs: int = 1):
        check_range("max_tokens", max_tokens, allow_none=True)
        check_range("ttl", ttl, allow_none=True)
        check_range("refresh_interval", refresh_interval, high=1e9)
        check_range("snapshot_every", snapshot_every, allow_none=True)
        check_range("catch_up_tokens", catch_up_tokens, low=1)
        check_range("snapshot_jobs", snapshot_jobs, low=1, high=64)
        self._shared = not isinstance(path, PoolStore)
        self.store = PoolStore.shared(path, tokenizer, max_depth, durable) if self._shared \
            else path
        self.max_depth = self.store.max_depth
        self.max_tokens = max_tokens
        self.ttl = ttl
        self.refresh_interval = refresh_interval
        self.snapshot_every = snapshot_every
        self.snapshot_jobs = snapshot_jobs
        self.catch_up_tokens = catch_up_tokens
        self._lock = self.store.lock  # shared with the proposers drafting from it
        self.delta = Delta(self.max_depth)
        self.view = PoolView()
        self.wanted: set[str] | None = None  # namespaces to index (None: all)
        self.behind = False  # others' commits are still being indexed
        self.compacted = True  # False while a forget's compaction is pending
        self._open: dict[int, tuple[int, str]] = {}  # open output: handle -> (sequence, namespace)
        self._handles = 0
        self._ids: dict[int, int] = {}  # committed delta sequence -> store id
        self._seen = 0  # stored ids up to this are indexed (delta or view)
        self._long_pending = False  # a long commit is being indexed by the loader
        self._own: set[int] = set()  # ids this process committed and indexed already
        self._deletes = 0
        #: ``forget`` deletions seen: the proposer drops what it keeps in memory
        #: beside the pool (finished trees, family outputs) when this grows.
        self.forgets = self.store.forgets()
        self._inode = None
        self._last_refresh = 0.0
        self._since_snapshot = 0
        self._loader = Loader(self)
        self._prepared: Prepared | None = None  # what the loader made, to swap in
        self._warned: set[str] = set()
        self._snapshotter: subprocess.Popen | None = None
        self._writer = Writer(self)
        self._closed = False
        # Prepared without holding the lock (it takes it for short reads), so that
        # a compaction asked meanwhile is let through, not waited on for ever.
        prepared = self._loader.prepare(OPEN_ROOM_TOKENS)
        with self._lock:
            self._swap(prepared)
        self.store.watch()
        self._writer.start()

    def recover(self, timeout: float = 10.0) -> bool:
        """Finish what an interrupted command left: leftover files, snapshot
        folders no longer named, a forget's compaction (waiting up to
        ``timeout`` seconds for servers to let go of the file, as ``forget``
        does).  The offline commands call it (``suffixspec snapshot``,
        ``prune``, ``forget``); a server never does, so opening a pool to
        serve does no maintenance (what a cut-short forget deleted is never
        drafted either way).  Returns whether everything was finished."""
        if self.store.readonly:
            return True
        with self._lock:
            self.store.remove_leftovers()
            self._remove_stale_snapshots()
        if not self.store.compaction_pending():
            return True
        try:  # a forget was cut short: finish it
            self._finish_forget(timeout)
        except PoolError as e:  # what it deleted is not drafted: serve on
            self._warn("forget", f"suffixspec: a forget on {self.store.path} is not finished "
                                 f"({e}); the next `suffixspec snapshot` that can, finishes it")
            return False
        return self.compacted

    # ----------------------------------------------------------- cross pool
    @property
    def tokens(self) -> int:
        return self.view.tokens + self.delta.tokens

    def want(self, namespaces) -> None:
        """Index only these namespaces (and any asked for later) of what is not in the view.

        Until the first call every namespace is indexed.  One asked for later
        is indexed in the background (its new commits at once).
        """
        with self._lock:
            new = set(namespaces) if self.wanted is None else set(namespaces) - self.wanted
            if new:
                first = self.wanted is None  # everything is indexed until then
                self.wanted = new | (self.wanted or set())
                if not first:
                    self._loader.start()

    def begin(self, namespace: str = DEFAULT_NAMESPACE, anchors: np.ndarray | None = None) -> int:
        """Open a sequence for an output, after its ``anchors``; returns its handle.

        The handle stays valid when the pool reloads its delta; ``seq_of``
        gives the sequence the output has in the delta now.
        """
        with self._lock:
            seq = self.delta.begin(check_namespace(namespace), anchors)
            self._handles += 1
            self._open[self._handles] = (seq, namespace)
            return self._handles

    def seq_of(self, handle: int) -> int:
        """The delta sequence of an open output."""
        return self._open[handle][0]

    def extend(self, handle: int, tokens: np.ndarray) -> None:
        with self._lock:
            self.delta.extend(self._open[handle][0], tokens)

    def commit(self, handle: int, request_id: str = "") -> None:
        """Keep the finished output: drafted from at once, stored by the writer thread."""
        with self._lock:
            seq, namespace = self._open.pop(handle)
            tokens = self.delta.index.sequence(seq)
            self.delta.close(seq)
            if tokens.shape[0] == anchor_count(tokens):
                self.delta.remove(seq)
                return  # no output
            self._writer.put_commit(tokens, namespace, str(request_id), self.delta, seq)
            self._evict()
            self._since_snapshot += tokens.shape[0]
            if self.snapshot_every is not None and self._since_snapshot >= self.snapshot_every:
                self._snapshot_in_child()

    def discard(self, handle: int) -> None:
        with self._lock:
            seq, _ = self._open.pop(handle)
            self.delta.remove(seq)

    def add(self, tokens: np.ndarray, namespace: str = DEFAULT_NAMESPACE,
            anchors: np.ndarray | None = None) -> int:
        """Commit a finished output (after its ``anchors``) in one call."""
        handle = self.begin(namespace, anchors)
        self.extend(handle, tokens)
        self.commit(handle)
        return handle

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every commit so far is in the pool file; False on ``timeout``.
        Raises the writer's error, if it met one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._writer.error is not None:
                    raise self._writer.error
                if not self._writer.pending:
                    return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    # -------------------------------------------------------------- refresh
    def refresh(self, force: bool = False) -> None:
        """Pick up a reloaded delta and view, others' commits, a new snapshot.

        Bounded: nothing here waits for the file or indexes more than
        ``catch_up_tokens``; what takes longer runs in the loader thread.
        ``force`` (tools and tests, not serving): everything at once, a new
        snapshot included, however long it takes.
        """
        if force:
            self.flush()
            with self._lock:
                if self._file_replaced():
                    self.store._let_go()
                snap = self.store.snapshot()
                if (snap.generation if snap else 0) != self.view.generation:
                    self.reload()
                self._drop_deleted(self.store.deletes(), bounded=False)
                self.forgets = self.store.forgets()
                self._catch_up(None)
            return
        with self._lock:
            if self._prepared is not None:
                self._swap(self._prepared)
            now = time.monotonic()
            if not force and not self.behind and now - self._last_refresh < self.refresh_interval:
                return
            if not self.store.can_open_now():  # a compaction holds the file
                return
            self._last_refresh = now
            try:
                with self.store.no_wait():
                    self._refresh_from_file()
            except FileBusy:  # a compaction began just now: next time
                self.behind = True
            except (PoolError, OSError) as e:  # drafting goes on from what is in memory
                self._warn("refresh", f"suffixspec: {self.store.path} cannot be read ({e}); "
                                      f"drafting from what was loaded")

    def _refresh_from_file(self) -> None:
        if self._file_replaced():
            # A compaction or a copy replaced it: open the new one (unless a write
            # of the writer thread holds it: next time).
            if not self.store._let_go(wait=False):
                return
            self._loader.start()
        with self.store.read() as txn:
            snap = self.store.snapshot(txn)
            deletes = self.store.deletes(txn)
            self.forgets = self.store.forgets(txn)
        if deletes != self._deletes:  # what a prune or forget deleted goes at once
            self._drop_deleted(deletes)
            self._keep_listed(snap)
        if (snap.generation if snap else 0) != self.view.generation:
            self._loader.start()  # until it ends, merged segments are drafted as they were
        if not self._writer.pending:  # while our commits are being stored, their ids are unknown
            self._catch_up(self.catch_up_tokens)
        if self.delta.index.room() > FULL:
            self._loader.start()  # a roomier delta, made in the background

    def _catch_up(self, budget: int | None) -> None:
        """Index what others committed in the namespaces wanted, about ``budget``
        tokens at most (None: all); ``behind`` says the next refresh goes on.

        A sequence longer than ``LONG`` (one long output, or an 8 MB ingest
        line) is not indexed here, in a serving call: the loader thread
        indexes it with everything after the snapshot and the result is
        swapped in; until then others' newer commits wait.
        """
        self.behind = False
        if self._long_pending and budget is not None:
            return
        spent = 0
        for record in self.store.records(after=self._seen):
            if budget is not None and record.nbytes > 4 * LONG:
                # Told by its size, before reading it (whatever its namespace).
                self._long_pending = True
                self._loader.start()
                break
            seq = self.store.decode(record)
            if seq.seq_id not in self._own and (self.wanted is None
                                                or seq.namespace in self.wanted):
                self._ids[self.delta.add(seq.tokens, seq.namespace)] = seq.seq_id
            self._seen = max(self._seen, seq.seq_id)
            spent += seq.length + 64  # reading a record costs too, indexed or not
            if budget is not None and spent >= budget:
                self.behind = True
                break
        self._own = {i for i in self._own if i > self._seen}
        self._evict()

    def _evict(self) -> None:
        """Keep the indexed tokens within ``max_tokens`` by dropping the oldest
        from memory (the file keeps them until a snapshot applies the budget)."""
        if self.max_tokens is not None:
            for seq in self.delta.evict(lambda: self.tokens > self.max_tokens):
                self._ids.pop(seq, None)
        self.delta.maybe_rebuild()  # keeps sequence ids

    def _drop_deleted(self, deletes: int, bounded: bool = True) -> None:
        """Stop drafting what was deleted since (``prune``, ``forget``), at once.

        Taking a few sequences out of the delta costs little; taking many
        (a prune of a million tokens) would hold a serving call for seconds.
        Then the delta is replaced by one holding only the outputs in flight,
        and the loader thread indexes again what the file still holds: until
        it is swapped in, others' recent commits are not drafted from.
        ``bounded`` False (a forced refresh): taken out here, however many."""
        if deletes == self._deletes:
            return
        with self.store.read() as txn:
            gone = [seq for seq, sid in self._ids.items() if not self.store.holds(txn, (sid,))]
        doomed = sum(int(self.delta.index.seqs[seq, lay.SEQ_LEN]) for seq in gone)
        if bounded and doomed > DROP_TOKENS:
            self._swap(Prepared(self.view, Delta(self.max_depth), {}, self._seen, {},
                                None if self.wanted is None else frozenset(self.wanted),
                                deletes, self._inode))
            self._loader.start()
            return
        for seq in gone:
            del self._ids[seq]
            self.delta.remove(seq)
        self._deletes = deletes

    def _keep_listed(self, snap) -> None:
        """Stop drafting segments the snapshot no longer lists, at once."""
        listed = {seg.folder for seg in snap.segments} if snap else set()
        kept = tuple(s for s in self.view.segments if s.segment.folder in listed)
        if len(kept) != len(self.view.segments):
            self.view = PoolView(self.view.generation, kept)

    # ------------------------------------------------------------ snapshots
    def write_snapshot(self, progress=None, jobs: int | None = None) -> int:
        """Enforce ``max_tokens`` and ``ttl``, bring the segments up to date, reload.

        Runs in the calling thread (maintenance, not serving).  Returns the
        snapshot generation.  ``progress(tokens)`` follows the reading of the
        store; ``jobs`` (default ``snapshot_jobs``) processes build each
        segment (``segments.write_snapshot``).
        """
        self.flush()
        prune(self.store, max_tokens=self.max_tokens, older_than=self.ttl)
        generation = segments.write_snapshot(self.store, self.snapshot_jobs if jobs is None
                                             else jobs, progress)
        self.reload()
        return generation

    def reload(self) -> None:
        """Map the current snapshot and index what it leaves uncovered, now."""
        prepared = self._loader.prepare()
        with self._lock:
            self._swap(prepared)

    def snapshotting(self) -> bool:
        """Whether a snapshot child (``snapshot_every``) is still at work."""
        return self._snapshotter is not None and self._snapshotter.poll() is None

    def _snapshot_in_child(self) -> None:
        """Write the snapshot from a child process (``snapshot_every``)."""
        if self._snapshotter is not None and self._snapshotter.poll() is None:
            return
        self._since_snapshot = 0
        args = [str(self.store.path), str(self.max_tokens), str(self.ttl),
                str(self.snapshot_jobs)]
        try:
            self._snapshotter = subprocess.Popen(
                [sys.executable, "-c", _SNAPSHOT_CHILD, *args], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as e:
            self._warn("snapshot", f"suffixspec: no snapshot of {self.store.path} ({e})")

    def _remove_stale_snapshots(self) -> None:
        """Remove snapshot folders the pool no longer names, unless a snapshot is being written."""
        root = self.store.snapshot_folders
        if not root.is_dir():
            return
        with files.folder_lock(root, wait=False) as lock:
            if lock is not None:
                segments.remove_unnamed(self.store)

    def prune(self, max_tokens: int | None = None, older_than: float | None = None,
              namespace: str | None = None, snapshot: bool = True) -> int:
        """Delete sequences older than ``older_than`` seconds and the oldest
        beyond ``max_tokens`` (within ``namespace`` if given); returns how many."""
        self.flush()
        deleted = prune(self.store, max_tokens, older_than, namespace)
        if deleted and snapshot:
            self.write_snapshot()
        return deleted

    def forget(self, request_id: str | None = None, namespace: str | None = None,
               timeout: float = 10.0) -> int:
        """Delete a request's or a namespace's sequences for real.

        One transaction deletes them and drops the snapshot segments that
        hold them, so from then on no process drafts them, even if this one
        is killed.  Those segments are rebuilt (``segments``) and the file
        compacted, so their tokens are gone from disk; other processes let go
        of the file at their next pool operation.  If one holds on past
        ``timeout`` seconds, ``compacted`` is False and the compaction stays
        pending: the next forget or ``recover`` (``suffixspec snapshot``) that can, finishes it.
        Returns how many sequences were deleted.
        """
        if (request_id is None) == (namespace is None):
            raise ValueError("forget needs exactly one of request_id and namespace")
        self.flush()
        doomed = [m.seq_id for m in self.store.sequences(namespace=namespace, with_tokens=False)
                  if request_id is None or m.request_id == str(request_id)]
        deleted = self.store.delete(doomed, forget=True)
        self._finish_forget(timeout)
        return deleted

    def _finish_forget(self, timeout: float) -> None:
        """Rebuild the dropped segments and compact the file; sets ``compacted``."""
        self.write_snapshot()
        with self._lock:
            self.view = PoolView(self.view.generation)
            self.compacted = self.store.compact(timeout)
        self.reload()

    def save_calibration(self, table: np.ndarray) -> None:
        """Keep a copy of the proposer's calibration table, for the next process to
        open the pool: written by the writer thread after the commits before it."""
        with self._lock:
            self._writer.put_table("calibration", table.copy())

    def load_calibration(self) -> np.ndarray | None:
        """The calibration table last kept here, as it was kept (None: none)."""
        with self._lock:
            return self.store.load_table("calibration")

    def close(self) -> None:
        """Store what was committed, stop the threads, let go of the file.

        A commit the file could not take (a read-only or full disk) was
        logged when it failed; closing says so once more and goes on."""
        if self._closed:
            return
        try:
            self.flush(timeout=60.0)
        except PoolError as e:
            logger.warning("suffixspec: %s closed with outputs it could not store: %s",
                           self.store.path, e)
        finally:
            self._closed = True
            self._writer.stop(timeout=5.0)
            self._loader.join(timeout=30.0)
            with self._lock:
                self.view = PoolView()
            if self._shared:
                self.store.release()

    def __enter__(self) -> PersistentPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _indexed_already(self, ids: list[int], items: list) -> None:
        """The writer stored ``items`` as ``ids`` (hold the lock): those still in
        the delta are indexed already, so catching up skips them."""
        for sid, (_, _, _, delta, seq) in zip(ids, items):
            if delta is self.delta and seq in delta.committed:
                self._own.add(sid)
                self._ids[seq] = sid

    # ------------------------------------------------- the loader's result
    def _swap(self, new: Prepared) -> None:
        """Put a prepared delta and view in place (hold the lock).

        Outputs in flight take the tokens they gained since they were copied;
        those begun since are copied now; those ended since are dropped from
        it (their stored copy is indexed by catching up).
        """
        self._prepared = None
        for h, (seq, _) in new.copied.items():
            if h not in self._open:
                new.delta.remove(seq)
        moved = {}
        for h, (seq, namespace) in self._open.items():
            tokens = self.delta.index.sequence(seq)
            have = new.copied.get(h)
            if have is None:
                now = new.delta.begin(namespace, capacity=max(tokens.shape[0], 1))
                new.delta.extend(now, tokens)
            else:
                now = have[0]
                if tokens.shape[0] > have[1].shape[0]:
                    new.delta.extend(now, tokens[have[1].shape[0]:])
            moved[h] = (now, namespace)
        self._open = moved
        self.delta, self.view, self._ids = new.delta, new.view, new.ids
        self._seen, self._own, self._deletes = new.upto, set(), new.deletes
        self._long_pending = False  # the loader indexed up to ``upto``
        self._inode = new.inode
        self.behind = True  # catch up on what came after ``upto`` at the next refresh
        if new.wanted != (None if self.wanted is None else frozenset(self.wanted)):
            self._loader.start()  # a namespace was asked for meanwhile

    def _read_quietly(self, call):
        """``call()`` under the lock, retried (lock let go) while a compaction holds the file."""
        while True:
            self._wait_for_file()
            with self._lock:
                try:
                    with self.store.no_wait():
                        return call()
                except FileBusy:
                    continue

    def _wait_for_file(self) -> None:
        """Until the file can be read without waiting (no compaction holds it),
        without holding the lock, so serving calls go on meanwhile.  Where this
        process holds the file a compaction asked for, it lets go here rather
        than wait for the watcher thread to."""
        while not self.store.can_open_now() and not self._closed:
            if not self.store.yield_to_compaction():
                time.sleep(0.01)

    def _file_replaced(self) -> bool:
        try:
            return os.stat(self.store.path).st_ino != self._inode
        except FileNotFoundError:
            return False

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def prune(store: PoolStore, max_tokens: int | None = None, older_than: float | None = None,
          namespace: str | None = None) -> int:
    """Delete stored sequences older than ``older_than`` seconds and the oldest
    beyond ``max_tokens`` (within ``namespace`` if given); returns how many."""
    if max_tokens is None and older_than is None:
        return 0
    now = time.time()
    metas = list(store.sequences(namespace=namespace, with_tokens=False))
    doomed = {m.seq_id for m in metas if older_than is not None and now - m.added > older_than}
    if max_tokens is not None:
        total = sum(m.length for m in metas if m.seq_id not in doomed)
        for m in metas:  # oldest first
            if total <= max_tokens:
                break
            if m.seq_id not in doomed:
                doomed.add(m.seq_id)
                total -= m.length
    return store.delete(doomed)


def snapshot_child() -> None:
    """``python -c`` entry of the snapshot child: POOL MAX_TOKENS TTL JOBS."""
    in_background()  # its build workers inherit it
    path, max_tokens, ttl, jobs = sys.argv[1:5]
    store = PoolStore(path)
    try:
        prune(store, None if max_tokens == "None" else int(max_tokens),
              None if ttl == "None" else float(ttl))
        segments.write_snapshot(store, int(jobs))
    finally:
        store.close()


_SNAPSHOT_CHILD = "from suffixspec.pools.persistent import snapshot_child; snapshot_child()"
