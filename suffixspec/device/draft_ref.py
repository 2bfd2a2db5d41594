"""One drafting step on the device, in torch ops: the reference implementation.

``draft_step`` drafts for a batch of requests from their candidate windows
(``layout.DeviceWindows``) and their own history, with no read back to the
host: every size is a host int, no operation has a data-dependent shape.  It
runs on CPU tensors in the tests and in replay, and is the oracle of the fused
Triton kernel (``draft_triton``).

Per batch row ``b`` (request slot ``s = idx[b]``, context ``hist[s,
:total_len[s]]``):

1. **Outcome of the last draft.**  ``num_sampled[b] - 1`` of the slot's last
   draft (``last_valid[s]`` tokens) were accepted: how it fared (``recent``)
   and how far into its output the request is (``total_len[s]`` less the
   slot's ``start``) are calibration's request state, as the host's
   ``calibration.request_state``.
2. **Align.**  If the context followed the window since it was built (its
   ``t`` tokens since then match the window right after the head), it ends
   ``t`` tokens into the path, and calibration sees the window's match
   length plus ``t``.  Else the context ends where its longest suffix (at
   most ``head`` tokens; the later of equals) ends in the window, at or past
   the head and before the last token, and calibration sees that length;
   a branch window the context has not reached yet (its head runs on into
   the path, past the context's end) aligns nowhere.
3. **Own history.**  The longest suffix of the context (at most
   ``scan_depth`` tokens) that ends earlier in the context, the newest of
   equals (vLLM's rule); its continuation counts as seen once.  **Family.**
   The same over the slot's family row (``DeviceWindows.family``: the family
   outputs the host's own tree indexes beside the request): a candidate of
   the request's own tree, seen once, that no other is scored against.  The
   own history's continuation scores in rows of its own
   (``calibration.SRC_SCAN``): in a long history the newest of many
   occurrences is a poorer bet than a trie's continuation seen once, while
   a family row holds two outputs, where the longest match is most often
   the only one; the arbiter counts a scan's pick as the own tree's.
4. **Score.**  A candidate's next ``k`` tokens, each with its calibrated
   probability (``calib``), a running product, kept while it beats the
   threshold (and within the length cap): the gain is ``sum(p - thr)``.
   Where the proposer drafts with a reference (``P_REFERENCE``), the own
   history's continuation is it: each token of every candidate, the
   reference's own included (it agrees with itself), is scored in the
   plane of its agreement with it, as the host scores its own candidates
   and its reference's draft against ``calibrated.reference``.  The
   candidate with the largest positive gain drafts (the lowest row of
   equals; the own-history candidate last).
5. **Arbitrate** (``P_ARBITRATE``, as ``native.arbiter`` on the host):
   where the own history matched and its draft differs from the pick's,
   the pair's cell (the pick's source and match length, the scan's match
   length, whether the two part at their first token) is written with both
   drafts, for the host to score once the context has gone past them; where
   the cell prefers the reference (``Calibration.prefer``), the scan's draft
   is drafted instead, with buckets -1 (calibration learns from the
   policy's picks only).
6. **Write** drafts (unused slots repeat the last token), per-slot
   confidences (each token's own acceptance estimate given the ones before
   it, as vLLM's adaptive verification takes them; 0 past the draft), valid
   counts, calibration buckets, and the slot state.

Token ids at or past ``vocab_size`` and the -1 padding never reach a draft.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from suffixspec.native import arbiter, calibration as cal
from suffixspec.native.layout import FROM_ANCHOR, FROM_LIVE as PICK_LIVE, FROM_REQUEST
from suffixspec.device import calib
from suffixspec.device.spec import PAIR_CELL, PAIR_FIELDS, PAIR_PICK, PAIR_REFERENCE  # noqa: F401
from suffixspec.device.layout import (P_ARBITRATE, P_DEPTH, P_FACTOR, P_OFFSET, P_REFERENCE,
                                      P_THR, P_W_COARSE, P_W_FINE, P_W_SHARED, W_AT, W_HEAD,
                                      W_LEN, W_MATCH, W_SOURCE, Calibration, DeviceWindows)

#: ``StepOutputs.choice``: drafted from the own-history scan, the pool's device
#: corpus, the pool's one-token paths, the family row, the open outputs of the
#: other requests; nothing drafted.
FROM_SCAN = -2
FROM_CORPUS = -3
FROM_SHORT = -4
FROM_FAMILY = -5
FROM_LIVE = -6
FROM_NOTHING = -1

#: ``StepOutputs.pair``'s fields: ``spec.PAIR_*`` (imported above).


@dataclass
class StepOutputs:
    """A step's drafts, in batch order (``[B, k]`` / ``[B]``): ``drafts``
    (int64), ``conf`` (float32), ``num_valid`` (int32), ``probs`` (each
    token's running product, float32), ``buckets`` (int32), ``choice`` (the
    window row that drafted, or ``FROM_*``), ``match`` (the match length
    calibration saw), ``last`` (each row's last token, int64: the filler);
    the arbiter's pair: ``pair`` (int32 ``[B, PAIR_FIELDS]``: its cell, -1
    for none; the pick's length; the reference's) and ``pair_tokens`` (int64
    ``[B, 2, k]``: the pick, then the reference; -1 past each), as they were
    drafted (a later fit of the batch cuts ``drafts`` only)."""

    drafts: torch.Tensor
    conf: torch.Tensor
    num_valid: torch.Tensor
    probs: torch.Tensor
    buckets: torch.Tensor
    choice: torch.Tensor
    match: torch.Tensor
    last: torch.Tensor
    pair: torch.Tensor
    pair_tokens: torch.Tensor

    @classmethod
    def empty(cls, rows: int, k: int, device="cpu") -> StepOutputs:
        def z(*shape, dtype=torch.int32):
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(z(rows, k, dtype=torch.int64), z(rows, k, dtype=torch.float32), z(rows),
                   z(rows, k, dtype=torch.float32), z(rows, k), z(rows), z(rows),
                   z(rows, dtype=torch.int64), z(rows, PAIR_FIELDS),
                   z(rows, 2, k, dtype=torch.int64))

    def rows(self, b: int) -> StepOutputs:
        return StepOutputs(*(getattr(self, f)[:b] for f in self.__dataclass_fields__))


def recent_of(last_valid: torch.Tensor, num_sampled: torch.Tensor) -> torch.Tensor:
    """How each slot's last draft fared (``calibration.RECENT_*``)."""
    accepted = (num_sampled - 1).clamp(min=0)
    return torch.where(last_valid <= 0, cal.RECENT_NONE,
                       torch.where(accepted <= 0, cal.RECENT_REJECTED,
                                   torch.where(accepted < last_valid, cal.RECENT_PARTLY,
                                               cal.RECENT_WHOLLY))).to(torch.int32)


def context_tail(hist, total, depth: int, slots=None) -> torch.Tensor:
    """``[B, depth]`` (int64): the last tokens of each row (of rows ``slots`` of
    ``hist``, when given), newest first, -2 before its start."""
    d = torch.arange(depth, device=hist.device)
    at = total[:, None] - 1 - d[None, :]
    if slots is None:
        got = hist.gather(1, at.clamp(min=0))
    else:
        got = hist[slots[:, None], at.clamp(0, hist.shape[1] - 1)]
    return torch.where(at >= 0, got.to(torch.int64), -2)


def own_history_scan(hist, total, depth: int):
    """``(length, end)`` per row: the longest suffix of ``hist[b, :total[b]]`` (at
    most ``depth`` tokens) that also ends at an earlier ``end`` (the newest of
    equals); length 0 when none (``native.vllm_suffix.local_match``)."""
    return suffix_scan(hist, total, context_tail(hist, total, depth))


def suffix_scan(rows, lengths, tail):
    """``(length, end)`` per row: the longest suffix of a context (``tail``,
    ``[B, D]``, its last tokens newest first, negative before its start) that
    ends at a position ``end`` of ``rows[b, :lengths[b]]`` with a token after
    it (``1 <= end < lengths[b]``), the newest of equals; length 0 when none
    (``native.vllm_suffix.family_match``).  The own history is the context's
    own row; a family row is another."""
    width = rows.shape[1]
    depth = tail.shape[1]
    pos = torch.arange(width, device=rows.device)                  # candidate ends
    d = torch.arange(depth, device=rows.device)
    src = pos[:, None] - 1 - d[None, :]                            # [L, D]
    tok = rows[:, src.clamp(min=0)]                                # [B, L, D]
    ok = (src[None] >= 0) & (tok == tail[:, None, :]) & (tail[:, None, :] >= 0)
    length = ok.to(torch.int64).cumprod(dim=2).sum(dim=2)          # [B, L]
    live = (pos[None, :] >= 1) & (pos[None, :] < lengths.to(torch.int64)[:, None])
    score = torch.where(live & (length > 0), length * (width + 1) + pos[None, :], 0)
    best = score.max(dim=1).values
    length = best // (width + 1)
    return length, torch.where(length > 0, best - length * (width + 1), 0)


def agreement(tokens, ref, ref_ok):
    """Each token's agreement with the reference (``calibrated.agreement``):
    ``tokens`` ``[B, C, k]``, ``ref`` ``[B, k]`` valid where ``ref_ok`` (a
    prefix of each row).  A token agrees where it and every token before it
    equal the reference's; it differs where those before it do and it does
    not; else (or past the reference) there is no agreement."""
    ok = ref_ok[:, None, :]
    eq = (tokens == ref[:, None, :]) & ok
    before = torch.cumprod(eq.to(torch.int64), dim=-1)
    before = torch.cat([torch.ones_like(before[..., :1]), before[..., :-1]], dim=-1).bool()
    return torch.where(before & eq, cal.AGREE_SAME,
                       torch.where(before & ok, cal.AGREE_DIFF, cal.AGREE_NONE))


def _score(tokens, c, n, valid, src, match, calibration: Calibration, vocab_size: int,
           agree=None, last=None):
    """Probabilities and gains of candidates: ``tokens``/``c``/``n``/``valid``
    ``[..., k]``, ``src``/``match`` ``[...]``, ``agree`` (``[..., k]``, None:
    none) each token's agreement with the reference, ``last`` (``[...]``,
    None: none) the token each candidate follows, the context's last: a
    token's kind is lifted after the kind of the one before it.  Returns ``(q, p, kept,
    gain, buckets)``: each token's estimate, running product, whether it is
    drafted, the candidate's gain, the tokens' buckets."""
    params = calibration.params
    thr = params[P_THR]
    k = tokens.shape[-1]
    depth = torch.arange(k, device=tokens.device)
    ok = valid & (c > 0) & (n > 0) & (tokens >= 0) & (tokens < vocab_size)
    ok = ok.to(torch.int32).cumprod(dim=-1).bool()
    m = match[..., None].expand_as(tokens)
    fine = calib.bucket(src[..., None].expand_as(tokens), m, depth.expand_as(tokens), c, n, agree)
    weights = (params[P_W_SHARED], params[P_W_COARSE], params[P_W_FINE])
    kind = calib.kind_of(calibration.kinds, tokens)
    before = prev = None
    if last is not None:
        prev = torch.cat([last[..., None], tokens[..., :-1]], dim=-1)
        before = calib.kind_of(calibration.kinds, prev)
    q = torch.where(ok, calib.probability(calibration.table, weights, fine, c, n, m, kind,
                                          before, tokens, prev), 0.0)
    p = q.cumprod(dim=-1)
    # The length cap: match length * factor + offset tokens, when a factor is set.
    cap = torch.where(params[P_FACTOR] >= 0,
                      (match.to(p.dtype) * params[P_FACTOR] + params[P_OFFSET] + 1e-6).floor(),
                      torch.full_like(match, k, dtype=p.dtype))
    kept = ok & (p > thr) & (depth.to(p.dtype) < cap[..., None])
    kept = kept.to(torch.int32).cumprod(dim=-1).bool()
    gain = torch.where(kept, p - thr, 0.0).sum(dim=-1)
    return q, p, kept, gain, fine


#: Sources of the direct candidates (``direct_candidates``), in their order.
#: The own-history scan's continuation scores in rows of its own
#: (``calibration.SRC_SCAN``); the family row's, as the host's family
#: outputs, in the own tree's.
DIRECT_SOURCES = (cal.SRC_SCAN, cal.SRC_CROSS, cal.SRC_CROSS, cal.SRC_REQUEST, cal.SRC_LIVE)


@functools.cache
def direct_sources(device: torch.device) -> torch.Tensor:
    """``DIRECT_SOURCES`` on ``device`` (int64), made once: a tensor made from host
    values each step would be a blocking copy, a wait for the GPU's queue."""
    return torch.tensor(DIRECT_SOURCES, dtype=torch.int64, device=device)


def direct_candidates(hist, slots, total, k: int, scan, corpus=None, short=None,
                      family=None, live=None):
    """The candidates found apart from the windows, ``(tokens, c, n, match)``
    (``[B, X, k]`` x3, ``[B, X]``; int64), in the order of ``DIRECT_SOURCES``:
    the own history (``scan``: ``(length, end)``; a continuation seen once),
    the pool's device corpus (``corpus``: its draft and votes), the pool's
    one-token paths (``short``), the family row (``family``: the batch's rows,
    their lengths and their scan's ``(length, end)``; seen once), the other
    requests' open outputs (``live``: their draft and votes).  A missing one
    drafts nothing."""
    b = total.shape[0]
    dev = total.device
    j = torch.arange(k, device=dev)
    s_len, s_end = (x.to(torch.int64) for x in scan)
    s_at = s_end[:, None] + j
    one = ((s_len[:, None] > 0) & (s_at < total[:, None])).to(torch.int64)
    tokens = [hist[slots[:, None], s_at.clamp(0, hist.shape[1] - 1)].to(torch.int64)]
    counts, totals, matches = [one], [one], [s_len]
    zero = torch.zeros(b, k, dtype=torch.int64, device=dev)
    if family is not None:
        rows, lengths, (f_len, f_end) = family
        f_len = f_len.to(torch.int64)
        f_at = f_end.to(torch.int64)[:, None] + j
        f_tok = rows.gather(1, f_at.clamp(0, rows.shape[1] - 1)).to(torch.int64)
        f_one = ((f_len[:, None] > 0) & (f_at < lengths.to(torch.int64)[:, None])).to(torch.int64)
        family = (f_len, f_tok, f_one, f_one)
    for extra in (corpus, short, family, live):
        if extra is None:
            extra = (torch.zeros(b, dtype=torch.int64, device=dev), zero, zero, zero)
        e_len, e_tok, e_c, e_n = (x.to(torch.int64) for x in extra)
        live = (e_len > 0)[:, None]
        tokens.append(e_tok)
        counts.append(e_c * live)
        totals.append(e_n * live)
        matches.append(e_len)
    return (torch.stack(tokens, dim=1), torch.stack(counts, dim=1), torch.stack(totals, dim=1),
            torch.stack(matches, dim=1))


def draft_step(hist, total_len, idx, num_sampled, windows: DeviceWindows,
               calibration: Calibration, k: int, vocab_size: int, out: StepOutputs,
               scan=None, scan_depth: int = 24, corpus=None, short=None,
               family_scan=None, fused=None, live=None) -> StepOutputs:
    """Drafts for the batch rows ``idx`` (slots); see the module docstring.

    ``hist`` (int32 ``[slots, max_len]``) and ``total_len`` (``[slots]``) are
    the requests' tokens; ``num_sampled`` (``[B]``) the tokens the last step
    emitted per row (0: the row is prefilling and gets no draft).  ``scan``:
    the own-history match ``(length, end)`` per row, when computed apart
    (replay does it in a Numba kernel); else computed here.  ``corpus``,
    ``short``: the pool tiers' drafts, or functions of the context's last
    tokens (newest first) and of its last token that give them
    (``corpus.DeviceCorpus.draft``, ``corpus.OneTokenPaths.draft``).
    ``family_scan``: the family rows' match ``(length, end)`` per row, when
    computed apart; else computed here (none where ``windows.spec.family`` is
    0).  ``live``: the open outputs' draft, or a function of the context's
    last tokens that gives it (``corpus.LiveCorpus.draft``; its rows indexed
    before).  ``fused``: what aligns, scores and
    writes (``fused_ref``, or the Triton kernel's launcher).  Writes the
    first ``B`` rows of ``out`` and returns them; updates the slots' state.
    """
    b = idx.shape[0]
    slots = idx.to(torch.int64)
    total = total_len[slots].to(torch.int64)
    sampled = num_sampled.to(torch.int64)
    recent = recent_of(windows.last_valid[slots], sampled)
    state = calib.request_state(recent, (total - windows.start[slots]).clamp(min=0))
    tail = context_tail(hist, total, windows.spec.head, slots)           # [B, D]
    if scan is None:
        scan = own_history_scan(hist[slots], total, scan_depth)
    if callable(corpus) or callable(live):
        deep = context_tail(hist, total, max(scan_depth, 4), slots)
        corpus = corpus(deep) if callable(corpus) else corpus
        live = live(deep) if callable(live) else live
    if callable(short):
        short = short(tail[:, 0])
    family = None
    if windows.spec.family > 0:
        rows, lengths = windows.family[slots], windows.family_len[slots]
        if family_scan is None:
            family_scan = suffix_scan(rows, lengths, context_tail(hist, total, scan_depth, slots))
        family = (rows, lengths, family_scan)
    direct = direct_candidates(hist, slots, total, k, scan, corpus, short, family, live)
    o = out.rows(b)
    (fused or fused_ref)(tail, total, sampled, state, slots, windows, direct, calibration, k,
                         vocab_size, o)
    windows.recent[slots] = recent
    windows.last_valid[slots] = o.num_valid
    return o


def fused_ref(tail, total, sampled, state, slots, windows: DeviceWindows, direct,
              calibration: Calibration, k: int, vocab_size: int, o: StepOutputs) -> None:
    """Align every window, score every candidate, keep the best, write ``o``:
    steps 2, 4 and 5 of the module docstring, for the batch's ``slots``.
    ``tail`` (``[B, head]``) is each context's last tokens, newest first;
    ``direct`` the other candidates (``direct_candidates``).  The Triton
    kernel (``draft_triton``) does this in one launch."""
    spec = windows.spec
    b = slots.shape[0]
    dev = tail.device
    head = spec.head
    width = spec.width
    wt = windows.tokens[slots].to(torch.int64)                           # [B, R, W]
    meta = windows.meta[slots].to(torch.int64)                           # [B, R, F]
    w_head, w_len = meta[..., W_HEAD], meta[..., W_LEN]
    e = torch.arange(width, device=dev)
    d = torch.arange(head, device=dev)
    at = e[:, None] - d[None, :]                                         # [W, D]
    same = (at >= 0) & (wt[:, :, at.clamp(min=0)] == tail[:, None, None, :])
    length = same.to(torch.int64).cumprod(dim=3).sum(dim=3)              # [B, R, W]
    # Where the context now ends in the window if it followed the window since
    # it was built: its tokens since then all match there.
    followed = total[:, None] - meta[..., W_AT]                         # [B, R]
    e_at = w_head - 1 + followed
    inside = (followed >= 0) & (e_at + 1 < w_len)
    at_len = length.gather(2, e_at.clamp(0, width - 1)[..., None])[..., 0]
    on_path = inside & (at_len >= torch.minimum(e_at + 1, torch.full_like(e_at, head)))
    # Else the longest match anywhere past the head (the later of equals), in a
    # window the context has reached (a branch window's head runs on into the
    # path: before the context reaches its branch, it holds no continuation).
    fits = ((e >= w_head[..., None] - 1) & (e + 1 < w_len[..., None]) & (length > 0)
            & (followed[..., None] >= 0))
    score = torch.where(fits, length * (width + 1) + e, -1).max(dim=2).values
    aligned = on_path | (score >= 0)
    a_len = torch.where(score >= 0, score // (width + 1), 0)
    a_end = torch.where(on_path, e_at, torch.where(score >= 0, score - a_len * (width + 1), 0))
    match = torch.where(on_path, meta[..., W_MATCH] + followed, a_len)
    match = torch.minimum(match, calibration.params[P_DEPTH].to(torch.int64))
    j = torch.arange(k, device=dev)
    at = a_end[..., None] + 1 + j                                        # [B, R, K]
    inside = aligned[..., None] & (at < w_len[..., None])
    at = at.clamp(max=width - 1)

    d_tok, d_c, d_n, d_match = direct
    tokens = torch.cat([wt.gather(2, at), d_tok], dim=1)                 # [B, C, K]
    counts = torch.cat([windows.c[slots].to(torch.int64).gather(2, at) * inside, d_c], dim=1)
    totals = torch.cat([windows.n[slots].to(torch.int64).gather(2, at) * inside, d_n], dim=1)
    match = torch.cat([match, d_match], dim=1)                           # [B, C]
    sources = direct_sources(dev).expand(b, -1)
    origin = torch.cat([meta[..., W_SOURCE], sources], dim=1)           # [B, C]
    src = origin + cal.N_SRC * state[:, None]
    # The own-history scan's continuation (the first direct candidate) is the
    # reference every candidate agrees with or not, itself included (as the
    # host's ``calibrated._reference_draft``); it rates no one where the
    # proposer drafts without one (``P_REFERENCE`` 0).
    ref_ok = (d_c[:, 0] > 0) & (calibration.params[P_REFERENCE] > 0)
    ref_ok = torch.cumprod(ref_ok.to(torch.int64), dim=-1).bool()
    agree = agreement(tokens, d_tok[:, 0], ref_ok)
    q, p, kept, gain, fine = _score(tokens, counts, totals,
                                    torch.ones_like(tokens, dtype=torch.bool), src, match,
                                    calibration, vocab_size, agree,
                                    tail[:, :1].expand(b, tokens.shape[1]))

    # The best candidate: windows in row order, then the others in order.
    best = gain.argmax(dim=1)                                            # the first of equals
    rows = spec.rows
    drafts_ok = (gain.gather(1, best[:, None])[:, 0] > 0) & (sampled > 0)
    swap = _arbitrate(best, drafts_ok, tokens, kept, match, origin, ref_ok[:, 0], sampled,
                      rows, calibration, o)
    best = torch.where(swap, rows, best)  # the scan drafts instead
    drafts_ok = drafts_ok | swap
    pick = best[:, None, None].expand(b, 1, k)

    def chosen(x):
        return x.gather(1, pick)[:, 0]

    kept = chosen(kept) & drafts_ok[:, None]
    tokens, q, p, fine = chosen(tokens), chosen(q), chosen(p), chosen(fine)
    fine = torch.where(swap[:, None], -1, fine)  # calibration learns from its own picks only
    match_all = match.gather(1, best[:, None])[:, 0]
    kind = torch.where(best < rows, best, FROM_SCAN - (best - rows))
    last = tail[:, 0].clamp(min=0)
    o.drafts.copy_(torch.where(kept, tokens, last[:, None]))
    o.conf.copy_(torch.where(kept, q, 0.0).to(torch.float32))
    o.probs.copy_(torch.where(kept, p, 0.0).to(torch.float32))
    o.num_valid.copy_(kept.sum(dim=1).to(torch.int32))
    o.buckets.copy_(torch.where(kept, fine, 0).to(torch.int32))
    o.choice.copy_(torch.where(drafts_ok, kind, FROM_NOTHING).to(torch.int32))
    o.match.copy_(torch.where(drafts_ok, match_all, 0).to(torch.int32))
    o.last.copy_(last)


def _arbitrate(best, drafts_ok, tokens, kept, match, origin, has_ref, sampled, ri: int,
               calibration: Calibration, o: StepOutputs) -> torch.Tensor:
    """Step 5 of the module docstring: write each row's pair (``o.pair``,
    ``o.pair_tokens``) and return where the scan (candidate ``ri``) drafts
    instead of the pick ``best`` (``arbiter.cell``, ``arbiter.prefers_reference``)."""
    b = best.shape[0]
    pick = best[:, None, None].expand(b, 1, tokens.shape[2])
    pick_kept = kept.gather(1, pick)[:, 0] & drafts_ok[:, None]
    ref_kept = kept[:, ri] & (sampled > 0)[:, None]
    pick_tok, ref_tok = tokens.gather(1, pick)[:, 0], tokens[:, ri]
    n_pick, n_ref = pick_kept.sum(dim=1), ref_kept.sum(dim=1)
    same = ((pick_tok == ref_tok) & pick_kept & ref_kept).to(torch.int64).cumprod(dim=1).sum(1)
    paired = (has_ref & (calibration.params[P_ARBITRATE] > 0) & (sampled > 0)
              & ~((same == n_pick) & (same == n_ref)))
    source = origin.gather(1, best[:, None])[:, 0]
    # the arbiter's pick sources: the scan's pick is the own tree's
    source = torch.where(source == cal.SRC_LIVE, PICK_LIVE,
                         torch.where(source == cal.SRC_SCAN, FROM_REQUEST,
                                     source.clamp(max=FROM_ANCHOR)))
    m = match.gather(1, best[:, None])[:, 0]
    policy = torch.where(n_pick > 0, source * arbiter.N_MATCH + m.clamp(max=arbiter.N_MATCH - 1),
                         arbiter.N_POLICY - 1)
    reference = match[:, ri].clamp(1, arbiter.N_REFERENCE) - 1
    cell = ((policy * arbiter.N_REFERENCE + reference) * arbiter.N_PART
            + (same > 0).to(torch.int64)).clamp(0, arbiter.ARB_ROWS - 1)
    swap = paired & (n_ref > 0) & (calibration.prefer[cell] > 0)
    o.pair[:, PAIR_CELL] = torch.where(paired, cell, -1).to(torch.int32)
    o.pair[:, PAIR_PICK] = n_pick.to(torch.int32)
    o.pair[:, PAIR_REFERENCE] = n_ref.to(torch.int32)
    o.pair_tokens[:, 0] = torch.where(pick_kept, pick_tok, -1)
    o.pair_tokens[:, 1] = torch.where(ref_kept, ref_tok, -1)
    return swap
