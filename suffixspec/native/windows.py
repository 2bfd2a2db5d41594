"""Candidate windows: the host's half of drafting on the device (``suffixspec.device``).

For each request of a step, the calibrated policy's best candidate from every
place it draws from (its own tree; each cross namespace with the ordinary
context, and with the start-anchored one) becomes one *window*:

* its *head*, the request's last ``head`` tokens, which the device lines up
  with the request's context as it is when it drafts;
* then the candidate's most frequent continuation (``draft_path``'s walk,
  taken past the cost cut, which the device makes), each token with its
  counts ``(c, n)``: ``c`` of the ``n`` occurrences of the string continue
  with it.

With a reference (``calibrated.reference``, ``Knobs.newest``), the
candidates are chosen as the host's drafting chooses them, and the reference
itself is one more window: the own tree's counts along the reference's
tokens, from the request's longest own match.  The device scores every
window against its own, fresher reference (the own-history scan).

The best window's runner-up tokens at its first branch points (``c < n``)
start *branch windows*, each continued the same way: when the engine's bonus
token takes the branch, a window still continues the context.

A trie of depth ``D`` ends a path ``D - m`` tokens after a match of ``m``; the
walk then matches the last ``D // 2`` tokens of the window again and goes on
from there, as the host would at a later step.

Windows are rows of a ``Windows`` record: ``tokens[i, r]`` (-1 past the
window's end), ``c[i, r]``/``n[i, r]`` (0 on the head), ``meta[i, r]``:
calibration source, match length at the path's start (what calibration
sees; an anchored context's is its output length), head length, window
length, and the context length the head ends at (a branch window's head
runs on into the path: the context reaches the branch when it is that long
plus one).  Rows a request does not fill have length 0.
"""

import numpy as np
from numba import njit

from . import calibration as cal
from .calibrated import _own_end, _lengths, longest, own_output, own_reference, reference_counted
from .layout import (Batch, Candidate, Heap, Index, Knobs, Merged, Pending, SEQ_LEN, SEQ_OFF,
                     SEQ_ROOT, SEQ_SLOT, Stats, Windows, Workspace)
from .tokens import SYNTHETIC_BASE
from .trie import anchors, suffix_position, tail
from .propose import side_tables, state_of, step_threshold
from .union import (NOWHERE, _count_all, advance, advance_all, best_next, counts_of, position,
                    side)

# ``Windows.meta`` fields.
W_SOURCE = 0   # calibration source (``calibration.SRC_*``)
W_MATCH = 1    # match length at the path's start
W_HEAD = 2     # head tokens (the request's context)
W_LEN = 3      # tokens in the window
W_AT = 4       # the context's length where the head ends (when the window was built)
W_FIELDS = 5

# Candidate kinds.
_OWN = 0
_CROSS = 1
_ANCHORED = 2


@njit(cache=True, nogil=True)
def _positions(sides, roots, own, ctx, end, length, pos):
    """Where ``ctx[end - length:end]`` ends on every side (rows of ``pos``)."""
    for k in range(pos.shape[0]):
        pos[k, 0], pos[k, 1], pos[k, 2] = NOWHERE
        if roots[k] >= 0:
            ix = side(sides, k)
            x, off = suffix_position(ix, roots[k], ctx, end, length, own if k == 0 else NOWHERE)
            if x >= 0:
                pos[k, 0], pos[k, 1], pos[k, 2] = position(ix, x, off)


@njit(cache=True, nogil=True)
def _held(pos):
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            return True
    return False


@njit(cache=True, nogil=True)
def runner_up(sides, pos, discount, exclude):
    """The most frequent next token other than ``exclude``: ``(token, c, n)``
    as ``union.best_next`` gives them (``c`` 0: none)."""
    n = -discount
    for k in range(pos.shape[0]):
        if pos[k, 0] >= 0:
            n += side(sides, k).nodes[pos[k, 0], 2]  # COUNT
    best = -1
    best_c = 0
    for k in range(pos.shape[0]):
        if pos[k, 0] < 0:
            continue
        ix = side(sides, k)
        x, off, length = pos[k, 0], pos[k, 1], pos[k, 2]
        if off < length:
            continue  # inside an edge: one token follows on this side
        y = ix.nodes[x, 7]  # FIRST
        while y != -1:
            tok = ix.nodes[y, 1]  # TOKEN
            if tok != exclude and tok < SYNTHETIC_BASE:
                c = _count_all(sides, pos, tok)
                if c > best_c:
                    best, best_c = tok, c
            y = ix.nodes[y, 8]  # NEXT
    if best_c > n:
        best_c = n
    return best, best_c, n


@njit(cache=True, nogil=True)
def _walk(sides, roots, pos, matched, discount, depth, row, at, saves):
    """Continue window ``row`` (``(tokens, c, n)`` of one row) from ``at`` with
    the most frequent continuation of the string at ``pos`` (``matched``
    tokens long), until the row is full or nothing follows.  The first
    ``saves`` branch points (``c < n``) are kept in ``saves`` (``(at,
    matched, discount, token, count)`` per point in ``saves[0]``, positions
    in ``saves[1]``; ``saves[2][0]`` counts them).  Returns the row's length.
    """
    tokens, cs, ns = row
    points, where, kept = saves
    width = tokens.shape[0]
    while at < width:
        tok, c, n = best_next(sides, pos, discount)
        if n <= 0 or c <= 0:
            if matched < depth or at == 0:
                break
            # The trie's depth ends the path: match the window's last tokens again.
            matched = min(depth // 2, at)
            discount = 0
            _positions(sides, roots, NOWHERE, tokens, at, matched, pos)
            if not _held(pos):
                break
            continue
        if tok >= SYNTHETIC_BASE:
            break
        if c < n and kept[0] < points.shape[0]:
            b = kept[0]
            points[b, 0] = at
            points[b, 1] = matched
            points[b, 2] = discount
            points[b, 3] = tok
            where[b, :pos.shape[0]] = pos
            kept[0] = b + 1
        tokens[at] = tok
        cs[at] = c
        ns[at] = n
        advance_all(sides, pos, tok)
        matched += 1
        discount = 0
        at += 1
    return at


@njit(cache=True, nogil=True)
def _walk_reference(sides, pos, discount, ref, row, at):
    """Continue window ``row`` from ``at`` with the reference ``ref``'s tokens,
    each with the counts of the string it continues at ``pos`` (the request's
    own tree), while its own tree holds them.  Returns the row's length."""
    tokens, cs, ns = row
    width = tokens.shape[0]
    for t in range(ref[0]):
        if at >= width:
            break
        tok = ref[1 + t]
        c, n = counts_of(sides, pos, tok, discount if t == 0 else 0)
        if n <= 0 or c <= 0:
            break
        tokens[at] = tok
        cs[at] = c
        ns[at] = n
        advance_all(sides, pos, tok)
        at += 1
    return at


@njit(cache=True, nogil=True)
def _clear(win, i, r):
    win.tokens[i, r, :] = -1
    win.c[i, r, :] = 0
    win.n[i, r, :] = 0
    win.meta[i, r, :] = 0


@njit(cache=True, nogil=True)
def _head(win, i, r, ctx, end, head):
    for t in range(head):
        win.tokens[i, r, t] = ctx[end - head + t]


@njit(cache=True, nogil=True)
def _group(i, kind, j, pools, solo):
    """``(sides, roots, own, used)`` of a candidate of request ``i``: its own tree
    (``_OWN``) or namespace ``j`` of the cross pool; ``used`` sides take part.
    ``pools`` is ``(local, local_roots, delta, tables, batch)``."""
    local, local_roots, delta, tables, batch = pools
    mine, cross = tables
    s = batch.seqs[i]
    if kind == _OWN:
        solo[0] = local_roots[batch.trees[i]]
        return mine, solo[:1], (local.seqs[s, SEQ_SLOT], local.seqs[s, SEQ_LEN],
                                local.seqs[s, SEQ_LEN]), 1
    roots = batch.cross_roots[i, j]
    used = cross.shape[0]
    while used > 1 and roots[used - 1] < 0:
        used -= 1
    own = NOWHERE
    cs = batch.cross_seqs[i]
    if cs >= 0 and roots[0] >= 0 and delta.seqs[cs, SEQ_ROOT] == roots[0]:
        n_anchors = anchors(delta, cs)
        out_len = delta.seqs[cs, SEQ_LEN] - n_anchors
        if kind == _ANCHORED:
            out_len = delta.seqs[cs, SEQ_LEN]
        own = (delta.seqs[cs, SEQ_SLOT], delta.seqs[cs, SEQ_LEN], out_len)
    return cross, roots[:used], own, used


@njit(cache=True)
def _found(found, row, kind, j, length, match, source):
    found[row, 0] = kind
    found[row, 1] = j
    found[row, 2] = length
    found[row, 3] = match
    found[row, 4] = source


@njit(cache=True, nogil=True)
def _candidates(req, pools, knobs, stats, work, pos, solo, found):
    """The policy's best candidate of each group of request ``req = (i, state,
    thr, limit)``, as rows of ``found`` (``[kind, namespace, length, match,
    source]``) and their gains; returns ``(count, gains)``."""
    i, state, thr, limit = req
    local, local_roots, delta, tables, batch = pools
    depth = knobs.depth
    s = batch.seqs[i]
    start, end = tail(local, s, depth)
    ctx = local.arena
    gains = np.zeros(found.shape[0], np.float64)
    reach = np.zeros(pos.shape[0], np.int64)
    count = 0
    sides, roots, own, used = _group(i, _OWN, 0, pools, solo)
    how = (np.int64(cal.SRC_REQUEST), state, limit, thr)
    hi = longest((sides, roots, own), ctx, start, end, depth, reach[:used])
    if hi > 0:
        n, gain, m, length = _lengths((sides, roots, own), ctx, end,
                                      (np.int64(1), hi, np.int64(-1), reach[:used]), how, knobs,
                                      stats, 0.0, work.cand, work, pos[:used])
        if n > 0:
            _found(found, count, _OWN, 0, length, m, cal.SRC_REQUEST)
            gains[count] = gain
            count += 1
    c_end, n_anchors, out_len = own_output(delta, batch.cross_seqs[i])
    how = (np.int64(cal.SRC_CROSS), state, limit, thr)
    for j in range(batch.cross_roots.shape[1]):
        sides, roots, own, used = _group(i, _CROSS, j, pools, solo)
        hi = longest((sides, roots, own), ctx, start, end, depth, reach[:used])
        if hi > 0:
            n, gain, m, length = _lengths((sides, roots, own), ctx, end,
                                          (np.int64(1), hi, np.int64(-1), reach[:used]), how,
                                          knobs, stats, 0.0, work.cand, work, pos[:used])
            if n > 0:
                _found(found, count, _CROSS, j, length, m, cal.SRC_CROSS)
                gains[count] = gain
                count += 1
        if knobs.anchors and n_anchors > 0 and out_len + 1 < depth:
            hi = out_len + n_anchors
            if hi > depth - 1:
                hi = depth - 1
            n, gain, m, length = _lengths((sides, roots, (own[0], own[1], own[1])), delta.arena,
                                          c_end, (out_len + 1, hi, out_len, reach[:used]), how,
                                          knobs, stats, 0.0, work.cand, work, pos[:used])
            if n > 0:
                _found(found, count, _ANCHORED, j, length, m, cal.SRC_ANCHOR + length - out_len - 1)
                gains[count] = gain
                count += 1
    return count, gains


@njit(cache=True, nogil=True)
def build_request(req, pools, knobs, stats, work, win, scratch):
    """Windows of request ``req = (i, state, thr, limit)`` (rows ``win.*[i]``);
    returns how many it has.  ``pools`` as for ``_group``; ``scratch`` is
    ``(points, where, kept, pos, solo, found)``: branch points (see
    ``_walk``), positions (a row per side), a root row and candidate rows.
    """
    i = req[0]
    local, local_roots, delta, tables, batch = pools
    points, where, kept, pos, solo, found = scratch
    rows = win.tokens.shape[1]
    width = win.tokens.shape[2]
    depth = knobs.depth
    for r in range(rows):
        _clear(win, i, r)
    s = batch.seqs[i]
    start, end = tail(local, s, depth)
    ctx = local.arena
    head = end - start  # the context's last tokens: what the device lines up
    if head > width // 4:
        head = width // 4
    # The reference (``calibrated.reference``) rates the candidates as the host's
    # own drafting does, and is a window of its own after theirs.
    work.ref[0] = 0
    longest_own = 0
    if knobs.newest > 0:
        sides, roots, own, _ = _group(i, _OWN, 0, pools, solo)
        longest_own = own_reference((sides, roots, own), s, ctx, start, end, depth,
                                    knobs.newest, work.ref)
    count, gains = _candidates(req, pools, knobs, stats, work, pos, solo, found)
    order = np.argsort(-gains[:count], kind="mergesort")  # best first; policy order in ties
    filled = 0
    saved = 0
    for q in range(count):
        if filled >= rows:
            break
        c = order[q]
        kind, j, length, match, source = (found[c, 0], found[c, 1], found[c, 2], found[c, 3],
                                          found[c, 4])
        sides, roots, own, used = _group(i, kind, j, pools, solo)
        q_ctx, q_end = ctx, end
        if kind == _ANCHORED:
            q_ctx = delta.arena
            cs = batch.cross_seqs[i]
            q_end = delta.seqs[cs, SEQ_OFF] + delta.seqs[cs, SEQ_LEN]
        p = pos[:used]
        _positions(sides, roots, own, q_ctx, q_end, length, p)
        discount = 0
        if _own_end(own, length, (p[0, 0], p[0, 1], p[0, 2])):
            discount = 1
        r = filled
        _head(win, i, r, ctx, end, head)
        kept[0] = 0 if filled == 0 else points.shape[0]  # branch points of the best only
        size = _walk(sides, roots, p, length, discount, depth,
                     (win.tokens[i, r], win.c[i, r], win.n[i, r]), head, (points, where, kept))
        if size <= head:
            _clear(win, i, r)
            continue
        if filled == 0:
            saved = kept[0]
        win.meta[i, r, W_SOURCE] = source
        win.meta[i, r, W_MATCH] = match
        win.meta[i, r, W_HEAD] = head
        win.meta[i, r, W_LEN] = size
        win.meta[i, r, W_AT] = local.seqs[s, SEQ_LEN]
        filled += 1
    if work.ref[0] > 0 and filled < rows:
        sides, roots, own, used = _group(i, _OWN, 0, pools, solo)
        p = pos[:used]
        counted = reference_counted(longest_own, work.ref[0], depth)
        _positions(sides, roots, own, ctx, end, counted, p)
        discount = 1 if _own_end(own, counted, (p[0, 0], p[0, 1], p[0, 2])) else 0
        r = filled
        _head(win, i, r, ctx, end, head)
        size = _walk_reference(sides, p, discount, work.ref,
                               (win.tokens[i, r], win.c[i, r], win.n[i, r]), head)
        if size <= head:
            _clear(win, i, r)
        else:
            win.meta[i, r, W_SOURCE] = cal.SRC_REQUEST
            win.meta[i, r, W_MATCH] = longest_own
            win.meta[i, r, W_HEAD] = head
            win.meta[i, r, W_LEN] = size
            win.meta[i, r, W_AT] = local.seqs[s, SEQ_LEN]
            filled += 1
    work.ref[0] = 0
    if filled == 0 or saved == 0:
        return filled
    # Branch windows: the best window's runner-up at each kept branch point.
    kind, j = found[order[0], 0], found[order[0], 1]
    sides, roots, own, used = _group(i, kind, j, pools, solo)
    for b in range(saved):
        if filled >= rows:
            break
        at, matched, discount, tok = points[b, 0], points[b, 1], points[b, 2], points[b, 3]
        p = pos[:used]
        p[:, :] = where[b, :used]
        alt, c, n = runner_up(sides, p, discount, tok)
        if c <= 0:
            continue
        r = filled
        lo = at - head
        if lo < 0:
            lo = 0
        for t in range(lo, at):
            win.tokens[i, r, t - lo] = win.tokens[i, 0, t]
        h = at - lo
        win.tokens[i, r, h] = alt
        win.c[i, r, h] = c
        win.n[i, r, h] = n
        advance_all(sides, p, alt)
        kept[0] = points.shape[0]
        size = _walk(sides, roots, p, matched + 1, np.int64(0), depth,
                     (win.tokens[i, r], win.c[i, r], win.n[i, r]), h + 1, (points, where, kept))
        win.meta[i, r, W_SOURCE] = win.meta[i, 0, W_SOURCE]
        win.meta[i, r, W_MATCH] = win.meta[i, 0, W_MATCH] + at - head
        win.meta[i, r, W_HEAD] = h
        win.meta[i, r, W_LEN] = size
        win.meta[i, r, W_AT] = win.meta[i, 0, W_AT] + at - head
        filled += 1
    return filled


@njit(cache=True, nogil=True)
def build_batch(local, local_roots, segs, delta, batch, knobs, stats, pending, work, win,
                branch_points):
    """Windows of every request of a step (``propose_batch``'s records, plain
    tuples); returns the windows each request has.  Calibration and the cost
    threshold pick each group's candidate as ``propose`` would; nothing is
    written to ``pending``."""
    local, delta = Index(*local), Index(*delta)
    batch, knobs, stats = Batch(*batch), Knobs(*knobs), Stats(*stats)
    pending = Pending(*pending)
    work = Workspace(Candidate(*work[0]), Heap(*work[1]), Merged(*work[2]), work[3],
                     Candidate(*work[4]))
    win = Windows(*win)
    mine, cross = side_tables(local, segs, delta)
    thr = step_threshold(stats, knobs)
    n_sides = cross.shape[0]
    points = np.zeros((branch_points, 4), np.int64)
    where = np.zeros((branch_points, n_sides, 3), np.int64)
    scratch = (points, where, np.zeros(1, np.int64), np.empty((n_sides, 3), np.int64),
               np.full(n_sides, -1, np.int64),
               np.zeros((1 + 2 * batch.cross_roots.shape[1], 5), np.int64))
    filled = np.zeros(batch.seqs.shape[0], np.int64)
    pools = (local, local_roots, delta, (mine, cross), batch)
    for i in range(batch.seqs.shape[0]):
        req = (np.int64(i), state_of(local, pending, batch.seqs[i]), thr, batch.limits[i])
        filled[i] = build_request(req, pools, knobs, stats, work, win, scratch)
    return filled


@njit(cache=True, nogil=True)
def one_token_paths(sides, roots, depth, wanted, seen, keys, tokens, cs, ns):
    """The pool's most frequent continuation of single tokens: what a request
    drafts from when only its last token matches (after a divergence that no
    window covers).  ``roots`` are one namespace's trees (a root per side).
    ``wanted``: the tokens to walk (empty: every token that follows a root,
    below ``seen``'s length; ``seen`` marks those walked).
    Row ``r`` is token ``keys[r]``'s path (``tokens``/``cs``/``ns`` rows as a
    window's, with no head).  Returns the rows."""
    used = roots.shape[0]
    pos = np.empty((used, 3), np.int64)
    points = np.zeros((0, 4), np.int64)
    where = np.zeros((0, used, 3), np.int64)
    kept = np.zeros(1, np.int64)
    count = 0
    k = 0
    y = np.int64(-1)
    i = 0
    while count < keys.shape[0]:
        if wanted.shape[0]:  # the tokens asked for
            if i >= wanted.shape[0]:
                break
            tok = np.int64(wanted[i])
            i += 1
        else:  # every root's children, side by side
            while y == -1 and k < used:
                if roots[k] >= 0:
                    y = np.int64(side(sides, k).nodes[roots[k], 7])  # FIRST
                if y == -1:
                    k += 1
            if y == -1:
                break
            nodes = side(sides, k).nodes
            tok = np.int64(nodes[y, 1])  # TOKEN
            y = np.int64(nodes[y, 8])  # NEXT
            if y == -1:
                k += 1
            if tok >= seen.shape[0] or seen[tok]:
                continue
            seen[tok] = True
        if tok < 0 or tok >= SYNTHETIC_BASE:
            continue
        for q in range(used):
            pos[q, 0], pos[q, 1], pos[q, 2] = NOWHERE
            if roots[q] >= 0:
                x, off, length = advance(side(sides, q), roots[q], 0, 0, tok)
                pos[q, 0], pos[q, 1], pos[q, 2] = x, off, length
        tokens[count, :] = -1
        cs[count, :] = 0
        ns[count, :] = 0
        _walk(sides, roots, pos, np.int64(1), np.int64(0), depth,
              (tokens[count], cs[count], ns[count]), np.int64(0), (points, where, kept))
        keys[count] = tok
        count += 1  # a token with nothing after it gets an empty row (its old one goes)
    return count
