"""The pool's loader: a new delta and view, made off the serving thread.

When the snapshot changes (a merge, a ``forget``, an ``add-segment``), a
namespace is asked for, the delta fills up, or another process committed a
long sequence, a ``PersistentPool`` asks its ``Loader`` for a new delta and
view.  The loader thread maps and checks the snapshot's new segments
(``view.open_segment``), indexes what they leave uncovered and what was
committed meanwhile into a new delta, with the process's outputs in flight,
and leaves the result (``Prepared``) for the pool's next ``refresh`` to swap
in.  It holds the pool's lock only for short reads: records are copied under
it and decoded and indexed without it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from suffixspec.native import layout as lay
from suffixspec.pools.background import in_background
from suffixspec.pools.memory import Delta
from suffixspec.pools.store import FileBusy
from suffixspec.pools.view import MappedSegment, PoolView, open_segment

#: Stored sequences read at once by the loader, and their bytes at most (one
#: record at least): it holds the pool's lock while it copies them, then
#: decodes and indexes them without it.
READ_BATCH = 128
READ_BYTES = 1 << 22
#: Times the loader reads the snapshot again when a newer one replaced it while it mapped.
MAP_ATTEMPTS = 5
#: A delta the loader makes has room for this share of its tokens more (at least
#: ``ROOM_TOKENS``), so serving calls seldom grow it (growing costs a time
#: proportional to its size); once fuller than ``FULL``, the loader makes another.
ROOM = 1.0
ROOM_TOKENS = 1 << 20
FULL = 0.5
#: The room a pool's first delta gets when it opens: small, since filling room
#: costs time in proportion (1M tokens: 50-300 ms here), and opening serves;
#: once the delta is fuller than ``FULL``, the loader makes a roomier one.
OPEN_ROOM_TOKENS = 1 << 16
#: Rounds of indexing what was committed while the loader worked.
CATCH_UP_ROUNDS = 4

class Replaced(Exception):
    """A segment's folder is gone: a newer snapshot replaced it."""


@dataclass
class Prepared:
    """A delta and view the loader made, to swap in at the next ``refresh``."""

    view: PoolView
    delta: Delta
    ids: dict[int, int]            # committed delta sequence -> store id
    upto: int                      # stored ids up to this are in it, or in the view
    copied: dict[int, tuple]       # open output's handle -> (its sequence here, tokens copied)
    wanted: frozenset | None
    deletes: int
    inode: int | None = None
    problems: list[str] = field(default_factory=list)


class Loader:
    """Prepares a pool's next delta and view in a thread (``start``), or now (``prepare``)."""

    def __init__(self, pool):
        self.pool = pool  # a PersistentPool: its lock, store and what it serves
        self._thread: threading.Thread | None = None
        self._again = False  # a reload is due once the current one ends

    def start(self) -> None:
        """Prepare a new delta and view in the loader thread (again, if one runs)."""
        if self._thread is not None and self._thread.is_alive():
            self._again = True
            return
        self._again = False
        self._thread = threading.Thread(target=self._loop, name="suffixspec-pool-loader",
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        pool = self.pool
        in_background()
        while not pool._closed:
            try:
                prepared = self.prepare()
            except Exception as e:  # the old delta and view stay in use
                pool._warn("load", f"suffixspec: {pool.store.path} could not be reloaded "
                                   f"({e}); drafting goes on from what was loaded")
                return
            with pool._lock:
                pool._prepared = prepared
                if not self._again:
                    return
                self._again = False

    def prepare(self, room_tokens: int = ROOM_TOKENS) -> Prepared:
        """Map the current snapshot's segments (checking new ones) and index
        what they leave uncovered, with this process's open sequences, into
        a new delta with room for ``ROOM`` times its tokens more, at least
        ``room_tokens``.  Takes the store's lock only for short reads."""
        pool = self.pool
        for attempt in range(MAP_ATTEMPTS):
            pool._wait_for_file()
            with pool._lock:
                wanted = None if pool.wanted is None else frozenset(pool.wanted)
                mapped = pool.view.by_folder()
                copied = {h: (pool.delta.index.sequence(seq), ns)
                          for h, (seq, ns) in pool._open.items()}
                try:
                    with pool.store.no_wait(), pool.store.read() as txn:
                        snap = pool.store.snapshot(txn)
                        deletes = pool.store.deletes(txn)
                        upto = pool.store.last_id()
                except FileBusy:
                    continue
                inode = os.stat(pool.store.path).st_ino
            problems = list(snap.refused) if snap else []
            try:
                view = self._map(snap, mapped, problems, last=attempt == MAP_ATTEMPTS - 1)
                break
            except Replaced:  # a newer snapshot replaced a segment just now: read it
                continue
        delta = Delta(pool.max_depth)
        for h, (tokens, ns) in copied.items():  # outputs in flight, as they were
            seq = delta.begin(ns, capacity=max(tokens.shape[0], 1))
            delta.extend(seq, tokens)
            copied[h] = (seq, tokens)
        ids: dict[int, int] = {}
        after = 0
        for seg in view.segments:
            self._index_range(delta, ids, after, min(seg.segment.first, upto), wanted)
            after = max(after, seg.segment.last)
        self._index_range(delta, ids, after, upto, wanted)
        upto = max(upto, after)
        # What was committed meanwhile (by this process too) is indexed here, not
        # by the serving calls after the swap: until little is left.
        for _ in range(CATCH_UP_ROUNDS):
            last = pool._read_quietly(pool.store.last_id)
            if last <= upto:
                break
            self._index_range(delta, ids, upto, last, wanted)
            upto = last
        delta.index.reserve(max(int(ROOM * delta.tokens), room_tokens))
        return Prepared(view, delta, ids, upto, copied, wanted, deletes, inode, problems)

    def _map(self, snap, mapped: dict[str, MappedSegment], problems: list[str],
             last: bool) -> PoolView:
        """The view of ``snap``: segments mapped already are kept, new ones
        mapped and checked.  A segment that fails is left out (its range is
        indexed from the stored sequences), and so are the smallest beyond
        ``layout.SEGMENTS``.  A segment whose folder is gone was replaced by a
        newer snapshot: ``Replaced``, unless this is the ``last`` try."""
        pool = self.pool
        found = []
        for seg in snap.segments if snap else ():
            have = mapped.get(seg.folder)
            if have is not None and have.segment == seg:
                found.append(have)
                continue
            folder = pool.store.snapshot_folders / seg.folder
            if not folder.is_dir() and not last:
                raise Replaced
            try:
                stamps = pool._read_quietly(lambda: pool.store.stamps(seg.folder))
                m, fresh = open_segment(folder, seg, pool.max_depth, None, stamps)
            except FileNotFoundError as e:  # removed mid-way: a newer snapshot replaced it
                if not last:
                    raise Replaced from e
                problems.append(f"segment {seg.folder}: {e}")
                continue
            except (OSError, ValueError) as e:
                problems.append(f"segment {seg.folder}: {e}")
                continue
            if fresh is not None and not pool.store.readonly:
                pool._read_quietly(lambda: pool.store.record_stamps(seg.folder, fresh))
            found.append(m)
        if len(found) > lay.SEGMENTS:
            largest = sorted(found, key=lambda m: -m.segment.tokens)[:lay.SEGMENTS]
            found = [m for m in found if any(m is g for g in largest)]
        if problems:
            pool._warn(f"segments {snap.generation if snap else 0}",
                       f"suffixspec: {len(problems)} snapshot segment(s) of {pool.store.path} are "
                       f"not used ({'; '.join(problems)}); drafting from their stored sequences "
                       f"until `suffixspec snapshot` writes them anew")
        return PoolView(snap.generation if snap else 0, tuple(found))

    def _index_range(self, delta: Delta, ids: dict, after: int, upto: int, wanted) -> None:
        """Index the stored sequences with ids in ``(after, upto]`` in the namespaces wanted."""
        pool = self.pool
        while after < upto and not pool._closed:
            pool._wait_for_file()
            with pool._lock:  # a batch at a time: serving calls run between batches
                batch, size = [], 0
                try:
                    with pool.store.no_wait():
                        for record in pool.store.records(after=after):
                            if (record.seq_id > upto or len(batch) >= READ_BATCH
                                    or (batch and size + record.nbytes > READ_BYTES)):
                                break
                            batch.append(record.kept())  # copied here, read after
                            size += record.nbytes
                except FileBusy:
                    continue
            if not batch:
                return
            for record in batch:  # decoded and indexed without the lock
                seq = pool.store.decode(record)
                if wanted is None or seq.namespace in wanted:
                    ids[delta.add(seq.tokens, seq.namespace)] = seq.seq_id
            after = batch[-1].seq_id if batch[-1].seq_id < upto else upto
