"""``Gate``: lets one process replace a pool file while others have it open.

Compaction rewrites a pool into a new file and swaps it in.  A process that
still had the old file open would go on using LMDB's shared lock file, whose
transaction state no longer matches the new file, and could wipe the pool.
So the swap happens only while no other process has the file open:

* Every process holds a shared lock on the *gate* (a byte of ``POOL-gate``)
  while its LMDB environment is open.  It takes the gate through a
  *turnstile* (another byte), so a waiting compaction holds new entrants back.
* A compaction takes the turnstile exclusively, bumps a request counter
  stored in the file, and waits for the gate exclusively.  Processes see the
  counter change at their next pool operation, close their environment and
  queue at the turnstile; they enter again once the new file is in place.

Locks are open-file-description locks (``F_OFD_SETLK``, Linux): each is held
by the descriptor that took it, so closing another descriptor of the gate
file in the same process (a second handle on the pool, refused or closed)
leaves it in place, and the kernel drops it when its process dies, so a
killed process never blocks a compaction.  Where the kernel has no such
locks, POSIX record locks (``fcntl.lockf``) stand in; those are held per
process, and closing any descriptor of the file drops them all.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from pathlib import Path

_OFD = hasattr(fcntl, "F_OFD_SETLK")
_SHARED, _EXCLUSIVE, _FREE = fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK
_LOCKF = {_SHARED: fcntl.LOCK_SH, _EXCLUSIVE: fcntl.LOCK_EX, _FREE: fcntl.LOCK_UN}


def _lock(fd: int, kind: int, offset: int, wait: bool = True) -> None:
    """Lock (or free) byte ``offset`` of ``fd``; without ``wait``, ``OSError``
    when another holder conflicts."""
    if _OFD:
        # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
        arg = struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, arg)
    else:
        fcntl.lockf(fd, _LOCKF[kind] | (0 if wait else fcntl.LOCK_NB), 1, offset)

_TURNSTILE = 0  # byte offsets of the two locks
_GATE = 1
_COUNTER = 8    # 8-byte counter of compaction requests


class Gate:
    def __init__(self, pool_path: Path):
        self.path = pool_path.with_name(pool_path.name + "-gate")
        self._fd: int | None = None
        self._pid: int | None = None
        self.seen = 0  # the request counter when this process entered

    def _file(self) -> int | None:
        if self._fd is None or self._pid != os.getpid():
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError:
                # A read-only folder: no process can compact here.
                self._fd = None
            self._pid = os.getpid()
        return self._fd

    def enter(self, wait: bool = True) -> bool:
        """Take the gate (shared) through the turnstile; during a compaction,
        wait for its end, or (``wait`` False) return False at once."""
        fd = self._file()
        if fd is None:
            return True
        try:
            _lock(fd, _SHARED, _TURNSTILE, wait)
        except OSError:
            return False
        try:
            _lock(fd, _SHARED, _GATE)
            # Read while the turnstile keeps a compaction from asking: a request
            # made after this must look new to ``requested``.
            self.seen = self._counter(fd)
        finally:
            _lock(fd, _FREE, _TURNSTILE)
        return True

    def leave(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            _lock(self._fd, _FREE, _GATE)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)  # drops this descriptor's locks
        self._fd = None

    def requested(self) -> bool:
        """Has a compaction asked everyone to let go since this process entered?"""
        fd = self._fd if self._pid == os.getpid() else None
        return fd is not None and self._counter(fd) != self.seen

    def exclusive(self, timeout: float) -> bool:
        """Become the only process past the gate; False if others hold on past ``timeout``.

        On True the caller holds the turnstile and the gate exclusively until
        ``release``.  The caller's own environment must be closed before it
        replaces the file.
        """
        fd = self._file()
        if fd is None:
            return False
        _lock(fd, _EXCLUSIVE, _TURNSTILE)
        self.seen = self._counter(fd) + 1
        os.pwrite(fd, self.seen.to_bytes(8, "little"), _COUNTER)
        deadline = time.monotonic() + timeout
        while True:
            try:
                _lock(fd, _EXCLUSIVE, _GATE, wait=False)
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    _lock(fd, _SHARED, _GATE)  # back to an ordinary holder
                    _lock(fd, _FREE, _TURNSTILE)
                    return False
                time.sleep(0.01)

    def release(self) -> None:
        """End an exclusive hold; the caller enters again like anyone else."""
        fd = self._file()
        if fd is None:
            return
        _lock(fd, _FREE, _GATE)
        _lock(fd, _FREE, _TURNSTILE)

    def idle(self) -> bool:
        """True when no compaction is running (used to clean up its leftovers)."""
        fd = self._file()
        if fd is None:
            return False
        try:
            _lock(fd, _EXCLUSIVE, _TURNSTILE, wait=False)
        except OSError:
            return False
        _lock(fd, _FREE, _TURNSTILE)
        return True

    @staticmethod
    def _counter(fd: int) -> int:
        return int.from_bytes(os.pread(fd, 8, _COUNTER).ljust(8, b"\0"), "little")
