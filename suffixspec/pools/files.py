"""A snapshot index as files: one raw array per file, described by dtype, shape and checksum.

A snapshot folder holds ``meta``, ``nodes``, ``hkeys``, ``hvals``, ``arena``,
``seqs`` and ``roots`` as ``<name>.bin`` (the arrays of
``SuffixIndex.to_arrays``, raw, native byte order).  Their description lives
in the pool file, so a folder is only used by the pool that names it.
Arrays are written streaming (``Writer``), read as read-only memory maps, and
checked against their size and checksum before any kernel sees them (and
their structure, ``validate``): the kernels index them without bounds
checks.  A file that has not been written since its last check (same size,
inode and file times, as stamped in the pool file) is not read again, so
reopening a large pool costs no checksum.  The checksum is XXH3-64
(``xxhash``), which checks a map several times faster than CRC-32, so a large
pool opens quickly.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import shutil
import time
from pathlib import Path

import numpy as np
import xxhash


class Writer:
    """Append arrays to a new file (mode 0600), keeping the checksum of what was written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._f = open(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")
        self._hash = xxhash.xxh3_64()
        self.bytes = 0

    def write(self, a: np.ndarray) -> None:
        data = np.ascontiguousarray(a).data
        self._f.write(data)
        self._hash.update(data)
        self.bytes += data.nbytes

    @property
    def checksum(self) -> int:
        return self._hash.intdigest()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        self._f.flush()
        if exc[0] is None:
            os.fsync(self._f.fileno())
        self._f.close()


def save(path: Path, a: np.ndarray) -> list:
    """Write one array; returns its description ``[dtype, shape, checksum]``."""
    with Writer(path) as w:
        w.write(a)
    return [a.dtype.str, list(a.shape), w.checksum]


def describe(path: Path, dtype, shape) -> list:
    """The description of an array already in ``path`` (its checksum read back)."""
    return [np.dtype(dtype).str, list(shape), file_checksum(path)]


def file_checksum(path: Path) -> int:
    """XXH3-64 of a file's bytes, read through a memory map (no copy), a piece at
    a time (other threads run between pieces)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return xxhash.xxh3_64_intdigest(b"")
        h = xxhash.xxh3_64()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            for lo in range(0, size, _PIECE):
                h.update(view[lo:lo + _PIECE])
            del view
        return h.intdigest()


_PIECE = 1 << 23


def sync_folder(folder: Path) -> None:
    """Make a folder's entries (new files, renames) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: A file's stamp is kept only once it was last changed this long before: file
#: times tick coarsely, so a write just after a check could leave them unchanged.
RACY_S = 2.0


def open_arrays(folder: Path, described: dict,
                stamps: dict | None = None) -> tuple[dict[str, np.ndarray], set[str], dict]:
    """Read-only memory maps of a snapshot folder's arrays, checked.

    ``stamps`` name files checked before: ``name -> [size, inode, mtime,
    ctime, checksum]``.  A file whose stat and checksum are as stamped is not
    read; every other one is checked against its checksum.  Returns the
    arrays, the names checked now, and the stamps of those (the ones last
    changed more than ``RACY_S`` ago) to keep.  Raises ``ValueError`` naming
    the file when one has another size or fails its checksum,
    ``FileNotFoundError`` when one is gone.
    """
    folder = Path(folder)
    stamps = stamps or {}
    checked: set[str] = set()
    fresh = {}
    out = {}
    for name, (dtype, shape, checksum) in described.items():
        path = folder / f"{name}.bin"
        dt = np.dtype(dtype)
        size = int(np.prod(shape)) * dt.itemsize
        st = os.stat(path)
        if st.st_size != size:
            raise ValueError(f"{path} has {st.st_size} bytes, its description says {size}")
        stamp = [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, checksum]
        if stamps.get(name) != stamp:
            if file_checksum(path) != checksum:
                raise ValueError(f"{path} fails its checksum")
            checked.add(name)
            if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
                fresh[name] = stamp
        if size == 0:
            out[name] = np.zeros(shape, dt)
        else:
            out[name] = np.memmap(path, dt, "r", shape=tuple(shape)).view(np.ndarray)
    return out, checked, fresh


@contextlib.contextmanager
def folder_lock(root: Path, wait: bool = True):
    """Hold the lock of the snapshot folders under ``root`` (created 0700); yields its fd.

    One snapshot is written at a time, and only the lock's holder removes
    folders.  Processes that inherit the fd hold the lock with it, so a
    build's workers keep it while they run.  With ``wait`` False, yields
    None at once when another process holds it.
    """
    root.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


def remove_except(root: Path, keep) -> list[str]:
    """Remove every snapshot folder under ``root`` but those named in ``keep`` (hold ``folder_lock``).

    Those are replaced segments and builds cut short.  A process that still
    maps a replaced snapshot keeps reading it: the files go once it lets go.
    Returns the names removed.
    """
    gone = []
    for entry in root.iterdir():
        if entry.is_dir() and entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry.name)
    return gone


def folder_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 when it does not exist)."""
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
