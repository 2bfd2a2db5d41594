"""Brute-force twins of the device drafting step, written from its docstring
in plain Python loops (``suffixspec.device.draft_ref``): the oracle its torch
ops and the Triton kernel are held to."""

from __future__ import annotations

import numpy as np

from suffixspec.native import calibration as cal

FROM_SCAN, FROM_NOTHING = -2, -1


def probability(table, weights, src, m, depth, c, n, kind=-1, before=-1, token=-1, prev=-1):
    fine = int(cal.bucket(src, m, depth, c, n))
    p = estimate(table, weights, fine, c / (n + 1.0 / np.sqrt(max(m, 1))), kind, before)
    if token >= 0:  # its token row's ratio, shrunk towards 1
        row = cal.TOKEN_BASE + token % cal.TOKEN_ROWS
        factor = min((table[row, 0] + cal.W_TOKEN) / (table[row, 1] + cal.W_TOKEN), cal.TOKEN_MAX)
        if prev >= 0:  # its bigram row's, after token ``prev``, shrunk towards that
            row = bigram_row(prev, token)
            factor = min((table[row, 0] + cal.W_BIGRAM * factor) / (table[row, 1] + cal.W_BIGRAM),
                         cal.TOKEN_MAX)
        p *= factor
    return min(p, cal.P_MAX), fine


def bigram_row(prev, token):
    """The row of ``token`` after ``prev``: the low 18 bits of the token, xor
    those of the one before turned by 9 bits."""
    low = prev % cal.BIGRAM_ROWS
    turned = ((low << 9) | (low >> 9)) % cal.BIGRAM_ROWS
    return cal.BIGRAM_BASE + ((token % cal.BIGRAM_ROWS) ^ turned)


def estimate(table, weights, fine, prior, kind=-1, before=-1):
    """The estimate of fine row ``fine`` with the shared level's ``prior``,
    lifted by ``kind`` after ``before``, before its token row."""
    coarse = int(cal.coarse_of(fine))
    shared = int(cal.shared_of(fine))
    ws, wc, wf = weights
    ps = (table[shared, 0] + ws * prior) / (table[shared, 1] + ws)
    pc = (table[coarse, 0] + wc * ps) / (table[coarse, 1] + wc)
    p = (table[fine, 0] + wf * pc) / (table[fine, 1] + wf)
    if kind >= 0 and pc > 0:
        row = lift_row(fine, kind)
        lift = (table[row, 0] + wc * pc) / (table[row, 1] + wc)
        if before >= 0:
            row = pair_row(fine, before, kind)
            lift = (table[row, 0] + wf * lift) / (table[row, 1] + wf)
        p = min(p * lift / pc, cal.P_MAX)
    return p


def lift_row(fine, kind):
    """The lift row of ``kind`` beside fine row ``fine``'s coarse row: the lift
    rows follow the planes, per plane and kind one row per coarse row."""
    plane = 0 if fine < cal.PLANE_ROWS else 1 + (fine - cal.PLANE_ROWS) // cal.PLANE
    first = cal.N_SHARED if plane == 0 else cal.PLANE_ROWS + (plane - 1) * cal.PLANE
    coarse = first + (fine - first - cal.N_COARSE) // (cal.N_STATE * cal.N_DEPTH)
    return cal.BASE_ROWS + (plane * cal.N_KIND + kind) * cal.N_COARSE + coarse - first


def pair_row(fine, before, kind):
    """The pair row of ``kind`` after ``before`` beside ``lift_row(fine, kind)``:
    the pair rows follow the lift rows, per plane, kind before and kind one
    row per coarse row."""
    lift = lift_row(fine, kind)
    plane, rest = divmod(lift - cal.BASE_ROWS, cal.N_KIND * cal.N_COARSE)
    coarse = rest % cal.N_COARSE
    return (cal.BASE_ROWS + cal.LIFT_ROWS
            + ((plane * cal.N_KIND + before) * cal.N_KIND + kind) * cal.N_COARSE + coarse)


def kind_of(kinds, token):
    return int(kinds[token]) if kinds is not None and 0 <= token < len(kinds) else -1


def recent_of(last_valid, sampled):
    accepted = max(sampled - 1, 0)
    if last_valid <= 0:
        return cal.RECENT_NONE
    if accepted <= 0:
        return cal.RECENT_REJECTED
    return cal.RECENT_PARTLY if accepted < last_valid else cal.RECENT_WHOLLY


def agreements(tokens, ref):
    """Each token's agreement with the reference ``ref`` (a list)."""
    out, on = [], True
    for j, t in enumerate(tokens):
        if on and j < len(ref):
            out.append(cal.AGREE_SAME if t == ref[j] else cal.AGREE_DIFF)
            on = out[-1] == cal.AGREE_SAME
        else:
            out.append(cal.AGREE_NONE)
            on = False
    return out


def score(tokens, c, n, src, m, k, table, weights, thr, factor, offset, vocab, ref=(),
          kinds=None, last=-1):
    """(gain, drafted tokens, q per token, p per token, buckets) of one
    candidate drafted after token ``last``."""
    cap = k if factor < 0 else int(np.floor(m * factor + offset + 1e-6))
    prob, gain = 1.0, 0.0
    out, qs, ps, fines = [], [], [], []
    agree = agreements(tokens, list(ref))
    for j in range(k):
        if j >= len(tokens):
            break
        t, cj, nj = tokens[j], c[j], n[j]
        if not (cj > 0 and nj > 0 and 0 <= t < vocab):
            break
        before = last if j == 0 else tokens[j - 1]
        q, fine = probability(table, weights, int(cal.with_agreement(src, agree[j])), m, j, cj,
                              nj, kind_of(kinds, t), kind_of(kinds, before), t, before)
        p = prob * q
        if not (p > thr and j < cap):
            break
        prob = p
        gain += p - thr
        out.append(t)
        qs.append(q)
        ps.append(p)
        fines.append(fine)
    return gain, out, qs, ps, fines


def local_match(row, total, depth):
    best_len, best_pos = 0, 0
    for pos in range(1, total):
        m = 0
        while m < depth and pos - 1 - m >= 0 and row[pos - 1 - m] == row[total - 1 - m]:
            m += 1
        if m > 0 and (m > best_len or (m == best_len and pos > best_pos)):
            best_len, best_pos = m, pos
    return best_len, best_pos


def family_match(family, ctx, depth):
    """The longest suffix of ``ctx`` ending at a position of ``family`` with a
    token after it, the newest of equals."""
    best_len, best_pos = 0, 0
    for pos in range(1, len(family)):
        m = 0
        while (m < depth and m < len(ctx) and pos - 1 - m >= 0
               and family[pos - 1 - m] == ctx[-1 - m]):
            m += 1
        if m > 0 and (m > best_len or (m == best_len and pos > best_pos)):
            best_len, best_pos = m, pos
    return best_len, best_pos


def draft_row(ctx, sampled, last_valid, windows, table, weights, thr, factor, offset, depth,
              k, vocab, head, scan_depth=24, extra=(), reference=False, family=None,
              live=None, start=0, kinds=None):
    """The device step for one request: ``windows`` is a list of ``(tokens, c, n,
    [source, match, head, length])``; ``extra`` more candidates ``(tokens, c,
    n, match, source)`` after the scan (``None``: none); ``family`` the slot's
    family row (a list; None: none), its candidate after them; ``live`` the open
    outputs' draft ``(tokens, c, n, match)`` (None: none), last; ``reference``:
    the scan's continuation rates the other candidates' tokens; ``start``
    where the request's output starts in ``ctx``; ``kinds`` each token's kind
    (None: none).  Returns
    ``(tokens, q, p, buckets, choice, match, recent)``."""
    recent = recent_of(last_valid, sampled)
    position = sum(max(len(ctx) - start, 0) >= edge for edge in cal.POSITION_EDGES)
    state = recent + cal.N_RECENT * position
    cands = []
    for tokens, c, n, meta in windows:
        source, base, w_head, w_len, w_at = meta

        def matched(e):
            length = 0
            while (length < head and e - length >= 0 and length < len(ctx)
                   and tokens[e - length] == ctx[-1 - length]):
                length += 1
            return length

        followed = len(ctx) - w_at
        e = w_head - 1 + followed
        if followed >= 0 and e + 1 < w_len and matched(e) >= min(e + 1, head):
            m = base + followed
        else:
            best = None
            for e in range(len(tokens)):
                if e >= w_head - 1 and e + 1 < w_len and matched(e) > 0 and followed >= 0:
                    if best is None or (matched(e), e) > best:
                        best = (matched(e), e)
            if best is None:
                cands.append(None)
                continue
            m, e = best
        m = min(m, depth)
        span = slice(e + 1, w_len)
        cands.append((list(tokens[span]), list(c[span]), list(n[span]), m, source))
    s_len, s_end = local_match(ctx, len(ctx), scan_depth)
    s_tok = list(ctx[s_end:s_end + k]) if s_len > 0 else []
    cands.append((s_tok, [1] * len(s_tok), [1] * len(s_tok), s_len, cal.SRC_SCAN))
    cands.extend(extra)
    if family is not None:
        cands.extend([None] * (2 - len(extra)))  # the corpus and the one-token paths
        f_len, f_end = family_match(family, ctx, scan_depth)
        f_tok = list(family[f_end:f_end + k]) if f_len > 0 else []
        cands.append((f_tok, [1] * len(f_tok), [1] * len(f_tok), f_len, cal.SRC_REQUEST))
    if live is not None:
        cands.extend([None] * (4 + len(windows) - len(cands)))  # the tiers before it
        cands.append((*live, cal.SRC_LIVE))
    ref = s_tok if reference else []
    best, best_gain = None, 0.0
    for i, cand in enumerate(cands):
        if cand is None:
            continue
        tokens, c, n, m, source = cand
        result = score(tokens, c, n, source + cal.N_SRC * state, m, k, table, weights, thr,
                       factor, offset, vocab, ref, kinds, ctx[-1] if len(ctx) else -1)
        if result[0] > best_gain:
            best, best_gain = (i, result, m), result[0]
    if best is None or sampled <= 0:
        return [], [], [], [], FROM_NOTHING, 0, recent
    i, (gain, out, qs, ps, fines), m = best
    choice = i if i < len(windows) else FROM_SCAN - (i - len(windows))
    return out, qs, ps, fines, choice, m, recent


def assert_drafts_as_corpus_twin(draft, ctx, ring, table, depth: int, k: int) -> None:
    """``draft`` (``(match length, tokens, c, n)`` of one row) equals
    ``vllm_suffix.corpus_draft`` of context ``ctx`` over the ring and table,
    votes included, zero past the chain."""
    from suffixspec.native import vllm_suffix

    length, tokens, c, n = draft
    chain = np.zeros(k, np.int64)
    votes = np.zeros((k, 2), np.int64)
    g_len, g_n = vllm_suffix.corpus_draft(ctx, ctx.shape[0], ring, table, depth, k, chain, votes)
    assert length.item() == g_len
    if g_len:
        assert tokens[0, :g_n].tolist() == chain[:g_n].tolist()
        assert c[0].tolist() == votes[:, 0].tolist() and n[0].tolist() == votes[:, 1].tolist()
        assert (c[0, g_n:] == 0).all()
