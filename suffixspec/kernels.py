"""Getting the Numba kernels ready without making an engine wait.

A process with Numba's on-disk cache filled loads every kernel in about a
second (``from_cache``).  With an empty cache, compiling takes about a minute
on a 2-core machine; ``BackgroundStart`` does it beside an engine's own
start-up, in a child process (its own interpreter, so the compile holds no
lock of the engine's), then loads the result and hands over to what needs
the kernels.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Callable

from suffixspec.native import warmup
from suffixspec.native.warmup import STEPS, NotCached

#: The step whose kernel takes longest to compile (about half of all).
LONGEST = "drafting"


def _child(steps, stderr=subprocess.DEVNULL) -> subprocess.Popen | None:
    """A child process compiling the kernels of ``steps`` into Numba's cache
    (None where no process can be started)."""
    code = f"from suffixspec.native.warmup import warmup; warmup(steps={tuple(steps)!r})"
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    except OSError:
        return None


def from_cache(steps=STEPS) -> bool:
    """Load the kernels of ``steps`` from Numba's on-disk cache; False
    (compiling nothing more) when one is not there."""
    try:
        warmup(cached_only=True, steps=steps)
    except NotCached:
        return False
    return True


def compile_on_two_cores(steps=STEPS, progress=None) -> float:
    """``warmup(progress, steps=steps)``, faster when the cache is cold.

    What the cache holds is loaded.  When the drafting kernel must compile,
    a child process compiles it while this one compiles the rest; this one
    then loads it from the cache (or compiles it, if the child could not
    write the cache).  Returns the seconds it took.
    """
    t0 = time.perf_counter()
    if from_cache(steps):
        return time.perf_counter() - t0
    child = None
    if LONGEST in steps and not from_cache((LONGEST,)):
        child = _child((LONGEST,))
    warmup(progress, steps=[s for s in steps if s != LONGEST or child is None])
    if child is not None:
        if progress is not None:
            progress(LONGEST)
        child.wait()
        warmup(steps=steps)
    return time.perf_counter() - t0


class BackgroundStart:
    """Compile the kernels in a child process, load them here, then call ``then(seconds)``.

    Where the cache cannot be written (the child's work is lost) the kernels
    compile in this process's thread instead.  ``stop`` ends it early (the
    child is killed; Numba writes cache files whole, by rename) and ``then``
    is not called.  A failure is logged on ``logger`` and ``then`` is not
    called.
    """

    def __init__(self, then: Callable[[float], None], logger: logging.Logger):
        self._then = then
        self._logger = logger
        self._stopped = threading.Event()
        self._child: subprocess.Popen | None = None
        self._thread = threading.Thread(target=self._run, name="suffixspec-kernels", daemon=True)

    def start(self) -> BackgroundStart:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for it; True when it is over."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._compile_in_child()
            if self._stopped.is_set():
                return
            warmup()  # loads what the child cached, compiles what it could not
            if not self._stopped.is_set():
                self._then(time.perf_counter() - t0)
        except Exception as exc:  # never raised into the engine: it serves without drafts
            self._logger.error("suffixspec: the kernels could not be made ready, so nothing "
                               "is drafted: %r", exc, exc_info=exc)

    def _compile_in_child(self) -> None:
        self._child = _child(STEPS, stderr=subprocess.PIPE)
        if self._child is None:
            self._logger.info("suffixspec: compiling in this process (no child process)")
            return
        _, err = self._child.communicate()
        if self._child.returncode != 0 and not self._stopped.is_set():
            last = (err.strip().splitlines() or ["no message"])[-1]
            self._logger.info("suffixspec: compiling in this process (the child process "
                              "failed: %s)", last)
