"""``FeederProcess``: the window feeder (``device.feeder``) in a process of its own.

Beside the worker in one interpreter, the feeder's Python holds the
interpreter lock while it runs, and the worker's host work waits for it
(``bench/feeder_bench.py`` measures by how much).  Here the feeder's work
runs in a child process, and the worker's process keeps only what cannot
move:

* the worker's calls (``add``, ``snapshot``, ``finished``, ``forget``,
  ``sent``) queue their jobs and return;
* a relay thread waits for each job's copy to the host (its event), then
  sends what the worker queued since its last send as one message through a
  pipe;
* ``take`` reads the child's replies (the step it handled, the payload
  buffer it packed) and waits, at most ``deadline``, for the previous step's.

The payload buffers are one shared file mapping (``/dev/shm`` where there is
one) that the child packs and the worker copies to the device.  A buffer has
one owner at a time, and ownership moves by message only: the child owns the
free ones; one it publishes is the worker's, until the worker frees it (once
its copy to the device is done, or at once when it takes a newer one).  So
nothing is written while it is read.  With no free buffer the child handles
the step but publishes nothing (``FeederStats.unpublished``).

The child builds the proposer itself from a picklable ``build`` (``ready``):
the pool, the kernels and the calibration live there, and the worker's
process never loads them.  It replies the token kinds the device's
calibration needs (``on_built``).  If the child dies, the worker goes on
without payloads (the device drafts from its own tiers), said once.  At
``close`` the child commits what requests in flight emitted and closes the
pool; if the worker's process dies first, the pipe closes and the child does
the same, then exits.

It has run on CPU tensors (tests, ``bench/feeder_bench.py --process``), not
yet on a GPU, where it waits on CUDA events in the relay thread and
registers the shared buffers as pinned memory for the copies: so
``Settings.device_feeder_process`` is off by default.
"""

from __future__ import annotations

import logging
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from suffixspec.device.feeder import FeederStats, WindowFeeder, hand_over, wait_for_step
from suffixspec.device.payload import Packer, PayloadSpec

#: Payload buffers: one being packed, one published, one being copied.
BUFFERS = 3
#: Seconds ``close`` waits for the child to commit what is in flight.
CLOSE_SECONDS = 30.0
#: The counters the child reports with every step (``FeederStats`` fields).
COUNTERS = ("snapshots", "rows", "windows_built", "paths_sent", "docs_sent", "published",
            "unpublished", "lost_requests", "stale_rows", "seconds", "cpu_seconds")


def shared_buffers(path: str, count: int, size: int) -> list[np.ndarray]:
    """``count`` int32 buffers of ``size`` over the file at ``path``, mapped shared
    (plain arrays: ``np.memmap``'s views cost more to make, and packing makes many)."""
    with open(path, "r+b") as f:
        whole = np.frombuffer(mmap.mmap(f.fileno(), count * size * 4), dtype=np.int32)
    return [whole[i * size:(i + 1) * size] for i in range(count)]


class _ChildFeeder(WindowFeeder):
    """The feeder as the child runs it: it packs only the buffers it owns."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.free = set(range(len(self.buffers)))

    def _claim(self) -> int | None:
        """The next free buffer in turn, as the feeder's thread takes them (so the
        two pack the same bytes into buffers of the same history)."""
        count = len(self.buffers)
        for i in range(count):
            b = (self._next + i) % count
            if b in self.free:
                self.free.discard(b)
                self._next = (b + 1) % count
                return b
        return None

    def counters(self) -> tuple:
        st = self.stats
        cross = self.proposer.cross if self.proposer is not None else None
        return tuple(getattr(st, name) for name in COUNTERS) + (
            int(cross.tokens) if cross is not None else -1,)


def _serve(jobs_in: Connection, replies: Connection) -> None:
    """The child: jobs in, payloads and replies out, until ``close`` or the worker is gone."""
    (path, count, spec, k, vocab_size, packer, params, branch_points, arbiter,
     logger_name) = jobs_in.recv()
    logger = logging.getLogger(logger_name)  # its lines to stderr, as the worker's would go
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s (feeder): %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    feeder = _ChildFeeder(spec, k, vocab_size, shared_buffers(path, count, spec.size), packer,
                          params, branch_points=branch_points, arbiter=arbiter, threaded=False,
                          logger=logger)
    if not _send(replies, ("started", os.getpid())):
        return
    handled = 0
    while True:
        batches, gone = [], False
        try:
            batches.append(jobs_in.recv())
            while jobs_in.poll():
                batches.append(jobs_in.recv())
        except (EOFError, OSError):  # the worker's process is gone: commit, then exit
            gone = True
        jobs, closing = [], gone
        for job in (j for batch in batches for j in batch):
            if job[0] == "free":
                feeder.free.add(job[1])
            elif job[0] == "build":
                proposer = _build(job[1], vocab_size, logger)
                if proposer is not None:
                    jobs.append(("ready", proposer))
                    closing |= not _send(replies, ("built", proposer.stats.kinds))
            elif job[0] == "close":
                closing = True
            else:
                handled += job[0] == "snapshot"
                jobs.append(job)
        step = feeder.handle(jobs) if jobs else None
        ready, feeder._ready = feeder._ready, None
        closing |= not _send(replies, ("done", step, handled, ready, feeder.counters()))
        if closing:
            feeder.close()
            _send(replies, ("closed", feeder.counters(), dict(feeder.stats.phase_cpu)))
            return


def _send(replies: Connection, msg: tuple) -> bool:
    """False when nobody reads the replies any more (the worker's process is gone)."""
    try:
        replies.send(msg)
    except OSError:
        return False
    return True


def _build(build, vocab_size: int, logger: logging.Logger):
    try:
        proposer = build()
    except Exception as exc:  # no proposer: the device drafts from its own tiers
        logger.warning("suffixspec: the feeder could not build its proposer; drafts come "
                       "from the device's own history: %r", exc, exc_info=exc)
        return None
    proposer.vocab_size = vocab_size
    return proposer


class FeederProcess:
    """``WindowFeeder``'s calls for the worker, the work in a child process (see
    the module docstring).  ``buffers``: the payload buffers, numpy views of
    the shared mapping, for the worker to copy from; ``on_built(kinds)``
    runs in the worker's thread (in ``take``) once the child built its
    proposer.  ``lockstep``: no relay thread; ``take`` sends what was queued
    since the last one and waits until the child has done it (as
    ``WindowFeeder``'s ``threaded=False``: replay and tests)."""

    def __init__(self, spec: PayloadSpec, k: int, vocab_size: int, packer: Packer,
                 params: list[float], branch_points: int = 4, arbiter: bool = True,
                 count: int = BUFFERS, logger: logging.Logger | None = None, on_built=None,
                 lockstep: bool = False):
        self.logger = logger or logging.getLogger("suffixspec.device")
        self.on_built = on_built
        self.proposer = None  # it lives in the child
        self.stats = FeederStats()
        self.cross_tokens = -1  # the child's pool's, as of its last reply (-1: none)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, self._path = tempfile.mkstemp(prefix="suffixspec-payloads-", dir=folder)
        os.ftruncate(fd, count * spec.size * 4)
        os.close(fd)
        self.buffers = shared_buffers(self._path, count, spec.size)
        # A child interpreter of its own (not multiprocessing's spawn, which imports
        # the caller's main module again): the pipes' ends passed as descriptors.
        jobs_in, jobs_out = os.pipe()
        replies_in, replies_out = os.pipe()
        package = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (package, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "suffixspec.device.feeder_process", str(jobs_in),
             str(replies_out)], pass_fds=(jobs_in, replies_out), stdin=subprocess.DEVNULL,
            env=env)
        os.close(jobs_in)
        os.close(replies_out)
        self._jobs_out = Connection(jobs_out, readable=False)
        self._replies = Connection(replies_in, writable=False)
        self._jobs_out.send((self._path, count, spec, k, vocab_size, packer, list(params),
                             branch_points, arbiter, self.logger.name))
        self._alive = True
        self._said = False
        self._done_step = 0
        self._snapshots_sent = 0
        self._handled = 0
        self._ready: tuple[int, int] | None = None  # (buffer, step): the newest published
        self._closed_stats: tuple | None = None
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._dones = 0  # the child's turns replied
        self._relay = None
        if not lockstep:
            self._relay = threading.Thread(target=self._run_relay,
                                           name="suffixspec-feeder-relay", daemon=True)
            self._relay.start()

    # ------------------------------------------------ from the worker thread
    def ready(self, build) -> None:
        """Build the proposer in the child with ``build`` (picklable, no arguments)."""
        self._put(("build", build))

    def add(self, req_id: str, slot: int, epoch: int, tokens, prompt_len: int,
            event=None) -> None:
        self._put(("add", req_id, slot, epoch, tokens, prompt_len, event))

    def forget(self, req_ids: list[str]) -> None:
        self._put(("forget", list(req_ids)))

    def snapshot(self, step: int, rows, req_ids: list[str], event) -> None:
        self._snapshots_sent += 1
        self._put(("snapshot", step, rows, list(req_ids), event))

    def finished(self, req_ids: list[str], tails, event) -> None:
        self._put(("finish", list(req_ids), tails, event))

    def pending_snapshots(self) -> int:
        """Snapshots sent and not yet handled (as of the child's last reply read)."""
        return self._snapshots_sent - self._handled

    def take(self, step: int, deadline: float) -> int | None:
        """As ``WindowFeeder.take``: the newest payload buffer published (None:
        nothing new), waiting at most ``deadline`` for step ``step - 1``'s."""
        if self._relay is None and self._send_queued():  # lockstep: the child's turn first
            dones = self._dones
            while self._alive and self._dones == dones:
                self._read(1.0)
        self._read(0.0)
        wait_for_step(self.stats, lambda: self._done_step < step - 1 and self._alive,
                      self._read, deadline)
        ready, self._ready = self._ready, None
        return hand_over(self.stats, ready, step)

    def sent(self, buffer: int, event) -> None:
        """The worker copied ``buffer``: the child may pack it again once ``event`` is done."""
        self._put(("free", buffer, event))

    def lag(self) -> dict:
        return self.stats.lag()

    def phases(self, steps: int) -> dict[str, float]:
        return self.stats.phases(steps)

    def close(self) -> None:
        """The child commits what is in flight and closes the pool (at most
        ``CLOSE_SECONDS``), then exits."""
        self._put(("close",))
        if self._relay is None:
            self._send_queued()
            self._jobs_out.close()
        else:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._relay.join(timeout=CLOSE_SECONDS)
        end = time.monotonic() + CLOSE_SECONDS
        while self._alive and self._closed_stats is None and time.monotonic() < end:
            self._read(min(end - time.monotonic(), 1.0), quiet=True)
        try:
            self._proc.wait(timeout=max(end - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            self.logger.warning("suffixspec: the feeder did not close in %.0f s; stopped",
                                CLOSE_SECONDS)
            self._proc.kill()
            self._proc.wait()
        self._replies.close()
        self._alive = False
        self._unlink()

    # ------------------------------------------------------------ internals
    def _put(self, job: tuple) -> None:
        with self._cond:
            self._queue.append(job)
            self._cond.notify()

    def _run_relay(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                stop = self._stop
            self._send_queued()
            if stop:
                self._jobs_out.close()
                return

    def _send_queued(self) -> bool:
        """The jobs queued, each one's copy waited for, sent as one message;
        False when there were none (or the child is gone)."""
        with self._cond:
            jobs = list(self._queue)
            self._queue.clear()
        if not jobs or not self._alive:
            return False
        try:
            self._jobs_out.send([_on_host(job) for job in jobs])
        except (OSError, ValueError) as exc:  # the child is gone
            self._gone(exc)
            return False
        return True

    def _read(self, timeout: float, quiet: bool = False) -> None:
        """The child's replies, waiting at most ``timeout`` for the first."""
        try:
            while self._replies.poll(timeout):
                timeout = 0.0
                self._reply(self._replies.recv())
        except (EOFError, OSError) as exc:
            if not quiet or self._closed_stats is None:
                self._gone(exc)
            self._alive = False

    def _reply(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "done":
            _, step, handled, ready, counters = msg
            self._dones += 1
            if step is not None:
                self._done_step = max(self._done_step, step)
            self._handled = handled
            if ready is not None:
                if self._ready is not None:  # never taken: the child's again
                    self._put(("free", self._ready[0], None))
                self._ready = ready
            self._count(counters)
        elif kind == "built":
            if self.on_built is not None:
                self.on_built(msg[1])
        elif kind == "closed":
            self._closed_stats = msg[1]
            self._count(msg[1])
            self.stats.phase_cpu = msg[2]
        elif kind == "started":
            self._unlink()  # both ends have it mapped: the name is not needed any more

    def _count(self, counters: tuple) -> None:
        for name, value in zip(COUNTERS, counters):
            setattr(self.stats, name, value)
        self.cross_tokens = counters[-1]

    def _gone(self, exc: BaseException) -> None:
        if self._alive and not self._said:
            self._said = True
            self.logger.warning("suffixspec: the feeder process stopped; drafts come from the "
                                "device's own history from now on: %r", exc)
        self._alive = False

    def _unlink(self) -> None:
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass


def _on_host(job: tuple) -> tuple:
    """``job`` as the child takes it: its host copy waited for, as numpy."""
    kind = job[0]
    if kind == "add":
        _, req_id, slot, epoch, tokens, prompt_len, event = job
        _wait(event)
        return ("add", req_id, slot, epoch, np.asarray(tokens), prompt_len, None)
    if kind == "snapshot":
        _, step, rows, req_ids, event = job
        _wait(event)
        return ("snapshot", step, np.asarray(rows), req_ids, None)
    if kind == "finish":
        _, req_ids, tails, event = job
        _wait(event)
        return ("finish", req_ids, np.asarray(tails), None)
    if kind == "free":
        _wait(job[2])
        return ("free", job[1])
    return job


def _wait(event) -> None:
    if event is not None:
        event.synchronize()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False),
           Connection(int(sys.argv[2]), readable=False))
