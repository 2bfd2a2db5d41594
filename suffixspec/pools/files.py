"""A snapshot index as files: one raw array per file, described by dtype, shape and checksum.

A snapshot folder holds ``meta``, ``nodes``, ``hkeys``, ``hvals``, ``arena``,
``seqs`` and ``roots`` as ``<name>.bin`` (the arrays of
``SuffixIndex.to_arrays``, raw, native byte order).  Their description lives
in the pool file, so a folder is only used by the pool that names it.
Arrays are written streaming (``Writer``), read as read-only memory maps, and
checked against their size and checksum before any kernel sees them: the
kernels index them without bounds checks.  A file that has not been written
since its last check (same size, inode and file times, ``VERIFIED``) is not
read again, so reopening a large pool costs no checksum.  The checksum is XXH3-64
(``xxhash``), which checks a map several times faster than CRC-32, so a large
pool opens quickly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import shutil
import threading
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
    """XXH3-64 of a file's bytes, read through a memory map (no copy)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return xxhash.xxh3_64_intdigest(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return xxhash.xxh3_64_intdigest(m)


def sync_folder(folder: Path) -> None:
    """Make a folder's entries (new files, renames) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: In a snapshot folder: the files whose checksum was verified, with their
#: size, inode, mtime and ctime then.  A file whose stat is unchanged since
#: has not been written through the file system, so it is not read again.
VERIFIED = ".verified"

#: A stamp is kept only for a file last changed this long before: file times
#: tick coarsely, so a write just after a check could leave them unchanged.
RACY_S = 2.0


def open_arrays(folder: Path, described: dict, check: bool = True) -> dict[str, np.ndarray]:
    """Read-only memory maps of a snapshot folder's arrays.

    Raises ``ValueError`` naming the file when one has another size or (with
    ``check``) fails its checksum; ``FileNotFoundError`` when one is gone.
    A file is checked only if it was written since its last check
    (``VERIFIED``), which then records it.
    """
    folder = Path(folder)
    stamps = _read_stamps(folder) if check else {}
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
        if check and stamps.get(name) != stamp:
            if file_checksum(path) != checksum:
                raise ValueError(f"{path} fails its checksum")
            if time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
                fresh[name] = stamp
        if size == 0:
            out[name] = np.zeros(shape, dt)
        else:
            out[name] = np.memmap(path, dt, "r", shape=tuple(shape)).view(np.ndarray)
    if fresh:
        _write_stamps(folder, {**stamps, **fresh})
    return out


def _read_stamps(folder: Path) -> dict:
    try:
        stamps = json.loads((folder / VERIFIED).read_text())
        return stamps if isinstance(stamps, dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: every file is checked


def _write_stamps(folder: Path, stamps: dict) -> None:
    """Record verified files, if the folder can be written (a reader's may not)."""
    tmp = folder / f"{VERIFIED}.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(stamps, f)
        os.replace(tmp, folder / VERIFIED)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


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
