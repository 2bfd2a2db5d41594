"""The pool's writer: commits and tables go to the pool file from one thread.

A serving call never waits for the pool file (a compaction may hold it): a
``PersistentPool`` hands each commit and each calibration table to its
``Writer``, which stores what has queued up in one transaction, in order.
``pending`` counts what is handed over and not yet stored (``flush`` waits
for it to reach 0); ``error`` is the last failure to store, raised by the
pool's next ``flush``.  A failure is logged once and drafting goes on.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np

from suffixspec.pools.background import in_background
from suffixspec.pools.store import FileBusy, PoolError

#: Commits stored in one transaction at most.
WRITE_BATCH = 1024


@dataclass(frozen=True)
class Table:
    """A table for the writer thread to keep in the pool file."""

    name: str
    table: np.ndarray


class Writer:
    """Stores a pool's commits and tables from its own thread (``start``, ``stop``)."""

    def __init__(self, pool):
        self.pool = pool  # a PersistentPool: its lock, store, delta and the ids it keeps
        self.pending = 0  # handed over and not yet stored (changed under the pool's lock)
        self.error: PoolError | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="suffixspec-pool-writer",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put_commit(self, tokens: np.ndarray, namespace: str, request_id: str, delta,
                   seq: int) -> None:
        """Store a committed output (hold the pool's lock); ``delta``'s sequence
        ``seq`` holds it indexed already."""
        self.pending += 1
        self._queue.put((tokens, namespace, request_id, delta, seq))

    def put_table(self, name: str, table: np.ndarray) -> None:
        """Keep ``table`` (hold the pool's lock), after the commits before it."""
        self.pending += 1
        self._queue.put(Table(name, table))

    def stop(self, timeout: float) -> None:
        """Store what is queued, then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        """Store commits in order, what has queued up in one transaction; never
        raises into serving."""
        in_background()
        pool = self.pool
        while True:
            items = [self._queue.get()]
            while len(items) < WRITE_BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is None
            tables = [item for item in items if isinstance(item, Table)]
            items = [item for item in items if isinstance(item, tuple)]
            if items:
                self._store_commits(items)
            if tables:  # the last one kept is the newest
                self._store_table(tables[-1].name, tables[-1].table)
                with pool._lock:
                    self.pending -= len(tables)
            if stop:
                return

    def _store_table(self, name: str, table: np.ndarray) -> None:
        pool = self.pool
        while True:
            pool._wait_for_file()
            try:  # not under the pool's lock, as commits
                with pool.store.no_wait():
                    pool.store.save_table(name, table)
                return
            except FileBusy:
                continue
            except Exception as e:  # noqa: BLE001 - the writer thread must not end here
                with pool._lock:
                    pool._warn("table", f"suffixspec: the {name} table was not kept in "
                                        f"{pool.store.path}: {e}")
                return

    def _store_commits(self, items: list) -> None:
        pool = self.pool
        records = [(tokens, namespace, "engine", request_id)
                   for tokens, namespace, request_id, _, _ in items]
        while True:
            pool._wait_for_file()
            # Not under the pool's lock: serving calls go on while the commit
            # reaches the disk (the store's file lock keeps the file steady).
            # Until ``pending`` drops, nothing catches up on these ids.
            try:
                with pool.store.no_wait():  # never waits through a compaction
                    ids = pool.store.add_many(records)
            except FileBusy:
                continue
            except Exception as e:  # the file cannot take them: logged, drafting goes on
                with pool._lock:
                    self.pending -= len(items)
                    self.error = e if isinstance(e, PoolError) else PoolError(str(e))
                    pool._warn("write", f"suffixspec: {len(items)} output(s) were not "
                                        f"stored in {pool.store.path}: {e}")
                return
            with pool._lock:
                self.pending -= len(items)
                self.error = None
                pool._indexed_already(ids, items)
            return
