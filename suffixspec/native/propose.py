"""One engine step: drafts for a batch of requests, from every pool, in one call.

Indexes of three kinds take part: ``local`` holds one tree per request;
``delta`` and the ``segs`` hold cross-request trees (a pool's appendable
part and a persistent pool's read-only snapshot segments, ``union``; any of
them may be a stand-in with no roots).  Which
trees each request reads is in the ``Batch`` record; drafts follow the
calibrated policy (``calibrated``).  Synthetic tokens (``tokens.SYNTHETIC_BASE`` and above) mark output starts; no
draft ever holds one.
"""

import numpy as np
from numba import njit

from . import calibrated, calibration as cal, trie
from .layout import (SEQ_LEN, SEQ_OFF, Batch, Candidate, Heap, Index, Knobs, Merged, Outputs,
                     Pending, Stats, Workspace)
from .union import FIELDS, put


@njit(cache=True, nogil=True)
def propose_batch(reading, batch, knobs, held):
    """``propose`` with its records passed as plain tuples in the records' field order.

    Numba types a plain tuple of arrays several times faster than a
    namedtuple on every call, so records cross the Python boundary plain and
    are named again here; those that stay from step to step come as one
    object each (``held``): the indexes (``held.Reading``: ``segs`` is the
    snapshot segments' side table, ``union``) and the calibration, outputs,
    pending drafts and workspace (``held.Held``).
    """
    work = held.work
    propose(Index(*reading.local), reading.roots, reading.segs, Index(*reading.delta),
            Batch(*batch), Knobs(*knobs), Stats(*held.stats), Outputs(*held.out),
            Pending(*held.pending),
            Workspace(Candidate(*work[0]), Heap(*work[1]), Merged(*work[2]), work[3],
                      Candidate(*work[4])))


@njit(cache=True, nogil=True)
def side_tables(local, segs, delta):
    """The side tables of a step (``union``): the requests' own trees (one side),
    and the cross pool's in-memory part then its snapshot segments ``segs``."""
    mine = np.empty((1, FIELDS, 3), np.int64)
    put(mine, 0, local)
    cross = np.empty((1 + segs.shape[0], FIELDS, 3), np.int64)
    put(cross, 0, delta)
    for k in range(segs.shape[0]):  # loops, not a slice copy: that compiles a costly error path
        for f in range(FIELDS):
            for j in range(3):
                cross[1 + k, f, j] = segs[k, f, j]
    return mine, cross


@njit(cache=True)
def state_of(local, pending, s):
    """The calibration state (``calibration.request_state``) of the request in
    own sequence ``s``: how its last draft fared, how far into its output it is."""
    return cal.request_state(pending.recent[s], local.seqs[s, SEQ_LEN] - pending.start[s])


@njit(cache=True, nogil=True)
def step_threshold(stats, knobs):
    """The probability a drafted token must beat this step: the cost threshold,
    at least the floor ``knobs.min_prob``."""
    thr = cal.threshold(stats.state)
    if knobs.min_prob > thr:
        thr = knobs.min_prob
    return thr


@njit(cache=True, nogil=True)
def propose(local, local_roots, segs, delta, batch, knobs, stats, out, pending, work):
    """Draft for every request of a step, from its own tree and cross trees.

    A draft holds at most ``batch.limits[i]`` tokens: tokens while their
    probability beats ``max(threshold(state), min_prob)``, at most
    ``match_len * factor + offset`` of them when ``factor >= 0``.  Drafts are
    rows of ``out``, and are kept as the request's pending draft (row
    ``batch.seqs[i]``), which ``calibration.learn`` scores against the
    emitted tokens.
    """
    mine, cross = side_tables(local, segs, delta)
    thr = step_threshold(stats, knobs)
    for i in range(batch.seqs.shape[0]):
        s = batch.seqs[i]
        calibrated.draft_request(i, state_of(local, pending, s), thr, local, local_roots, delta,
                                 (mine, cross), batch, knobs, stats, out, work, pending)
        n = out.n[i]
        pending.n[s] = n
        length = local.seqs[s, SEQ_LEN]
        pending.last[s] = local.arena[local.seqs[s, SEQ_OFF] + length - 1] if length > 0 else -1
        for j in range(n):  # loops, not slice copies: those compile a costly error path
            pending.tokens[s, j] = out.tokens[i, j]
            pending.parents[s, j] = out.parents[i, j]
            pending.buckets[s, j] = out.buckets[i, j]


#: What ``learn_and_extend`` returns: all done, or which index ran short of room.
EXTENDED, LOCAL_FULL, DELTA_FULL = 0, 1, 2


@njit(cache=True, nogil=True)
def learn_and_extend(held, appending, seq_ids, cross_seqs, tokens, offsets, depth_scratch,
                     ok_scratch):
    """The rest of an engine step, in one call: score the pending drafts of
    ``held`` (a ``held.Held``) with its calibration (``calibration.learn``),
    then index the emitted tokens in the requests' own sequences ``seq_ids``
    of ``appending.local`` and in their output sequences ``cross_seqs`` of
    ``appending.delta`` (-1: none), as ``trie.extend_batch`` does.

    Returns ``EXTENDED``, or ``LOCAL_FULL`` / ``DELTA_FULL`` when that index
    ran short of room at its progress record: grow it and resume there (the
    drafts are scored already; a ``LOCAL_FULL`` leaves ``delta`` to do).
    """
    cal.learn(held.stats, held.pending, seq_ids, tokens, offsets, depth_scratch, ok_scratch)
    progress = appending.local_progress
    progress[0] = 0
    progress[1] = 0
    if not trie.extend_batch(appending.local, seq_ids, tokens, offsets, progress):
        return LOCAL_FULL
    progress = appending.delta_progress
    progress[0] = 0
    progress[1] = 0
    if not trie.extend_batch(appending.delta, cross_seqs, tokens, offsets, progress):
        return DELTA_FULL
    return EXTENDED
