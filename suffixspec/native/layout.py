"""What the kernels exchange: array fields, flags, and the named records.

Kernels take named records (namedtuples of arrays) instead of long lists of
positional arrays.  Inside compiled code a record costs nothing.  At the
Python boundary, though, Numba types a namedtuple argument several times
slower than a plain tuple on every call, so entry kernels called per engine
step take their records as plain tuples in the same field order (``flat``)
and name them again inside (``propose.propose_batch``), or only unpack them.
Each array still costs an unboxing per call, so the records that stay from
step to step reach the per-step kernels inside one object (``held``).
Every record is built here, in one place, for the proposer and for warm-up.
"""

from collections import namedtuple

import numpy as np

from . import arbiter

# Node fields: rows of ``nodes`` (int32, shape [capacity, NODE_FIELDS]).
PARENT = 0
TOKEN = 1
COUNT = 2
LEN = 3
REF_SEQ = 4
REF_POS = 5
BEST = 6
FIRST = 7
NEXT = 8
PREV = 9
NODE_FIELDS = 10

# Sequence fields: rows of ``seqs`` (int64, shape [capacity, SEQ_FIELDS]).
SEQ_OFF = 0     # start of the sequence's region in token storage
SEQ_LEN = 1     # tokens in the sequence
SEQ_CAP = 2     # size of its region
SEQ_ROOT = 3    # root node of its tree
SEQ_SLOT = 4    # row of ``active`` while open, else -1
SEQ_STATE = 5   # one of the SEQ_* states below
SEQ_FRONT = 6   # open suffixes starting before this all sit in open leaves
SEQ_FIELDS = 7

SEQ_FREE = 0
SEQ_LIVE = 1
SEQ_REMOVED = 2  # counts removed; tokens kept while labels may point into them

# Scalars of the index: ``meta`` (int64).
META_DEPTH = 0
META_TOP = 1          # next never-used node row
META_FREE_HEAD = 2    # head of the free-node list (chained through NEXT)
META_FREE_COUNT = 3
META_HASH_FILL = 4    # used slots in the child table
META_ARENA_TOP = 5    # end of the last allocated region in token storage
META_LIVE_TOKENS = 6  # tokens of live sequences
META_DEAD_TOKENS = 7  # tokens of removed sequences still in storage
META_TIES = 8         # which of equally frequent children is BEST, see below
META_SIZE = 9

# Tie orders (``META_TIES``): which of equally frequent children is BEST.
# NEWEST: the one whose count rose last (a new child counts as rising).
# ARCTIC: arctic-inference's order.  The sibling list is then kept as arctic
# keeps its children (new children at the end) and BEST is its first child,
# so path drafts equal arctic's.
TIES_NEWEST = 0
TIES_ARCTIC = 1

EMPTY = -1
FREED = -2  # COUNT of a node on the free list

# Draft sources (``Outputs.source``).
FROM_NONE = -1
FROM_REQUEST = 0
FROM_CROSS = 1
FROM_ANCHOR = 2
FROM_LIVE = 3  # drafting on the device: the other requests' open outputs

# --------------------------------------------------------------------------
# Records.
# --------------------------------------------------------------------------

#: One index: a forest of suffix tries (``trie``).
Index = namedtuple("Index", "meta nodes hkeys hvals arena seqs active")

#: Frontier of a tree draft: one entry per candidate token.
Heap = namedtuple("Heap", "prob node off parent bucket depth")

#: One draft's rows: tokens, parents, probabilities, calibration buckets.
Candidate = namedtuple("Candidate", "tokens parents probs buckets")

#: Candidates' trees merged into one (``merge``): node rows, each node's first
#: child and next sibling, where each token of the candidate being merged went,
#: and ``size``: nodes in use, first first-level node.
Merged = namedtuple("Merged", "tokens parents probs buckets first next where size")

#: Scratch of one propose call: the draft being built, the frontier, the merged
#: tree, and the request's reference (``calibrated.reference``): ``ref[0]``
#: tokens, then the tokens.
Workspace = namedtuple("Workspace", "cand heap merged ref alt")

#: The requests of one step.  Request ``i`` reads its context from sequence
#: ``seqs[i]`` of tree ``trees[i]`` in the request index, may draw from the
#: trees ``cross_roots[i, j, :]`` of namespace ``j`` (side 0: the delta index,
#: side k: snapshot segment k - 1, ``union``; -1: none), has its own open
#: output sequence ``cross_seqs[i]`` in the delta index (-1: none), and
#: drafts at most ``limits[i]`` tokens.
Batch = namedtuple("Batch", "seqs trees cross_seqs limits cross_roots")

#: Snapshot segments a persistent pool drafts from at once (``union``): the
#: side table has room for this many, absent ones stand in empty.
SEGMENTS = 8

#: Drafting settings of a proposer (scalars): the trie depth, the length cap
#: (``factor`` -1: none), the probability floor, tree drafts, start anchors,
#: and how far back the reference is looked for (``newest``, 0: no reference).
Knobs = namedtuple("Knobs", "depth factor offset min_prob tree anchors newest arbitrate")

#: Drafts of a step, row ``i`` for request ``i``; ``source`` holds ``FROM_*`` codes.
Outputs = namedtuple("Outputs", "tokens parents probs n score match source buckets")

#: Calibration statistics: the (accepted, tried) table, the state (running
#: means, draft cost, settings) and the kind of each token id (int8, -1: none);
#: see ``calibration``.
Stats = namedtuple("Stats", "table state kinds")

#: The latest draft of each request (row: its sequence in the request index),
#: scored against the emitted tokens by ``calibration.learn``; ``recent`` is
#: how the previous draft fared, ``start`` the sequence's length where the
#: request's output starts (its output position is the rest), ``last`` the
#: context's last token when it drafted (-1: none), the token before the draft.  ``keep_meta``
#: and ``keep_tokens`` are each request's ring of drafts the arbiter has yet
#: to score, ``arbiter`` its table (``arbiter``).
Pending = namedtuple("Pending",
                     "tokens parents buckets n recent start last keep_meta keep_tokens arbiter")

#: Candidate windows of a step's requests (``windows``): row ``[i, r]`` is
#: window ``r`` of request ``i``: its tokens, each token's counts ``c`` of
#: ``n``, and ``meta`` (``windows.W_*``).
Windows = namedtuple("Windows", "tokens c n meta")


def windows(rows: int, per_request: int, width: int) -> Windows:
    shape = (rows, per_request, width)
    return Windows(np.full(shape, -1, np.int32), np.zeros(shape, np.int32),
                   np.zeros(shape, np.int32), np.zeros((rows, per_request, 5), np.int32))


def heap_scratch(max_tokens: int, min_prob: float = 0.0) -> Heap:
    """Frontier arrays of a tree draft.

    Children pushed per expansion number at most ``1/min_prob``, so this size
    never drops an entry when ``min_prob >= 1/256``.
    """
    fan = 256 if min_prob <= 0 else min(256, int(np.ceil(1.0 / min_prob)))
    size = max(max_tokens, 1) * fan + 1
    return Heap(np.empty(size, np.float64), *(np.empty(size, np.int32) for _ in range(5)))


def candidate(k: int) -> Candidate:
    return Candidate(np.empty(k, np.int32), np.empty(k, np.int32), np.empty(k, np.float32),
                     np.empty(k, np.int32))


#: A merged tree holds up to this many times a draft's tokens before the best are kept.
MERGE_ROOM = 4


def merged(k: int) -> Merged:
    m = MERGE_ROOM * k
    return Merged(*candidate(m), np.empty(m, np.int32), np.empty(m, np.int32),
                  np.empty(k, np.int32), np.array([0, -1], np.int64))


def workspace(max_tokens: int, min_prob: float = 0.0) -> Workspace:
    k = max(max_tokens, 1)
    return Workspace(candidate(k), heap_scratch(k, min_prob), merged(k), np.zeros(k + 1, np.int64),
                     candidate(k))


def outputs(rows: int, max_tokens: int) -> Outputs:
    k = max(max_tokens, 1)
    return Outputs(np.zeros((rows, k), np.int32), np.zeros((rows, k), np.int32),
                   np.zeros((rows, k), np.float32), np.zeros(rows, np.int64),
                   np.zeros(rows, np.float64), np.zeros(rows, np.int64), np.zeros(rows, np.int64),
                   np.zeros((rows, k), np.int32))


def pending(rows: int, max_tokens: int, old: Pending | None = None) -> Pending:
    """Pending-draft rows; ``old``'s rows, and its arbiter table, are kept."""
    k = max(max_tokens, 1)
    ring = arbiter.ring(k)
    table = (np.zeros((arbiter.ARB_ROWS, arbiter.A_FIELDS), np.float64) if old is None
             else old.arbiter)
    new = Pending(np.zeros((rows, k), np.int32), np.zeros((rows, k), np.int32),
                  np.zeros((rows, k), np.int32), np.zeros(rows, np.int64),
                  np.zeros(rows, np.int64), np.zeros(rows, np.int64), np.full(rows, -1, np.int64),
                  np.full((rows, ring, arbiter.K_FIELDS), -1, np.int64),
                  np.zeros((rows, ring, 2, k), np.int32), table)
    if old is not None:
        for a, b in zip(new[:-1], old[:-1]):
            a[: b.shape[0]] = b
    return new


def flat(record) -> tuple:
    """A record, and the records in it, as plain tuples (for an entry kernel)."""
    return tuple(flat(x) if isinstance(x, tuple) else x for x in record)


def read_only(index: Index) -> Index:
    """Read-only views of an index's arrays."""
    views = []
    for a in index:
        v = a.view()
        v.setflags(write=False)
        views.append(v)
    return Index(*views)
