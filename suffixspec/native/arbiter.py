"""The arbiter: the policy's pick or the reference, learned from both drafts' outcomes.

The calibrated policy scores every candidate token by token, the reference
(what followed the newest earlier occurrence of the request's longest own
match, vLLM's drafter's rule) among them, and drafts the candidate of the
best expected gain.  Which of the two actually does better depends on the
pair of match lengths and on where the pick came from, in ways the
per-token buckets do not see: against a one-token match in the cross pool a
repeated own string tends to win, against a five-token one it tends to lose.

So at each step with a reference whose draft differs from the pick, both
drafts are kept (``keep``).  Once the request's context has grown past the
point where either could still be accepted, both are scored exactly
(``settle``): a path draft's accepted length is its agreement with the
tokens that followed, whichever draft the engine verified.  ``table``
(float64, ``[ARB_ROWS, 3]``) holds per *cell* the reference's value, the
pick's, and the drafts scored; a draft's value is its accepted tokens less
the threshold (``calibration.threshold``) times its length, the net gain the
policy maximises.  The reference is drafted instead of the pick where its
value leads (``prefers_reference``).

Drafting on the device (``preferred``) swaps only where the reference's
lead passes ``DEVICE_MARGIN`` times the square root of the drafts scored,
after ``DEVICE_MIN_SCORED`` of them.  It reads the table one step late and
its reference is shorter (the own-history scan, scored as seen once), and
there swapping on any lead lowered est on sql by 0.67% in replay; with the
margin no trace lost more than 0.06% (docs/device.md has the figures).  On
the host the same margin was mixed, so the host swaps on any lead.

A cell is the pick's source (own tree, cross pool, start-anchored query; on
the device also the other requests' open outputs, whose cells only the
device's pairs fill) and
match length (0 .. 4, 5 or more; or no pick), the reference's match length
(1 .. 4, 5 or more), and whether the two drafts part at their first token
or later.  Counts are halved once a cell has scored ``HALF_LIFE`` drafts.

Per request sequence ``s`` the ring ``keep_meta[s]`` (``[RING, K_FIELDS]``:
the context length the drafts start at, -1 for a free slot; the cell; each
draft's length) and ``keep_tokens[s]`` (``[RING, 2, K]``: the pick, then the
reference's draft) hold the drafts not scored yet.  A draft of ``k`` tokens
is final once ``k`` tokens have followed its start or it has missed, and a
step adds at least one token, so ``K + 1`` slots always suffice.
"""

import numpy as np
from numba import njit

N_MATCH = 6                   # a match length: 0 .. 4, 5 or more
N_SOURCES = 4                 # the pick's source: a ``FROM_*`` code, FROM_REQUEST .. FROM_LIVE
N_POLICY = N_SOURCES * N_MATCH + 1  # the pick: its source and match length; or no pick
N_REFERENCE = 5               # the reference's match length: 1 .. 4, 5 or more
N_PART = 2                    # the drafts part at their first token; later
ARB_ROWS = N_POLICY * N_REFERENCE * N_PART
HALF_LIFE = 4096.0
DEVICE_MARGIN = 0.5
DEVICE_MIN_SCORED = 10.0

A_REFERENCE = 0
A_POLICY = 1
A_SCORED = 2
A_FIELDS = 3

K_START = 0
K_CELL = 1
K_POLICY = 2
K_REFERENCE = 3
K_FIELDS = 4


def ring(max_tokens: int) -> int:
    """Slots of a request's ring of kept drafts."""
    return max(max_tokens, 1) + 1


@njit(cache=True)
def cell(pick_match, pick_n, pick_source, reference_match, later):
    """Row of ``table`` for a pick (``pick_n`` tokens from source ``pick_source``,
    a ``FROM_*`` code, after a match of ``pick_match``) against a reference
    after a match of ``reference_match``; ``later``: the drafts agree on their
    first token."""
    p = N_POLICY - 1 if pick_n <= 0 else pick_source * N_MATCH + min(pick_match, N_MATCH - 1)
    r = min(max(reference_match, 1), N_REFERENCE) - 1
    return (p * N_REFERENCE + r) * N_PART + later


@njit(cache=True)
def prefers_reference(table, row):
    """Whether the reference's value leads the pick's in ``row``."""
    return table[row, A_REFERENCE] > table[row, A_POLICY]


def preferred(table, margin: float = DEVICE_MARGIN,
              min_scored: float = DEVICE_MIN_SCORED) -> np.ndarray:
    """Per row (int32 ``[ARB_ROWS]``), whether the reference's value leads the
    pick's by more than ``margin * sqrt(scored)`` after ``min_scored`` drafts
    scored: what drafting on the device reads
    (``device.layout.Calibration.prefer``).  With both 0 it is
    ``prefers_reference`` of every row, the host's rule."""
    scored = table[:, A_SCORED]
    lead = table[:, A_REFERENCE] - table[:, A_POLICY]
    return ((scored >= min_scored) & (lead > margin * np.sqrt(scored))).astype(np.int32)


@njit(cache=True, nogil=True)
def _accepted(draft, n, arena, at, avail):
    """``(accepted, final)``: how many of ``draft[:n]`` agree with
    ``arena[at:at + avail]``, and whether no later token can change that."""
    j = 0
    while j < n and j < avail:
        if draft[j] != arena[at + j]:
            return j, True
        j += 1
    return j, j == n


@njit(cache=True, nogil=True)
def settle(table, keep_meta, keep_tokens, s, arena, off, length, thr):
    """Score the kept drafts of sequence ``s`` (its tokens ``arena[off:off +
    length]``) that are final, at threshold ``thr``, and free their slots."""
    for r in range(keep_meta.shape[1]):
        start = keep_meta[s, r, K_START]
        if start < 0:
            continue
        n_pick = keep_meta[s, r, K_POLICY]
        n_ref = keep_meta[s, r, K_REFERENCE]
        got_pick, done = _accepted(keep_tokens[s, r, 0], n_pick, arena, off + start,
                                   length - start)
        if not done:
            continue
        got_ref, done = _accepted(keep_tokens[s, r, 1], n_ref, arena, off + start,
                                  length - start)
        if not done:
            continue
        row = keep_meta[s, r, K_CELL]
        if table[row, A_SCORED] >= HALF_LIFE:
            for f in range(A_FIELDS):
                table[row, f] *= 0.5
        table[row, A_REFERENCE] += got_ref - thr * n_ref
        table[row, A_POLICY] += got_pick - thr * n_pick
        table[row, A_SCORED] += 1.0
        keep_meta[s, r, K_START] = -1


@njit(cache=True, nogil=True)
def keep(keep_meta, keep_tokens, s, start, row, pick, n_pick, reference, n_ref):
    """Keep a step's two drafts, starting at context length ``start``, for
    ``settle``; a full ring gives up its oldest."""
    slot = -1
    for r in range(keep_meta.shape[1]):
        if keep_meta[s, r, K_START] < 0:
            slot = r
            break
        if slot < 0 or keep_meta[s, r, K_START] < keep_meta[s, slot, K_START]:
            slot = r
    keep_meta[s, slot, K_START] = start
    keep_meta[s, slot, K_CELL] = row
    keep_meta[s, slot, K_POLICY] = n_pick
    keep_meta[s, slot, K_REFERENCE] = n_ref
    for j in range(n_pick):
        keep_tokens[s, slot, 0, j] = pick[j]
    for j in range(n_ref):
        keep_tokens[s, slot, 1, j] = reference[j]


@njit(cache=True, nogil=True)
def adopt(table, keep_meta, keep_tokens, seqs, arena, offsets, lengths, thr, pairs, tokens):
    """Drafting on the device arbitrated (``device.draft_ref``): per row ``i``,
    score sequence ``seqs[i]``'s kept drafts that are final (its tokens
    ``arena[offsets[i]:offsets[i] + lengths[i]]``), then keep the row's pair
    of drafts, starting at ``lengths[i]``: ``pairs[i]`` is its cell (-1:
    none), the pick's length and the reference's, ``tokens[i]`` the pick then
    the reference.  The pairs come from the device: a cell out of range is
    no pair, lengths are clipped to the drafts' width."""
    k = min(keep_tokens.shape[3], tokens.shape[2])
    for i in range(seqs.shape[0]):
        s = seqs[i]
        settle(table, keep_meta, keep_tokens, s, arena, offsets[i], lengths[i], thr)
        row = pairs[i, 0]
        if row < 0 or row >= table.shape[0]:
            continue
        n_pick = min(max(pairs[i, 1], 0), k)
        n_ref = min(max(pairs[i, 2], 0), k)
        keep(keep_meta, keep_tokens, s, lengths[i], row, tokens[i, 0], n_pick, tokens[i, 1],
             n_ref)
