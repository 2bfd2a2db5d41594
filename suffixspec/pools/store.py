"""``PoolStore``: a pool's sequences and index snapshot in one LMDB file.

Layout (named databases in one environment, ``subdir=False``, mode 0600):

* ``meta``: ``b"format"`` -> msgpack ``{version, tokenizer, fingerprint,
  max_depth, created}``; ``b"next_id"`` -> the next sequence id.
* ``seqs``: 8-byte big-endian sequence id -> msgpack ``{ns, src, rid, t, n,
  a, crc, tok}``: namespace, source, request id, time added, token count, how
  many of the tokens are leading output-start anchors (``suffixspec.anchors``),
  CRC-32 of the token bytes, and the int32 tokens.  Ids only grow, so every insert is
  a sorted append.
  ``b"table:<name>"`` -> msgpack ``{shape, crc, saved, data}``: a float64
  table kept beside the sequences (the proposer's calibration).
* ``snap``: ``b"meta"`` -> msgpack ``{generation, created, segments}``.  The
  snapshot is made of segments, each an index over the sequences with ids in
  ``(first, last]`` (``records.Segment``).  A segment's arrays are files in
  ``<pool>.snapshots/<folder>/`` (``suffixspec.pools.files``); its entry
  gives each one's dtype, shape and checksum.  ``b"verified:<folder>"`` ->
  msgpack stamps of the files of that folder whose checksums and structure
  were checked (``view.open_segment``).
  ``meta`` also holds ``b"deletes"``: how many deleting transactions ran, and
  ``b"forgets"``: how many of those were a ``forget`` (serving processes then
  drop what they keep in memory beside the pool).

A pool is its file, whatever the name it is reached by: links are followed
before the lock file, the gate and the snapshot folder are named after it
(LMDB names its lock file after the path it is given, so two names would be
two locks on one file), a file with a second name (a hard link) is refused,
and so is anything but a regular file (a FIFO, a device, a folder), before
it is opened.  New files are made by LMDB's 0.9 engine (py-lmdb 3 also
ships 1.0, whose files 0.9 cannot read); a file is opened with the engine
that made it.  Readers a killed process left in the lock file are cleared
when the file is opened (``reader_check``), so their old pages do not pin
the file's growth.

Every write is one transaction; a commit that returned is durable.  A full map
grows and the transaction is retried.  The default map size is large (address
space only: the file grows as it fills), so this is rare.  The environment is
opened lazily and again after a fork, so each process has its own handle.
LMDB allows one handle per file and process: ``PoolStore.shared`` hands every
user of a path in this process the same store, closed when the last lets go.
Calls on one store are serialised by its ``lock``.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import stat
import threading
import time
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import lmdb
import msgpack
import numpy as np

from suffixspec.anchors import anchor_count
from suffixspec.fingerprint import TokenizerId
from suffixspec.config import check_namespace
from suffixspec.native.tokens import MAX_TOKEN_ID
from suffixspec.pools import files
from suffixspec.pools.gate import Gate
from suffixspec.pools.records import Snapshot

# Version 2 added output-start anchors; this suffixspec reads version 2 only.
FORMAT_VERSION = 2
WATCH_INTERVAL = 0.2  # seconds between the watcher's looks at the gate
# How a refused write reads in LMDB's errors: ENOSPC, EFBIG, EDQUOT, and EIO,
# which LMDB reports for a short write (a disk that filled up mid-write).
_NO_SPACE = ("No space left", "File too large", "Disk quota exceeded", "Input/output error")


class PoolError(RuntimeError):
    """A pool cannot be used as asked; the message says why."""


class TokenizerMismatchError(PoolError):
    """The pool was built with a different tokenizer."""


class CorruptPoolError(PoolError):
    """Stored data fails its checks."""


class DiskFullError(PoolError):
    """A write was refused (disk full, size limit); what was committed stays."""


class FileBusy(PoolError):
    """A compaction holds the file and the caller asked not to wait (``no_wait``)."""


@dataclass(frozen=True)
class StoredRecord:
    """A stored sequence as the pool file holds it (``PoolStore.records``)."""

    seq_id: int
    nbytes: int  # of the stored record: four per token, and a small header
    raw: bytes | memoryview

    def kept(self) -> StoredRecord:
        """The record with its bytes copied (valid after the iteration moved on)."""
        return StoredRecord(self.seq_id, self.nbytes, bytes(self.raw))


@dataclass
class StoredSequence:
    seq_id: int
    namespace: str
    source: str
    request_id: str
    added: float
    length: int                # tokens stored, anchors included
    tokens: np.ndarray | None  # None when read without tokens
    anchors: int = 0           # leading output-start anchors among the tokens

    @property
    def output(self) -> np.ndarray | None:
        """The tokens without the anchors."""
        return None if self.tokens is None else self.tokens[self.anchors:]


def _key(seq_id: int) -> bytes:
    return seq_id.to_bytes(8, "big")


class PoolStore:
    """One pool file.  Create it by passing ``tokenizer`` and ``max_depth``.

    Opening an existing pool checks its format version and, when ``tokenizer``
    is given, refuses a different tokenizer.
    """

    def __init__(self, path: str | Path, tokenizer: TokenizerId | None = None,
                 max_depth: int | None = None, readonly: bool = False,
                 map_size: int = 1 << 36, durable: bool = True):
        self.path = pool_file(path)
        self.readonly = readonly
        self.durable = durable
        self._map_size = map_size
        self._env = None
        self._pid = None
        self.gate = Gate(self.path)
        self.lock = threading.RLock()  # one call at a time, whoever shares the store
        # Held through every write transaction and while the environment is
        # opened, let go or resized (``write``): a pool's writer thread stores
        # commits holding it alone, so serving calls (which hold ``lock``) never
        # wait for a commit to reach the disk.  Taken after ``lock`` when both
        # are held; a thread holding it alone never waits for ``lock``.
        self._file_lock = threading.RLock()
        self.users = 0  # holders through ``shared``
        self._watch_pid = None
        self._watch_stop = threading.Event()
        self._local = threading.local()  # no_wait, per thread
        exists = self.path.exists()
        if exists:
            _refuse_foreign(self.path)
        else:
            if readonly:
                raise PoolError(f"no pool at {self.path}")
            if tokenizer is None or max_depth is None:
                raise PoolError(f"no pool at {self.path}; creating one needs a tokenizer "
                                f"and max_depth")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._closed = False
        try:
            self.info = self._read_or_create_format(tokenizer, max_depth)
            self._check_identity(tokenizer, max_depth)
        except BaseException:
            self.close()  # a refused pool leaves no handle open
            raise

    @classmethod
    def shared(cls, path: str | Path, tokenizer: TokenizerId | None = None,
               max_depth: int | None = None, durable: bool = True) -> PoolStore:
        """The store of ``path`` that every user in this process shares (LMDB
        refuses a second handle); ``release`` it when done."""
        key = os.path.realpath(path)
        with _SHARED_LOCK:
            store = _SHARED.get(key)
            if store is None or store._closed:
                store = _SHARED[key] = cls(path, tokenizer, max_depth, durable=durable)
            else:
                store._check_identity(tokenizer, max_depth)
            store.users += 1
            return store

    def release(self) -> None:
        """One user of a ``shared`` store is done; the last closes it."""
        with _SHARED_LOCK:
            self.users -= 1
            if self.users <= 0:
                _SHARED.pop(os.path.realpath(self.path), None)
                self.close()

    def _check_identity(self, tokenizer, max_depth) -> None:
        if tokenizer is not None and not tokenizer.matches(self.info["fingerprint"]):
            raise TokenizerMismatchError(
                f"pool {self.path} was built with tokenizer {self.info['tokenizer']} "
                f"({self.info['fingerprint']}), but this run uses {tokenizer}; pools "
                f"never mix token ids of different tokenizers")
        if max_depth is not None and max_depth != self.info["max_depth"]:
            raise PoolError(f"pool {self.path} has max_depth {self.info['max_depth']}, "
                            f"asked for {max_depth}")

    # ------------------------------------------------------------ environment
    @contextlib.contextmanager
    def no_wait(self):
        """Within it, an operation of this thread that would wait for a
        compaction to end raises ``FileBusy`` at once (serving calls)."""
        before = getattr(self._local, "no_wait", False)
        self._local.no_wait = True
        try:
            yield
        finally:
            self._local.no_wait = before

    @property
    def env(self) -> lmdb.Environment:
        if self._env is None or self._pid != os.getpid():
            with self._file_lock:
                return self._open_env()
        return self._env

    def _open_env(self) -> lmdb.Environment:
        if self._env is None or self._pid != os.getpid():
            # Waits while another process compacts the file, unless asked not to.
            if not self.gate.enter(wait=not getattr(self._local, "no_wait", False)):
                raise FileBusy(f"{self.path} is being compacted")
            try:
                # Opened again (after a compaction) only where it is: a pool file
                # removed under a process is not made anew, empty, in its place.
                self._env = _open_lmdb(str(self.path), subdir=False, max_dbs=4, mode=0o600,
                                       map_size=self._map_size, readonly=self.readonly,
                                       sync=self.durable, metasync=self.durable, lock=True,
                                       max_readers=256, create=self._pid is None)
                self._check_size()
                self._env.reader_check()  # readers of dead processes pin no pages
                self._dbs = {name: self._env.open_db(name.encode(), create=not self.readonly)
                             for name in ("meta", "seqs", "snap")}
            except lmdb.Error as e:
                if self._env is not None:
                    self._env.close()
                self._env = None
                self.gate.leave()
                if "already open" in str(e):
                    raise PoolError(f"{self.path} is already open in this process; close "
                                    f"the other handle first") from e
                cannot_write = isinstance(e, lmdb.ReadonlyError) or any(
                    words in str(e) for words in ("Read-only file system", "Permission denied"))
                if not self.path.exists() and self._pid is None:  # it was to be made here
                    raise PoolError(f"cannot create a pool at {self.path} ({e})"
                                    + ("; its folder cannot be written" if cannot_write
                                       else "")) from e
                if not self.path.exists():
                    raise PoolError(f"{self.path} is gone (removed while open)") from e
                if cannot_write:
                    raise PoolError(f"{self.path} cannot be opened for writing ({e}); "
                                    f"commands that only read open it read-only") from e
                raise CorruptPoolError(f"{self.path} is not a readable pool file ({e})") from e
            self._pid = os.getpid()
        return self._env

    def _check_size(self) -> None:
        """Refuse a file shorter than its pages: touching them would kill the process."""
        used = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        size = os.stat(self.path).st_size
        if size < used:
            raise lmdb.CorruptedError(f"the file is truncated: {size} bytes, its pages "
                                      f"need {used}")

    def db(self, name: str):
        self.env  # noqa: B018 - opens the environment (and its databases) if needed
        return self._dbs[name]

    def _let_go(self, wait: bool = True) -> bool:
        """Close the environment (the next operation opens it again); without
        ``wait``, only if no write transaction of another thread holds it:
        False then, and it stays open."""
        if not self._file_lock.acquire(blocking=wait):
            return False
        try:  # not under a write transaction of another thread
            if self._env is not None and self._pid == os.getpid():
                self._env.close()
                self.gate.leave()
            self._env = None
        finally:
            self._file_lock.release()
        return True

    def close(self) -> None:
        """Close the pool file for good: its environment, the gate's file, the watcher."""
        self._watch_stop.set()
        with self.lock:
            self._let_go()
            self.gate.close()
            self._closed = True

    def yield_to_compaction(self, wait: bool | None = None) -> bool:
        """If another process asked to compact the file, let go of it; True if so.

        The next operation opens the file again once the compaction is done.
        Letting go waits for a write transaction of another thread to end
        unless ``wait`` is False (default: unless in ``no_wait``): the file is
        then kept until a later call.
        """
        if self._env is None or self._pid != os.getpid() or not self.gate.requested():
            return False
        if wait is None:
            wait = not getattr(self._local, "no_wait", False)
        return self._let_go(wait)

    def clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died inside a read transaction
        (their old pages are then reused); returns how many.  Never waits."""
        if self._env is None or self._pid != os.getpid():
            return 0
        if not self._file_lock.acquire(blocking=False):
            return 0
        try:
            return self._env.reader_check() if self._env is not None else 0
        except lmdb.Error:
            return 0
        finally:
            self._file_lock.release()

    def can_open_now(self) -> bool:
        """Whether an operation would open the file without waiting for a
        compaction to end (it is open, or no compaction holds the gate)."""
        if self._env is not None and self._pid == os.getpid():
            return not self.gate.requested()
        return self.gate.idle()

    def watch(self) -> None:
        """Let go of the file whenever a compaction asks, from a thread of this
        process (once per process).  An idle process holding the pool (a
        server without requests) makes no pool operation, so without it a
        compaction would wait for it."""
        if self._watch_pid == os.getpid() or self._watch_stop.is_set():
            return
        self._watch_pid = os.getpid()
        threading.Thread(target=_let_go_when_asked, args=(weakref.ref(self), self._watch_stop),
                         name="suffixspec-pool-watcher", daemon=True).start()

    def __enter__(self) -> PoolStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, fn: Callable):
        """Run ``fn(txn)`` in one write transaction, growing the map as needed.

        The transaction holds ``_file_lock``, not ``lock``: readers holding
        ``lock`` go on beside it (LMDB keeps their view), and nothing opens,
        lets go of or resizes the environment meanwhile.  ``lock`` is held
        only while the environment is made ready."""
        if self.readonly:
            raise PoolError(f"pool {self.path} is open read-only")
        while True:
            self.yield_to_compaction()
            self.env  # noqa: B018 - opened (a compaction waited for) before taking ``lock``
            with self.lock:  # then the file lock: the order every caller takes them in
                env = self.env
                self._file_lock.acquire()
            try:
                env.reader_check()  # a dead reader's snapshot pins no page this write frees
                with env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                resize = 2 * env.info()["map_size"]
            except lmdb.MapResizedError:
                resize = 0  # another process grew it: adopt its size
            except lmdb.Error as e:
                if any(words in str(e) for words in _NO_SPACE):
                    raise DiskFullError(f"could not write {self.path} (disk full?): {e}") from e
                raise
            finally:
                self._file_lock.release()
            with self.lock:  # no reader's transaction is open while the map changes
                self._remap(resize)

    def read(self, buffers: bool = False):
        """A read transaction (use as a context manager)."""
        self.yield_to_compaction()
        while True:
            try:
                return self.env.begin(buffers=buffers)
            except lmdb.MapResizedError:
                self._remap(0)
            except lmdb.Error as e:
                raise CorruptPoolError(f"{self.path}: cannot read the pool ({e})") from e

    @contextlib.contextmanager
    def _damage_is_corruption(self):
        """LMDB's errors about damaged pages, as ``CorruptPoolError`` naming the file."""
        try:
            yield
        except (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError,
                lmdb.BadValsizeError) as e:
            raise CorruptPoolError(f"{self.path} is damaged ({e})") from e

    def _remap(self, size: int) -> None:
        """Resize the map (no view into the file outlives a transaction)."""
        with self._file_lock:
            self.env.set_mapsize(size)

    # ----------------------------------------------------------------- format
    def _read_or_create_format(self, tokenizer, max_depth) -> dict:
        with self.read() as txn:
            raw = txn.get(b"format", db=self.db("meta"))
        if raw is None:
            if self.readonly or tokenizer is None or max_depth is None:
                raise CorruptPoolError(f"{self.path} is not a suffixspec pool (no format record)")
            info = {"version": FORMAT_VERSION, "tokenizer": tokenizer.name,
                    "fingerprint": tokenizer.fingerprint, "max_depth": int(max_depth),
                    "vocab_size": tokenizer.vocab_size, "created": time.time()}

            def create(txn):
                if txn.get(b"format", db=self.db("meta")) is None:
                    txn.put(b"format", msgpack.packb(info), db=self.db("meta"))
                    txn.put(b"next_id", _key(1), db=self.db("meta"))
                return msgpack.unpackb(txn.get(b"format", db=self.db("meta")))

            return _checked_format(self.write(create), self.path)
        try:
            info = msgpack.unpackb(raw)
        except (ValueError, msgpack.UnpackException) as e:
            raise CorruptPoolError(f"{self.path}: unreadable format record ({e})") from e
        return _checked_format(info, self.path)

    @property
    def max_depth(self) -> int:
        return int(self.info["max_depth"])

    @property
    def tokenizer(self) -> TokenizerId:
        return TokenizerId(self.info["tokenizer"], self.info["fingerprint"], self.vocab_size)

    @property
    def vocab_size(self) -> int | None:
        """Token ids of this pool lie below this (None: not recorded)."""
        return self.info.get("vocab_size")

    # -------------------------------------------------------------- sequences
    def add(self, tokens: np.ndarray, namespace: str, source: str = "",
            request_id: str = "") -> int:
        """Commit one sequence; returns its id once the commit returned."""
        return self.add_many([(tokens, namespace, source, request_id)])[0]

    def add_many(self, items: Iterable[tuple]) -> list[int]:
        """Commit ``(tokens, namespace, source, request_id)`` items in one transaction
        (``PoolError`` for a token id no vocabulary has)."""
        values = _records(items, None)
        return self.write(lambda txn: self._append(txn, values))

    def add_with_segments(self, items: Iterable[tuple],
                          segments_for: Callable[[list[int], object], list]) -> list[int]:
        """Commit items as ``add_many`` does and, in the same transaction, add
        the snapshot segments ``segments_for(their new ids, txn)`` (``suffixspec
        add-segment``): no process sees the ones without the others.
        ``segments_for`` may raise to refuse, and nothing is added.  The items
        come from another pool, so their token ids must also lie in this
        pool's vocabulary."""
        values = _records(items, self.vocab_size)

        def put(txn):
            ids = self._append(txn, values)
            snap = self.snapshot(txn)
            segments = list(snap.segments if snap else ()) + segments_for(ids, txn)
            self._put_segments(txn, sorted(segments, key=lambda seg: seg.first))
            return ids

        return self.write(put)

    def append(self, txn, items: Iterable[tuple]) -> list[int]:
        """``add_many`` inside the write transaction ``txn`` (``write``)."""
        return self._append(txn, _records(items, None))

    def records_in(self, txn, after: int = 0) -> Iterator[StoredRecord]:
        """``records`` read in transaction ``txn``."""
        with self._damage_is_corruption():
            cur = txn.cursor(db=self.db("seqs"))
            if not cur.set_range(_key(after + 1)):
                return
            for key, value in cur:
                yield StoredRecord(int.from_bytes(bytes(key), "big"), len(value), bytes(value))

    def _append(self, txn, values: list[bytes]) -> list[int]:
        meta, seqs = self.db("meta"), self.db("seqs")
        first = int.from_bytes(txn.get(b"next_id", db=meta), "big")
        for i, value in enumerate(values):
            txn.put(_key(first + i), value, db=seqs, append=True)
        txn.put(b"next_id", _key(first + len(values)), db=meta)
        return list(range(first, first + len(values)))

    def holds(self, txn, seq_ids: Iterable[int]) -> bool:
        """Whether every one of ``seq_ids`` is still stored."""
        seqs = self.db("seqs")
        return all(txn.get(_key(int(i)), db=seqs) is not None for i in seq_ids)

    def records(self, after: int = 0) -> Iterator[StoredRecord]:
        """Stored sequences with id > ``after``, in id order, not yet decoded.

        Each record's id and stored size cost nothing; its ``raw`` bytes are
        valid until the iteration moves on (``kept()`` copies them) and
        ``decode`` reads it.  So a caller can leave a long record to another
        thread, or copy records under a lock and decode them after.
        """
        with self.read(buffers=True) as txn, self._damage_is_corruption():
            cur = txn.cursor(db=self.db("seqs"))
            if not cur.set_range(_key(after + 1)):
                return
            for key, value in cur:
                yield StoredRecord(int.from_bytes(bytes(key), "big"), len(value), value)

    def decode(self, record: StoredRecord, with_tokens: bool = True) -> StoredSequence:
        """The sequence a record stores (``CorruptPoolError`` when it is damaged)."""
        return _decode(_key(record.seq_id), record.raw, self.path, with_tokens)

    def sequences(self, after: int = 0, namespace: str | None = None,
                  with_tokens: bool = True,
                  damaged: list | None = None) -> Iterator[StoredSequence]:
        """Stored sequences with id > ``after``, in id order.  A damaged record
        raises ``CorruptPoolError``, or, given a ``damaged`` list, has its id
        put there and is passed over."""
        for record in self.records(after):
            try:
                seq = self.decode(record, with_tokens)
            except CorruptPoolError:
                if damaged is None:
                    raise
                damaged.append(record.seq_id)
                continue
            if namespace is None or seq.namespace == namespace:
                yield seq

    def delete(self, seq_ids: Iterable[int], forget: bool = False) -> int:
        """Delete sequences by id; returns how many existed.

        The same transaction marks the snapshot segments that hold them
        ``stale`` (the next snapshot rebuilds those) or, with ``forget``, drops
        those segments (which still hold their tokens) and marks the file for
        compaction, so a process killed right after never leaves the deleted
        data draftable, and the next ``compact`` erases it from disk.
        """
        ids = sorted(set(seq_ids))

        def drop(txn):
            n = sum(bool(txn.delete(_key(i), db=self.db("seqs"))) for i in ids)
            if not n:
                return 0
            meta = self.db("meta")
            txn.put(b"deletes", (self.deletes(txn) + 1).to_bytes(8, "big"), db=meta)
            snap = self.snapshot(txn)
            if snap is not None:
                kept = []
                for seg in snap.segments:
                    at = bisect.bisect_right(ids, seg.first)
                    if at < len(ids) and ids[at] <= seg.last:
                        if forget:
                            continue
                        seg = seg.marked_stale()
                    kept.append(seg)
                if kept != list(snap.segments):
                    self._put_segments(txn, kept)
            if forget:
                txn.put(_COMPACT_PENDING, b"1", db=meta)
                txn.put(b"forgets", (self.forgets(txn) + 1).to_bytes(8, "big"), db=meta)
            return n

        return self.write(drop) if ids else 0

    def compaction_pending(self) -> bool:
        """True when deleted data may still sit in the file's free pages."""
        with self.read() as txn:
            return txn.get(_COMPACT_PENDING, db=self.db("meta")) is not None

    def last_id(self) -> int:
        with self.read() as txn:
            return int.from_bytes(txn.get(b"next_id", db=self.db("meta")), "big") - 1

    # ----------------------------------------------------------------- tables
    def save_table(self, name: str, table: np.ndarray) -> None:
        """Keep a float64 ``table`` under ``name``, replacing the one there."""
        data = np.ascontiguousarray(table, np.float64)
        value = msgpack.packb({"shape": list(data.shape), "crc": zlib.crc32(data),
                               "saved": time.time(), "data": data.tobytes()})
        self.write(lambda txn: txn.put(b"table:" + name.encode(), value, db=self.db("meta")))

    def load_table(self, name: str) -> np.ndarray | None:
        """The table kept under ``name``, in the shape it was kept in; None
        when there is none.  A damaged one raises ``CorruptPoolError``."""
        with self.read() as txn, self._damage_is_corruption():
            raw = txn.get(b"table:" + name.encode(), db=self.db("meta"))
            raw = None if raw is None else bytes(raw)
        if raw is None:
            return None
        try:
            info = msgpack.unpackb(raw)
            stored = tuple(info["shape"])
            table = np.frombuffer(info["data"], np.float64)
            shape_ok = (0 < len(stored) <= 4 and all(type(d) is int and d >= 0 for d in stored)
                        and table.size == int(np.prod(stored, dtype=object)))
            intact = zlib.crc32(table) == info["crc"]
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
            raise CorruptPoolError(f"{self.path}: unreadable table {name!r} ({e})") from e
        if not intact:
            raise CorruptPoolError(f"{self.path}: table {name!r} fails its checksum")
        if not shape_ok:
            raise CorruptPoolError(f"{self.path}: table {name!r} has a shape its data cannot "
                                   f"take ({list(stored)!r} for {table.size} values)")
        return table.reshape(stored).copy()

    # --------------------------------------------------------------- snapshot
    def snapshot(self, txn=None) -> Snapshot | None:
        """The snapshot's description (``records.Snapshot``), None when there is none.

        A description that fails its checksum or is unreadable is
        ``CorruptPoolError``; a segment entry that does not hold together is
        left out, named in ``refused``.
        """
        if txn is None:
            with self.read() as t:
                return self.snapshot(t)
        with self._damage_is_corruption():
            raw = txn.get(b"meta", db=self.db("snap"))
            if raw is None:
                return None
            raw = bytes(raw)
            crc = txn.get(b"meta_crc", db=self.db("snap"))
            if crc is not None and int.from_bytes(bytes(crc), "big") != zlib.crc32(raw):
                raise CorruptPoolError(f"{self.path}: the snapshot's description fails its "
                                       f"checksum")
            try:
                return Snapshot.parse(msgpack.unpackb(raw))
            except (ValueError, msgpack.UnpackException) as e:
                raise CorruptPoolError(f"{self.path}: unreadable snapshot description ({e})"
                                       ) from e

    def deletes(self, txn=None) -> int:
        """How many deleting transactions ran on this pool (a snapshot build
        that saw this change checks what it indexed)."""
        if txn is None:
            with self.read() as t:
                return self.deletes(t)
        return int.from_bytes(txn.get(b"deletes", db=self.db("meta")) or b"", "big")

    def forgets(self, txn=None) -> int:
        """How many ``forget`` deletions ran on this pool."""
        if txn is None:
            with self.read() as t:
                return self.forgets(t)
        return int.from_bytes(txn.get(b"forgets", db=self.db("meta")) or b"", "big")

    def update_segments(self, change: Callable) -> int:
        """Replace the snapshot's segments by ``change(current snapshot, txn)`` (a
        list of ``Segment``) in one transaction; returns the new generation."""
        return self.write(lambda txn: self._put_segments(txn, change(self.snapshot(txn), txn)))

    def _put_segments(self, txn, segments: list) -> int:
        snap = self.db("snap")
        generation = 1 + int.from_bytes(txn.get(b"snap_generation", db=self.db("meta")) or b"",
                                        "big")
        old = txn.get(b"meta", db=snap)
        if old is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError, msgpack.UnpackException):
                generation = max(generation, 1 + msgpack.unpackb(bytes(old))["generation"])
        txn.put(b"snap_generation", generation.to_bytes(8, "big"), db=self.db("meta"))
        folders = {seg.folder for seg in segments}
        with txn.cursor(db=snap) as cur:  # stamps of folders no longer named go too
            keys = [bytes(k) for k in cur.iternext(values=False) if bytes(k) not in (
                b"meta", b"meta_crc") and bytes(k)[len(_STAMP):].decode(errors="replace")
                not in folders]
        for key in keys:
            txn.delete(key, db=snap)
        meta = msgpack.packb({"generation": generation, "created": time.time(),
                              "segments": [seg.to_dict() for seg in segments]})
        txn.put(b"meta", meta, db=snap)
        txn.put(b"meta_crc", zlib.crc32(meta).to_bytes(4, "big"), db=snap)
        return generation

    def stamps(self, folder: str) -> dict | None:
        """What the last check of snapshot folder ``folder`` recorded (None: nothing)."""
        with self.read() as txn, self._damage_is_corruption():
            raw = txn.get(_STAMP + folder.encode(), db=self.db("snap"))
            raw = None if raw is None else bytes(raw)
        if raw is None:
            return None
        try:
            stamps = msgpack.unpackb(raw)
        except (ValueError, msgpack.UnpackException):
            return None  # unreadable: every file is checked again
        return stamps if isinstance(stamps, dict) else None

    def record_stamps(self, folder: str, stamps: dict) -> None:
        """Keep ``stamps`` of snapshot folder ``folder``, if the snapshot still names it."""
        value = msgpack.packb(stamps)

        def put(txn):
            snap = self.snapshot(txn)
            if snap is not None and any(seg.folder == folder for seg in snap.segments):
                txn.put(_STAMP + folder.encode(), value, db=self.db("snap"))

        if not self.readonly:
            self.write(put)

    @property
    def snapshot_folders(self) -> Path:
        """Where the snapshot files live: ``<pool>.snapshots/``."""
        return self.path.with_name(self.path.name + ".snapshots")

    # ------------------------------------------------------------ maintenance
    def stats(self) -> dict:
        namespaces: dict[str, dict] = {}
        sequences = tokens = 0
        damaged: list[int] = []
        for seq in self.sequences(with_tokens=False, damaged=damaged):
            ns = namespaces.setdefault(seq.namespace, {"sequences": 0, "tokens": 0})
            ns["sequences"] += 1
            ns["tokens"] += seq.length - seq.anchors
            sequences += 1
            tokens += seq.length - seq.anchors
        snap = self.snapshot()
        return {"path": str(self.path), "sequences": sequences, "tokens": tokens,
                "damaged_sequences": len(damaged),
                "namespaces": namespaces, "bytes_on_disk": self.disk_bytes(),
                "tokenizer": self.info["tokenizer"], "fingerprint": self.info["fingerprint"],
                "max_depth": self.max_depth, "format_version": self.info["version"],
                "snapshot_generation": snap.generation if snap else None,
                "snapshot_tokens": snap.tokens if snap else 0,
                "snapshot_segments": len(snap.segments) if snap else 0,
                "snapshot_age_s": round(time.time() - snap.created, 1) if snap else None}

    def disk_bytes(self) -> int:
        """Bytes on disk: the pool file and its snapshot files."""
        return self.path.stat().st_size + files.folder_bytes(self.snapshot_folders)

    def check(self) -> int:
        """Verify every sequence (decoding, count, checksum, token ids) and every
        snapshot segment (checksums, structure); returns how many sequences."""
        from suffixspec.pools.view import open_segment

        n = 0
        last = 0
        for seq in self.sequences():
            n += 1
            last = seq.seq_id
        if last > self.last_id():
            raise CorruptPoolError(f"{self.path}: sequence id {last} beyond next_id")
        snap = self.snapshot()
        if snap is not None:
            if snap.refused:
                raise CorruptPoolError(f"{self.path}: {'; '.join(snap.refused)}")
            for seg in snap.segments:
                try:
                    open_segment(self.snapshot_folders / seg.folder, seg, self.max_depth, None,
                                 None)
                except (OSError, ValueError) as e:
                    raise CorruptPoolError(f"{self.path}: snapshot segment {seg.folder}: {e}"
                                           ) from e
        return n

    def compact(self, timeout: float = 10.0) -> bool:
        """Rewrite the file without free pages, so deleted data is gone from disk.

        The new file replaces the old one only while no other process has it
        open (see ``suffixspec.pools.gate``): processes let go at their next pool
        operation and reopen the new file.  Returns False, leaving the file
        as it was and the compaction pending, when some process held on for
        ``timeout`` seconds.
        """
        # No write transaction of this process's other threads meanwhile; the
        # locks in the order every caller takes them (the last write takes both).
        with self.lock, self._file_lock:
            return self._compact(timeout)

    def _compact(self, timeout: float) -> bool:
        self.env  # noqa: B018 - this process is inside the gate
        if not self.gate.exclusive(timeout):
            return False
        try:
            tmp = self.path.with_name(self.path.name + ".compact")
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                self._env.copyfd(fd, compact=True)
                os.fsync(fd)
            finally:
                os.close(fd)
            self._env.close()
            self._env = None
            os.replace(tmp, self.path)
            # Nobody has the file open: a fresh lock file matches the new file.
            lock = self.path.with_name(self.path.name + "-lock")
            lock.unlink(missing_ok=True)
        finally:
            if self._env is not None:
                self._env.close()
                self._env = None
            self.gate.release()
        self.write(lambda txn: txn.delete(_COMPACT_PENDING, db=self.db("meta")))
        return True

    def remove_leftovers(self) -> None:
        """Delete what a compaction killed mid-way left beside the pool."""
        tmp = self.path.with_name(self.path.name + ".compact")
        if tmp.exists() and self.gate.idle():
            tmp.unlink(missing_ok=True)


_COMPACT_PENDING = b"compact_pending"
_STAMP = b"verified:"
_OUR_DBS = {b"meta", b"seqs", b"snap"}
_SHARED: dict[str, PoolStore] = {}
_SHARED_LOCK = threading.Lock()


def _let_go_when_asked(ref, stop: threading.Event) -> None:
    """Close the store's file whenever a compaction asks, until ``stop``."""
    while not stop.wait(WATCH_INTERVAL):
        store = ref()
        if store is None or store._watch_pid != os.getpid():
            return
        with store.lock:  # never during another call on the store
            if not stop.is_set():
                # Not while a writer thread holds the file: serving calls wait
                # for ``lock``, so this thread must never wait with it held.
                store.yield_to_compaction(wait=False)  # the next operation reopens
                store.clear_stale_readers()
        del store


def pool_file(path: str | Path) -> Path:
    """The file a pool path names, links followed; ``PoolError`` for what cannot
    be a pool file: anything but a regular file (looked at without opening
    it: a FIFO would block), or a file with another name (a hard link), which
    LMDB would lock under each name apart.  A path that names nothing (a
    dangling link too) is where the pool will be made."""
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real
    except OSError as e:
        raise PoolError(f"cannot use {path} as a pool ({e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise PoolError(f"{path} is {kind}, not a pool file; it was left untouched")
    if st.st_nlink > 1:
        raise PoolError(f"{path} has {st.st_nlink} names (hard links); a pool file must have "
                        f"one (each name would be locked apart and commits lost): remove the "
                        f"others, or reach it by a symbolic link")
    return real


def _open_lmdb(path: str, **options) -> lmdb.Environment:
    """``lmdb.open``, a new file made by LMDB's 0.9 engine whatever
    ``LMDB_DEFAULT_LIB_VERSION`` says (py-lmdb 3 opens an existing file with
    the engine that made it)."""
    if not os.path.exists(path):
        try:
            return lmdb.open(path, lib_version=0, **options)
        except TypeError:  # a py-lmdb with one engine
            pass
    return lmdb.open(path, **options)


def _refuse_foreign(path: Path) -> None:
    """Refuse a file that is not a suffixspec pool, before anything writes to it.

    The look is read-only and takes no lock, so nothing is left beside the
    file.  Without a lock it may catch a pool mid-write; only a file that is
    no LMDB file, or that twice shows names no pool has, is refused.
    """
    for attempt in range(2):
        try:
            env = _open_lmdb(str(path), subdir=False, readonly=True, lock=False, max_dbs=4)
        except lmdb.InvalidError as e:
            raise CorruptPoolError(f"{path} is not a suffixspec pool ({e})") from None
        except lmdb.Error:
            return  # the locked open that follows tells what is wrong
        try:
            if os.stat(path).st_size < (env.info()["last_pgno"] + 1) * env.stat()["psize"]:
                return  # truncated: the locked open refuses it without touching pages
            with env.begin() as txn:
                names = {bytes(k) for k in txn.cursor().iternext(values=False)}
        except lmdb.Error:
            return
        finally:
            env.close()
        names = {n.rstrip(b"\0") for n in names}  # LMDB 1.0 keeps a name's trailing NUL
        if names <= _OUR_DBS:
            return
        time.sleep(0.05)
    shown = ", ".join(sorted(repr(n)[2:-1] for n in names - _OUR_DBS)[:3])
    raise CorruptPoolError(f"{path} is an LMDB file of something else (it holds {shown}), "
                           f"not a suffixspec pool; it was left untouched")


def _records(items: Iterable[tuple], vocab_size: int | None) -> list[bytes]:
    """Stored records of ``(tokens, namespace, source, request_id[, added])``
    items; ``added`` (when the sequence was first stored) defaults to now.

    Tokens are leading start anchors, then vocabulary ids (below
    ``vocab_size`` when known); anything else is ``PoolError`` naming it.
    """
    now = time.time()
    values = []
    top = MAX_TOKEN_ID if vocab_size is None else min(MAX_TOKEN_ID, vocab_size - 1)
    for tokens, namespace, source, request_id, *added in items:
        check_namespace(namespace)
        tokens = np.ascontiguousarray(tokens, np.int32)
        data = tokens.tobytes()
        anchors = anchor_count(tokens)
        body = tokens[anchors:]
        bad = np.flatnonzero((body < 0) | (body > top))
        if bad.size:
            raise PoolError(f"token id {int(body[bad[0]])} is not a vocabulary id (0 to {top})")
        values.append(msgpack.packb({"ns": namespace, "src": str(source), "rid": str(request_id),
                                     "t": added[0] if added else now, "n": len(data) // 4,
                                     "a": anchors,
                                     "crc": _record_crc(data, namespace, anchors), "tok": data}))
    return values


def _checked_format(info: dict, path: Path) -> dict:
    if not isinstance(info, dict) or not {"tokenizer", "fingerprint", "max_depth"} <= set(info):
        raise CorruptPoolError(f"{path}: the format record is damaged")
    if info.get("version") != FORMAT_VERSION:
        raise CorruptPoolError(f"{path}: pool format version {info.get('version')}, this "
                               f"suffixspec reads version {FORMAT_VERSION}; `suffixspec export` "
                               f"with the release that wrote it, then `suffixspec ingest` the "
                               f"export into a new pool")
    return info


def _record_crc(data: bytes, namespace: str, anchors: int) -> int:
    """CRC-32 of a record's tokens, namespace and anchor count."""
    return zlib.crc32(data, zlib.crc32(f"{namespace}\0{anchors}".encode()))


def _decode(key, value, path, with_tokens=True) -> StoredSequence:
    seq_id = int.from_bytes(bytes(key), "big")
    try:
        rec = msgpack.unpackb(bytes(value))
        data = rec["tok"]
        if len(data) != 4 * rec["n"] or _record_crc(data, rec["ns"], rec["a"]) != rec["crc"]:
            raise ValueError("record fails its count or checksum")
        tokens = np.frombuffer(data, np.int32).copy() if with_tokens else None
        return StoredSequence(seq_id, rec["ns"], rec["src"], rec["rid"], rec["t"], rec["n"],
                              tokens, int(rec["a"]))
    except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException) as e:
        raise CorruptPoolError(f"{path}: sequence {seq_id} is corrupt ({e})") from e
