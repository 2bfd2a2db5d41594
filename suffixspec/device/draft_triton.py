"""The device drafting step's fused kernel in Triton: align, score, choose, write.

``fused_triton`` takes what ``draft_ref.fused_ref`` takes and writes what it
writes, in one launch of one program per batch row: every window is lined up
with the context (a ``[width, head]`` block of comparisons, its run of
matches counted by a cumulative sum), every candidate (windows, then the
direct ones) is scored with the calibration table, the best kept.  Every size
is a host int or a ``tl.constexpr``: nothing is read back to the host.

``draft_ref.fused_ref`` is its oracle (``tests/test_device_triton.py`` runs
both under ``TRITON_INTERPRET=1`` on CPU tensors, and compiles the kernel for
sm_90); on lent H100 and H200 machines ``bench/device_check.py`` found them
equal on 50 random cases per batch size (docs/results.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from suffixspec.device.draft_ref import (DIRECT_SOURCES, FROM_NOTHING, FROM_SCAN, PAIR_FIELDS,
                                         direct_sources)
from suffixspec.device.layout import (P_DEPTH, P_FACTOR, P_OFFSET, P_THR, P_W_COARSE, P_W_FINE,
                                      P_W_SHARED, W_AT, W_FIELDS, W_HEAD, W_LEN, W_MATCH,
                                      W_SOURCE, Calibration, DeviceWindows)
from suffixspec.native import arbiter, calibration as cal
from suffixspec.native.layout import FROM_ANCHOR, FROM_LIVE


@triton.jit
def _count_bucket(n):
    return tl.where(n <= 2, n - 1, tl.where(n <= 4, 2, tl.where(n <= 8, 3,
                                                                   tl.where(n <= 16, 4, 5))))


@triton.jit
def _match_bucket(m):
    return tl.where(m <= 3, m, tl.where(m <= 5, 4, tl.where(m <= 8, 5, tl.where(
        m <= 15, 6, tl.where(m <= 31, 7, 8)))))


@triton.jit
def _depth_bucket(j):
    return tl.where(j <= 2, j, tl.where(j <= 4, 3, tl.where(j <= 8, 4, 5)))


@triton.jit
def _score(tok, before_tok, c, n, src, m, j, agree, table_ptr, params_ptr, vocab, kinds_ptr,
           n_kinds, K: tl.constexpr,
           N_SRC: tl.constexpr, N_RATIO: tl.constexpr, N_MATCH: tl.constexpr,
           N_STATE: tl.constexpr, N_DEPTH: tl.constexpr, N_SHARED: tl.constexpr,
           N_COARSE: tl.constexpr, ROWS: tl.constexpr, PLANE_ROWS: tl.constexpr,
           PLANE: tl.constexpr, BASE_ROWS: tl.constexpr, LIFT_ROWS: tl.constexpr,
           N_KIND: tl.constexpr, P_MAX: tl.constexpr, TOKEN_BASE: tl.constexpr,
           TOKEN_ROWS: tl.constexpr, W_TOKEN: tl.constexpr, TOKEN_MAX: tl.constexpr,
           BIGRAM_BASE: tl.constexpr, BIGRAM_ROWS: tl.constexpr, W_BIGRAM: tl.constexpr):
    """One candidate's ``(q, p, kept, gain, fine)`` (``draft_ref._score``);
    ``before_tok`` holds the token before each of ``tok``."""
    thr = tl.load(params_ptr + 0)
    factor = tl.load(params_ptr + 1)
    offset = tl.load(params_ptr + 2)
    ws = tl.load(params_ptr + 4)
    wc = tl.load(params_ptr + 5)
    wf = tl.load(params_ptr + 6)
    ok = (c > 0) & (n > 0) & (tok >= 0) & (tok < vocab) & (j < K)
    ok = tl.cumsum((~ok).to(tl.int32), axis=0) == 0
    safe_n = tl.maximum(n, 1)
    ratio = tl.where(c >= n, N_RATIO - 1, tl.minimum(tl.maximum((5 * c) // safe_n, 0),
                                                      N_RATIO - 2))
    state = src // N_SRC
    shared = ((tl.maximum(_count_bucket(n), 0) * N_RATIO + ratio) * N_MATCH
              + tl.maximum(_match_bucket(m), 0))
    coarse = (src - N_SRC * state) * N_SHARED + shared
    base = tl.where(agree == 0, N_SHARED, PLANE_ROWS + (agree - 1) * PLANE)
    fine = base + N_COARSE + (coarse * N_STATE + state) * N_DEPTH + _depth_bucket(j)
    fine = tl.minimum(tl.maximum(fine, 0), ROWS - 1)
    plane = tl.where(fine < PLANE_ROWS, 0, 1 + (fine - PLANE_ROWS) // PLANE)
    base = tl.where(plane == 0, N_SHARED, PLANE_ROWS + (plane - 1) * PLANE)
    coarse_row = base + (fine - base - N_COARSE) // (N_STATE * N_DEPTH)
    shared_row = (coarse_row - base) % N_SHARED
    mf = tl.maximum(m, 1).to(tl.float32)
    prior = c.to(tl.float32) / (n.to(tl.float32) + 1.0 / tl.sqrt_rn(mf))
    ps = (tl.load(table_ptr + 2 * shared_row) + ws * prior) / (
        tl.load(table_ptr + 2 * shared_row + 1) + ws)
    pc = (tl.load(table_ptr + 2 * coarse_row) + wc * ps) / (
        tl.load(table_ptr + 2 * coarse_row + 1) + wc)
    q = (tl.load(table_ptr + 2 * fine) + wf * pc) / (tl.load(table_ptr + 2 * fine + 1) + wf)
    inside = (tok >= 0) & (tok < n_kinds)
    kind = tl.load(kinds_ptr + tl.where(inside, tok, 0), mask=inside, other=-1)
    row = BASE_ROWS + (plane * N_KIND + tl.maximum(kind, 0)) * N_COARSE + coarse_row - base
    lift = (tl.load(table_ptr + 2 * row) + wc * pc) / (tl.load(table_ptr + 2 * row + 1) + wc)
    inside = (before_tok >= 0) & (before_tok < n_kinds)
    before = tl.load(kinds_ptr + tl.where(inside, before_tok, 0), mask=inside, other=-1)
    row = (BASE_ROWS + LIFT_ROWS
           + ((plane * N_KIND + tl.maximum(before, 0)) * N_KIND + tl.maximum(kind, 0)) * N_COARSE
           + coarse_row - base)
    lift = tl.where(before >= 0, (tl.load(table_ptr + 2 * row) + wf * lift) / (
        tl.load(table_ptr + 2 * row + 1) + wf), lift)
    lifted = q * lift / tl.maximum(pc, 1e-30)
    q = tl.where((kind >= 0) & (pc > 0), tl.minimum(lifted, P_MAX), q)
    row = TOKEN_BASE + (tl.maximum(tok, 0) & (TOKEN_ROWS - 1))
    scale = tl.minimum((tl.load(table_ptr + 2 * row) + W_TOKEN) / (
        tl.load(table_ptr + 2 * row + 1) + W_TOKEN), TOKEN_MAX)
    # the (token before, token) row, shrunk towards the token row (``calibration.bigram_row``)
    prev = tl.maximum(before_tok, 0) & (BIGRAM_ROWS - 1)
    row = BIGRAM_BASE + ((tl.maximum(tok, 0) ^ (prev << 9) ^ (prev >> 9)) & (BIGRAM_ROWS - 1))
    bigram = (tl.load(table_ptr + 2 * row) + W_BIGRAM * scale) / (
        tl.load(table_ptr + 2 * row + 1) + W_BIGRAM)
    scale = tl.where(before_tok >= 0, tl.minimum(bigram, TOKEN_MAX), scale)
    q = tl.minimum(tl.where(tok >= 0, q * scale, q), P_MAX)
    q = tl.where(ok, q, 0.0)
    p = tl.cumprod(q, axis=0)
    cap = tl.where(factor >= 0, tl.floor(m.to(tl.float32) * factor + offset + 1e-6),
                   K * 1.0)
    kept = ok & (p > thr) & (j.to(tl.float32) < cap)
    kept = tl.cumsum((~kept).to(tl.int32), axis=0) == 0
    gain = tl.sum(tl.where(kept, p - thr, 0.0), axis=0)
    return q, p, kept, gain, fine


@triton.jit
def _agreement(tok, ref, ref_ok):
    """Each token's agreement with the reference (``draft_ref.agreement``)."""
    eq = (tok == ref) & ref_ok
    miss = (~eq).to(tl.int32)
    before = (tl.cumsum(miss, axis=0) - miss) == 0
    return tl.where(before & eq, 1, tl.where(before & ref_ok, 2, 0)).to(tl.int64)


@triton.jit
def _keep(take, new, old):
    """``new`` where ``take``, else ``old`` (tuples of the same shapes)."""
    return (tl.where(take, new[0], old[0]), tl.where(take, new[1], old[1]),
            tl.where(take, new[2], old[2]), tl.where(take, new[3], old[3]),
            tl.where(take, new[4], old[4]), tl.where(take, new[5], old[5]),
            tl.where(take, new[6], old[6]), tl.where(take, new[7], old[7]),
            tl.where(take, new[8], old[8]))


@triton.jit
def _fused_kernel(
    tail_ptr,        # *int64  [B, D]  each context's last tokens, newest first (-2: none)
    total_ptr,       # *int64  [B]
    sampled_ptr,     # *int64  [B]
    state_ptr,       # *int64  [B]  the request state (``calib.request_state``)
    slots_ptr,       # *int64  [B]
    win_tok_ptr,     # *int32  [S, R, W]
    win_c_ptr,       # *int32  [S, R, W]
    win_n_ptr,       # *int32  [S, R, W]
    win_meta_ptr,    # *int32  [S, R, F]
    d_tok_ptr,       # *int64  [B, X, K]
    d_c_ptr,         # *int64  [B, X, K]
    d_n_ptr,         # *int64  [B, X, K]
    d_match_ptr,     # *int64  [B, X]
    d_src_ptr,       # *int64  [X]
    table_ptr,       # *fp32   [ROWS, 2]
    params_ptr,      # *fp32   [PARAMS]
    prefer_ptr,      # *int32  [ARB_ROWS]
    drafts_ptr,      # *int64  [B, K]  (out)
    conf_ptr,        # *fp32   [B, K]  (out)
    probs_ptr,       # *fp32   [B, K]  (out)
    valid_ptr,       # *int32  [B]     (out)
    buckets_ptr,     # *int32  [B, K]  (out)
    choice_ptr,      # *int32  [B]     (out)
    match_ptr,       # *int32  [B]     (out)
    last_ptr,        # *int64  [B]     (out)
    pair_ptr,        # *int32  [B, 3]  (out) the arbiter's cell (-1: none), pick's n, reference's n
    pair_tok_ptr,    # *int64  [B, 2, K] (out) the pick, the reference (-1 past each)
    vocab,
    kinds_ptr,       # *int32  [n_kinds]  each token id's kind (-1: none)
    n_kinds,
    R: tl.constexpr, W: tl.constexpr, D: tl.constexpr, F: tl.constexpr, X: tl.constexpr,
    K: tl.constexpr, K_PO2: tl.constexpr,
    M_SOURCE: tl.constexpr, M_MATCH: tl.constexpr, M_HEAD: tl.constexpr, M_LEN: tl.constexpr,
    M_AT: tl.constexpr, FROM_SCAN: tl.constexpr, FROM_NOTHING: tl.constexpr,
    N_SRC: tl.constexpr, N_RATIO: tl.constexpr, N_MATCH: tl.constexpr,
    N_STATE: tl.constexpr, N_DEPTH: tl.constexpr, N_SHARED: tl.constexpr,
    N_COARSE: tl.constexpr, ROWS: tl.constexpr, PLANE_ROWS: tl.constexpr, PLANE: tl.constexpr,
    BASE_ROWS: tl.constexpr, LIFT_ROWS: tl.constexpr, N_KIND: tl.constexpr,
    P_MAX: tl.constexpr, TOKEN_BASE: tl.constexpr, TOKEN_ROWS: tl.constexpr,
    W_TOKEN: tl.constexpr, TOKEN_MAX: tl.constexpr, BIGRAM_BASE: tl.constexpr,
    BIGRAM_ROWS: tl.constexpr, W_BIGRAM: tl.constexpr,
    A_MATCH: tl.constexpr, A_POLICY: tl.constexpr, A_REFERENCE: tl.constexpr,
    A_PART: tl.constexpr, ARB_ROWS: tl.constexpr, FROM_ANCHOR: tl.constexpr,
    PICK_LIVE: tl.constexpr, SRC_LIVE: tl.constexpr, SRC_SCAN: tl.constexpr,
    PAIR_FIELDS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    total = tl.load(total_ptr + b)
    sampled = tl.load(sampled_ptr + b)
    state = tl.load(state_ptr + b)
    depth = tl.load(params_ptr + 3).to(tl.int64)
    e = tl.arange(0, W).to(tl.int64)
    d = tl.arange(0, D).to(tl.int64)
    j = tl.arange(0, K_PO2).to(tl.int64)
    tail = tl.load(tail_ptr + b * D + d)
    last_tok = tl.load(tail_ptr + b * D).to(tl.int64)  # the context's last token
    at = e[:, None] - d[None, :]                                             # [W, D]

    best_gain = tl.zeros((), tl.float32)
    best = tl.full((), -1, tl.int64)
    best_m = tl.zeros((), tl.int64)
    best_tok = tl.zeros([K_PO2], tl.int64)
    best_q = tl.zeros([K_PO2], tl.float32)
    best_p = tl.zeros([K_PO2], tl.float32)
    best_kept = tl.zeros([K_PO2], tl.int1)
    best_fine = tl.zeros([K_PO2], tl.int64)
    best_src = tl.zeros((), tl.int64)
    # The reference: the own-history scan's continuation (direct candidate 0).
    use_ref = tl.load(params_ptr + 7) > 0
    ref = tl.load(d_tok_ptr + b * X * K + j, mask=j < K, other=-1)
    ref_ok = tl.where(use_ref, (tl.load(d_c_ptr + b * X * K + j, mask=j < K, other=0) > 0)
                      & (j < K), False)
    ref_ok = tl.cumsum((~ref_ok).to(tl.int32), axis=0) == 0
    for r in range(R):
        row = (slot * R + r) * W
        meta = win_meta_ptr + (slot * R + r) * F
        w_src = tl.load(meta + M_SOURCE).to(tl.int64)
        w_match = tl.load(meta + M_MATCH).to(tl.int64)
        w_head = tl.load(meta + M_HEAD).to(tl.int64)
        w_len = tl.load(meta + M_LEN).to(tl.int64)
        w_at = tl.load(meta + M_AT).to(tl.int64)
        tok2 = tl.load(win_tok_ptr + row + at, mask=at >= 0, other=-1).to(tl.int64)
        miss = ((at < 0) | (tok2 != tail[None, :])).to(tl.int32)
        length = tl.sum((tl.cumsum(miss, axis=1) == 0).to(tl.int64), axis=1)   # [W]
        followed = total - w_at
        e_at = w_head - 1 + followed
        inside = (followed >= 0) & (e_at + 1 < w_len)
        at_len = tl.sum(tl.where(e == e_at, length, 0), axis=0)
        on_path = inside & (at_len >= tl.minimum(e_at + 1, D))
        fits = (e >= w_head - 1) & (e + 1 < w_len) & (length > 0) & (followed >= 0)
        score = tl.max(tl.where(fits, length * (W + 1) + e, -1), axis=0)
        found = score >= 0
        a_len = tl.where(found, score // (W + 1), 0)
        a_end = tl.where(on_path, e_at, tl.where(found, score - a_len * (W + 1), 0))
        m = tl.minimum(tl.where(on_path, w_match + followed, a_len), depth)
        pos = a_end + 1 + j
        # (a scalar condition joins a block through where: the interpreter's & would not)
        ins = tl.where(on_path | found, (pos < w_len) & (pos < W) & (j < K), False)
        tok = tl.load(win_tok_ptr + row + pos, mask=ins, other=-1).to(tl.int64)
        prior_tok = tl.load(win_tok_ptr + row + pos - 1, mask=ins & (j > 0), other=-1)
        prior_tok = tl.where(j == 0, last_tok, prior_tok.to(tl.int64))
        c = tl.load(win_c_ptr + row + pos, mask=ins, other=0).to(tl.int64)
        n = tl.load(win_n_ptr + row + pos, mask=ins, other=0).to(tl.int64)
        q, p, kept, gain, fine = _score(tok, prior_tok, c, n, w_src + N_SRC * state, m, j,
                                        _agreement(tok, ref, ref_ok), table_ptr, params_ptr,
                                        vocab, kinds_ptr, n_kinds, K, N_SRC, N_RATIO, N_MATCH,
                                        N_STATE, N_DEPTH, N_SHARED, N_COARSE, ROWS, PLANE_ROWS,
                                        PLANE, BASE_ROWS, LIFT_ROWS, N_KIND, P_MAX,
                                        TOKEN_BASE, TOKEN_ROWS, W_TOKEN, TOKEN_MAX,
                                        BIGRAM_BASE, BIGRAM_ROWS, W_BIGRAM)
        best_gain, best, best_m, best_tok, best_q, best_p, best_kept, best_fine, best_src = _keep(
            gain > best_gain, (gain, r, m, tok, q, p, kept, fine, w_src),
            (best_gain, best, best_m, best_tok, best_q, best_p, best_kept, best_fine, best_src))
    # The scan's candidate as drafted, for the arbiter (direct candidate 0).
    ref_m = tl.zeros((), tl.int64)
    ref_q = tl.zeros([K_PO2], tl.float32)
    ref_p = tl.zeros([K_PO2], tl.float32)
    ref_kept = tl.zeros([K_PO2], tl.int1)
    for x in range(X):
        base = (b * X + x) * K
        tok = tl.load(d_tok_ptr + base + j, mask=j < K, other=-1)
        prior_tok = tl.load(d_tok_ptr + base + j - 1, mask=(j > 0) & (j < K), other=-1)
        prior_tok = tl.where(j == 0, last_tok, prior_tok)
        c = tl.load(d_c_ptr + base + j, mask=j < K, other=0)
        n = tl.load(d_n_ptr + base + j, mask=j < K, other=0)
        m = tl.load(d_match_ptr + b * X + x)
        origin = tl.load(d_src_ptr + x)
        src = origin + N_SRC * state
        # (the reference itself in the agreeing plane, as on the host)
        agree = _agreement(tok, ref, ref_ok)
        q, p, kept, gain, fine = _score(tok, prior_tok, c, n, src, m, j, agree, table_ptr,
                                        params_ptr,
                                        vocab, kinds_ptr, n_kinds, K, N_SRC, N_RATIO, N_MATCH,
                                        N_STATE, N_DEPTH, N_SHARED, N_COARSE, ROWS, PLANE_ROWS,
                                        PLANE, BASE_ROWS, LIFT_ROWS, N_KIND, P_MAX,
                                        TOKEN_BASE, TOKEN_ROWS, W_TOKEN, TOKEN_MAX,
                                        BIGRAM_BASE, BIGRAM_ROWS, W_BIGRAM)
        first = x == 0
        ref_m = tl.where(first, m, ref_m)
        ref_q = tl.where(first, q, ref_q)
        ref_p = tl.where(first, p, ref_p)
        ref_kept = tl.where(first, kept, ref_kept)
        best_gain, best, best_m, best_tok, best_q, best_p, best_kept, best_fine, best_src = _keep(
            gain > best_gain, (gain, R + x, m, tok, q, p, kept, fine, origin),
            (best_gain, best, best_m, best_tok, best_q, best_p, best_kept, best_fine, best_src))

    live = sampled > 0
    ok = (best >= 0) & live
    pick_kept = tl.where(ok, best_kept & (j < K), False)
    # The arbiter (``draft_ref._arbitrate``): the pair's cell, and whether the
    # scan drafts instead.
    ref_kept = tl.where(live, ref_kept & (j < K), False)
    n_pick = tl.sum(pick_kept.to(tl.int64), axis=0)
    n_ref = tl.sum(ref_kept.to(tl.int64), axis=0)
    eq = (best_tok == ref) & pick_kept & ref_kept
    same = tl.sum((tl.cumsum((~eq).to(tl.int32), axis=0) == 0).to(tl.int64), axis=0)
    has_ref = tl.sum(tl.where(j == 0, ref_ok.to(tl.int32), 0), axis=0) > 0
    paired = (has_ref & (tl.load(params_ptr + 8) > 0) & live
              & ~((same == n_pick) & (same == n_ref)))
    pick_src = tl.where(best_src == SRC_LIVE, PICK_LIVE,
                        tl.where(best_src == SRC_SCAN, 0,  # the own tree's, FROM_REQUEST
                                 tl.minimum(best_src, FROM_ANCHOR)))
    policy = tl.where(n_pick > 0, pick_src * A_MATCH
                      + tl.minimum(best_m, A_MATCH - 1), A_POLICY - 1)
    reference = tl.minimum(tl.maximum(ref_m, 1), A_REFERENCE) - 1
    cell = (policy * A_REFERENCE + reference) * A_PART + (same > 0).to(tl.int64)
    cell = tl.minimum(tl.maximum(cell, 0), ARB_ROWS - 1)
    swap = paired & (n_ref > 0) & (tl.load(prefer_ptr + cell) > 0)
    pair = pair_ptr + b * PAIR_FIELDS
    tl.store(pair, tl.where(paired, cell, -1).to(tl.int32))
    tl.store(pair + 1, n_pick.to(tl.int32))
    tl.store(pair + 2, n_ref.to(tl.int32))
    tl.store(pair_tok_ptr + b * 2 * K + j, tl.where(pick_kept, best_tok, -1), mask=j < K)
    tl.store(pair_tok_ptr + b * 2 * K + K + j, tl.where(ref_kept, ref, -1), mask=j < K)

    kept = tl.where(swap, ref_kept, pick_kept)
    tok = tl.where(swap, ref, best_tok)
    last = tl.maximum(tl.sum(tl.where(d == 0, tail, 0), axis=0), 0)
    out = b * K + j
    tl.store(drafts_ptr + out, tl.where(kept, tok, last), mask=j < K)
    tl.store(conf_ptr + out, tl.where(kept, tl.where(swap, ref_q, best_q), 0.0), mask=j < K)
    tl.store(probs_ptr + out, tl.where(kept, tl.where(swap, ref_p, best_p), 0.0), mask=j < K)
    tl.store(buckets_ptr + out, tl.where(kept, tl.where(swap, -1, best_fine), 0).to(tl.int32),
             mask=j < K)
    tl.store(valid_ptr + b, tl.sum(kept.to(tl.int32), axis=0))
    kind = tl.where(swap, FROM_SCAN, tl.where(best < R, best, FROM_SCAN - (best - R)))
    tl.store(choice_ptr + b, tl.where(ok | swap, kind, FROM_NOTHING).to(tl.int32))
    tl.store(match_ptr + b, tl.where(swap, ref_m, tl.where(ok, best_m, 0)).to(tl.int32))
    tl.store(last_ptr + b, last)


@triton.jit
def _scan_kernel(
    ctx_ptr,         # *int32  [S, L]  the requests' tokens (the contexts)
    ctx_stride,
    rows_ptr,        # *int32  [S, M]  the rows scanned: the contexts again, or family rows
    rows_stride,
    slots_ptr,       # *int64  [B]
    total_ptr,       # *int64  [B]     the contexts' lengths
    len_ptr,         # *int64  [B]     the scanned rows' lengths
    best_ptr,        # *int64  [B, NB]  (out) per block: length * (M + 1) + end, 0: none
    NB: tl.constexpr, DEPTH: tl.constexpr, BLOCK: tl.constexpr,
):
    """Per (row, block of end positions): the longest suffix of the context (at
    most ``DEPTH`` tokens) that also ends at a position of the block with a
    token after it in the scanned row, packed with that position so that one
    max picks the longest, then the newest."""
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1).to(tl.int64)
    slot = tl.load(slots_ptr + b)
    ctx = ctx_ptr + slot * ctx_stride
    row = rows_ptr + slot * rows_stride
    total = tl.load(total_ptr + b)
    radix = rows_stride + 1
    end = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    live = (end >= 1) & (end < tl.load(len_ptr + b))
    length = tl.zeros([BLOCK], tl.int64)
    for t in range(DEPTH):
        want = tl.load(ctx + total - 1 - t, mask=total - 1 - t >= 0, other=-2)
        at = end - 1 - t
        live = tl.where(want >= 0, live & (at >= 0), False)
        tok = tl.load(row + at, mask=live, other=-1)
        live = live & (tok == want)
        length += live.to(tl.int64)
    score = tl.where(length > 0, length * radix + end, 0)
    tl.store(best_ptr + b * NB + blk, tl.max(score, axis=0))


def _scan(hist, total, rows, lengths, slots, depth: int, block: int):
    """``draft_ref.suffix_scan`` of rows ``slots`` of ``rows`` (``lengths`` per
    batch row) against the contexts in ``hist`` (``total`` per batch row)."""
    b, width = slots.shape[0], rows.shape[1]
    blocks = triton.cdiv(width, block)
    best = torch.zeros(b, blocks, dtype=torch.int64, device=hist.device)
    _scan_kernel[(b, blocks)](hist, hist.stride(0), rows, rows.stride(0), slots.contiguous(),
                              total.to(torch.int64).contiguous(),
                              lengths.to(torch.int64).contiguous(), best, NB=blocks,
                              DEPTH=depth, BLOCK=block, num_warps=4)
    top = best.max(dim=1).values
    length = top // (width + 1)
    return length, torch.where(length > 0, top - length * (width + 1), 0)


def scan_triton(hist, total, slots, depth: int, block: int = 256):
    """``draft_ref.own_history_scan`` for rows ``slots`` of ``hist`` in one launch
    (``total`` per row): ``(length, end)``."""
    return _scan(hist, total, hist, total, slots, depth, block)


def family_scan_triton(family, family_len, hist, total, slots, depth: int, block: int = 256):
    """``draft_ref.suffix_scan`` of the family rows of ``slots`` (``family``,
    ``family_len`` per slot; ``layout.DeviceWindows``) against their
    contexts in ``hist`` (``total`` per batch row), in one launch."""
    return _scan(hist, total, family, family_len[slots], slots, depth, block)


@triton.jit
def _tokens_at(tokens_ptr, at, mask, base, other):
    """Each candidate's tokens at positions ``at`` (``[C, X]``) of its row
    (``base``: the row's first token)."""
    return tl.load(tokens_ptr + base[:, None] + at, mask=mask, other=other).to(tl.int64)


@triton.jit
def _corpus_kernel(
    tail_ptr,        # *int64  [B, T]  each context's last tokens, newest first (-2: none)
    tail_stride,
    tokens_ptr,      # *int32  the ring [C] (-1 separates documents); LIVE: the history rows
    table_ptr,       # *int64  [2, NB, SLOTS]  the ring's tables; LIVE: the live corpus's
    length_ptr,      # *int64  [B]     (out) match length, 0: none
    out_ptr,         # *int64  [B, K]  (out) tokens
    c_ptr,           # *int64  [B, K]  (out) votes for each token
    n_ptr,           # *int64  [B, K]  (out) candidates still matching
    cap,             # the ring's tokens
    row_stride,      # LIVE: the history rows' stride
    total_ptr,       # LIVE: *int64 [slots]  each row's tokens
    own_ptr,         # LIVE: *int64 [B]      each context's own slot
    HASH_MUL: tl.constexpr, NB: tl.constexpr, SLOTS: tl.constexpr, DEPTH: tl.constexpr,
    DEPTH_PO2: tl.constexpr, K: tl.constexpr, K_PO2: tl.constexpr, LIVE: tl.constexpr,
):
    """``corpus.DeviceCorpus.draft`` for one row per program; with ``LIVE``,
    ``corpus.LiveCorpus.draft`` (its tables, read in the history rows)."""
    b = tl.program_id(0).to(tl.int64)
    C: tl.constexpr = 2 * SLOTS
    ci = tl.arange(0, C).to(tl.int64)
    di = tl.arange(0, DEPTH_PO2).to(tl.int64)
    ki = tl.arange(0, K_PO2).to(tl.int64)
    tail = tl.load(tail_ptr + b * tail_stride + di, mask=di < DEPTH, other=-2)
    hv = tl.zeros((), tl.int64)
    b2 = tl.zeros((), tl.int64)
    held = tl.zeros((), tl.int64)
    for d in tl.static_range(4):
        t = tl.load(tail_ptr + b * tail_stride + d)
        held += (t >= 0).to(tl.int64)
        hv = (hv ^ tl.where(t >= 0, t, 0)) * HASH_MUL
        if d == 1:
            b2 = ((hv >> 29) ^ hv) & (NB - 1)
    b4 = ((hv >> 29) ^ hv) & (NB - 1)
    is4 = ci < SLOTS
    key_len = tl.where(is4, 4, 2)
    vals = tl.load(table_ptr + tl.where(is4, b4 * SLOTS + ci, (NB + b2) * SLOTS + ci - SLOTS))
    if LIVE:  # stamp << 40 | slot << 24 | position, in another slot's row
        where = vals & ((1 << 40) - 1)
        cslot = where >> 24
        vals = tl.where((vals >= 0) & (cslot != tl.load(own_ptr + b)), vals, -1)
        cpos = where & ((1 << 24) - 1)
        ident = where
        end = tl.load(total_ptr + cslot, mask=vals >= 0, other=0)
        base = tl.where(vals >= 0, cslot * row_stride, 0)
    else:
        cpos = vals & 0xFFFFFFFF
        ident = cpos
        end = tl.zeros_like(cpos) + cap
        base = tl.zeros_like(cpos)
    src = cpos[:, None] - 1 - di[None, :]
    ring = _tokens_at(tokens_ptr, src,
                      (vals[:, None] >= 0) & (src >= 0) & (src < end[:, None])
                      & (di[None, :] < DEPTH), base, -3)
    miss = (ring != tail[None, :]).to(tl.int32)
    c_len = tl.sum((tl.cumsum(miss, axis=1) == 0).to(tl.int64), axis=1)
    at = cpos[:, None] + ki[None, :]
    cont = _tokens_at(tokens_ptr, at,
                      (vals[:, None] >= 0) & (ki[None, :] < K) & (at < end[:, None]), base, -1)
    nxt = tl.sum(tl.where(ki[None, :] == 0, cont, 0), axis=1)
    ok = (vals >= 0) & (nxt >= 0) & (c_len >= key_len) & (held >= key_len)
    earlier = ci[:, None] < ci[None, :]
    dup = (ident[:, None] == ident[None, :]) & ok[:, None] & earlier
    ok = ok & (tl.max(dup.to(tl.int32), axis=0) == 0)
    cont = tl.where(ok[:, None], cont, -1)
    cont = tl.where(tl.cumsum((cont < 0).to(tl.int32), axis=1) == 0, cont, -1)
    same_len = (c_len[:, None] == c_len[None, :]) & ok[:, None] & earlier
    first = ok & (tl.max(same_len.to(tl.int32), axis=0) == 0)
    best_score = tl.full((), -1.0, tl.float32)
    best_len = tl.full((), -1, tl.int64)
    best_tok = tl.zeros([K_PO2], tl.int64)
    best_c = tl.zeros([K_PO2], tl.int64)
    best_n = tl.zeros([K_PO2], tl.int64)
    for i in range(C):
        pick = ci == i
        if tl.sum(tl.where(pick, first.to(tl.int32), 0), axis=0) > 0:
            length = tl.sum(tl.where(pick, c_len, 0), axis=0)
            alive = ok & (c_len >= length)
            go = length > 0
            cum = tl.full((), 1.0, tl.float32)
            score = tl.zeros((), tl.float32)
            chain = tl.zeros([K_PO2], tl.int64)
            votes = tl.zeros([K_PO2], tl.int64)
            among = tl.zeros([K_PO2], tl.int64)
            for d in tl.static_range(K):
                col = tl.sum(tl.where(ki[None, :] == d, cont, 0), axis=1)
                has = alive & (col >= 0)
                count = tl.sum(((col[:, None] == col[None, :]) & has[None, :]).to(tl.int64),
                               axis=1)
                count = tl.where(has, count, 0)
                cmax = tl.max(count, axis=0)
                newest = tl.max(tl.where(has & (count == cmax), vals, -1), axis=0)
                tok = tl.sum(tl.where(has & (vals == newest), col, 0), axis=0)
                go = go & (cmax > 0)
                denom = tl.maximum(tl.sum(alive.to(tl.int64), axis=0), 1)
                cum = tl.where(go, cum * cmax.to(tl.float32) / denom.to(tl.float32), cum)
                score = tl.where(go, score + cum, score)
                chain = tl.where((ki == d) & go, tok, chain)
                votes = tl.where((ki == d) & go, cmax, votes)
                among = tl.where((ki == d) & go, denom, among)
                alive = alive & (col >= 0) & (col == tok)
            take = (score > best_score) | ((score == best_score) & (length > best_len))
            best_score = tl.where(take, score, best_score)
            best_len = tl.where(take, length, best_len)
            best_tok = tl.where(take, chain, best_tok)
            best_c = tl.where(take, votes, best_c)
            best_n = tl.where(take, among, best_n)
    found = best_len > 0
    tl.store(length_ptr + b, tl.where(found, best_len, 0))
    out = b * K + ki
    tl.store(out_ptr + out, tl.where(found, best_tok, 0), mask=ki < K)
    tl.store(c_ptr + out, tl.where(found, best_c, 0), mask=ki < K)
    tl.store(n_ptr + out, tl.where(found, best_n, 0), mask=ki < K)


def _vote(tokens, table, buckets: int, tail, depth: int, k: int, cap: int = 0, live=None):
    """One launch of ``_corpus_kernel``: ``(match length, tokens, c, n)``."""
    from suffixspec.native.vllm_suffix import HASH_MUL, SLOTS

    b = tail.shape[0]
    dev = tail.device
    length = torch.zeros(b, dtype=torch.int64, device=dev)
    out, c, n = (torch.zeros(b, k, dtype=torch.int64, device=dev) for _ in range(3))
    stride, total, own = (0, length, length) if live is None else live
    _corpus_kernel[(b,)](tail.to(torch.int64).contiguous(), tail.stride(0), tokens, table,
                         length, out, c, n, cap, stride, total, own, HASH_MUL=int(HASH_MUL),
                         NB=buckets, SLOTS=SLOTS, DEPTH=depth,
                         DEPTH_PO2=triton.next_power_of_2(depth), K=k,
                         K_PO2=triton.next_power_of_2(k), LIVE=live is not None, num_warps=4)
    return length, out, c, n


def corpus_triton(corpus, tail, depth: int, k: int):
    """``corpus.DeviceCorpus.draft`` of ``corpus`` in one launch."""
    return _vote(corpus.tokens, corpus.table, corpus.buckets, tail, depth, k, corpus.capacity)


def live_triton(live, hist, total_len, slots, tail, depth: int, k: int):
    """``corpus.LiveCorpus.draft`` of ``live`` in one launch (``hist`` int32 and
    contiguous)."""
    tail = tail.contiguous()
    return _vote(hist, live.table, live.buckets, tail, depth, k,
                 live=(hist.stride(0), total_len.to(torch.int64).contiguous(),
                       slots.to(torch.int64).contiguous()))


def constexprs(windows: DeviceWindows, k: int) -> dict:
    """The kernel's compile-time sizes for ``windows`` and drafts of ``k`` tokens."""
    spec = windows.spec
    return dict(R=spec.rows, W=spec.width, D=spec.head, F=W_FIELDS, X=len(DIRECT_SOURCES), K=k,
                K_PO2=triton.next_power_of_2(k), M_SOURCE=W_SOURCE, M_MATCH=W_MATCH,
                M_HEAD=W_HEAD, M_LEN=W_LEN, M_AT=W_AT, FROM_SCAN=FROM_SCAN,
                FROM_NOTHING=FROM_NOTHING, N_SRC=cal.N_SRC, N_RATIO=cal.N_RATIO,
                N_MATCH=cal.N_MATCH, N_STATE=cal.N_STATE, N_DEPTH=cal.N_DEPTH,
                N_SHARED=cal.N_SHARED, N_COARSE=cal.N_COARSE, ROWS=cal.TABLE_ROWS,
                PLANE_ROWS=cal.PLANE_ROWS, PLANE=cal.PLANE, BASE_ROWS=cal.BASE_ROWS,
                LIFT_ROWS=cal.LIFT_ROWS, TOKEN_BASE=cal.TOKEN_BASE, TOKEN_ROWS=cal.TOKEN_ROWS,
                W_TOKEN=cal.W_TOKEN, TOKEN_MAX=cal.TOKEN_MAX, BIGRAM_BASE=cal.BIGRAM_BASE,
                BIGRAM_ROWS=cal.BIGRAM_ROWS, W_BIGRAM=cal.W_BIGRAM,
                N_KIND=cal.N_KIND, P_MAX=cal.P_MAX, A_MATCH=arbiter.N_MATCH,
                A_POLICY=arbiter.N_POLICY, A_REFERENCE=arbiter.N_REFERENCE,
                A_PART=arbiter.N_PART, ARB_ROWS=arbiter.ARB_ROWS, FROM_ANCHOR=FROM_ANCHOR,
                PICK_LIVE=FROM_LIVE, SRC_LIVE=cal.SRC_LIVE, SRC_SCAN=cal.SRC_SCAN,
                PAIR_FIELDS=PAIR_FIELDS)


def fused_triton(tail, total, sampled, state, slots, windows: DeviceWindows, direct,
                 calibration: Calibration, k: int, vocab_size: int, o) -> None:
    """``draft_ref.fused_ref`` in one launch (float32 calibration)."""
    spec = windows.spec
    if not (triton.next_power_of_2(spec.width) == spec.width
            and triton.next_power_of_2(spec.head) == spec.head):
        raise ValueError("the Triton kernel needs a power-of-two window width")
    b = slots.shape[0]
    d_tok, d_c, d_n, d_match = (x.contiguous() for x in direct)
    src = direct_sources(tail.device)
    table = calibration.table.to(torch.float32).contiguous()
    params = calibration.params.to(torch.float32).contiguous()
    _fused_kernel[(b,)](
        tail.contiguous(), total.contiguous(), sampled.contiguous(),
        state.to(torch.int64).contiguous(), slots.contiguous(), windows.tokens, windows.c,
        windows.n, windows.meta, d_tok, d_c, d_n, d_match, src, table, params,
        calibration.prefer, o.drafts, o.conf, o.probs, o.num_valid, o.buckets, o.choice,
        o.match, o.last, o.pair, o.pair_tokens, vocab_size, calibration.kinds,
        calibration.kinds.shape[0], **constexprs(windows, k), num_warps=4)


__all__ = ["fused_triton", "P_DEPTH", "P_FACTOR", "P_OFFSET", "P_THR", "P_W_COARSE",
           "P_W_FINE", "P_W_SHARED"]
