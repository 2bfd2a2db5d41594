"""``SuffixProposer``: the standalone proposer API over the two pools."""

from __future__ import annotations

import logging
import os
import threading
import time
from itertools import accumulate
from typing import Hashable, Sequence

import numpy as np

from suffixspec.anchors import MAX_ANCHORS, start_anchors
from suffixspec.config import ProposerConfig, check_namespace
from suffixspec.draft import Draft
from suffixspec.locking import locked
from suffixspec.native import arbiter, calibration as cal
from suffixspec.native.held import Holder, appending, hold, reading
from suffixspec.native import layout as lay
from suffixspec.native.warmup import SERVING, warmup
from suffixspec.native.propose import (DELTA_FULL, EXTENDED, LOCAL_FULL, learn_and_extend,
                                       propose_batch)
from suffixspec.native import union
from suffixspec.native.tokens import SYNTHETIC_BASE
from suffixspec.native.windows import build_batch as build_windows, one_token_paths
from suffixspec.pools.memory import CrossPool, RequestPool
from suffixspec.pools.store import FileBusy, PoolError
from suffixspec.pools.view import EMPTY_VIEW
from suffixspec.token_kinds import checked_kinds
from suffixspec.tokens import as_token_ids


_SOURCES = ("request", "cross", "anchor")
#: The calibration table (22 MB) goes to a persistent pool once this many
#: requests finished since the last save, and this many seconds passed: at
#: most once a minute however fast requests finish (each write grows the
#: file while readers hold its old pages), and at ``close``.
CALIBRATION_SAVE_EVERY = 16
CALIBRATION_SAVE_SECONDS = 60.0

logger = logging.getLogger(__name__)


def _distinct(req_ids) -> None:
    if len(set(req_ids)) != len(req_ids):
        raise ValueError("the same request appears twice in one call")


class SuffixProposer:
    """Drafts continuations from suffix tries over the request and past outputs.

    Settings come as a ``ProposerConfig`` or as its fields by keyword
    (``SuffixProposer(max_spec_tokens=8)``); see ``suffixspec.config`` for
    each one.  Besides them:

    pool:
        A persistent cross-request pool: a path (opened or created as a
        ``PersistentPool`` with ``tokenizer``; several proposers may open one
        file) or a pool object (``CrossPool`` or ``PersistentPool``).
        Replaces the in-memory pool.
    tokenizer:
        The ``TokenizerId`` of the engine's tokenizer, checked against a
        persistent pool's (needed to create one).
    pool_options:
        For a pool path, ``PersistentPool``'s options: ``refresh_interval``
        (seconds until others' commits are drafted from; 1 s),
        ``snapshot_every`` (committed tokens between snapshots), ``ttl``...
    token_kinds:
        The kind of each token id's text (``suffixspec.token_kinds.token_kinds``
        of the engine's tokenizer): the calibration then learns how each kind
        fares beside its bucket.  None: no kinds, as without a tokenizer.

    A proposer is safe to share between threads: each public call holds its
    lock, so calls run one at a time.
    """

    def __init__(self, config: ProposerConfig | None = None, *, pool=None, tokenizer=None,
                 pool_options: dict | None = None, token_kinds=None, **settings):
        config = ProposerConfig.from_settings(config, **settings)
        self.config = config
        self.max_depth = int(config.max_depth)
        self.max_spec_tokens = int(config.max_spec_tokens)
        self.max_spec_factor = config.spec_factor
        self.max_spec_offset = float(config.max_spec_offset)
        self.min_token_prob = config.token_prob_floor
        self.tree = bool(config.tree)
        self.namespace = config.namespace
        self.shared_namespace = config.shared_namespace
        self.knobs = lay.Knobs(self.max_depth, self.max_spec_factor, self.max_spec_offset,
                               self.min_token_prob, self.tree, bool(config.anchors),
                               int(config.newest_window), bool(config.arbitrate))
        self.stats = cal.new_stats(float(config.draft_cost),
                                   None if token_kinds is None else checked_kinds(token_kinds))
        # Calibration tables: the proposer's namespace's (``stats.table``) and
        # up to ``namespace_tables`` more, one per namespace, each with the
        # one threshold state; per table the (table, state) tuple the kernels take.
        self._table_index = {self.namespace: 0}
        self._stats_flats = [tuple(self.stats)]
        self._table_of: dict[Hashable, int] = {}  # req_id -> its table
        # What the step kernels take as one object each (``native.held``): per
        # table its ``Held``, and the indexes read and appended to.
        self._helds: dict[int, Holder] = {}
        self._reading, self._appending = Holder(reading), Holder(appending)
        # A ``StepCost`` or ``StepCostEstimator`` (``suffixspec.stepcost``): when
        # set, each step's draft cost follows it and the size of the batch.
        self.step_cost = None
        # When set, drafts stop before any token id at or past it (an engine's
        # vocabulary; a shared pool may hold another model's ids).
        self.vocab_size: int | None = None
        cross_tokens = config.cross_pool_tokens
        if isinstance(pool, (str, os.PathLike)):
            from suffixspec.pools.persistent import PersistentPool

            if tokenizer is None:
                raise ValueError("a pool path needs tokenizer=TokenizerId of the engine's "
                                 "tokenizer, so token ids of different tokenizers never mix")
            pool = PersistentPool(pool, tokenizer=tokenizer, max_depth=self.max_depth,
                                  max_tokens=cross_tokens, **(pool_options or {}))
        elif pool_options:
            raise ValueError("pool_options are for a pool path (a pool object has its own)")
        if pool is not None and pool.max_depth != self.max_depth:
            raise ValueError(f"pool has max_depth {pool.max_depth}, proposer has {self.max_depth}")
        if pool is None and cross_tokens != 0:
            pool = CrossPool(self.max_depth, cross_tokens, config.cross_pool_requests)
        self.cross = pool
        # a family's past outputs are kept where past outputs are
        self.requests = RequestPool(self.max_depth, keep_tokens=int(config.reuse_tokens),
                                    family_outputs=(0 if pool is None
                                                    else int(config.family_outputs)))
        self.reused_tokens = 0  # prompt tokens found indexed already (next turns)
        self.forgets = 0  # forgets in the cross pool seen (``_refresh_cross``)
        self._cross_forgets = getattr(self.cross, "forgets", 0)
        # One public call at a time; shared with the pool, whose own thread
        # may let go of the pool file between calls.
        self._lock = pool._lock if pool is not None else threading.RLock()
        if pool is not None:
            pool.want((self.namespace,) if self.shared_namespace is None
                      else (self.namespace, self.shared_namespace))
        self._cross_seq: dict[Hashable, int] = {}
        self._draw_from: dict[Hashable, tuple[str, ...]] = {}  # req_id -> namespaces
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        # Root rows per (namespaces, batch size), for one view and delta state.
        self._roots_for: tuple = (None, -1, None, {})
        self._no_roots = np.full((8, 1, 1 + lay.SEGMENTS), -1, np.int64)
        self._finished = 0
        self._saved_at = (0, time.monotonic())  # (finished, when) at the last save
        self._closed = False
        self._calibration_failed = False
        self._load_calibration()
        warmup(steps=SERVING)
        self._work_flat = lay.flat(lay.workspace(self.max_spec_tokens, self.min_token_prob))
        # The latest draft of each request (row: its sequence in the request
        # pool), scored against the emitted tokens by ``extend``.
        self.pending = lay.pending(64, self.max_spec_tokens)
        k = max(self.max_spec_tokens, 1)
        self._learn_scratch = (np.empty(k, np.int64), np.empty(k, np.bool_))
        self._one = (np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(2, np.int64))
        self._one_rows = np.zeros((3, 1), np.int64)  # ``_rows`` of one request
        self.outputs = lay.outputs(8, self.max_spec_tokens)
        self._default_limits = np.full(8, self.max_spec_tokens, np.int64)

    # ----------------------------------------------------------- lifecycle
    @locked
    def start_request(self, req_id: Hashable, prompt_token_ids, namespace: str | None = None,
                      draw_from: Sequence[str] | None = None,
                      anchors: np.ndarray | None = None) -> None:
        """Index the prompt of a new request.

        Its output will join ``namespace`` (default: the proposer's); it
        drafts from the namespaces in ``draw_from`` (default: its own plus the
        shared one).  ``anchors``: the output's start anchors when
        ``prompt_token_ids`` is only the end of the prompt (``anchors.start_anchors``
        of the whole; ``learn`` serves long prompts so).
        """
        if req_id in self.requests.requests:
            raise ValueError(f"request {req_id!r} is already active")
        prompt = as_token_ids(prompt_token_ids, "prompt_token_ids")
        own = self.namespace if namespace is None else check_namespace(namespace)
        if draw_from is None:
            draw = (own,) if self.shared_namespace in (None, own) else (own, self.shared_namespace)
        elif isinstance(draw_from, str):
            raise ValueError(f"draw_from must be a list of namespaces, not the string "
                             f"{draw_from!r}")
        else:
            draw = tuple(dict.fromkeys(check_namespace(ns) for ns in draw_from))
        draw = self._interned.setdefault(draw, draw)  # equal sets share one object
        if self.cross is not None:
            self.cross.want(draw)
        starts = family = None  # both only where past outputs are kept
        if self.cross is not None:
            starts = start_anchors(prompt) if anchors is None else _anchors(anchors)
            if starts.shape[0] > 1 and own in draw:
                family = (own, int(starts[1]))
        self.reused_tokens += self.requests.start(req_id, prompt, family, own)
        seq = self.requests.requests[req_id][1]
        if seq >= self._pending.n.shape[0]:
            self.pending = lay.pending(2 * seq + 2, self.max_spec_tokens, self._pending)
        self._pending.n[seq] = 0
        self._pending.recent[seq] = cal.RECENT_NONE
        self._pending.start[seq] = self.requests.index.seqs[seq, lay.SEQ_LEN]
        self._pending.keep_meta[seq, :, arbiter.K_START] = -1  # no kept drafts of another
        self._draw_from[req_id] = draw
        self._table_of[req_id] = self._table_for(own)
        if self.cross is not None:
            self._cross_seq[req_id] = self.cross.begin(own, starts)

    @locked
    def extend(self, req_id: Hashable, token_ids) -> None:
        """Append the tokens the engine emitted for ``req_id`` this step."""
        self._check_active(req_id)
        tokens = as_token_ids(token_ids)
        if tokens.shape[0] == 0:
            return
        if not tokens.flags.writeable:  # one kind of array: one compiled kernel
            tokens = tokens.copy()
        seqs, cross, offsets = self._one
        seqs[0] = self.requests.requests[req_id][1]
        handle = self._cross_seq.get(req_id)
        cross[0] = -1 if handle is None else self.cross.seq_of(handle)
        offsets[1] = tokens.shape[0]
        self._learn_and_index(self._table_of[req_id], seqs, cross, tokens, offsets)

    @locked
    def extend_batch(self, req_ids: Sequence[Hashable], token_ids: Sequence) -> None:
        """``extend`` for every request of an engine step, in one native call per pool.

        ``token_ids[i]`` are the tokens emitted for ``req_ids[i]``.  All input
        is validated before anything is appended.
        """
        b = len(req_ids)
        if len(token_ids) != b:
            raise ValueError(f"{len(token_ids)} token lists for {b} requests")
        if b <= 1:
            if b:
                self.extend(req_ids[0], token_ids[0])
            return
        _distinct(req_ids)
        rows = self._rows(req_ids)
        # One check of all the tokens at once: per-array checks cost more than the indexing.
        arrays = [t if isinstance(t, np.ndarray) else np.asarray(t) for t in token_ids]
        for a in arrays:
            if a.ndim != 1:
                raise ValueError(f"token_ids must be one-dimensional, got shape {a.shape}")
        arrays = [a for a in arrays if a.shape[0]] or [np.empty(0, np.int32)]
        offsets = np.fromiter(accumulate((len(t) for t in token_ids), initial=0), np.int64, b + 1)
        tokens = as_token_ids(np.concatenate(arrays))
        seqs = rows[1]
        table, groups = self._tables_of(req_ids)
        if groups is None:
            self._learn_and_index(table, seqs, rows[2], tokens, offsets)
            return
        for t, picked in groups:
            mine = np.where(picked, seqs, -1)  # -1: skipped
            cal.learn(self._stats_flats[t], self._pending_flat, mine, tokens, offsets,
                      *self._learn_scratch)
        self.requests.index.extend_many(seqs, tokens, offsets)
        if self.cross is not None:
            self.cross.delta.index.extend_many(rows[2], tokens, offsets)

    def _learn_and_index(self, table: int, seqs, cross, tokens, offsets) -> None:
        """Score the pending drafts of own sequences ``seqs`` with calibration
        ``table``, and index the emitted tokens in them and in the output
        sequences ``cross`` (-1: none): one native call, unless an index has
        to grow."""
        local = self.requests.index
        delta = local if self.cross is None else self.cross.delta.index  # no pool: all -1
        full = learn_and_extend(self._held(table),
                                self._appending(*local.extend_args(), *delta.extend_args()),
                                seqs, cross, tokens, offsets, *self._learn_scratch)
        if full == LOCAL_FULL:
            local.extend_many(seqs, tokens, offsets, resume=True)
        if full != EXTENDED and delta is not local:
            delta.extend_many(cross, tokens, offsets, resume=full == DELTA_FULL)

    @locked
    def finish_request(self, req_id: Hashable) -> None:
        """The request ended normally: its output stays in the cross pool, and
        its own trie waits a while for a request that continues it."""
        seq = self._end(req_id, keep=True)
        if seq is not None:
            self.cross.commit(seq, request_id=str(req_id))
        self._finished += 1
        if (self._finished - self._saved_at[0] >= CALIBRATION_SAVE_EVERY
                and time.monotonic() - self._saved_at[1] >= CALIBRATION_SAVE_SECONDS):
            self.save_calibration()

    @locked
    def save_calibration(self) -> bool:
        """Keep the calibration table in a persistent pool, so that an engine
        opening the pool next (after a restart, or a replica) drafts with what
        this one learned instead of learning it again.  Done once
        ``CALIBRATION_SAVE_EVERY`` requests finished and ``CALIBRATION_SAVE_SECONDS``
        passed since the last save, and at ``close``; the last process to save
        wins.  Returns whether it was kept; a pool that cannot take it is
        logged once and drafting goes on."""
        save = getattr(self.cross, "save_calibration", None)
        if save is None:
            return False
        self._saved_at = (self._finished, time.monotonic())
        try:
            save(self.stats.table)
        except FileBusy:
            return False  # a compaction holds the file: the next save keeps it
        except PoolError as e:
            if not self._calibration_failed:
                logger.warning("suffixspec: calibration not kept in the pool: %s", e)
            self._calibration_failed = True
            return False
        return True

    def _load_calibration(self) -> None:
        load = getattr(self.cross, "load_calibration", None)
        if load is None:
            return
        try:
            kept = load()
        except PoolError as e:
            logger.warning("suffixspec: the pool's calibration is not used (%s); it is "
                           "learned again", e)
            return
        if kept is None:
            return
        try:
            table = cal.upgrade_table(kept)
        except (ValueError, IndexError, TypeError):
            table = None
        problem = ("its layout is one this version does not know" if table is None
                   else cal.table_problem(table))
        if problem is not None:  # never drafted with, so never saved back
            logger.warning("suffixspec: the pool's calibration table is not used (%s); it is "
                           "learned again", problem)
            return
        self.stats.table[:] = table  # in place: the kernels hold this array

    def close(self) -> None:
        """Keep the calibration in a persistent pool and close the pool; the
        proposer drafts no more (every later call raises ``locking.Closed``).
        Also on leaving a ``with`` block.  Closing twice does nothing."""
        if self._closed:
            return
        self.save_calibration()
        with self._lock:
            self._closed = True
        close = getattr(self.cross, "close", None)
        if close is not None:
            close()  # not under the lock: a pool's writer thread takes it to finish

    def __enter__(self) -> SuffixProposer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @locked
    def abort_request(self, req_id: Hashable) -> None:
        """The request was cancelled: forget it entirely."""
        seq = self._end(req_id, keep=False)
        if seq is not None:
            self.cross.discard(seq)

    def _end(self, req_id: Hashable, keep: bool) -> int | None:
        """Retire or drop the request's own tree; returns its open cross-pool
        sequence, if any."""
        self._check_active(req_id)
        self._pending.n[self.requests.requests[req_id][1]] = 0
        if keep:
            self.requests.retire(req_id)
        else:
            self.requests.drop(req_id)
        self._draw_from.pop(req_id)
        self._table_of.pop(req_id)
        return self._cross_seq.pop(req_id, None)

    @locked
    def output_sequence(self, req_id: Hashable) -> int | None:
        """The handle of the cross-pool sequence an active request's output goes to
        (None: none)."""
        self._check_active(req_id)
        return self._cross_seq.get(req_id)

    @locked
    def discard_output(self, seq: int) -> None:
        """Take output sequence ``seq`` (a handle, see ``output_sequence``) out of
        the cross pool; if its request is still active, its output stops going there."""
        owner = next((r for r, s in self._cross_seq.items() if s == seq), None)
        if owner is not None:
            del self._cross_seq[owner]
        self.cross.discard(seq)

    @locked
    def index_memory(self) -> tuple[int, int]:
        """(bytes held, tokens indexed) of the cross-request pool (snapshot included)."""
        if self.cross is None:
            return 0, 0
        snapshot = sum(s.nbytes() for s in self.cross.view.segments)
        return self.cross.delta.index.memory_bytes() + snapshot, self.cross.tokens

    @property
    def active_requests(self):
        return self.requests.requests.keys()

    # ------------------------------------------------------------- drafting
    @locked
    def propose(self, req_ids: Sequence[Hashable],
                max_spec_tokens: int | Sequence[int] | None = None) -> list[Draft]:
        """One draft per request, computed in one native call (one per
        calibration table where the requests' namespaces have tables of their
        own, ``namespace_tables``).

        ``max_spec_tokens`` lowers the draft limit, for all requests (an int)
        or per request (a sequence as long as ``req_ids``); engines use it for
        the room left in the context window.
        """
        b = len(req_ids)
        if b == 0:
            return []
        if b > 1:
            _distinct(req_ids)
        if self.cross is not None:
            self._refresh_cross()  # first: a reload moves outputs to other delta sequences
        rows = self._rows(req_ids)
        limits = self._limits(max_spec_tokens, b)
        if self._out.n.shape[0] < b:
            self.outputs = lay.outputs(max(b, 2 * self._out.n.shape[0]), self.max_spec_tokens)
        out = self._out
        local = self.requests.index
        # The view owns every array its side table names; holding it for the
        # call keeps them mapped whatever the pool does meanwhile.
        view, delta, cross_roots = self._cross_args(req_ids)
        fit = getattr(self.step_cost, "admit", None)
        if fit is not None:
            self.stats.state[cal.ST_COST] = 0.0  # candidates; ``_fit`` prices the batch
        elif self.step_cost is not None:
            self.stats.state[cal.ST_COST] = self.step_cost.draft_cost(
                b, self.stats.state[cal.ST_DRAFTED])
        # Records as plain tuples (see ``native.layout``): typed faster per call.
        batch = (rows[1], rows[0], rows[2], limits, cross_roots)
        arrays = local.read_only_arrays()
        table, groups = self._tables_of(req_ids)
        if groups is None:
            propose_batch(self._reading(arrays, local.roots, view.table, delta), batch,
                          self._knobs_flat, self._held(table))
        else:  # one call per calibration table, the rows put back in order
            out = lay.outputs(b, self.max_spec_tokens)
            for t, picked in groups:
                rows_t = np.flatnonzero(picked)
                propose_batch(self._reading(arrays, local.roots, view.table, delta),
                              tuple(f[rows_t] for f in batch), self._knobs_flat, self._held(t))
                for whole, part in zip(out, self._out):
                    whole[rows_t] = part[:rows_t.shape[0]]
        tokens, parents, probs, n, score, match, source = out[:7]
        if self.vocab_size is not None:
            _stop_outside(tokens[:b], probs[:b], n[:b], score[:b], self.vocab_size)
        keep = None
        if fit is not None:
            keep, n, score = _fit(parents[:b], probs[:b], n[:b], score[:b], fit)
        lengths = n[:b].tolist()
        if not any(lengths):  # no draft at all: nothing to copy
            return [Draft(match_len=m) for m in match[:b].tolist()]
        # One copy of each output for the batch (the next step overwrites
        # them); each draft holds views of its rows.  Whole rows: a copy of a
        # part of a row costs twice as much.
        tokens, parents, probs = tokens[:b].copy(), parents[:b].copy(), probs[:b].copy()
        drafts = []
        for i, k in enumerate(lengths):
            if k == 0:
                drafts.append(Draft(match_len=int(match[i])))
                continue
            d = Draft(tokens[i, :k], parents[i, :k], probs[i, :k],
                      float(score[i]), int(match[i]), _SOURCES[source[i]])
            if keep is not None and not keep[i, :k].all():
                d = _subtree(d, keep[i, :k])
            drafts.append(d)
        return drafts

    @locked
    def candidate_windows(self, req_ids: Sequence[Hashable], windows: lay.Windows,
                          branch_points: int = 4) -> np.ndarray:
        """Candidate windows of ``req_ids`` (rows of ``windows``, see
        ``native.windows``): per request, the policy's best candidate from each
        place it draws from, continued past the cost cut, and branch windows
        at the best one's first ``branch_points`` branch points.  Returns how
        many windows each request has.  What the device drafts from
        (``suffixspec.device``); the pending drafts that ``extend`` scores are
        left as they are."""
        b = len(req_ids)
        if b == 0:
            return np.zeros(0, np.int64)
        if b > 1:
            _distinct(req_ids)
        if windows.tokens.shape[0] < b:
            raise ValueError(f"windows have {windows.tokens.shape[0]} rows for {b} requests")
        if self.cross is not None:
            self._refresh_cross()
        rows = self._rows(req_ids)
        view, delta, cross_roots = self._cross_args(req_ids)
        batch = (rows[1], rows[0], rows[2], self._limits(None, b), cross_roots)
        arrays, roots = self.requests.index.read_only_arrays(), self.requests.index.roots
        table, groups = self._tables_of(req_ids)
        if groups is None:
            return build_windows(arrays, roots, view.table, delta, batch, self._knobs_flat,
                                 self._stats_flats[table], self._pending_flat, self._work_flat,
                                 tuple(windows), int(branch_points))
        counts = np.zeros(b, np.int64)
        for t, picked in groups:  # one call per calibration table, rows put back in order
            rows_t = np.flatnonzero(picked)
            part = tuple(np.ascontiguousarray(a[rows_t]) for a in windows)
            counts[rows_t] = build_windows(arrays, roots, view.table, delta,
                                           tuple(f[rows_t] for f in batch), self._knobs_flat,
                                           self._stats_flats[t], self._pending_flat,
                                           self._work_flat, part, int(branch_points))
            for whole, a in zip(windows, part):
                whole[rows_t] = a
        return counts

    def _refresh_cross(self) -> None:
        """Pick up the cross pool's news; after a ``forget`` there, drop what this
        proposer keeps of finished requests in memory (their trees, the family
        outputs): whatever was forgotten is drafted by no one from then on.
        ``forgets`` counts the forgets seen (drafting on the device clears its
        pool tiers when it grows)."""
        self.cross.refresh()
        seen = getattr(self.cross, "forgets", 0)
        if seen != self._cross_forgets:
            self._cross_forgets = seen
            self.requests.forget_finished()
            self.forgets += 1

    @locked
    def family_outputs(self, req_id: Hashable) -> tuple[np.ndarray, ...]:
        """The family outputs (``family_outputs``) that ``req_id``'s own tree
        indexes beside its tokens, oldest first: what the device's family row
        holds (``device.layout.family_row``)."""
        self._check_active(req_id)
        return self.requests.family_of(req_id)

    @locked
    def one_token_paths(self, width: int, vocab_size: int, tokens=None,
                        namespace: str | None = None):
        """The cross pool's most frequent continuation (``width`` tokens, with
        counts) of single tokens in ``namespace`` (default: the proposer's):
        of ``tokens`` (say, those of a newly committed output: only their paths
        changed), or of every token id below ``vocab_size`` it holds.  See
        ``native.windows.one_token_paths``.  Returns ``(keys, tokens, c, n)``,
        a row per token."""
        wanted = (np.zeros(0, np.int64) if tokens is None
                  else np.unique(np.asarray(tokens, np.int64)))
        wanted = wanted[(wanted >= 0) & (wanted < vocab_size)]
        pool = self.cross
        rows = wanted.shape[0] if tokens is not None else vocab_size
        keys = np.zeros(rows, np.int32)
        out = [np.full((rows, width), -1, np.int32), np.zeros((rows, width), np.int32),
               np.zeros((rows, width), np.int32)]
        if pool is None or rows == 0:
            return keys[:0], *(a[:0] for a in out)
        self._refresh_cross()
        view, delta = pool.view, pool.delta
        ns = self.namespace if namespace is None else namespace
        roots = np.concatenate([[delta.root(ns)], view.roots(ns)]).astype(np.int64)
        sides = np.concatenate([union.table([delta.index.read_only_arrays()]), view.table])
        count = one_token_paths(sides, roots, self.max_depth, wanted,
                                np.zeros(vocab_size, np.bool_), keys, *out)
        return keys[:count], *(a[:count] for a in out)

    @locked
    def adopt_drafts(self, req_ids: Sequence[Hashable], tokens: np.ndarray, buckets: np.ndarray,
                     n: np.ndarray) -> None:
        """The engine verifies these path drafts (drafted on the device from this
        proposer's windows) instead of this proposer's own: ``extend`` scores
        them, row ``i`` for ``req_ids[i]``: its first ``n[i]`` ``tokens`` with
        their calibration ``buckets``."""
        pend = self._pending
        k = pend.tokens.shape[1]
        b = len(req_ids)
        if b == 0:
            return
        seqs = self._rows(req_ids)[1]
        w = min(k, tokens.shape[1], buckets.shape[1])
        m = np.minimum(np.asarray(n, np.int64)[:b], w)
        keep = np.arange(w)[None, :] < m[:, None]  # each row's first m: the rest as it was
        pend.n[seqs] = m
        pend.tokens[seqs, :w] = np.where(keep, tokens[:b, :w], pend.tokens[seqs, :w])
        pend.buckets[seqs, :w] = np.where(keep, buckets[:b, :w], pend.buckets[seqs, :w])
        pend.parents[seqs, :w] = np.where(keep, np.arange(-1, w - 1)[None, :],
                                          pend.parents[seqs, :w])
        index = self.requests.index  # the drafts follow each context's last token
        length = index.seqs[seqs, lay.SEQ_LEN].astype(np.int64)
        ends = index.seqs[seqs, lay.SEQ_OFF].astype(np.int64) + np.maximum(length, 1)
        pend.last[seqs] = np.where(length > 0, index.arena[ends - 1], -1)

    @locked
    def adopt_pairs(self, req_ids: Sequence[Hashable], pairs: np.ndarray,
                    tokens: np.ndarray) -> None:
        """The arbiter's side of ``adopt_drafts``: drafting on the device kept a
        pair of drafts per row (``device.draft_ref``, ``StepOutputs.pair`` and
        ``pair_tokens``: the cell, -1 for none, the pick's length and the
        reference's; the pick's tokens then the reference's), drafted at each
        request's context as it is now.  Scores the requests' earlier pairs
        that the context has gone past, then keeps these (``native.arbiter``);
        ``arbiter.preferred`` of the table is what the device reads next."""
        b = len(req_ids)
        if b == 0:
            return
        pairs = np.ascontiguousarray(pairs[:b], np.int64)
        tokens = np.ascontiguousarray(tokens[:b], np.int64)
        if pairs.ndim != 2 or pairs.shape[1] < 3 or tokens.ndim != 3 or tokens.shape[1] != 2:
            raise ValueError(f"pairs {pairs.shape} and tokens {tokens.shape} do not hold a "
                             f"cell and two lengths, and two drafts, per request")
        seqs = self._rows(req_ids)[1]
        index = self.requests.index
        offsets = index.seqs[seqs, lay.SEQ_OFF].astype(np.int64)
        lengths = index.seqs[seqs, lay.SEQ_LEN].astype(np.int64)
        pend = self._pending
        thr = max(float(cal.threshold(self.stats.state)), self.min_token_prob)
        arbiter.adopt(pend.arbiter, pend.keep_meta, pend.keep_tokens, seqs, index.arena, offsets,
                      lengths, thr, pairs, tokens)

    # ------------------------------------------------------------ internals
    # Records the kernels take, with their plain tuples (see ``native.layout``)
    # kept beside them so a step builds none.
    @property
    def knobs(self) -> lay.Knobs:
        return self._knobs

    @knobs.setter
    def knobs(self, knobs: lay.Knobs) -> None:
        self._knobs, self._knobs_flat = knobs, tuple(knobs)

    @property
    def pending(self) -> lay.Pending:
        return self._pending

    @pending.setter
    def pending(self, pending: lay.Pending) -> None:
        self._pending, self._pending_flat = pending, tuple(pending)

    @property
    def outputs(self) -> lay.Outputs:
        return self._out

    @outputs.setter
    def outputs(self, out: lay.Outputs) -> None:
        self._out, self._out_flat = out, tuple(out)

    def _held(self, table: int):
        """The ``Held`` of calibration ``table`` with today's outputs, pending
        drafts and workspace (made again after one of them was replaced)."""
        held = self._helds.get(table)
        if held is None:
            held = self._helds[table] = Holder(hold)
        return held(self._stats_flats[table], self._out_flat, self._pending_flat,
                    self._work_flat)

    def _cross_args(self, req_ids):
        """The cross pool's view (its snapshot segments), its delta's arrays, and
        each request's roots in them (``(b, namespaces, 1 + SEGMENTS)``).

        Root rows are kept per view and delta state; a batch whose requests
        all draw from the same namespaces (the usual case) is one lookup.
        """
        b = len(req_ids)
        pool = self.cross
        if pool is None:
            if self._no_roots.shape[0] < b:
                self._no_roots = np.full((2 * b, 1, 1 + lay.SEGMENTS), -1, np.int64)
            return EMPTY_VIEW, self.requests.index.read_only_arrays(), self._no_roots[:b]
        view, delta = pool.view, pool.delta
        held_view, held_gen, held_delta, cache = self._roots_for
        if held_view is not view or held_delta is not delta or held_gen != delta.generation:
            cache = {}
            self._roots_for = (view, delta.generation, delta, cache)
        draws = [self._draw_from[r] for r in req_ids]
        first = draws[0]
        key = (first, b) if draws.count(first) == b else None  # the cache keys by equality too
        roots = cache.get(key) if key is not None else None
        if roots is None:
            width = max(1, max(len(d) for d in draws))
            roots = np.full((b, width, 1 + lay.SEGMENTS), -1, np.int64)
            for i, d in enumerate(draws):
                for j, ns in enumerate(d):
                    roots[i, j, 0] = delta.root(ns)
                    roots[i, j, 1:] = view.roots(ns)
            if key is not None:
                if len(cache) > 256:
                    cache.clear()
                cache[key] = roots
        return view, delta.index.read_only_arrays(), roots

    def _check_active(self, req_id: Hashable) -> None:
        if req_id not in self.requests.requests:
            raise ValueError(f"unknown request {req_id!r}: not started, or already finished")

    def _row(self, req_id: Hashable) -> tuple[int, int, int]:
        """(tree, sequence) in the request pool and its cross-pool sequence (-1: none)."""
        try:
            tree, seq = self.requests.requests[req_id]
        except (KeyError, TypeError):
            raise ValueError(f"unknown request {req_id!r}: not started, or already finished") from None
        handle = self._cross_seq.get(req_id)
        return tree, seq, -1 if handle is None else self.cross.seq_of(handle)

    def _rows(self, req_ids: Sequence[Hashable]) -> np.ndarray:
        """``_row`` of each request, in one pass: ``(3, b)`` int64, each field
        contiguous (a column of a ``(b, 3)`` array is strided, which Numba types
        apart from a single request's contiguous one: kernels would compile a
        second time at the first step with two requests).  Valid until the
        next call: one request's rows are written into the same record each
        time."""
        own = self.requests.requests
        handles = self._cross_seq
        seq_of = self.cross.seq_of if handles else None
        try:
            if len(req_ids) == 1:  # the usual case at low load: into one reused record
                r = req_ids[0]
                tree, seq = own[r]
                one = self._one_rows
                one[0, 0], one[1, 0] = tree, seq
                one[2, 0] = -1 if seq_of is None or (h := handles.get(r)) is None else seq_of(h)
                return one
            trees, seqs, cross = [], [], []
            for r in req_ids:
                tree, seq = own[r]
                trees.append(tree)
                seqs.append(seq)
                cross.append(-1 if seq_of is None or (h := handles.get(r)) is None
                             else seq_of(h))
        except (KeyError, TypeError):
            for r in req_ids:
                self._row(r)  # raises, naming the request
            raise
        # One flat list to numpy: a nested one costs twice as much per step.
        return np.array(trees + seqs + cross, np.int64).reshape(3, len(seqs))

    @locked
    def calibration_table(self, namespace: str | None = None) -> np.ndarray:
        """The calibration table (``native.calibration``) that drafts of
        ``namespace``'s requests (default: the proposer's) are scored by and
        learn in; a namespace that has none yet is the proposer's."""
        ns = self.namespace if namespace is None else check_namespace(namespace)
        return self._stats_flats[self._table_index.get(ns, 0)][0]

    def _table_for(self, namespace: str) -> int:
        """The calibration table of ``namespace``'s requests: its own, made
        empty on first use while fewer than ``namespace_tables`` namespaces
        have one, else the proposer's namespace's."""
        t = self._table_index.get(namespace)
        if t is None:
            if len(self._stats_flats) > self.config.namespace_tables:
                return 0
            t = self._table_index[namespace] = len(self._stats_flats)
            self._stats_flats.append((cal.new_table(), self.stats.state, self.stats.kinds))
        return t

    def _tables_of(self, req_ids) -> tuple[int, list | None]:
        """``(table, None)`` when every request of ``req_ids`` drafts with one
        calibration table (the usual case), else ``(-1, [(table, mask), ...])``."""
        if len(self._stats_flats) == 1:
            return 0, None
        of = self._table_of
        tables = [of[r] for r in req_ids]
        first = tables[0]
        if all(t == first for t in tables):
            return first, None
        tables = np.array(tables)
        return -1, [(int(t), tables == t) for t in np.unique(tables)]

    def _limits(self, max_spec_tokens, b: int) -> np.ndarray:
        if max_spec_tokens is None:
            if self._default_limits.shape[0] < b:
                self._default_limits = np.full(2 * b, self.max_spec_tokens, np.int64)
            return self._default_limits[:b]
        if np.isscalar(max_spec_tokens):
            limits = np.full(b, max_spec_tokens)
        else:
            limits = np.asarray(max_spec_tokens)
            if limits.shape != (b,):
                raise ValueError(f"max_spec_tokens has {limits.size} limits for {b} requests")
        if limits.dtype.kind not in "iu":
            raise ValueError(f"max_spec_tokens must be integers, got {limits.dtype}")
        if b and limits.min() < 0:
            raise ValueError("max_spec_tokens must not be negative")
        return np.minimum(limits, self.max_spec_tokens).astype(np.int64)


def _stop_outside(tokens, probs, n, score, vocab_size: int) -> None:
    """Cut each row (in place) before its first token id at or past ``vocab_size``."""
    slots = np.arange(tokens.shape[1])[None, :]
    outside = (tokens >= vocab_size) & (slots < n[:, None])
    if not outside.any():
        return
    rows = np.flatnonzero(outside.any(axis=1))
    n[rows] = outside[rows].argmax(axis=1)  # a prefix is a tree: parents come first
    score[rows] = np.where(slots < n[rows, None], probs[rows], 0.0).sum(axis=1)


def _fit(parents, probs, n, score, admit):
    """What a stepped step cost admits of a batch's drafts (rows of the
    kernel's outputs): the ``admit(b, probs)`` likeliest tokens of the batch
    (ties to the earlier token, so a parent before its child), each kept only
    with its parent.  Returns ``(keep, n, score)``: the kept tokens, and per
    row the tokens to take and their score, for rows that keep a prefix (a
    path always does); other rows keep their ``n`` and go by ``keep``."""
    b, width = probs.shape
    slots = np.arange(width)[None, :]
    drafted = slots < n[:, None]
    flat = np.where(drafted, probs, -np.inf).ravel()
    order = np.argsort(-flat, kind="stable")[:int(drafted.sum())]
    budget = admit(b, flat[order])
    if budget >= order.shape[0]:
        return None, n, score
    keep = np.zeros(b * width, bool)
    keep[order[:budget]] = True
    keep = keep.reshape(b, width)
    rows = np.arange(b)[:, None]
    while True:  # a token whose parent went goes too (rare: a child is no likelier)
        orphan = keep & (parents >= 0) & ~keep[rows, np.maximum(parents, 0)]
        if not orphan.any():
            break
        keep &= ~orphan
    kept = keep.sum(axis=1)
    prefix = (keep == (slots < kept[:, None])).all(axis=1)
    n = np.where(prefix, kept, n)
    score = np.where(prefix, np.where(slots < kept[:, None], probs, 0.0).sum(axis=1), score)
    return keep, n, score


def _subtree(d: Draft, keep: np.ndarray) -> Draft:
    """``d`` without the tokens ``keep`` drops (parents precede children)."""
    index = np.cumsum(keep) - 1
    parents = d.parents[keep]
    parents = np.where(parents >= 0, index[np.maximum(parents, 0)], -1).astype(np.int32)
    probs = d.probs[keep]
    return Draft(d.token_ids[keep], parents, probs, float(probs.sum()), d.match_len, d.source)


def _anchors(anchors) -> np.ndarray:
    """Anchors a caller passes: start anchors as ``start_anchors`` makes them."""
    a = np.asarray(anchors)
    if (a.ndim != 1 or not 1 <= a.shape[0] <= MAX_ANCHORS or a.dtype.kind not in "iu"
            or np.any(a < SYNTHETIC_BASE) or np.any(a >= 1 << 31)):
        raise ValueError("anchors must be start anchors (anchors.start_anchors)")
    return a.astype(np.int32)
