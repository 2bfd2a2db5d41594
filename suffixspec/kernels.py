"""Getting the Numba kernels ready without making an engine wait.

A process with Numba's on-disk cache filled loads every kernel in about a
second (``from_cache``).  With an empty cache, compiling takes about a minute
on a 2-core machine; ``BackgroundStart`` does it beside an engine's own
start-up, in child processes (interpreters of their own, so the compile
holds no lock of the engine's; one per core, the longest step alone), then
loads the result and hands over to what needs the kernels.  Only the
serving steps (``warmup.SERVING``) compile before the first draft; the rest
compile on first use.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

from suffixspec.native import warmup
from suffixspec.native.warmup import SERVING, NotCached

#: The step whose kernel takes longest to compile (over half of the serving steps').
LONGEST = "drafting"


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def step_groups(steps, n: int) -> list[tuple[str, ...]]:
    """``steps`` in at most ``n`` groups to compile side by side: ``LONGEST``
    alone, the others shared round-robin among the rest (each in order)."""
    if n <= 1 or not steps:
        return [tuple(steps)]
    rest = [s for s in steps if s != LONGEST]
    groups = [(LONGEST,)] if LONGEST in steps else []
    lanes = max(1, n - len(groups))
    return groups + [tuple(rest[i::lanes]) for i in range(min(lanes, len(rest)))]


#: How much lower a background compile runs than the engine beside it (``os.nice``).
BACKGROUND_NICE = 10


def _child(steps, stderr=subprocess.DEVNULL, nice: int = 0) -> subprocess.Popen | None:
    """A child process compiling the kernels of ``steps`` into Numba's cache,
    ``nice`` lower than this one (None where no process can be started)."""
    code = f"from suffixspec.native.warmup import warmup; warmup(steps={tuple(steps)!r})"
    if nice:
        code = f"import os; os.nice({nice}); " + code
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    except OSError:
        return None


def from_cache(steps=SERVING) -> bool:
    """Load the kernels of ``steps`` from Numba's on-disk cache; False
    (compiling nothing more) when one is not there."""
    try:
        warmup(cached_only=True, steps=steps)
    except NotCached:
        return False
    return True


def compile_in_parallel(steps=SERVING, progress=None) -> float:
    """``warmup(progress, steps=steps)``, faster when the cache is cold.

    What the cache holds is loaded.  The steps still to compile are split
    into groups (``step_groups``, one per core): child processes compile all
    groups but the last, which this process compiles meanwhile; it then
    loads the children's kernels from the cache (or compiles them, where a
    child could not write the cache).  Returns the seconds it took.
    """
    t0 = time.perf_counter()
    if from_cache(steps):
        return time.perf_counter() - t0
    cold = [s for s in steps if not from_cache((s,))]
    *others, own = step_groups(cold, cores())
    children = [c for c in (_child(group) for group in others) if c is not None]
    warmup(progress, steps=own)
    for group, child in zip(others, children):
        if progress is not None:
            for step in group:
                progress(step)
        child.wait()
    warmup(steps=steps)
    return time.perf_counter() - t0


class BackgroundStart:
    """Compile the kernels of ``steps`` in child processes, load them here, then
    call ``then(seconds)``.

    The children (``step_groups``, one per core) have interpreters of their
    own, so the compile holds no lock of the engine's, and run
    ``BACKGROUND_NICE`` lower, so the engine's own start comes first.  Where the cache cannot
    be written (a child's work is lost) the kernels compile in this
    process's thread instead.  ``stop`` ends it early (the children are
    killed; Numba writes cache files whole, by rename) and ``then`` is not
    called.  A failure is logged on ``logger`` and ``then`` is not called.
    """

    def __init__(self, then: Callable[[float], None], logger: logging.Logger, steps=SERVING):
        self._then = then
        self._logger = logger
        self._steps = tuple(steps)
        self._stopped = threading.Event()
        self._children: list[subprocess.Popen] = []
        self._thread = threading.Thread(target=self._run, name="suffixspec-kernels", daemon=True)

    def start(self) -> BackgroundStart:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        for child in list(self._children):
            if child.poll() is None:
                child.kill()
        self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for it; True when it is over."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._compile_in_children()
            if self._stopped.is_set():
                return
            warmup(steps=self._steps)  # loads what the children cached, compiles what they could not
            if not self._stopped.is_set():
                self._then(time.perf_counter() - t0)
        except Exception as exc:  # never raised into the engine: it serves without drafts
            self._logger.error("suffixspec: the kernels could not be made ready, so nothing "
                               "is drafted: %r", exc, exc_info=exc)

    def _compile_in_children(self) -> None:
        started = []
        for group in step_groups(self._steps, cores()):
            if self._stopped.is_set():
                break
            err = tempfile.TemporaryFile("w+")  # not a pipe: a child never blocks on it
            child = _child(group, stderr=err, nice=BACKGROUND_NICE)
            if child is None:
                err.close()
                self._logger.info("suffixspec: compiling in this process (no child process)")
                continue
            self._children.append(child)
            started.append((child, err))
        for child, err in started:
            child.wait()
            if child.returncode != 0 and not self._stopped.is_set():
                err.seek(0)
                last = (err.read().strip().splitlines() or ["no message"])[-1]
                self._logger.info("suffixspec: compiling in this process (a child process "
                                  "failed: %s)", last)
            err.close()
