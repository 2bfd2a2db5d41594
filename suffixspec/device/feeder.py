"""``WindowFeeder``: the host's half of drafting on the device, in its own thread.

The worker thread (``DeviceDrafter``, ``device.drafter``) never drafts on the
host and never waits for the step in flight.  Each step it hands the feeder a
*snapshot* that the device wrote after drafting (per batch row: its slot,
length, tokens sampled, the draft and its calibration buckets, and the last
tokens), copied to a host buffer of its own behind an event.  The feeder,
one step behind:

1. waits for the snapshot's event (in this thread), catches each request's
   host tokens up (a row whose slot is not its request's is dropped and
   counted), lets calibration score the device's last draft
   (``SuffixProposer.adopt_drafts`` then ``extend``; the arbiter its pairs,
   ``adopt_pairs``), and commits finished requests to the pool;
2. builds the next windows of the step's requests (``candidate_windows``),
   the one-token paths that changed, the corpus documents of finished
   outputs and the family rows of requests that started, and packs them
   with the step's threshold, the calibration table's rows the scoring
   counted (``calibration.touched_rows``: the device's table follows the
   host's, a step behind) and the arbiter's choice per cell into a payload
   (``device.payload``);
3. publishes it: the worker's next step copies it to the device.

The heavy parts are Numba kernels that release the interpreter lock.  If the
feeder falls behind, windows go stale and drafts degrade; the GPU never
waits (the worker waits at most ``deadline`` seconds, for the previous step's
payload only).  ``threaded=False`` runs it in the caller's thread instead,
in lockstep (replay).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from suffixspec.device.payload import Packer, PayloadSpec, views
from suffixspec.device.spec import PAIR_FIELDS, family_row, host_params
from suffixspec.native import arbiter, calibration as cal
from suffixspec.native import layout as lay
from suffixspec.native.tokens import MAX_TOKEN_ID
from suffixspec.native.vllm_suffix import PROMPT_CONTEXT


# Snapshot columns (int32): then the last ``k + 1`` tokens, the draft's ``k``
# tokens and their ``k`` calibration buckets, the arbiter's pair
# (``PAIR_FIELDS``, then the pick's ``k`` tokens and the reference's).
S_SLOT, S_TOTAL, S_SAMPLED, S_CHOICE, S_VALID = range(5)
S_FIELDS = 5


def snapshot_columns(k: int) -> dict[str, slice]:
    """The snapshot's column ranges after ``S_FIELDS``, by name: what the worker
    writes (``device_speculator``) and the feeder reads."""
    widths = {"tail": k + 1, "draft": k, "buckets": k, "pair": PAIR_FIELDS,
              "pair_tokens": 2 * k}
    out, at = {}, S_FIELDS
    for name, width in widths.items():
        out[name] = slice(at, at + width)
        at += width
    return out


def snapshot_width(k: int) -> int:
    return snapshot_columns(k)["pair_tokens"].stop


@dataclass
class Followed:
    """What the feeder knows of one running request."""

    slot: int
    epoch: int
    prompt_len: int
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # room to grow
    length: int = 0
    started: bool = False  # the proposer holds it

    def all(self) -> np.ndarray:
        """Its tokens (a view: appending never writes over it)."""
        return self.buffer[:self.length]

    def append(self, tokens: np.ndarray) -> None:
        n = tokens.shape[0]
        if self.length + n > self.buffer.shape[0]:  # doubling: a step costs what it adds
            grown = np.empty(max(2 * self.buffer.shape[0], self.length + n, 64), np.int32)
            grown[:self.length] = self.buffer[:self.length]
            self.buffer = grown
        self.buffer[self.length:self.length + n] = tokens
        self.length += n


#: The feeder's work by phase (``FeederStats.phase_cpu``): waiting for a
#: snapshot's or tail's copy (CUDA spins, so it costs CPU), following requests
#: that start (indexing the prompt), catching each row's tokens up, indexing
#: them (one native call per pool), scoring the device's drafts and pairs,
#: committing finished requests, then packing: windows, one-token paths,
#: calibration (params, table, arbiter's choice) and corpus documents.
PHASES = ("wait", "add", "catch_up", "index", "score", "finish", "windows", "paths",
          "calibration", "docs")


@dataclass
class FeederStats:
    snapshots: int = 0
    rows: int = 0
    windows_built: int = 0
    paths_sent: int = 0
    table_rows_sent: int = 0
    forgets: int = 0  # forgets in the pool the device was told of
    docs_sent: int = 0
    families_sent: int = 0
    published: int = 0
    unpublished: int = 0  # steps handled with no free buffer to pack (``FeederProcess``)
    taken: int = 0
    waits_timed_out: int = 0
    wait_seconds: float = 0.0  # the worker's, in ``take``, for the previous step's payload
    lost_requests: int = 0  # gaps in a request's tokens: its windows stop
    stale_rows: int = 0  # snapshot rows whose slot is not their request's (dropped)
    seconds: float = 0.0      # wall time handling jobs
    cpu_seconds: float = 0.0  # this thread's CPU time doing it
    phase_cpu: dict = field(default_factory=dict)  # that CPU time by ``PHASES``
    ages: deque = field(default_factory=lambda: deque(maxlen=4096))  # steps, per taken payload

    def lag(self) -> dict:
        """Window age (steps between the snapshot a payload was built from and
        the step that used it), p50 and p99, how often a wait timed out, and the
        worker's milliseconds waiting per payload taken."""
        ages = np.asarray(self.ages) if self.ages else np.zeros(1)
        return {"age_p50": float(np.percentile(ages, 50)),
                "age_p99": float(np.percentile(ages, 99)),
                "waits_timed_out": self.waits_timed_out, "taken": self.taken,
                "wait_ms_per_take": round(1e3 * self.wait_seconds / max(self.taken, 1), 3)}

    def phases(self, steps: int) -> dict[str, float]:
        """The feeder's CPU milliseconds per step by phase (``PHASES``)."""
        return {p: round(1e3 * self.phase_cpu.get(p, 0.0) / max(steps, 1), 3) for p in PHASES}


def wait_for_step(stats: FeederStats, behind, wait, deadline: float) -> None:
    """While ``behind()``, ``wait(seconds left)``, at most ``deadline`` seconds in
    all: the worker's one wait for the feeder, counted in ``stats``."""
    if deadline <= 0 or not behind():
        return
    began = time.perf_counter()
    end = began + deadline
    while behind():
        left = end - time.perf_counter()
        if left <= 0:
            stats.waits_timed_out += 1
            break
        wait(left)
    stats.wait_seconds += time.perf_counter() - began


def hand_over(stats: FeederStats, ready: tuple[int, int] | None, step: int) -> int | None:
    """The buffer of ``ready`` (``(buffer, step built from)``, or None) for step
    ``step``, counted with its windows' age."""
    if ready is None:
        return None
    buffer, built = ready
    stats.taken += 1
    stats.ages.append(step - 1 - built)
    return buffer


class WindowFeeder:
    """See the module docstring.  ``buffers``: pinned host payload buffers
    (numpy int32 views, at least 2) the worker copies from; ``k`` the draft
    length; ``packer`` the payload's packer (it keeps the device corpus's ring
    bookkeeping); ``params`` the payload's initial params (float list);
    ``arbiter``: the device arbitrates (``Settings.device_arbiter``)."""

    def __init__(self, spec: PayloadSpec, k: int, vocab_size: int, buffers: list[np.ndarray],
                 packer: Packer, params: list[float], branch_points: int = 4,
                 arbiter: bool = True, threaded: bool = True,
                 logger: logging.Logger | None = None):
        self.spec = spec
        self.arbiter = arbiter
        self.k = k
        self.vocab_size = vocab_size
        self.packer = packer
        self.branch_points = branch_points
        self.buffers = [views(b, spec) for b in buffers]
        self._sent: list = [None] * len(buffers)  # per buffer: the event its last copy records
        for v in self.buffers:
            packer.clear(v)
            v["params"].view(np.float32)[:] = params
        # The calibration table's rows the device has yet to get: those the last
        # step's drafts touch (sent once scored), and those waiting for room.
        self._touched = np.zeros(0, np.int64)
        self._table_rows: deque = deque()
        # After a forget in the pool: the corpus ring and one-token path rows not
        # yet cleared on the device ([ring, paths]; None: nothing to clear).
        self._forgets = 0
        self._sweep: list[int] | None = None
        self.proposer = None
        self.requests: dict[str, Followed] = {}
        self.stats = FeederStats()
        self._jobs: deque = deque()
        self._cond = threading.Condition()
        self._ready: tuple[int, int] | None = None  # (buffer, step) published, not yet taken
        self._done_step = 0  # the last snapshot's step handled
        self._pending = 0  # snapshots queued, not yet handled
        self._next = 0  # the buffer packed next
        self._changed: list[np.ndarray] = []
        self._docs: deque = deque()
        self._families: deque = deque()  # requests whose family row is not yet sent
        self._pending_windows: list[str] = []  # the requests of the last snapshot
        self._turn = 0
        self._lap_at = 0.0
        self._warned = False
        self._stop = False
        self.logger = logger or logging.getLogger("suffixspec.device")
        self._thread = None
        if threaded:
            self._thread = threading.Thread(target=self._run, name="suffixspec-feeder",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------ from the worker thread
    def ready(self, proposer) -> None:
        """The kernels are ready: follow the requests with ``proposer``."""
        with self._cond:
            self._jobs.append(("ready", proposer))
            self._cond.notify()

    def add(self, req_id: str, slot: int, epoch: int, tokens, prompt_len: int,
            event=None) -> None:
        """A request took ``slot`` (a new one, or one resumed after preemption):
        ``tokens`` (its own host buffer, written once ``event`` is done) are its
        prompt and whatever it emitted before."""
        with self._cond:
            self._jobs.append(("add", req_id, slot, epoch, tokens, prompt_len, event))
            self._cond.notify()

    def forget(self, req_ids: list[str]) -> None:
        """These requests ended without a slot to read (preempted, then ended):
        nothing of them is learned."""
        with self._cond:
            self._jobs.append(("forget", list(req_ids)))
            self._cond.notify()

    def snapshot(self, step: int, rows, req_ids: list[str], event) -> None:
        """Step ``step``'s snapshot: ``rows`` (a host buffer of its own, numpy or a
        CPU tensor, written once ``event`` is done)."""
        with self._cond:
            self._jobs.append(("snapshot", step, rows, list(req_ids), event))
            self._pending += 1
            self._cond.notify()

    def pending_snapshots(self) -> int:
        """Snapshots queued and not yet handled."""
        return self._pending

    def finished(self, req_ids: list[str], tails, event) -> None:
        """These requests ended: ``tails`` (a host buffer of its own, written once
        ``event`` is done) holds per request its length, then its last tokens."""
        with self._cond:
            self._jobs.append(("finish", list(req_ids), tails, event))
            self._cond.notify()

    def take(self, step: int, deadline: float) -> int | None:
        """The payload buffer to copy to the device at step ``step``: the newest
        published (None: nothing new).  Waits at most ``deadline`` seconds for
        the previous step's snapshot to be handled.  Without a thread of its
        own (``threaded=False``: replay, lockstep) the feeder first does every
        job queued, in the caller's thread."""
        if self._thread is None:
            self._drain()
        with self._cond:
            wait_for_step(self.stats, lambda: self._done_step < step - 1 and not self._stop,
                          self._cond.wait, deadline)
            ready, self._ready = self._ready, None
        return hand_over(self.stats, ready, step)

    def sent(self, buffer: int, event) -> None:
        """The worker copied ``buffer``: it may be packed again once ``event`` is done."""
        self._sent[buffer] = event

    def close(self) -> None:
        """Stop, what is queued done first; then what requests in flight emitted
        (genuine model output) joins the pool, and the pool closes."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is None:
            self._drain()
        else:
            self._thread.join(timeout=10)
        prop = self.proposer
        if prop is not None:
            for req_id in list(prop.active_requests):
                prop.finish_request(req_id)
            prop.close()

    # ------------------------------------------------------- feeder thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                stop = self._stop
            self._drain()  # on close too: requests that finished just before it are committed
            if stop:
                return

    def _drain(self) -> None:
        """Do every job queued so far."""
        with self._cond:
            jobs = list(self._jobs)
            self._jobs.clear()
            self._pending -= sum(job[0] == "snapshot" for job in jobs)
        if not jobs:
            return
        last_step = self.handle(jobs)
        if last_step is not None:
            with self._cond:
                self._done_step = max(self._done_step, last_step)
                self._cond.notify_all()

    def handle(self, jobs: list) -> int | None:
        """Do ``jobs`` (as queued by the worker's calls), then publish a payload
        if a snapshot was among them; returns the newest snapshot's step.  The
        feeder thread's work, callable in any one thread (``bench/feeder_bench.py``
        replays recorded jobs through it)."""
        start = time.perf_counter()
        self._lap_at = cpu = time.thread_time()
        last_step = None
        try:
            for job in jobs:
                if job[0] == "snapshot":
                    last_step = job[1]
                getattr(self, "_on_" + job[0])(*job[1:])
            if last_step is not None:
                self._publish(last_step)
        except Exception as exc:  # the feeder must never stop serving
            self._failed(exc)
        self.stats.seconds += time.perf_counter() - start
        self.stats.cpu_seconds += time.thread_time() - cpu
        return last_step

    def _lap(self, phase: str) -> None:
        """This thread's CPU since the last lap goes to ``phase``."""
        now = time.thread_time()
        cpu = self.stats.phase_cpu
        cpu[phase] = cpu.get(phase, 0.0) + now - self._lap_at
        self._lap_at = now

    def _failed(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            self.logger.warning("suffixspec: the window feeder failed; drafts go on from the "
                           "device's own history until it recovers (later failures are not "
                           "logged): %r", exc, exc_info=exc)

    def _on_ready(self, proposer) -> None:
        self.proposer = proposer
        # A table loaded with the pool: the rows it holds, a payload's room at a time.
        self._table_rows.append(np.flatnonzero(proposer.stats.table.any(axis=1)))
        for req_id, rec in self.requests.items():
            self._start(req_id, rec)
        self._lap("add")

    def _start(self, req_id: str, rec: Followed) -> None:
        prop = self.proposer
        if prop is None or rec.started:
            return
        if req_id in prop.active_requests:
            prop.abort_request(req_id)
        prop.start_request(req_id, rec.all())
        rec.started = True
        if self.spec.window.family and prop.family_outputs(req_id):
            self._families.append(req_id)

    def _on_add(self, req_id, slot, epoch, tokens, prompt_len, event) -> None:
        if event is not None:
            event.synchronize()
        self._lap("wait")
        self._drop(req_id)  # resumed after preemption: starts over
        tokens = np.asarray(tokens, np.int32)
        if tokens.shape[0] and (tokens.min() < 0 or tokens.max() > MAX_TOKEN_ID):
            self.stats.lost_requests += 1  # not token ids: never followed
            return
        rec = Followed(slot, epoch, prompt_len)
        rec.append(tokens)
        self.requests[req_id] = rec
        self._start(req_id, rec)
        self._lap("add")

    def _catch_up(self, req_id: str, rec: Followed, total: int, tail: np.ndarray,
                  gains: list | None = None) -> bool:
        """Append what the request gained (the end of ``tail``); False when the
        tail does not reach back to what the feeder holds.  ``gains``: where
        the proposer's part goes, ``(req_id, tokens)``, for one batched call
        (else it is extended at once)."""
        gained = total - rec.length
        if gained <= 0:
            return gained == 0
        if gained > tail.shape[0]:
            return False
        new = tail[tail.shape[0] - gained:]
        if new.min() < 0 or new.max() > MAX_TOKEN_ID:  # not a token: this request alone goes
            return False
        if rec.started:
            if gains is None:
                self.proposer.extend(req_id, new)
            else:
                gains.append((req_id, new))
        before = max(rec.length - self.k, 0)
        rec.append(new)
        # The output grows in the pool: the one-token paths of its last tokens
        # change (a view: appending never writes over what it holds).
        self._changed.append(rec.buffer[before:rec.length])
        return True

    def _lose(self, req_id: str) -> None:
        self._drop(req_id)
        self.stats.lost_requests += 1

    def _drop(self, req_id: str) -> None:
        """Stop following ``req_id``; nothing of it is learned."""
        rec = self.requests.pop(req_id, None)
        if rec is not None and rec.started:
            self.proposer.abort_request(req_id)

    def _on_forget(self, req_ids) -> None:
        for req_id in req_ids:
            self._drop(req_id)
        self._lap("finish")

    def _on_snapshot(self, step, rows, req_ids, event) -> None:
        if event is not None:
            event.synchronize()  # this thread waits; the worker and the GPU go on
        rows = np.asarray(rows)  # a host buffer of its own (a torch tensor, or numpy)
        self._lap("wait")
        k = self.k
        self.stats.snapshots += 1
        col = snapshot_columns(k)
        live, rows_of, gains = [], [], []
        totals, sampled = rows[:, S_TOTAL].tolist(), rows[:, S_SAMPLED].tolist()
        slots = rows[:, S_SLOT].tolist()
        for i, req_id in enumerate(req_ids):
            rec = self.requests.get(req_id)
            if rec is None or sampled[i] == 0:
                continue  # unknown, or still in prefill
            if slots[i] != rec.slot:  # a row of another slot's request: never learned from
                self.stats.stale_rows += 1
                continue
            if not self._catch_up(req_id, rec, totals[i], rows[i, col["tail"]], gains):
                self._lose(req_id)
                continue
            if rec.started:
                live.append(req_id)
                rows_of.append(i)
        self._lap("catch_up")
        if gains:  # one native call per pool for the whole step
            self.proposer.extend_batch([r for r, _ in gains], [t for _, t in gains])
        # The last step's drafts are scored now: the rows they touch, to the device.
        self._table_rows.append(self._touched)
        self._touched = np.zeros(0, np.int64)
        self._lap("index")
        if live:  # calibration scores these drafts at the next tokens
            picked = rows[rows_of]
            drafts = np.ascontiguousarray(picked[:, col["draft"]])
            buckets = np.ascontiguousarray(picked[:, col["buckets"]])
            valid = np.ascontiguousarray(picked[:, S_VALID])
            self.proposer.adopt_drafts(live, drafts, buckets, valid.astype(np.int64))
            touched = np.empty(7 * buckets.size, np.int64)
            m = cal.touched_rows(buckets, drafts, np.ascontiguousarray(picked[:, col["tail"]][:, -1]),
                                 valid, self.proposer.stats.kinds, touched)
            self._touched = touched[:m]
        if live and self.arbiter:  # the arbiter scores the device's pairs at later tokens
            self.proposer.adopt_pairs(live, picked[:, col["pair"]],
                                      picked[:, col["pair_tokens"]].reshape(-1, 2, k))
        self.stats.rows += len(live)
        self._pending_windows = live
        self._lap("score")

    def _on_finish(self, req_ids, tails, event) -> None:
        if event is not None:
            event.synchronize()
        tails = np.asarray(tails)
        self._lap("wait")
        for i, req_id in enumerate(req_ids):
            rec = self.requests.get(req_id)
            if rec is None:
                continue
            if not self._catch_up(req_id, rec, int(tails[i, 0]), tails[i, 1:]):
                self._lose(req_id)
                continue
            del self.requests[req_id]
            if rec.started:
                self.proposer.finish_request(req_id)
            self._docs.append(rec.all()[max(rec.prompt_len - PROMPT_CONTEXT, 0):])
        self._lap("finish")

    def _claim(self) -> int | None:
        """The buffer to pack next (None: none is free; the step publishes nothing)."""
        b = self._next
        self._next = (b + 1) % len(self.buffers)
        event = self._sent[b]
        if event is not None:
            event.synchronize()  # its last copy to the device is done
        return b

    def _publish(self, step: int) -> None:
        """Pack the next payload into a free buffer and offer it to the worker."""
        b = self._claim()
        self._lap("wait")
        if b is None:
            self.stats.unpublished += 1
            return
        v = self.buffers[b]
        self.packer.clear(v)
        v["header"][0] = step
        prop = self.proposer
        live, self._pending_windows = self._pending_windows, []
        if prop is not None:
            self._pack_windows(v, live)
            self._pack_families(v)
            self._lap("windows")
            self._pack_paths(v)
            self._lap("paths")
            thr = max(cal.threshold(prop.stats.state), prop.min_token_prob)
            v["params"].view(np.float32)[:] = host_params(
                prop.stats.state, thr, prop.max_spec_factor, prop.max_spec_offset,
                prop.max_depth, prop.config.newest_window > 0,
                self.arbiter and prop.config.arbitrate)
            self._pack_table(v, prop.stats.table)
            v["prefer"][:] = arbiter.preferred(prop.pending.arbiter)
            self._lap("calibration")
            self._pack_forget(v, prop)
        while self._docs and self._sweep is None:  # taken first: one refused is not retried
            doc = self._docs.popleft()
            if not self.packer.put_doc(v, doc):  # the section is full: next step
                self._docs.appendleft(doc)
                break
            self.stats.docs_sent += 1
        self._lap("docs")
        with self._cond:
            self._ready = (b, step)
        self.stats.published += 1

    def _pack_forget(self, v, prop) -> None:
        """After a ``forget`` in the pool (the proposer saw it, ``forgets``): the
        device drops every family row at once, then the corpus ring and the
        one-token paths a payload's room at a time; documents wait until the
        ring is clear, those finished before the forget are dropped."""
        if prop.forgets != self._forgets:
            self._forgets = prop.forgets
            self._sweep = [0, 0]
            self._docs.clear()
            self._changed.clear()
            v["clear"][4] = 1
            self.stats.forgets += 1
        if self._sweep is None:
            return
        ring, paths = self._sweep
        ring_end, path_end = self.packer.capacity, self.vocab_size
        v["clear"][:4] = [ring, min(ring + self.spec.clear_ring, ring_end),
                          paths, min(paths + self.spec.clear_paths, path_end)]
        self._sweep = [min(ring + self.spec.clear_ring, ring_end),
                       min(paths + self.spec.clear_paths, path_end)]
        if self._sweep == [ring_end, path_end]:
            self._sweep = None
            self.packer.head = 0  # the ring is clear: documents start at its beginning

    def _pack_table(self, v, table: np.ndarray) -> None:
        """The table's rows waiting for the device, as many as a payload holds,
        with their values now."""
        if not self._table_rows:
            return
        rows = np.unique(np.concatenate(self._table_rows))
        self._table_rows.clear()
        room = self.spec.table_rows
        if rows.shape[0] > room:  # the rest next step
            self._table_rows.append(rows[room:])
            rows = rows[:room]
        m = rows.shape[0]
        v["table_idx"][:m] = rows
        v["table"].view(np.float32)[:m] = table[rows]
        self.stats.table_rows_sent += m

    def _pack_windows(self, v, live) -> None:
        # Those still followed (a request may have finished since its snapshot).
        live = [r for r in live if r in self.requests and self.requests[r].started]
        if len(live) > self.spec.rows:  # more than a payload holds: take turns
            at = self._turn % len(live)
            live = (live[at:] + live[:at])[:self.spec.rows]
            self._turn += self.spec.rows
        if not live:
            return
        u = len(live)
        slots = [self.requests[r].slot for r in live]
        epochs = [self.requests[r].epoch for r in live]
        staged = lay.windows(u, self.spec.window.rows, self.spec.window.width)
        self.proposer.candidate_windows(live, staged, self.branch_points)
        v["slots"][:u] = slots[:u]
        v["epochs"][:u] = epochs[:u]
        v["win_tokens"][:u] = staged.tokens
        v["win_c"][:u] = staged.c
        v["win_n"][:u] = staged.n
        v["win_meta"][:u] = staged.meta
        v["header"][1] = u
        self.stats.windows_built += u

    def _pack_families(self, v) -> None:
        """Family rows of requests that started, as many as the section holds."""
        prop = self.proposer
        width = self.spec.window.family
        while self._families:
            req_id = self._families[0]
            rec = self.requests.get(req_id)
            if rec is None or not rec.started or req_id not in prop.active_requests:
                self._families.popleft()  # gone since
                continue
            row = family_row(prop.family_outputs(req_id), width)
            if not self.packer.put_family(v, rec.slot, rec.epoch, row):
                return  # the section is full: next step
            self._families.popleft()
            self.stats.families_sent += 1

    def _pack_paths(self, v) -> None:
        if not self._changed:
            return
        tokens = np.unique(np.concatenate(self._changed))
        self._changed.clear()
        room = self.spec.paths
        if tokens.shape[0] > room:  # the rest next step
            self._changed.append(tokens[room:])
            tokens = tokens[:room]
        keys, t, c, n = self.proposer.one_token_paths(self.k, self.vocab_size, tokens)
        m = keys.shape[0]
        v["path_keys"][:m] = keys
        v["path_tokens"][:m] = t
        v["path_c"][:m] = c
        v["path_n"][:m] = n
        v["header"][2] = m
        self.stats.paths_sent += m

    def lag(self) -> dict:
        return self.stats.lag()

    def phases(self, steps: int) -> dict[str, float]:
        return self.stats.phases(steps)
