"""One engine step: drafts for a batch of requests, from every pool, in one call.

Two drafting policies share the candidate search:

* **calibrated** (default): each drafted token's probability is the product
  of calibrated acceptance estimates (``calibration``), and a draft grows while
  its next token's probability beats the threshold that the draft cost sets.
  Candidates are compared by their expected net gain, ``sum(p - threshold)``.
  With ``ANCHORED`` a request also queries the cross-request trees with its
  start-anchored context ``[prompt key, prompt-start key, BOS, output so far]``
  (its own open sequence in the cross pool), so the start of an output is
  matched against the starts of past outputs.
* **counts**: raw count ratios, drafts capped by ``match_len * factor +
  offset`` and ``min_prob``, ranked by their sum (what arctic-inference does,
  plus the policy flags below).

Synthetic tokens (``SYNTHETIC_BASE`` and above) mark output starts; no draft
ever holds one.
"""

import numpy as np
from numba import njit

from . import calibration as cal
from .suffix_index import (BEST, COUNT, FIRST, NEXT, SEQ_LEN, SEQ_OFF, SEQ_ROOT, SEQ_SLOT,
                           TOKEN, _elen, _label, draft_path, draft_tree, heap_pop, heap_push,
                           longest_match, suffix_position)
from .tokens import SYNTHETIC_BASE

# Policy flags (bench/policy_bench.py measures each).
ALL_LENGTHS = 1     # try every match length, keep the best, not just the longest
SELF_DISCOUNT = 2   # leave the context's own occurrence out of the first probability
LONG_BIAS = 4       # counts policy: a match of length L ranks (1 + L / (4 * depth)) times its sum
CALIBRATED = 8      # calibrated probabilities and cost-aware length (else: counts)
ANCHORED = 16       # also query cross trees with the start-anchored context
DEFAULT_POLICY = ALL_LENGTHS | SELF_DISCOUNT | CALIBRATED | ANCHORED
COUNTS_POLICY = ALL_LENGTHS | SELF_DISCOUNT | LONG_BIAS

# Draft sources (out_source).
FROM_NONE = -1
FROM_REQUEST = 0
FROM_CROSS = 1
FROM_ANCHOR = 2

# --------------------------------------------------------------------------
# Counts policy.
# --------------------------------------------------------------------------

@njit(cache=True)
def _pool_draft_counts(nodes, hkeys, hvals, arena, seqs, active, root, ctx, start, end,
                       depth, limit, factor, offset, min_prob, tree_mode, slot, own_len,
                       own_valid, flags, out_tokens, out_parents, out_probs, cand_tokens,
                       cand_parents, cand_probs, hp, hn, ho, hpar, hb, hd):
    """Draft from one tree for context ``ctx[start:end]`` by count ratios.

    ``slot``, ``own_len`` and ``own_valid`` describe the request's own open
    sequence in this tree (slot -1: none; see ``suffix_position``).  Returns
    ``(n, score, rank, match_len)``: the score is the sum of the
    probabilities, the rank what candidates were compared by; n is 0 when
    nothing matched.
    """
    match_len, x, off = longest_match(nodes, hkeys, hvals, arena, seqs, active, root, ctx,
                                      start, end, depth - 1, True, slot, own_len, own_valid)
    if match_len <= 0:
        return 0, 0.0, 0.0, 0
    shortest = 1 if flags & ALL_LENGTHS else match_len
    best_n = 0
    best_score = 0.0
    best_rank = -1.0
    best_len = match_len
    for length in range(match_len, shortest - 1, -1):
        cap = int(length * factor + offset + 1e-6)
        if cap > limit:
            cap = limit
        bias = 1.0 + length / (4.0 * depth) if flags & LONG_BIAS else 1.0
        # A draft scores at most its length: shorter matches cannot win now.
        if cap * bias <= best_rank:
            break
        x, off = suffix_position(nodes, hkeys, hvals, arena, seqs, root, ctx, end, length,
                                 active, slot, own_len, own_valid)
        discount = 0
        at_end = off == _elen(nodes, seqs, x)
        if flags & SELF_DISCOUNT and slot >= 0 and length <= own_valid and at_end:
            discount = 1
        if at_end:
            b = nodes[x, BEST]
            if b == -1:
                continue
            # Every later token is at most as probable as the first one.
            if cap * bias * nodes[b, COUNT] / (nodes[x, COUNT] - discount) <= best_rank:
                continue
        if tree_mode:
            n, score = draft_tree(nodes, arena, seqs, x, off, cap, min_prob,
                                  cand_tokens, cand_parents, cand_probs, hp, hn, ho, hpar, hb, hd)
        else:
            n, score = draft_path(nodes, arena, seqs, x, off, cap, min_prob,
                                  cand_tokens, cand_probs, discount)
            for i in range(n):
                cand_parents[i] = i - 1
        rank = score * bias
        # Longer matches are tried first and win ties.
        if n > 0 and rank > best_rank:
            best_n = n
            best_score = score
            best_rank = rank
            best_len = length
            out_tokens[:n] = cand_tokens[:n]
            out_parents[:n] = cand_parents[:n]
            out_probs[:n] = cand_probs[:n]
    if best_n == 0:
        return 0, 0.0, 0.0, match_len
    return best_n, best_score, best_rank, best_len


# --------------------------------------------------------------------------
# Calibrated policy.
# --------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _step_counts(nodes, arena, seqs, x, off, length, discount):
    """The forced or most frequent next token at ``(x, off)``.

    Returns ``(token, c, n, next_node)``: ``c`` of the ``n`` occurrences of
    the string continue with it; ``n <= 0`` when nothing follows.
    """
    if off < length:
        n = nodes[x, COUNT] - discount
        return _label(arena, seqs, nodes, x, off), n, n, x
    b = nodes[x, BEST]
    if b == -1:
        return -1, 0, 0, -1
    n = nodes[x, COUNT] - discount
    c = nodes[b, COUNT]
    if c > n:
        c = n
    return nodes[b, TOKEN], c, n, b


@njit(cache=True)
def _calibrated_path(nodes, arena, seqs, x, off, cap, thr, discount, src, match_len, table, state,
                     beat, out_tokens, out_probs, out_buckets):
    """Most frequent continuation from ``(x, off)`` while its probability beats ``thr``.

    Returns ``(n, gain)``, the gain being ``sum(p - thr)``.  Gives up (gain
    -1) as soon as the path can no longer gain more than ``beat``: no later
    token is more probable than the current one.
    """
    n = 0
    prob = 1.0
    gain = 0.0
    length = _elen(nodes, seqs, x)
    while n < cap:
        d = discount if n == 0 else 0
        tok, c, cnt, nx = _step_counts(nodes, arena, seqs, x, off, length, d)
        if cnt <= 0 or c <= 0 or tok >= SYNTHETIC_BASE:
            break
        fine = cal.bucket(src, match_len, n, c, cnt)
        p = prob * cal.probability(table, state, fine, c, cnt)
        if p <= thr:
            break
        prob = p
        out_tokens[n] = tok
        out_probs[n] = p
        out_buckets[n] = fine
        gain += p - thr
        n += 1
        if gain + (cap - n) * (p - thr) <= beat:
            return n, -1.0
        if nx != x:
            x = nx
            off = 1
            length = _elen(nodes, seqs, x)
        else:
            off += 1
    return n, gain


@njit(cache=True)
def _push_next(nodes, arena, seqs, x, off, prob, parent, d, discount, thr, src, match_len,
               table, state, hp, hn, ho, hpar, hb, hd, size):
    """Push the tokens that may follow position ``(x, off)``; returns the new heap size.

    A heap entry is one candidate token: the token at offset ``off`` of node
    ``x``'s edge, its probability, its parent in the draft, bucket and depth.
    """
    cap = hp.shape[0] - 1
    if off < _elen(nodes, seqs, x):
        n = nodes[x, COUNT] - discount
        tok = _label(arena, seqs, nodes, x, off)
        if n > 0 and tok < SYNTHETIC_BASE and size < cap:
            fine = cal.bucket(src, match_len, d, n, n)
            p = prob * cal.probability(table, state, fine, n, n)
            if p > thr:
                heap_push(hp, hn, ho, hpar, hb, hd, size, p, x, off, parent, fine, d)
                size += 1
        return size
    n = nodes[x, COUNT] - discount
    if n <= 0:
        return size
    c = nodes[x, FIRST]
    while c != -1:
        k = nodes[c, COUNT]
        if k > n:
            k = n
        if nodes[c, TOKEN] < SYNTHETIC_BASE and size < cap:
            fine = cal.bucket(src, match_len, d, k, n)
            p = prob * cal.probability(table, state, fine, k, n)
            if p > thr:
                heap_push(hp, hn, ho, hpar, hb, hd, size, p, c, 0, parent, fine, d)
                size += 1
        c = nodes[c, NEXT]
    return size


@njit(cache=True)
def _calibrated_tree(nodes, arena, seqs, x, off, cap, thr, discount, src, match_len, table, state,
                     beat, out_tokens, out_parents, out_probs, out_buckets,
                     hp, hn, ho, hpar, hb, hd):
    """Best-first tree of the most probable continuations, each beating ``thr``.

    Returns ``(n, gain)``; gives up (gain -1) once it cannot beat ``beat``.
    """
    # Typed arguments (no literals), so ``_push_next`` compiles once.
    size = _push_next(nodes, arena, seqs, np.int64(x), off, 1.0, np.int64(-1), np.int64(0),
                      np.int64(discount), thr, src, match_len, table, state, hp, hn, ho, hpar,
                      hb, hd, np.int64(0))
    n = 0
    gain = 0.0
    while n < cap and size > 0:
        prob = hp[0]
        y = hn[0]
        k = ho[0]
        parent = hpar[0]
        fine = hb[0]
        d = hd[0]
        size -= 1
        heap_pop(hp, hn, ho, hpar, hb, hd, size)
        out_tokens[n] = _label(arena, seqs, nodes, y, k)
        out_parents[n] = parent
        out_probs[n] = prob
        out_buckets[n] = fine
        gain += prob - thr
        n += 1
        if gain + (cap - n) * (prob - thr) <= beat:
            return n, -1.0
        size = _push_next(nodes, arena, seqs, np.int64(y), k + 1, prob, np.int64(n - 1),
                          np.int64(d + 1), np.int64(0), thr, src, match_len, table, state, hp,
                          hn, ho, hpar, hb, hd, np.int64(size))
    return n, gain


@njit(cache=True)
def _pool_draft_calibrated(nodes, hkeys, hvals, arena, seqs, active, root, ctx, end,
                           lo_len, hi_len, anchor_out, limit, factor, offset, thr, tree_mode,
                           slot, own_len, own_valid, src, recent, flags, table, state,
                           best_gain,
                           out_tokens, out_parents, out_probs, out_buckets,
                           cand_tokens, cand_parents, cand_probs, cand_buckets,
                           hp, hn, ho, hpar, hb, hd):
    """Try match lengths ``hi_len`` down to ``lo_len`` of ``ctx[:end]`` in one tree.

    A draft whose gain beats ``best_gain`` is written to ``out_*``.  With
    ``anchor_out >= 0`` the context is start-anchored: its last
    ``anchor_out`` tokens are output, the ones before are anchors, and the
    source follows from how many anchors a length spans.  Returns ``(n,
    gain, match_len)``, n 0 when nothing beat ``best_gain``.
    """
    depth = active.shape[1]
    best_n = 0
    best_len = 0
    longer = -1  # occurrences of the last length tried
    for length in range(hi_len, lo_len - 1, -1):
        x, off = suffix_position(nodes, hkeys, hvals, arena, seqs, root, ctx, end, length,
                                 active, slot, own_len, own_valid)
        if x == -1:
            continue
        # As many occurrences as one token longer: every occurrence is one of
        # the longer match, so the continuations are the same, and the longer
        # match already drafted them unless the depth bound cut its draft.
        occurrences = nodes[x, COUNT]
        if anchor_out < 0 and occurrences == longer and length + 1 + limit <= depth:
            continue
        longer = occurrences
        m = length
        s = src
        if anchor_out >= 0:
            m = anchor_out
            s = cal.SRC_ANCHOR + length - anchor_out - 1
        s += cal.N_SRC * recent
        cap = limit
        if factor >= 0.0:
            c2 = int(m * factor + offset + 1e-6)
            if c2 < cap:
                cap = c2
        if cap <= 0:
            continue
        length_x = _elen(nodes, seqs, x)
        discount = 0
        if flags & SELF_DISCOUNT and slot >= 0 and length <= own_valid and off == length_x:
            discount = 1
        # Every later token is at most as probable as the first.
        tok, c, cnt, nx = _step_counts(nodes, arena, seqs, x, off, length_x, discount)
        if cnt <= 0 or c <= 0:
            continue
        q = cal.probability(table, state, cal.bucket(s, m, 0, c, cnt), c, cnt)
        if cap * (q - thr) <= best_gain:
            continue
        if tree_mode:
            n, gain = _calibrated_tree(nodes, arena, seqs, x, off, cap, thr, discount, s, m,
                                       table, state, best_gain, cand_tokens, cand_parents, cand_probs,
                                       cand_buckets, hp, hn, ho, hpar, hb, hd)
        else:
            n, gain = _calibrated_path(nodes, arena, seqs, x, off, cap, thr, discount, s, m,
                                       table, state, best_gain, cand_tokens, cand_probs, cand_buckets)
            for i in range(n):
                cand_parents[i] = i - 1
        # Longer matches are tried first and win ties.
        if n > 0 and gain > best_gain:
            best_gain = gain
            best_n = n
            best_len = m
            out_tokens[:n] = cand_tokens[:n]
            out_parents[:n] = cand_parents[:n]
            out_probs[:n] = cand_probs[:n]
            out_buckets[:n] = cand_buckets[:n]
    return best_n, best_gain, best_len


@njit(cache=True)
def _anchors(arena, seqs, s):
    """Leading synthetic tokens of sequence ``s`` (its start anchors)."""
    off = seqs[s, SEQ_OFF]
    n = seqs[s, SEQ_LEN]
    a = 0
    while a < n and arena[off + a] >= SYNTHETIC_BASE:
        a += 1
    return a


@njit(cache=True)
def _tree_draft(nodes, hkeys, hvals, arena, seqs, active, root, l_arena, start, end,
                c_arena, c_end, anchors, out_len, slot, own, valid, src, recent, depth, limit,
                factor,
                offset, thr, tree_mode, flags, table, state, best, out_tokens, out_parents, out_probs,
                out_buckets, cand_tokens, cand_parents, cand_probs, cand_buckets,
                hp, hn, ho, hpar, hb, hd):
    """The best calibrated draft of one tree, if it beats ``best``.

    Queries the ordinary context ``l_arena[start:end]`` at every match length
    and, with ``anchors > 0``, the start-anchored context ``c_arena[:c_end]``
    (``anchors`` anchors, then ``out_len`` output tokens) at the lengths that
    reach into the anchors.  Returns ``(n, gain, match_len, source)``, n 0
    when nothing beat ``best``.
    """
    n_best = 0
    m_best = 0
    source = FROM_NONE
    hi, x, off = longest_match(nodes, hkeys, hvals, arena, seqs, active, root, l_arena,
                               start, end, depth - 1, True, slot, own, valid)
    if hi > 0:
        lo = 1 if flags & ALL_LENGTHS else hi
        n, gain, m = _pool_draft_calibrated(
            nodes, hkeys, hvals, arena, seqs, active, root, l_arena, end, lo, hi, -1,
            limit, factor, offset, thr, tree_mode, slot, own, valid, src, recent, flags, table,
            state,
            best, out_tokens, out_parents, out_probs, out_buckets,
            cand_tokens, cand_parents, cand_probs, cand_buckets, hp, hn, ho, hpar, hb, hd)
        if n > 0:
            best = gain
            n_best = n
            m_best = m
            source = FROM_REQUEST if src == cal.SRC_REQUEST else FROM_CROSS
    if flags & ANCHORED and anchors > 0 and out_len + 1 < depth:
        hi = out_len + anchors
        if hi > depth - 1:
            hi = depth - 1
        n, gain, m = _pool_draft_calibrated(
            nodes, hkeys, hvals, arena, seqs, active, root, c_arena, c_end, out_len + 1,
            hi, out_len, limit, factor, offset, thr, tree_mode, slot, own, own, src, recent,
            flags, table, state, best, out_tokens, out_parents, out_probs, out_buckets,
            cand_tokens, cand_parents, cand_probs, cand_buckets, hp, hn, ho, hpar, hb, hd)
        if n > 0:
            best = gain
            n_best = n
            m_best = m
            source = FROM_ANCHOR
    return n_best, best, m_best, source


@njit(cache=True)
def _draft_calibrated(i, recent, l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, l_roots,
                      b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, b_roots,
                      c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, c_roots,
                      depth, req_seqs, req_trees, req_cross_seqs, limits, factor, offset,
                      thr, tree_mode, flags, table, state, out_tokens, out_parents, out_probs,
                      out_n, out_score, out_match, out_source, out_buckets, cand_tokens,
                      cand_parents, cand_probs, cand_buckets, hp, hn, ho, hpar, hb, hd):
    """The calibrated policy for request ``i``: the best draft of all its trees."""
    s = req_seqs[i]
    end = l_seqs[s, SEQ_OFF] + l_seqs[s, SEQ_LEN]
    start = end - depth
    if start < l_seqs[s, SEQ_OFF]:
        start = l_seqs[s, SEQ_OFF]
    limit = limits[i]
    # Own open output sequence in the cross pool: [anchors..., output so far].
    cs = req_cross_seqs[i]
    c_end = 0
    anchors = 0
    out_len = 0
    if cs >= 0:
        c_end = c_seqs[cs, SEQ_OFF] + c_seqs[cs, SEQ_LEN]
        anchors = _anchors(c_arena, c_seqs, cs)
        out_len = c_seqs[cs, SEQ_LEN] - anchors
    own = l_seqs[s, SEQ_LEN]
    n, best, m, source = _tree_draft(
        l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, np.int64(l_roots[req_trees[i]]), l_arena,
        start, end, c_arena, c_end, 0, 0, l_seqs[s, SEQ_SLOT], own, own, cal.SRC_REQUEST, recent,
        depth, limit, factor, offset, thr, tree_mode, flags, table, state, 0.0, out_tokens[i],
        out_parents[i], out_probs[i], out_buckets[i], cand_tokens, cand_parents, cand_probs,
        cand_buckets, hp, hn, ho, hpar, hb, hd)
    out_n[i] = n
    out_match[i] = m
    out_source[i] = source
    for j in range(b_roots.shape[1]):
        root = b_roots[i, j]
        if root < 0:
            continue
        n, gain, m, source = _tree_draft(
            b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, root, l_arena, start, end,
            c_arena, c_end, anchors, out_len, -1, 0, 0, cal.SRC_CROSS, recent, depth, limit, factor,
            offset, thr, tree_mode, flags, table, state, best, out_tokens[i], out_parents[i],
            out_probs[i], out_buckets[i], cand_tokens, cand_parents, cand_probs, cand_buckets,
            hp, hn, ho, hpar, hb, hd)
        if n > 0:
            best = gain
            out_n[i] = n
            out_match[i] = m
            out_source[i] = source
    for j in range(c_roots.shape[1]):
        root = c_roots[i, j]
        if root < 0:
            continue
        slot = -1
        own = 0
        if cs >= 0 and c_seqs[cs, SEQ_ROOT] == root:
            slot = c_seqs[cs, SEQ_SLOT]
            own = c_seqs[cs, SEQ_LEN]
        valid = out_len if slot >= 0 else 0
        n, gain, m, source = _tree_draft(
            c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, root, l_arena, start, end,
            c_arena, c_end, anchors, out_len, slot, own, valid,
            cal.SRC_CROSS, recent, depth, limit, factor, offset, thr, tree_mode, flags, table,
            state, best,
            out_tokens[i], out_parents[i], out_probs[i], out_buckets[i], cand_tokens,
            cand_parents, cand_probs, cand_buckets, hp, hn, ho, hpar, hb, hd)
        if n > 0:
            best = gain
            out_n[i] = n
            out_match[i] = m
            out_source[i] = source
    score = 0.0
    for t in range(out_n[i]):
        score += out_probs[i, t]
    out_score[i] = score


@njit(cache=True)
def propose_batch(l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, l_roots,
                  b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, b_roots,
                  c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, c_roots,
                  depth, req_seqs, req_trees, req_cross_seqs, limits, factor,
                  offset, min_prob, tree_mode, flags, table, state,
                  out_tokens, out_parents, out_probs, out_n, out_score, out_match, out_source,
                  pend_tokens, pend_parents, pend_buckets, pend_n, pend_recent, out_buckets,
                  scratch_tokens, scratch_parents, scratch_probs,
                  cand_tokens, cand_parents, cand_probs, cand_buckets, hp, hn, ho, hpar, hb, hd):
    """Draft for every request of a step, from its own tree and cross trees.

    Three indexes take part: ``l_*`` holds one tree per request, ``b_*`` and
    ``c_*`` hold cross-request trees (a persistent pool's read-only snapshot
    and its appendable part; either may be a dummy with no roots).  Request
    ``i`` reads its context from local sequence ``req_seqs[i]`` of tree
    ``req_trees[i]`` and may draw from the trees ``b_roots[i, :]`` and
    ``c_roots[i, :]`` (-1: none).  ``req_cross_seqs[i]`` is its own open
    output sequence in ``c_*`` (-1 if none), which starts with its anchors.

    A draft holds at most ``limits[i]`` tokens.  Calibrated policy: tokens
    while their probability beats ``max(threshold(state), min_prob)``, at most
    ``match_len * factor + offset`` of them when ``factor >= 0``.  Counts
    policy: see ``_pool_draft_counts``.  Outputs are rows of ``out_*``;
    ``out_source`` is one of the ``FROM_*`` codes.  Calibrated drafts are also
    kept as the request's pending draft (``pend_*``, row ``req_seqs[i]``), which
    ``calibration.learn`` scores against the emitted tokens; ``pend_recent``
    holds how each request's previous draft fared.
    """
    calibrated = flags & CALIBRATED
    thr = cal.threshold(state)
    if min_prob > thr:
        thr = min_prob
    for i in range(req_seqs.shape[0]):
        if calibrated:
            _draft_calibrated(i, pend_recent[req_seqs[i]], l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, l_roots,
                              b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, b_roots,
                              c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, c_roots,
                              depth, req_seqs, req_trees, req_cross_seqs, limits, factor,
                              offset, thr, tree_mode, flags, table, state, out_tokens, out_parents,
                              out_probs, out_n, out_score, out_match, out_source,
                              out_buckets, cand_tokens, cand_parents, cand_probs,
                              cand_buckets, hp, hn, ho, hpar, hb, hd)
            s = req_seqs[i]
            n = out_n[i]
            pend_n[s] = n
            pend_tokens[s, :n] = out_tokens[i, :n]
            pend_parents[s, :n] = out_parents[i, :n]
            pend_buckets[s, :n] = out_buckets[i, :n]
        else:
            _draft_counts(i, l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, l_roots,
                          b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, b_roots,
                          c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, c_roots,
                          depth, req_seqs, req_trees, req_cross_seqs, limits, factor, offset,
                          min_prob, tree_mode, flags, out_tokens, out_parents, out_probs,
                          out_n, out_score, out_match, out_source, scratch_tokens,
                          scratch_parents, scratch_probs, cand_tokens, cand_parents,
                          cand_probs, hp, hn, ho, hpar, hb, hd)


@njit(cache=True)
def _draft_counts(i, l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, l_roots,
                  b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, b_roots,
                  c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, c_roots,
                  depth, req_seqs, req_trees, req_cross_seqs, limits, factor, offset,
                  min_prob, tree_mode, flags, out_tokens, out_parents, out_probs,
                  out_n, out_score, out_match, out_source, scratch_tokens,
                  scratch_parents, scratch_probs, cand_tokens, cand_parents,
                  cand_probs, hp, hn, ho, hpar, hb, hd):
    """The counts policy for request ``i``: each tree's best draft, the highest rank wins."""
    s = req_seqs[i]
    end = l_seqs[s, SEQ_OFF] + l_seqs[s, SEQ_LEN]
    start = end - depth
    if start < l_seqs[s, SEQ_OFF]:
        start = l_seqs[s, SEQ_OFF]
    n, score, best, m = _pool_draft_counts(
        l_nodes, l_hkeys, l_hvals, l_arena, l_seqs, l_active, np.int64(l_roots[req_trees[i]]),
        l_arena, start, end, depth, limits[i], factor, offset, min_prob,
        tree_mode, l_seqs[s, SEQ_SLOT], l_seqs[s, SEQ_LEN], l_seqs[s, SEQ_LEN], flags,
        out_tokens[i], out_parents[i], out_probs[i], cand_tokens, cand_parents, cand_probs,
        hp, hn, ho, hpar, hb, hd)
    out_n[i] = n
    out_score[i] = score
    out_match[i] = m
    out_source[i] = FROM_REQUEST if n > 0 else FROM_NONE
    cs = req_cross_seqs[i]
    for j in range(b_roots.shape[1] + c_roots.shape[1]):
        base = j < b_roots.shape[1]
        root = b_roots[i, j] if base else c_roots[i, j - b_roots.shape[1]]
        if root < 0:
            continue
        slot = -1
        own = 0
        valid = 0
        if not base and cs >= 0 and c_seqs[cs, SEQ_ROOT] == root:
            slot = c_seqs[cs, SEQ_SLOT]
            own = c_seqs[cs, SEQ_LEN]
            valid = own - _anchors(c_arena, c_seqs, cs)
        if base:
            n2, score2, rank2, m2 = _pool_draft_counts(
                b_nodes, b_hkeys, b_hvals, b_arena, b_seqs, b_active, root,
                l_arena, start, end, depth, limits[i], factor, offset, min_prob,
                tree_mode, slot, own, valid, flags, scratch_tokens, scratch_parents,
                scratch_probs, cand_tokens, cand_parents, cand_probs, hp, hn, ho, hpar, hb, hd)
        else:
            n2, score2, rank2, m2 = _pool_draft_counts(
                c_nodes, c_hkeys, c_hvals, c_arena, c_seqs, c_active, root,
                l_arena, start, end, depth, limits[i], factor, offset, min_prob,
                tree_mode, slot, own, valid, flags, scratch_tokens, scratch_parents,
                scratch_probs, cand_tokens, cand_parents, cand_probs, hp, hn, ho, hpar, hb, hd)
        if n2 > 0 and rank2 > best:
            best = rank2
            out_tokens[i, :n2] = scratch_tokens[:n2]
            out_parents[i, :n2] = scratch_parents[:n2]
            out_probs[i, :n2] = scratch_probs[:n2]
            out_n[i] = n2
            out_score[i] = score2
            out_match[i] = m2
            out_source[i] = FROM_CROSS
