"""Calibrated acceptance probabilities, learned online from verification outcomes.

A drafted token's chance of being accepted, given that every token before it
in the draft was, depends on where it came from.  Each drafted token falls in
one *bucket* of features: the source (the request's own tree, a cross tree
with the ordinary context, a start-anchored query: global, prompt-start key,
whole-prompt key; drafting on the device, the other requests' open outputs and
its scan of the request's own history),
the request's *state* (how its previous draft fared, and how far into its
output it is), the match length, the depth in the draft, and the counts it
was chosen by (``n`` occurrences of the string so far, ``c`` of them
continuing with this token).

``table`` (float64, ``[TABLE_ROWS, 2]``) holds (accepted, tried) per bucket at
three levels: a *shared* bucket (count, ratio, match length) that pools every
source, a *coarse* one that adds the source, and a *fine* one that adds the
request's state and the depth.

With a *reference* (``calibrated``: what followed the newest earlier
occurrence of the request's longest own match, the rule of vLLM's own
drafter), a token also says whether it agrees with the reference at its depth
(``AGREE_SAME``: the draft has followed it so far and this token does too;
``AGREE_DIFF``: it has followed it so far and this token does not;
``AGREE_NONE``: no reference there).  Each agreement is a *plane* of coarse
and fine rows over the one shared level: plane ``AGREE_NONE`` is rows
``[0, PLANE_ROWS)`` (shared, coarse, fine, as without a reference), the other
planes follow it, coarse then fine rows each.  Drafting on the device
scores its candidates in the same planes, against its own-history scan's
continuation (``device.draft_ref``).  Each level's rate shrinks towards the
level above, and the shared rate towards a prior::

    shared = (acc_s + W_SHARED * prior) / (tried_s + W_SHARED)
    coarse = (acc_c + W_COARSE * shared) / (tried_c + W_COARSE)
    p      = (acc_f + W_FINE * coarse) / (tried_f + W_FINE)

The prior is ``c / (n + 1 / sqrt(m))``, ``m`` the length of the match the
draft starts from: a continuation seen once after one matching token is a
coin toss, one seen once after 30 is nearly certain, and one seen 9 times in
9 is likely after any match.  So an empty table drafts like the raw counts,
trusting long matches, and a few hundred steps move it to what the engine
actually accepts.  Match length sits in the shared level because it matters
most and is learned fastest there: a continuation seen once after a 40-token
match is far more likely than one seen once after a 2-token match, whichever
tree it comes from.
Counts are halved once a bucket has been tried ``HALF_LIFE`` times, so the
table follows a workload that changes.

With the *kinds* of the tokenizer's tokens (``suffixspec.token_kinds``: a
newline, spaces, punctuation, a word with or without its leading space,
digits, mixed), each coarse row of each plane has a *lift* row per kind
(``lift_row``, the rows after the planes), counting the tokens of that kind
alone.  Its rate shrinks towards the coarse row's, and a token's estimate
is its fine rate times its kind's lift over the coarse rate::

    lift = (acc_k + W_COARSE * coarse) / (tried_k + W_COARSE)
    p    = min(fine * lift / coarse, P_MAX)

A tokenizer's kinds are information the counts lack: after the same match
and counts, a newline or a bracket is more often what follows than a word
is.  What comes before says more: a word after a newline is a different
bet from a word after a word.  So each lift row has a *pair* row per kind
of the token before (``pair_row``, after the lift rows: the draft's previous
token, or the context's last one for a first token), whose rate shrinks
towards the lift's with the fine weight and replaces it::

    pair = (acc_pk + W_FINE * lift) / (tried_pk + W_FINE)
    p    = min(fine * pair / coarse, P_MAX)

Without kinds (``NO_KINDS``) there is no lift and the lift and pair rows
stay empty; a token whose previous token is of no kind takes the lift alone.

Last, each token id has a *token* row (``token_row``, after the pair rows;
ids past ``TOKEN_ROWS`` share them modulo): how often drafted tokens of that
id were accepted, against how often their estimates (all of the above,
``estimate``) said they would be.  Their ratio, shrunk towards 1, scales the
estimate::

    p = min(estimate * min((acc_t + W_TOKEN) / (expected_t + W_TOKEN), TOKEN_MAX), P_MAX)

Kinds are classes of tokens; some tokens of a class are far better bets than
others (a closing bracket than an opening one).  ``learn`` counts the
expectation at the table as it is, with the shared row's own rate for the
prior (the match length and counts are not kept with a pending draft).
Token rows hold (accepted, expected), so their accepted may pass their
expected.

A token's record depends on the token before it as well: ``'`` after ``(``
is not ``'`` after a word.  So each (token before, token) pair has a
*bigram* row (``bigram_row``, after the token rows: the pair hashed into
``BIGRAM_ROWS`` rows), counted as the token row is, whose ratio shrinks
towards the token row's and replaces it (``token_factor``)::

    t      = (acc_t + W_TOKEN) / (expected_t + W_TOKEN)
    bigram = (acc_b + W_BIGRAM * min(t, TOKEN_MAX)) / (expected_b + W_BIGRAM)
    p      = min(estimate * min(bigram, TOKEN_MAX), P_MAX)

``state`` (float64, ``[STATE_SIZE]``) holds running means of tokens emitted
and tokens drafted per step, which with the draft cost give the gain a
drafted token must beat (``threshold``), and the prior weights and half-life
(settings, so trying other values needs no recompilation).
"""

import numpy as np
from numba import njit

from .layout import Stats

# Sources of a drafted token.
SRC_REQUEST = 0
SRC_CROSS = 1
SRC_ANCHOR = 2  # + anchors matched - 1: 2 global start, 3 prompt-start key, 4 prompt key
SRC_LIVE = 5  # drafting on the device: the open outputs of the other requests in flight
# Drafting on the device: its scan of the request's own history
# (``device.draft_ref.suffix_scan``), the newest occurrence's continuation, which
# it counts as seen once.  A trie's seen-once continuation is exactly that; the
# scan's is the newest of perhaps many, a poorer bet at the same counts, and
# learned in the own tree's rows it lowered every seen-once continuation of
# the windows with it (device gate at 32 in flight, bfcl: 0.949 of the host's
# est, 0.983 in rows of its own).  The host never drafts from it.
SRC_SCAN = 6
N_SRC = 7
# How the request's previous draft fared: no draft, first token rejected,
# partly accepted, wholly accepted.  Requests copying text keep accepting.
RECENT_NONE = 0
RECENT_REJECTED = 1
RECENT_PARTLY = 2
RECENT_WHOLLY = 3
N_RECENT = 4
# How far into its output the request is (tokens): before 32, 32-127, 128 on.
# Where an output starts it copies its family's and its prompt's wording; deep
# in, the same counts say less.
POSITION_EDGES = (32, 128)
N_POSITION = len(POSITION_EDGES) + 1
# A request's state, the fine level's key beside the depth: ``recent + N_RECENT * position``.
N_STATE = N_RECENT * N_POSITION

N_COUNT = 6   # n: 1, 2, 3-4, 5-8, 9-16, 17+
N_RATIO = 6   # c/n: [0, .2), [.2, .4), [.4, .6), [.6, .8), [.8, 1), 1
N_MATCH = 9   # match length: 0, 1, 2, 3, 4-5, 6-8, 9-15, 16-31, 32+
N_DEPTH = 6   # depth in the draft: 0, 1, 2, 3-4, 5-8, 9+
N_SHARED = N_COUNT * N_RATIO * N_MATCH
N_COARSE = N_SRC * N_SHARED
N_FINE = N_COARSE * N_STATE * N_DEPTH
PLANE_ROWS = N_SHARED + N_COARSE + N_FINE  # shared rows, then plane 0's coarse, then fine
# Agreement with the reference at a token's depth (a plane of coarse and fine rows each).
AGREE_NONE = 0
AGREE_SAME = 1
AGREE_DIFF = 2
N_AGREE = 3
PLANE = N_COARSE + N_FINE  # rows of a plane after the first

# Kinds of token text (``suffixspec.token_kinds``), one lift row each per coarse row.
N_KIND = 7
LIFT_ROWS = N_AGREE * N_KIND * N_COARSE
# ... and one pair row per kind of the token before, per lift row.
PAIR_ROWS = N_KIND * LIFT_ROWS
BASE_ROWS = PLANE_ROWS + (N_AGREE - 1) * PLANE
LIFT_END = BASE_ROWS + LIFT_ROWS  # the first pair row
# Per token id: (accepted, expected), ``token_row``.
TOKEN_ROWS = 1 << 18
TOKEN_BASE = LIFT_END + PAIR_ROWS
# Per (token before, token), hashed: (accepted, expected), ``bigram_row``.
BIGRAM_ROWS = 1 << 18
BIGRAM_BASE = TOKEN_BASE + TOKEN_ROWS
TABLE_ROWS = BIGRAM_BASE + BIGRAM_ROWS
W_TOKEN = 16.0   # a token row's weight of no change
W_BIGRAM = 6.0   # a bigram row's weight of its token row's ratio
TOKEN_MAX = 1.5  # the largest a token row scales an estimate by
NO_TOKEN = -1    # ``probability`` of no particular token: not scaled
ANY_TOKEN = -2   # of a token not known yet: scaled by ``TOKEN_MAX``, a bound
#: The kinds of a proposer without a tokenizer's: every token is of no kind.
NO_KINDS = np.full(1, -1, np.int8)
P_MAX = 0.999  # a lifted estimate's ceiling

W_SHARED = 4.0
W_COARSE = 8.0
W_FINE = 16.0
HALF_LIFE = 4096.0

# State: running means per request-step, the draft cost, and the prior weights.
ST_EMITTED = 0
ST_DRAFTED = 1
ST_COST = 2
ST_W_COARSE = 3
ST_W_FINE = 4
ST_HALF_LIFE = 5
ST_W_SHARED = 6
STATE_SIZE = 7
EMA = 0.01


def new_table() -> np.ndarray:
    return np.zeros((TABLE_ROWS, 2), np.float64)


#: The (sources, planes, sources kept, output positions, kind rows) of the
#: tables earlier versions kept: 0.1's sixth source was its recency
#: candidate (not kept), 0.2 had no agreement planes, 0.3 no ``SRC_LIVE``,
#: none before 0.5 knew the output position, 0.6 added the lift rows, 0.7
#: the pair rows, 0.8 the token rows, none before 0.9 had ``SRC_SCAN`` and
#: none before 0.10 the bigram rows.  Kind rows: 0 none, 1 lift rows, 2 lift
#: and pair rows, 3 those and the token rows, 4 those and the bigram rows.
EARLIER_LAYOUTS = {"0.1": (6, 1, SRC_LIVE, 1, 0), "0.2": (5, 1, SRC_LIVE, 1, 0),
                   "0.3": (5, N_AGREE, SRC_LIVE, 1, 0), "0.4": (6, N_AGREE, 6, 1, 0),
                   "0.5": (6, N_AGREE, 6, N_POSITION, 0), "0.6": (6, N_AGREE, 6, N_POSITION, 1),
                   "0.7": (6, N_AGREE, 6, N_POSITION, 2), "0.8": (6, N_AGREE, 6, N_POSITION, 3),
                   "0.9": (N_SRC, N_AGREE, N_SRC, N_POSITION, 3)}


def layout_rows(n_src: int, planes: int, positions: int = 1, kind_rows: int = 0) -> int:
    """Rows of a table of ``n_src`` sources, ``planes`` agreement planes,
    ``positions`` output-position buckets and the kind rows ``kind_rows``
    (``EARLIER_LAYOUTS``; lift and pair rows only with every plane)."""
    coarse = n_src * N_SHARED
    rows = N_SHARED + planes * coarse * (1 + N_RECENT * positions * N_DEPTH)
    return (rows + (kind_rows >= 1) * N_AGREE * N_KIND * coarse
            + (kind_rows >= 2) * N_AGREE * N_KIND * N_KIND * coarse
            + (kind_rows >= 3) * TOKEN_ROWS + (kind_rows >= 4) * BIGRAM_ROWS)


def upgrade_table(table: np.ndarray) -> np.ndarray | None:
    """A table of this layout from one kept by an earlier version
    (``EARLIER_LAYOUTS``), or None when ``table`` is of no known layout.
    Rows of the sources kept keep their counts; the rest (0.1's recency
    source, a source, plane or kind row an earlier table lacked) start
    empty.  A fine row of a table that did not know the output position
    stands for its bucket at every position."""
    if table.shape == (TABLE_ROWS, 2):
        return table
    if table.ndim != 2 or table.shape[1] != 2:
        return None
    for n_src, planes, kept, positions, kind_rows in EARLIER_LAYOUTS.values():
        if table.shape[0] == layout_rows(n_src, planes, positions, kind_rows):
            break
    else:
        return None
    out = np.zeros((TABLE_ROWS, 2), table.dtype)
    out[:N_SHARED] = table[:N_SHARED]
    at = N_SHARED
    fine_old = N_SHARED * N_RECENT * positions * N_DEPTH
    for plane in range(planes):
        base = N_SHARED if plane == AGREE_NONE else PLANE_ROWS + (plane - 1) * PLANE
        rows = table[at:at + n_src * N_SHARED].reshape(n_src, N_SHARED, 2)
        out[base:base + N_COARSE].reshape(N_SRC, N_SHARED, 2)[:kept] = rows[:kept]
        at += n_src * N_SHARED
        rows = table[at:at + n_src * fine_old].reshape(n_src, N_SHARED, positions, N_RECENT,
                                                       N_DEPTH, 2)
        new = out[base + N_COARSE:base + N_COARSE + N_FINE].reshape(
            N_SRC, N_SHARED, N_POSITION, N_RECENT, N_DEPTH, 2)
        new[:kept] = rows[:kept]  # a table without positions: at every position
        at += n_src * fine_old
    # The lift rows, then the pair rows: per (plane, kind[, kind before]), a coarse block.
    for blocks, base in ((N_AGREE * N_KIND, BASE_ROWS), (N_AGREE * N_KIND * N_KIND, LIFT_END))[
            :min(kind_rows, 2)]:
        rows = table[at:at + blocks * n_src * N_SHARED].reshape(blocks, n_src, N_SHARED, 2)
        out[base:base + blocks * N_COARSE].reshape(blocks, N_SRC, N_SHARED, 2)[:, :kept] = \
            rows[:, :kept]
        at += blocks * n_src * N_SHARED
    if kind_rows >= 3:
        out[TOKEN_BASE:BIGRAM_BASE] = table[at:at + TOKEN_ROWS]
    return out


def table_problem(table: np.ndarray) -> str | None:
    """Why ``table`` cannot be drafted with (None: it can): every count finite,
    and ``0 <= accepted <= tried <= 1e9`` (a token or bigram row: ``0 <=
    accepted, expected <= 1e9``; the table a pool keeps is read back unchecked
    otherwise: NaN or huge counts would stop every draft, a negative one
    would divide by zero)."""
    if not isinstance(table, np.ndarray) or table.shape != (TABLE_ROWS, 2):
        return f"its shape is {getattr(table, 'shape', None)}, not ({TABLE_ROWS}, 2)"
    if not np.isfinite(table).all():
        return "it holds counts that are not finite"
    if (table < 0).any() or (table > 1e9).any():
        return "it holds counts out of range"
    if (table[:TOKEN_BASE, 0] > table[:TOKEN_BASE, 1]).any():
        return "it holds more accepted than tried"
    return None


def new_stats(draft_cost: float, kinds: np.ndarray | None = None) -> Stats:
    """A fresh table and state; ``kinds`` per token id (``suffixspec.token_kinds``,
    None: ``NO_KINDS``)."""
    return Stats(new_table(), new_state(draft_cost), NO_KINDS if kinds is None else kinds)


def new_state(draft_cost: float) -> np.ndarray:
    state = np.zeros(STATE_SIZE, np.float64)
    state[ST_EMITTED] = 2.0
    state[ST_DRAFTED] = 4.0
    state[ST_COST] = draft_cost
    state[ST_W_COARSE] = W_COARSE
    state[ST_W_FINE] = W_FINE
    state[ST_HALF_LIFE] = HALF_LIFE
    state[ST_W_SHARED] = W_SHARED
    return state


@njit(cache=True, inline="always")
def kind_of(kinds, tok):
    """The kind of token ``tok`` (-1: none, or not a token ``kinds`` covers)."""
    if tok < 0 or tok >= kinds.shape[0]:
        return -1
    return kinds[tok]


@njit(cache=True, inline="always")
def _count_bucket(n):
    if n <= 2:
        return n - 1
    if n <= 4:
        return 2
    if n <= 8:
        return 3
    if n <= 16:
        return 4
    return 5


@njit(cache=True, inline="always")
def _match_bucket(m):
    if m <= 3:
        return m
    if m <= 5:
        return 4
    if m <= 8:
        return 5
    if m <= 15:
        return 6
    if m <= 31:
        return 7
    return 8


@njit(cache=True, inline="always")
def _depth_bucket(j):
    if j <= 2:
        return j
    if j <= 4:
        return 3
    if j <= 8:
        return 4
    return 5


@njit(cache=True, inline="always")
def position_bucket(output_len):
    """The output-position bucket of a request ``output_len`` tokens into its output."""
    b = 0
    for edge in POSITION_EDGES:
        if output_len >= edge:
            b += 1
    return b


@njit(cache=True, inline="always")
def request_state(recent, output_len):
    """The fine level's request state: how the previous draft fared
    (``RECENT_*``) and the output position."""
    return recent + N_RECENT * position_bucket(output_len)


@njit(cache=True, inline="always")
def with_agreement(src, agree):
    """``src`` (``source + N_SRC * state``) with the token's agreement with the reference."""
    return src + N_SRC * N_STATE * agree


@njit(cache=True, inline="always")
def _plane_base(agree):
    """Row of plane ``agree``'s first coarse bucket."""
    if agree == AGREE_NONE:
        return N_SHARED
    return PLANE_ROWS + (agree - 1) * PLANE


@njit(cache=True)
def bucket(src, match_len, depth, c, n):
    """Fine bucket (table row) of a token chosen by ``c`` of ``n`` occurrences.

    ``src`` is ``source + N_SRC * state`` (``request_state``), and ``with_agreement`` of it
    where a reference says something of the token.
    """
    if c >= n:
        rb = N_RATIO - 1
    else:
        rb = (5 * c) // n
        if rb > N_RATIO - 2:
            rb = N_RATIO - 2
    agree = src // (N_SRC * N_STATE)
    src = src - N_SRC * N_STATE * agree
    state = src // N_SRC
    shared = (_count_bucket(n) * N_RATIO + rb) * N_MATCH + _match_bucket(match_len)
    coarse = (src - N_SRC * state) * N_SHARED + shared
    return (_plane_base(agree) + N_COARSE + (coarse * N_STATE + state) * N_DEPTH
            + _depth_bucket(depth))


@njit(cache=True, inline="always")
def agreement_of(fine):
    """The agreement plane of fine row ``fine``."""
    if fine < PLANE_ROWS:
        return AGREE_NONE
    return 1 + (fine - PLANE_ROWS) // PLANE


@njit(cache=True, inline="always")
def coarse_of(fine):
    """Table row of the coarse bucket above fine row ``fine``."""
    base = _plane_base(agreement_of(fine))
    return base + (fine - base - N_COARSE) // (N_STATE * N_DEPTH)


@njit(cache=True, inline="always")
def shared_of(fine):
    """Table row of the shared bucket above fine row ``fine``."""
    return (coarse_of(fine) - _plane_base(agreement_of(fine))) % N_SHARED


@njit(cache=True, inline="always")
def lift_row(fine, kind):
    """Table row of the lift of tokens of ``kind`` (``0 <= kind < N_KIND``) over
    the coarse bucket above fine row ``fine``."""
    agree = agreement_of(fine)
    return (BASE_ROWS + (agree * N_KIND + kind) * N_COARSE + coarse_of(fine)
            - _plane_base(agree))


@njit(cache=True, inline="always")
def pair_row(fine, before, kind):
    """Table row of the lift of tokens of ``kind`` after a token of kind
    ``before`` (each in ``[0, N_KIND)``) over the coarse bucket above fine row
    ``fine``."""
    agree = agreement_of(fine)
    return (BASE_ROWS + LIFT_ROWS + ((agree * N_KIND + before) * N_KIND + kind) * N_COARSE
            + coarse_of(fine) - _plane_base(agree))


@njit(cache=True, inline="always")
def token_row(tok):
    """Table row of token id ``tok`` (``>= 0``)."""
    return TOKEN_BASE + (tok & (TOKEN_ROWS - 1))


@njit(cache=True, inline="always")
def bigram_row(prev, tok):
    """Table row of token id ``tok`` after token id ``prev`` (both ``>= 0``):
    the pair hashed into ``BIGRAM_ROWS`` (in 32-bit integers, as on the device)."""
    p = prev & (BIGRAM_ROWS - 1)
    return BIGRAM_BASE + ((tok ^ (p << 9) ^ (p >> 9)) & (BIGRAM_ROWS - 1))


@njit(cache=True)
def token_factor(table, tok, prev):
    """What token ``tok``'s rows, after token ``prev`` (-1: none, the token
    row alone), scale an estimate by (``NO_TOKEN``: 1, ``ANY_TOKEN``: the
    most any row does)."""
    if tok == NO_TOKEN:
        return 1.0
    if tok < 0:
        return TOKEN_MAX
    row = token_row(tok)
    r = (table[row, 0] + W_TOKEN) / (table[row, 1] + W_TOKEN)
    r = r if r < TOKEN_MAX else TOKEN_MAX
    if prev >= 0:
        row = bigram_row(prev, tok)
        r = (table[row, 0] + W_BIGRAM * r) / (table[row, 1] + W_BIGRAM)
        r = r if r < TOKEN_MAX else TOKEN_MAX
    return r


@njit(cache=True)
def probability(table, state, fine, c, n, matched, kind, before, tok, prev):
    """Estimated chance that token ``tok`` (``NO_TOKEN``, ``ANY_TOKEN``: see
    ``token_factor``) of bucket ``fine`` and ``kind``, after token ``prev``
    (-1: none) of kind ``before``, is accepted once reached (a kind -1: none).

    ``matched`` is the length of the match the draft starts from.
    """
    p = estimate(table, state, fine, c / (n + 1.0 / np.sqrt(max(matched, 1))), kind, before)
    p *= token_factor(table, tok, prev)
    return p if p < P_MAX else P_MAX


@njit(cache=True)
def estimate(table, state, fine, prior, kind, before):
    """``probability`` before its token row, with the shared level's ``prior``."""
    coarse = coarse_of(fine)
    shared = shared_of(fine)
    ws = state[ST_W_SHARED]
    wc = state[ST_W_COARSE]
    wf = state[ST_W_FINE]
    ps = (table[shared, 0] + ws * prior) / (table[shared, 1] + ws)
    pc = (table[coarse, 0] + wc * ps) / (table[coarse, 1] + wc)
    p = (table[fine, 0] + wf * pc) / (table[fine, 1] + wf)
    if kind < 0 or pc <= 0.0:
        return p
    row = lift_row(fine, kind)
    lift = (table[row, 0] + wc * pc) / (table[row, 1] + wc)
    if before >= 0:
        row = pair_row(fine, before, kind)
        lift = (table[row, 0] + wf * lift) / (table[row, 1] + wf)
    p *= lift / pc
    return p if p < P_MAX else P_MAX


@njit(cache=True)
def token_probability(stats, src, match_len, depth, c, n, tok, before):
    """``(fine bucket, estimated acceptance)`` of drafted token ``tok`` chosen by
    ``c`` of ``n``, after token ``before`` (-1: none)."""
    table, state, kinds = stats
    fine = bucket(src, match_len, depth, c, n)
    return fine, probability(table, state, fine, c, n, match_len, kind_of(kinds, tok),
                             kind_of(kinds, before), tok, before)


@njit(cache=True)
def threshold(state):
    """Gain a drafted token must beat: draft cost times the running tokens per unit cost.

    With ``e`` tokens emitted and ``d`` drafted per step, a step is worth
    ``e / (1 + cost * d)`` per unit of time; drafting one more token of
    probability ``p`` raises that exactly when ``p > cost * e / (1 + cost * d)``.
    """
    cost = state[ST_COST]
    return cost * state[ST_EMITTED] / (1.0 + cost * state[ST_DRAFTED])


@njit(cache=True)
def _count(table, row, hit, half_life, tried=1.0):
    """One outcome in ``row``: ``tried`` more tries (a token row: the
    estimate, expected acceptances), one more accepted if ``hit``."""
    if table[row, 1] >= half_life:
        table[row, 0] *= 0.5
        table[row, 1] *= 0.5
    table[row, 1] += tried
    if hit:
        table[row, 0] += 1.0


@njit(cache=True, nogil=True)
def touched_rows(buckets, tokens, last, n, kinds, out):
    """The table rows ``learn`` may count when it scores these path drafts (row
    ``i``: ``tokens[i, :n[i]]`` with their ``buckets``, after the token
    ``last[i]``), written to ``out`` (room for ``7 * buckets.size``); returns
    how many, repeats included.  What drafting on the device sends of the
    table once its drafts are scored (``device.feeder``)."""
    m = 0
    for i in range(buckets.shape[0]):
        for t in range(n[i]):
            fine = buckets[i, t]
            if fine < 0:
                continue
            tok = tokens[i, t]
            prev = last[i] if t == 0 else tokens[i, t - 1]
            kind = kind_of(kinds, tok)
            before = kind_of(kinds, prev)
            if tok >= 0:
                out[m] = token_row(tok)
                m += 1
                if prev >= 0:
                    out[m] = bigram_row(prev, tok)
                    m += 1
            out[m] = fine
            out[m + 1] = coarse_of(fine)
            out[m + 2] = shared_of(fine)
            m += 3
            if kind < 0:
                continue
            out[m] = lift_row(fine, kind)
            m += 1
            if before >= 0:
                out[m] = pair_row(fine, before, kind)
                m += 1
    return m


@njit(cache=True, nogil=True)
def learn(stats, pending, seq_ids, tokens, offsets, depth_scratch, ok_scratch):
    """Score each request's pending draft against the tokens the engine emitted.

    ``stats`` and ``pending`` hold the fields of the ``Stats`` and ``Pending``
    records (plain tuples or the records).
    Request ``i`` (pending row ``seq_ids[i]``, -1: skip) emitted
    ``tokens[offsets[i]:offsets[i + 1]]``; its pending ``last`` is the token
    before its draft's first ones.  A draft token is *reached* when its
    parent was accepted (first tokens always are) and its depth is below the
    number of emitted tokens; it was accepted when it equals the emitted
    token at its depth.  Every reached token counts one try in its buckets;
    the pending draft is then cleared.
    """
    table, state, kinds = stats
    pend_tokens, pend_parents, pend_buckets, pend_n, pend_recent, _, pend_last = pending[:7]
    for i in range(seq_ids.shape[0]):
        s = seq_ids[i]
        if s < 0:
            continue
        lo = offsets[i]
        m = offsets[i + 1] - lo
        if m == 0:
            continue
        n = pend_n[s]
        accepted = 0
        longest = 0
        for t in range(n):
            p = pend_parents[s, t]
            ok_scratch[t] = False
            if p >= 0 and not ok_scratch[p]:
                continue
            d = 0 if p < 0 else depth_scratch[p] + 1
            depth_scratch[t] = d
            if d + 1 > longest:
                longest = d + 1
            if d >= m:
                continue
            hit = pend_tokens[s, t] == tokens[lo + d]
            ok_scratch[t] = hit
            if hit and d + 1 > accepted:
                accepted = d + 1
            fine = pend_buckets[s, t]
            if fine < 0:  # not a token the calibration learns from
                continue
            tok = pend_tokens[s, t]
            kind = kind_of(kinds, tok)
            prev = pend_last[s] if p < 0 else pend_tokens[s, p]
            before = kind_of(kinds, prev)
            shared = shared_of(fine)
            if tok >= 0:  # what the table says of it, before this outcome
                own = (table[shared, 0] + 1.0) / (table[shared, 1] + 2.0)
                expected = estimate(table, state, fine, own, kind, before)
                _count(table, token_row(tok), hit, state[ST_HALF_LIFE], expected)
                if prev >= 0:
                    _count(table, bigram_row(prev, tok), hit, state[ST_HALF_LIFE], expected)
            _count(table, fine, hit, state[ST_HALF_LIFE])
            _count(table, coarse_of(fine), hit, state[ST_HALF_LIFE])
            _count(table, shared, hit, state[ST_HALF_LIFE])
            if kind < 0:
                continue
            _count(table, lift_row(fine, kind), hit, state[ST_HALF_LIFE])
            if before >= 0:
                _count(table, pair_row(fine, before, kind), hit, state[ST_HALF_LIFE])
        pend_n[s] = 0
        if n == 0:
            pend_recent[s] = RECENT_NONE
        elif accepted == 0:
            pend_recent[s] = RECENT_REJECTED
        elif accepted < longest:
            pend_recent[s] = RECENT_PARTLY
        else:
            pend_recent[s] = RECENT_WHOLLY
        emitted = m if m <= n + 1 else n + 1
        state[ST_EMITTED] += EMA * (emitted - state[ST_EMITTED])
        state[ST_DRAFTED] += EMA * (n - state[ST_DRAFTED])
