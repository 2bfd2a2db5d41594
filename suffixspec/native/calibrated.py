"""The calibrated policy: calibrated probabilities and a cost-aware length.

Each drafted token's probability is the product of calibrated acceptance
estimates (``calibration``), and a draft grows while its next token's
probability beats the threshold that the draft cost sets (``thr``).  Drafts
are compared by their expected net gain, ``sum(p - thr)``, over every match
length of every pool; the context's own occurrence, which has no
continuation yet, is left out of the first token's counts.  Tree drafts merge
every candidate's tree into one (``merge``).  With ``knobs.anchors`` a
request also queries the cross-request trees with its start-anchored context ``[prompt key, prompt-start key, BOS, output so far]``
(its own open sequence in the delta index), so the start of an output is
matched against the starts of past outputs.

``stats`` is the ``Stats`` record (calibration table and state); ``how`` is
``(source, state, limit, thr)``: the calibration source, the request's state
(``calibration.request_state``: how its previous draft fared, its output
position), the most tokens to draft, and the threshold.
"""

import numpy as np
from numba import njit

from . import arbiter, calibration as cal
from .heap import heap_push, heap_take
from .layout import (COUNT, Candidate, FIRST, FROM_ANCHOR, FROM_CROSS, FROM_NONE, FROM_REQUEST,
                     META_DEPTH, NEXT, PARENT, REF_POS, REF_SEQ, SEQ_LEN, SEQ_OFF, SEQ_ROOT,
                     SEQ_SLOT, TOKEN)
from .merge import merge_in, merge_out, merge_reset
from .tokens import SYNTHETIC_BASE
from .trie import (anchors, edge_len, tail, label, longest_match, occurring_position,
                   suffix_position)
from .union import (NOWHERE as NONE, advance_all, best_next, bound_next, counts_of,
                    occurrences, position, side)


@njit(cache=True, nogil=True)
def agreement(ref, depth, tok, on):
    """How token ``tok`` at ``depth`` stands to the reference ``ref``
    (``ref[0]`` tokens, then the tokens): ``on`` when the draft has followed
    it up to here."""
    if not on or depth >= ref[0]:
        return cal.AGREE_NONE
    return cal.AGREE_SAME if tok == ref[1 + depth] else cal.AGREE_DIFF


@njit(cache=True, nogil=True)
def newest_occurrence(arena, start, end, length, window):
    """Where the newest earlier occurrence of ``arena[end - length:end]``
    ends (what followed it starts there), or -1.  Occurrences in
    ``arena[start:end - 1]`` ending at most ``window`` tokens back count."""
    lo = end - window
    if lo < start + length:
        lo = start + length
    last = arena[end - 1]
    for e in range(end - 1, lo - 1, -1):
        if arena[e - 1] != last:
            continue
        t = 1
        while t < length and arena[e - 1 - t] == arena[end - 1 - t]:
            t += 1
        if t == length:
            return e
    return -1


@njit(cache=True, nogil=True)
def reference(arena, start, end, length, window, ref):
    """Write into ``ref`` what followed the newest earlier occurrence of the
    context's last ``length`` tokens (``arena[start:end]``), found at most
    ``window`` tokens back: vLLM's own drafter's rule, newest of the longest.
    ``ref[0]`` is its length (0: none), at most ``len(ref) - 1``; it stops
    before a synthetic token and at the context's end.  A plain scan: the
    proposer finds the same with ``own_reference``, which scans less."""
    ref[0] = 0
    if length <= 0 or window <= 0:
        return
    _follow(arena, newest_occurrence(arena, start, end, length, window), end, ref)


@njit(cache=True, nogil=True)
def _follow(arena, e, end, ref):
    """``ref`` := what follows position ``e`` (-1: nothing), as ``reference`` writes it."""
    ref[0] = 0
    if e < 0:
        return
    k = 0
    while k < ref.shape[0] - 1 and e + k < end and arena[e + k] < SYNTHETIC_BASE:
        ref[1 + k] = arena[e + k]
        k += 1
    ref[0] = k


SCAN = -2  # ``listed_newest``: the tree cannot list the occurrences; scan for them
LIST_BUDGET = 64  # nodes ``listed_newest`` visits at most


@njit(cache=True)
def _later(nodes, seqs, y, d, s, end, best):
    """The newer of ``best`` and the occurrence in sequence ``s`` that node ``y``
    (count 1) names, its label ``d`` tokens after the match's end.  A ref in
    another sequence (a family output beside the request's) names the one
    occurrence, elsewhere: a request's own tree never loses a sequence, so
    no removed one's tokens stand in for a surviving occurrence."""
    if nodes[y, REF_SEQ] != s:
        return best
    e = seqs[s, SEQ_OFF] + nodes[y, REF_POS] - d
    return e if best < e < end else best


@njit(cache=True, nogil=True)
def listed_newest(index, x, off, s, arena, end, length, window):
    """``newest_occurrence`` read off the own tree, without a scan, for the
    occurrences that end more than the tree's depth back.

    ``arena[end - length:end]`` ends at ``(x, off)`` in ``index``'s tree and
    ends sequence ``s``.  Every earlier occurrence in ``s`` continues; one
    that ends more than the depth back continues past some node of count 1
    below the match without reaching the sequence's end, and that node's ref
    names it: the subtree lists them all, up to ``LIST_BUDGET`` nodes, unless
    some string below the match reaches the tree's depth (its occurrences
    are not told apart there).  Returns what ``newest_occurrence`` would, when no
    occurrence ends within the depth; ``SCAN`` when the tree cannot say, or
    the newest's ref does not check out as an occurrence of the match.
    """
    nodes, seqs = index.nodes, index.seqs
    depth = index.meta[META_DEPTH]
    best = -1
    n = edge_len(nodes, seqs, x)
    if off < n and nodes[x, COUNT] == 1:
        best = _later(nodes, seqs, x, -off, s, end, best)
        if best == SCAN:
            return SCAN
        y = -1
    elif off < n:
        if length + n - off >= depth:
            return SCAN
        y = nodes[x, FIRST]
        d = n - off
    else:
        y = nodes[x, FIRST]
        d = 0
    visited = 0
    while y != -1:
        visited += 1
        if visited > LIST_BUDGET:
            return SCAN
        if nodes[y, COUNT] == 1:
            best = _later(nodes, seqs, y, d, s, end, best)
            if best == SCAN:
                return SCAN
        else:
            ny = edge_len(nodes, seqs, y)
            if length + d + ny >= depth:
                return SCAN
            if nodes[y, FIRST] != -1:
                d += ny
                y = nodes[y, FIRST]
                continue
        while y != -1 and nodes[y, NEXT] == -1:  # up to the next sibling
            y = nodes[y, PARENT]
            if y == x:
                y = -1
            else:
                d -= edge_len(nodes, seqs, y)
        if y != -1:
            y = nodes[y, NEXT]
    if best < 0:
        return -1
    start = seqs[s, SEQ_OFF]
    if best - length < start:
        return SCAN
    for t in range(1, length + 1):
        if arena[best - t] != arena[end - t]:
            return SCAN
    return best if end - best <= window else -1


@njit(cache=True, nogil=True)
def own_reference(trees, s, arena, start, end, depth, window, ref):
    """The longest own match (``longest`` over the own tree alone) of request
    sequence ``s``, whose context is ``arena[start:end]``, with its reference
    (``reference``, ``window`` > 0) written to ``ref``.  Occurrences within
    the tree's depth are scanned for; the own tree lists the ones before
    (``listed_newest``), and a scan finds them where it cannot."""
    sides, roots, own = trees
    ref[0] = 0
    if roots[0] < 0:
        return 0
    ix = side(sides, 0)
    length, x, off = longest_match(ix, roots[0], arena, start, end, depth - 1, True, own)
    if length <= 0:
        return 0
    first = ix.seqs[s, SEQ_OFF]  # the sequence's first token
    near = ix.meta[META_DEPTH]  # occurrences this close may run to the end: the tree hides them
    e = newest_occurrence(arena, first, end, length, min(window, near))
    if e < 0 and window > near:
        e = listed_newest(ix, x, off, s, arena, end, length, window)
        if e == SCAN:
            e = newest_occurrence(arena, first, end, length, window)
    _follow(arena, e, end, ref)
    return length


@njit(cache=True, nogil=True)
def draft_path(sides, pos, cap, thr, discount, src, match_len, stats, beat, cand, follow, last):
    """Most frequent continuation while its probability beats ``thr``.

    The string sits at positions ``pos`` on every side (``union``; node -1
    where a side lacks it), and counts add up over all of them; ``pos``
    moves along the draft; ``last`` is the token the draft follows (the
    context's last).  Returns ``(n, gain)``, the gain being
    ``sum(p - thr)``.  Gives up (gain -1) as soon as the path can no longer
    gain more than ``beat``: no later token is more probable than the
    current one.
    """
    n = 0
    prob = 1.0
    gain = 0.0
    ref, along = follow
    on = True  # the draft so far follows the reference
    while n < cap:
        d = discount if n == 0 else 0
        if along:
            if n >= ref[0]:
                break
            tok = ref[1 + n]
            c, cnt = counts_of(sides, pos, tok, d)
        else:
            tok, c, cnt = best_next(sides, pos, d)
        if cnt <= 0 or c <= 0 or tok >= SYNTHETIC_BASE:
            break
        agree = agreement(ref, n, tok, on)
        on = agree == cal.AGREE_SAME
        fine, q = cal.token_probability(stats, cal.with_agreement(src, agree), match_len, n, c,
                                        cnt, tok, last)
        p = prob * q
        if p <= thr:
            break
        prob = p
        cand.tokens[n] = tok
        cand.probs[n] = p
        cand.buckets[n] = fine
        gain += p - thr
        n += 1
        last = tok
        if gain + (cap - n) * (p - thr) <= beat:
            return n, -1.0
        advance_all(sides, pos, tok)
    return n, gain


@njit(cache=True, nogil=True)
def _push_next(index, x, off, entry, discount, thr, src, match_len, stats, heap, size, follow):
    """Push the tokens that may follow position ``(x, off)``; returns the new heap size.

    A heap entry is one candidate token: the token at offset ``off`` of node
    ``x``'s edge, its probability, its parent in the draft, bucket and depth;
    ``entry`` is ``(probability, parent, depth, token)`` of what they follow.
    ``follow`` is ``(ref, on)``: the reference, and whether the parent
    follows it.
    """
    prob, parent, d, last = entry
    ref, on = follow
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    table, state, kinds = stats
    before = cal.kind_of(kinds, last)
    cap = heap.prob.shape[0] - 1
    if off < edge_len(nodes, seqs, x):
        n = nodes[x, COUNT] - discount
        tok = label(arena, seqs, nodes, x, off)
        if n > 0 and tok < SYNTHETIC_BASE and size < cap:
            fine = cal.bucket(cal.with_agreement(src, agreement(ref, d, tok, on)), match_len, d,
                              n, n)
            p = prob * cal.probability(table, state, fine, n, n, match_len,
                                       cal.kind_of(kinds, tok), before, tok, last)
            if p > thr:
                size = heap_push(heap, size, p, x, off, parent, fine, d)
        return size
    n = nodes[x, COUNT] - discount
    if n <= 0:
        return size
    c = nodes[x, FIRST]
    while c != -1:
        k = nodes[c, COUNT]
        if k > n:
            k = n
        tok = nodes[c, TOKEN]
        if tok < SYNTHETIC_BASE and size < cap:
            fine = cal.bucket(cal.with_agreement(src, agreement(ref, d, tok, on)), match_len, d,
                              k, n)
            p = prob * cal.probability(table, state, fine, k, n, match_len,
                                       cal.kind_of(kinds, tok), before, tok, last)
            if p > thr:
                size = heap_push(heap, size, p, c, 0, parent, fine, d)
        c = nodes[c, NEXT]
    return size


@njit(cache=True, nogil=True)
def draft_tree(index, x, off, cap, thr, discount, src, match_len, stats, beat, cand, heap, follow):
    """Best-first tree of the most probable continuations, each beating ``thr``.

    ``follow`` is ``(ref, last)``: the reference, and the token the draft
    follows (the context's last).  Returns ``(n, gain)``; gives up (gain -1)
    once it cannot beat ``beat``.
    """
    nodes, arena, seqs = index.nodes, index.arena, index.seqs
    ref, last = follow
    # Typed arguments (no literals, ``np.bool_`` too), so ``_push_next`` compiles once.
    size = _push_next(index, np.int64(x), off, (1.0, np.int64(-1), np.int64(0), np.int64(last)),
                      np.int64(discount), thr, src, match_len, stats, heap, np.int64(0),
                      (ref, np.bool_(True)))
    n = 0
    gain = 0.0
    while n < cap and size > 0:
        prob, y, k, parent, fine, d, size = heap_take(heap, size)
        cand.tokens[n] = label(arena, seqs, nodes, y, k)
        cand.parents[n] = parent
        cand.probs[n] = prob
        cand.buckets[n] = fine
        gain += prob - thr
        n += 1
        if gain + (cap - n) * (prob - thr) <= beat:
            return n, -1.0
        size = _push_next(index, np.int64(y), k + 1, (prob, np.int64(n - 1), np.int64(d + 1),
                                                      np.int64(cand.tokens[n - 1])),
                          np.int64(0), thr, src, match_len, stats, heap, np.int64(size),
                          (ref, cal.agreement_of(fine) == cal.AGREE_SAME))
    return n, gain


@njit(cache=True)
def length_cap(limit, m, knobs):
    """The most tokens a draft from a match of ``m`` may have: ``limit``, or the
    length cap ``m * factor + offset`` where a factor is set."""
    cap = limit
    if knobs.factor >= 0.0:
        c2 = int(m * knobs.factor + knobs.offset + 1e-6)
        if c2 < cap:
            cap = c2
    return cap


@njit(cache=True, nogil=True)
def _copy_draft(cand, out, n):
    """The first ``n`` rows of draft ``cand`` into ``out``."""
    for j in range(n):  # loops, not slice copies: those compile a costly error path
        out.tokens[j] = cand.tokens[j]
        out.parents[j] = cand.parents[j]
        out.probs[j] = cand.probs[j]
        out.buckets[j] = cand.buckets[j]


@njit(cache=True)
def last_token(ctx, end):
    """The last token of context ``ctx[:end]`` (-1: none)."""
    return np.int64(ctx[end - 1]) if end > 0 else np.int64(-1)


@njit(cache=True, nogil=True)
def _first_probability(stats, src, m, c, n, ref, tok, last):
    """Estimated acceptance of a draft's first token ``tok`` (chosen by ``c``
    of ``n`` after a match of ``m``), in its plane against the reference
    ``ref``; with ``tok`` -1 (not known yet) the highest over agreeing or
    not, over the token's kind and over its token row: a bound."""
    table, state, kinds = stats
    before = cal.kind_of(kinds, last)
    if tok >= 0:
        # Typed arguments (no literals): the callees compile once for every caller.
        on = agreement(ref, np.int64(0), np.int64(tok), np.bool_(True))
        fine = cal.bucket(cal.with_agreement(src, on), m, 0, c, n)
        return cal.probability(table, state, fine, c, n, m, cal.kind_of(kinds, tok), before,
                               np.int64(tok), last)
    best = 0.0
    for agree in range(cal.N_AGREE):
        if (agree == cal.AGREE_NONE) != (ref[0] == 0):
            continue
        fine = cal.bucket(cal.with_agreement(src, agree), m, 0, c, n)
        best = max(best, cal.probability(table, state, fine, c, n, m, np.int64(-1),
                                         np.int64(-1), cal.ANY_TOKEN, last))
        if kinds.shape[0] > 1 or kinds[0] >= 0:  # a tokenizer's kinds: each may lift
            for kind in range(cal.N_KIND):
                best = max(best, cal.probability(table, state, fine, c, n, m, kind, before,
                                                 cal.ANY_TOKEN, last))
    return best


@njit(cache=True, nogil=True)
def _own_end(own, length, pos):
    """Whether the context's own occurrence ends at ``pos`` (it has no continuation yet)."""
    return own[0] >= 0 and length <= own[2] and pos[0] >= 0 and pos[1] == pos[2]


@njit(cache=True, nogil=True)
def _lengths(trees, ctx, end, span, how, knobs, stats, best_gain, out, work, pos):
    """Try match lengths ``hi`` down to ``lo`` of ``ctx[:end]`` in ``trees``.

    ``trees`` is ``(sides, roots, own)``: the side table (``union``), the tree on
    each (``roots[k]``, -1: none) and the request's own open sequence in
    side 0's tree, if any (see ``trie.suffix_position``).  Several trees are
    one pool's parts, and a path draft adds up their counts; tree drafts
    take one tree only, and every candidate's tree goes into the merged one.
    Only sides ``0 .. len(pos) - 1`` are read.  ``span`` is ``(lo, hi,
    anchor_out, reach)``: on side ``k < len(reach)`` every suffix of at most
    ``reach[k]`` tokens of the ordinary context is known to occur (a suffix
    of an occurring string occurs; ``longest``), so it is placed with one
    lookup per edge.  A draft whose gain beats
    ``best_gain`` is written to ``out``.  With ``anchor_out >= 0`` the
    context is start-anchored: its last ``anchor_out`` tokens are output, the
    ones before are anchors, and the source follows from how many anchors a
    length spans.  ``pos`` is scratch for the positions.  Returns ``(n,
    gain, match_len, length)``, n 0 when nothing beat ``best_gain``: the
    match length calibration sees (``anchor_out`` for an anchored context)
    and the tokens of ``ctx`` matched.
    """
    sides, roots, own = trees
    lo_len, hi_len, anchor_out, reach = span
    src, state, limit, thr = how
    cand = work.cand
    depth = side(sides, 0).active.shape[1]
    best_n = 0
    best_len = 0
    best_length = 0
    longer = -1  # occurrences of the last length tried
    last = last_token(ctx, end)  # what a draft's first token follows
    for length in range(hi_len, lo_len - 1, -1):
        for k in range(pos.shape[0]):
            pos[k, 0] = -1
            if roots[k] >= 0:
                ix = side(sides, k)
                mine = own if k == 0 else NONE
                if anchor_out < 0 and k < reach.shape[0] and length <= reach[k]:
                    x, off = occurring_position(ix, roots[k], ctx, end, length, mine)
                else:
                    x, off = suffix_position(ix, roots[k], ctx, end, length, mine)
                if x >= 0:
                    pos[k, 0], pos[k, 1], pos[k, 2] = position(ix, x, off)
        count, held, most = occurrences(sides, pos)
        if held == 0:
            continue
        # As many occurrences as one token longer: every occurrence is one of
        # the longer match, so the continuations are the same, and the longer
        # match already drafted them unless the depth bound cut its draft.
        if anchor_out < 0 and count == longer and length + 1 + limit <= depth:
            continue
        longer = count
        m = length
        s = src
        if anchor_out >= 0:
            m = anchor_out
            s = cal.SRC_ANCHOR + length - anchor_out - 1
        s += cal.N_SRC * state
        cap = length_cap(limit, m, knobs)
        if cap <= 0:
            continue
        discount = 0
        if _own_end(own, length, (pos[0, 0], pos[0, 1], pos[0, 2])):
            discount = 1
        # Every later token is at most as probable as the first.  Where one
        # tree holds the string, a path's first token is its most frequent
        # next one, scored in its own plane; a tree draft's may be any token,
        # and where several trees hold the string its count is only bounded
        # here (draft_path finds it, and gives up at once where it cannot win).
        tok = -1
        if held > 1:
            c, cnt = bound_next(sides, pos, discount)
        else:
            first, c, cnt = best_next(sides, pos, discount)
            if not knobs.tree:
                tok = first
        if cnt <= 0 or c <= 0:
            continue
        q = _first_probability(stats, s, m, c, cnt, work.ref, tok, last)
        if q <= thr or (not knobs.tree and cap * (q - thr) <= best_gain):
            continue
        if knobs.tree:  # one tree: the side that holds the string
            ix = side(sides, most)
            n, gain = draft_tree(ix, pos[most, 0], pos[most, 1], cap, thr, discount, s, m, stats,
                                 -1.0, cand, work.heap, (work.ref, last))
            merge_in(work.merged, cand, n)  # every candidate's whole tree
        else:
            n, gain = draft_path(sides, pos, cap, thr, discount, s, m, stats, best_gain, cand,
                                 (work.ref, np.bool_(False)), last)
            for i in range(n):
                cand.parents[i] = i - 1
        # Longer matches are tried first and win ties.
        if n > 0 and gain > best_gain:
            best_gain = gain
            best_n = n
            best_len = m
            best_length = length
            _copy_draft(cand, out, n)
    return best_n, best_gain, best_len, best_length


@njit(cache=True, nogil=True)
def longest(trees, ctx, start, end, depth, reach):
    """The longest suffix of ``ctx[start:end]`` (below ``depth`` tokens) that
    some tree of ``trees`` (sides ``0 .. len(reach) - 1``) holds with a
    continuation; each side's own longest goes to ``reach`` (0: none)."""
    sides, roots, own = trees
    hi = 0
    for k in range(reach.shape[0]):
        reach[k] = 0
        if roots[k] >= 0:
            h, _, _ = longest_match(side(sides, k), roots[k], ctx, start, end, depth - 1,
                                    True, own if k == 0 else NONE)
            if h > 0:
                reach[k] = h
            if h > hi:
                hi = h
    return hi


@njit(cache=True, nogil=True)
def _tree_draft(trees, ctx, start, end, anchored, how, knobs, stats, best, out, work, scratch, hi):
    """The best calibrated draft of ``trees``, counted together, if it beats ``best``.

    ``trees`` is as for ``_lengths``; ``scratch`` is ``(pos, reach)``, the
    positions ``_lengths`` takes and a row per side of ``pos`` for
    ``longest``.  Queries the
    ordinary context ``ctx[start:end]`` at every match length and, with
    ``anchors > 0``, the start-anchored context ``c_arena[:c_end]``
    (``anchors`` anchors, then ``out_len`` output tokens), where ``anchored``
    is ``(c_arena, c_end, anchors, out_len)``, at the lengths that reach into
    the anchors.  ``hi``: the longest match of the ordinary context, when the
    caller has it for the one side of ``pos`` (-1: found here).  Returns
    ``(n, gain, match_len, source)``, n 0 when nothing beat ``best``.
    """
    sides, roots, own = trees
    pos, reach = scratch
    c_arena, c_end, n_anchors, out_len = anchored
    depth = knobs.depth
    n_best = 0
    m_best = 0
    source = FROM_NONE
    if hi < 0:
        hi = longest(trees, ctx, start, end, depth, reach)
    else:
        reach[0] = hi
    if hi > 0:
        n, gain, m, _ = _lengths(trees, ctx, end, (np.int64(1), hi, np.int64(-1), reach), how,
                                 knobs, stats, best, out, work, pos)
        if n > 0:
            best = gain
            n_best = n
            m_best = m
            source = FROM_REQUEST if how[0] == cal.SRC_REQUEST else FROM_CROSS
    if knobs.anchors and n_anchors > 0 and out_len + 1 < depth:
        hi = out_len + n_anchors
        if hi > depth - 1:
            hi = depth - 1
        n, gain, m, _ = _lengths((sides, roots, (own[0], own[1], own[1])), c_arena, c_end,
                                 (out_len + 1, hi, out_len, reach), how, knobs, stats, best, out,
                                 work, pos)
        if n > 0:
            best = gain
            n_best = n
            m_best = m
            source = FROM_ANCHOR
    return n_best, best, m_best, source


@njit(cache=True)
def reference_counted(length, cap, depth):
    """The suffix length whose counts score the reference after a match of
    ``length``: the trie holds strings of at most ``depth`` tokens, so counts
    along ``cap`` drafted tokens are read after at most ``depth - cap``."""
    return max(1, min(length, depth - cap))


@njit(cache=True, nogil=True)
def _reference_draft(trees, ctx, end, length, how, knobs, stats, best, out, work, pos):
    """The reference (``work.ref``) drafted from the request's own tree, where
    it matches ``length`` tokens, if it beats ``best``; a tree draft merges it
    in whatever it gains.  Returns ``((n, gain, match_len, source), drafted)``:
    ``drafted`` tokens of it are in ``work.alt`` (all it has where the tree or
    the arbiter takes it whatever it gains)."""
    sides, roots, own = trees
    src, state, limit, thr = how
    ix = side(sides, 0)
    cap = length_cap(limit, length, knobs)
    counted = reference_counted(length, cap, knobs.depth)
    x, off = suffix_position(ix, roots[0], ctx, end, counted, own)
    if x < 0:
        return (0, best, 0, FROM_NONE), 0
    pos[0, 0], pos[0, 1], pos[0, 2] = position(ix, x, off)
    discount = 1 if _own_end(own, counted, (pos[0, 0], pos[0, 1], pos[0, 2])) else 0
    cand = work.alt  # whole, for the arbiter and the merged tree
    whole = knobs.tree or knobs.arbitrate
    n, gain = draft_path(sides, pos, cap, thr, discount, src + cal.N_SRC * state, length, stats,
                         -1.0 if whole else best, cand, (work.ref, np.bool_(True)),
                         last_token(ctx, end))
    for i in range(n):
        cand.parents[i] = i - 1
    if knobs.tree:
        merge_in(work.merged, cand, n)
    if n == 0 or gain <= best:
        return (0, best, 0, FROM_NONE), n
    _copy_draft(cand, out, n)
    return (n, gain, length, FROM_REQUEST), n


@njit(cache=True, nogil=True)
def own_output(delta, cs):
    """``(end, anchors, output length)`` of a request's own open output sequence
    ``cs`` in the delta index (``[anchors..., output so far]``; all 0 for -1)."""
    if cs < 0:
        return np.int64(0), np.int64(0), np.int64(0)
    n_anchors = anchors(delta, cs)
    return (delta.seqs[cs, SEQ_OFF] + delta.seqs[cs, SEQ_LEN], n_anchors,
            delta.seqs[cs, SEQ_LEN] - n_anchors)


@njit(cache=True, nogil=True)
def _take(drafted, best, out, i):
    """Keep a candidate's result as request ``i``'s draft if it drafted; returns the best gain."""
    n, gain, m, source = drafted
    if n > 0:
        out.n[i] = n
        out.match[i] = m
        out.source[i] = source
        return gain
    return best


@njit(cache=True, nogil=True)
def _arbitrate(i, s, length, ref_match, n_ref, out, alt, pending):
    """Keep this step's two drafts for ``arbiter.settle``, and draft the
    reference's instead of the policy's pick where its cell prefers it."""
    n = out.n[i]
    same = 0
    while same < n and same < n_ref and out.tokens[i, same] == alt.tokens[same]:
        same += 1
    if same == n and same == n_ref:
        return  # the same draft
    row = arbiter.cell(out.match[i], n, out.source[i], ref_match, 1 if same > 0 else 0)
    arbiter.keep(pending.keep_meta, pending.keep_tokens, s, length, row, out.tokens[i], n,
                 alt.tokens, n_ref)
    if n_ref > 0 and arbiter.prefers_reference(pending.arbiter, row):
        _copy_draft(alt, Candidate(out.tokens[i], out.parents[i], out.probs[i], out.buckets[i]),
                    n_ref)
        for j in range(n_ref):  # the policy's calibration learns from its own picks only
            out.buckets[i, j] = -1
        out.n[i] = n_ref
        out.match[i] = ref_match
        out.source[i] = FROM_REQUEST


@njit(cache=True, nogil=True)
def draft_request(i, state, thr, local, local_roots, delta, tables, batch, knobs, stats, out,
                  work, pending):
    """The calibrated policy for request ``i``: the best draft of all its trees.

    ``tables`` are side tables (``union``): ``mine`` has one side, ``local``
    (the requests' own trees); ``cross`` is the cross pool, ``delta`` (its
    in-memory part) then its snapshot segments.  A tree draft merges every
    candidate's tree (``merge``); its match length and source are the best
    candidate's.
    """
    if knobs.tree:
        merge_reset(work.merged)
    mine, cross = tables
    n_sides = cross.shape[0]
    pos = np.empty((n_sides, 3), np.int64)
    reach = np.zeros(n_sides, np.int64)
    solo = np.full(n_sides, -1, np.int64)  # one tree on one side
    l_seqs = local.seqs
    s = batch.seqs[i]
    start, end = tail(local, s, knobs.depth)
    limit = batch.limits[i]
    row = Candidate(out.tokens[i], out.parents[i], out.probs[i], out.buckets[i])
    cs = batch.cross_seqs[i]
    c_end, n_anchors, out_len = own_output(delta, cs)
    own_len = l_seqs[s, SEQ_LEN]
    ctx = local.arena
    arbitrating = knobs.arbitrate and not knobs.tree  # path drafts only
    if arbitrating:
        arbiter.settle(pending.arbiter, pending.keep_meta, pending.keep_tokens, s, ctx,
                       l_seqs[s, SEQ_OFF], own_len, thr)
    own_local = (l_seqs[s, SEQ_SLOT], own_len, own_len)
    solo[0] = local_roots[batch.trees[i]]
    work.ref[0] = 0
    longest_own = -1
    if knobs.newest > 0:
        longest_own = own_reference((mine, solo, own_local), s, ctx, start, end, knobs.depth,
                                    knobs.newest, work.ref)
    n, best, m, source = _tree_draft(
        (mine, solo, own_local), ctx, start, end,
        (delta.arena, c_end, np.int64(0), np.int64(0)),
        (np.int64(cal.SRC_REQUEST), state, limit, thr), knobs, stats, 0.0, row, work,
        (pos[:1], reach[:1]), np.int64(longest_own))
    out.n[i] = n
    out.match[i] = m
    out.source[i] = source
    n_ref = -1  # no reference
    if work.ref[0] > 0:
        drafted, n_ref = _reference_draft((mine, solo, own_local), ctx, end, longest_own,
                                          (np.int64(cal.SRC_REQUEST), state, limit, thr), knobs,
                                          stats, best, row, work, pos[:1])
        best = _take(drafted, best, out, i)
    solo[0] = -1
    anchored = (delta.arena, c_end, n_anchors, out_len)
    how = (np.int64(cal.SRC_CROSS), state, limit, thr)
    # Namespace j's trees in the in-memory part (side 0) and the snapshot
    # segments: path drafts count all together (``union``), tree drafts take
    # each apart, segments first.
    for j in range(batch.cross_roots.shape[1]):
        roots = batch.cross_roots[i, j]
        own = NONE
        if cs >= 0 and roots[0] >= 0 and delta.seqs[cs, SEQ_ROOT] == roots[0]:
            own = (delta.seqs[cs, SEQ_SLOT], delta.seqs[cs, SEQ_LEN], out_len)
        if not knobs.tree:
            used = n_sides
            while used > 1 and roots[used - 1] < 0:
                used -= 1
            best = _take(_tree_draft((cross, roots, own), ctx, start, end, anchored, how,
                                     knobs, stats, best, row, work, (pos[:used], reach[:used]),
                                     np.int64(-1)), best, out, i)
            continue
        for t in range(1, n_sides + 1):
            k = t % n_sides
            if roots[k] < 0:
                continue
            solo[k] = roots[k]
            best = _take(_tree_draft((cross, solo, own if k == 0 else NONE), ctx, start,
                                     end, anchored, how, knobs, stats, best, row, work,
                                     (pos[:k + 1], reach[:k + 1]), np.int64(-1)), best, out, i)
            solo[k] = -1
    if knobs.tree and out.n[i] > 0:
        out.n[i], _ = merge_out(work.merged, limit, thr, row)
    if n_ref >= 0 and arbitrating:
        _arbitrate(i, s, own_len, longest_own, n_ref, out, work.alt, pending)
    score = 0.0
    for t in range(out.n[i]):
        score += out.probs[i, t]
    out.score[i] = score
