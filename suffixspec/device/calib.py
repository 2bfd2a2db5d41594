"""``native.calibration``'s buckets and probabilities in torch ops.

The same formulas as the Numba kernels, elementwise over tensors of any
shape, so the device scores candidates exactly as the host policy does.
Counts ``n < 1`` give a clamped row (callers mask those tokens out).
"""

from __future__ import annotations

import torch

from suffixspec.native import calibration as cal


def _steps(x: torch.Tensor, bounds, values) -> torch.Tensor:
    """``values[k]`` for the first ``bounds[k] >= x``, else ``values[-1]``."""
    out = torch.full_like(x, values[-1])
    for bound, value in reversed(list(zip(bounds, values[:-1]))):
        out = torch.where(x <= bound, torch.full_like(x, value), out)
    return out


def count_bucket(n: torch.Tensor) -> torch.Tensor:
    return torch.where(n <= 2, n - 1, _steps(n, (4, 8, 16), (2, 3, 4, 5))).clamp(min=0)


def match_bucket(m: torch.Tensor) -> torch.Tensor:
    return torch.where(m <= 3, m, _steps(m, (5, 8, 15, 31), (4, 5, 6, 7, 8))).clamp(min=0)


def depth_bucket(j: torch.Tensor) -> torch.Tensor:
    return torch.where(j <= 2, j, _steps(j, (4, 8), (3, 4, 5))).clamp(min=0)


def request_state(recent: torch.Tensor, output_len: torch.Tensor) -> torch.Tensor:
    """The fine level's request state (``calibration.request_state``)."""
    position = torch.zeros_like(output_len)
    for edge in cal.POSITION_EDGES:
        position = position + (output_len >= edge).to(position.dtype)
    return recent.to(position.dtype) + cal.N_RECENT * position


def plane_base(agree: torch.Tensor) -> torch.Tensor:
    """Row of agreement plane ``agree``'s first coarse bucket (``calibration._plane_base``)."""
    return torch.where(agree == cal.AGREE_NONE, cal.N_SHARED,
                       cal.PLANE_ROWS + (agree - 1) * cal.PLANE)


def bucket(src, match_len, depth, c, n, agree=None) -> torch.Tensor:
    """Fine bucket (table row) of a token chosen by ``c`` of ``n``; ``src`` is
    ``source + N_SRC * state`` (``request_state``), ``agree`` the token's agreement with the
    reference (None: none) (``calibration.bucket``)."""
    safe_n = n.clamp(min=1)
    ratio = torch.where(c >= n, torch.full_like(c, cal.N_RATIO - 1),
                        ((5 * c) // safe_n).clamp(0, cal.N_RATIO - 2))
    state = src // cal.N_SRC
    shared = (count_bucket(n) * cal.N_RATIO + ratio) * cal.N_MATCH + match_bucket(match_len)
    coarse = (src - cal.N_SRC * state) * cal.N_SHARED + shared
    base = cal.N_SHARED if agree is None else plane_base(agree)
    fine = base + cal.N_COARSE + (coarse * cal.N_STATE + state) * cal.N_DEPTH + depth_bucket(
        depth)
    return fine.clamp(0, cal.TABLE_ROWS - 1)


def agreement_of(fine: torch.Tensor) -> torch.Tensor:
    """The agreement plane of fine rows ``fine`` (``calibration.agreement_of``)."""
    return torch.where(fine < cal.PLANE_ROWS, cal.AGREE_NONE,
                       1 + (fine - cal.PLANE_ROWS) // cal.PLANE)


def kind_of(kinds: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The kind of each of ``tokens`` (``calibration.kind_of``: -1 where none)."""
    inside = (tokens >= 0) & (tokens < kinds.shape[0])
    return torch.where(inside, kinds[tokens.clamp(0, kinds.shape[0] - 1)].to(tokens.dtype), -1)


def probability(table, weights, fine, c, n, matched, kind=None, before=None,
                tokens=None, prev=None) -> torch.Tensor:
    """Estimated acceptance of token ``tokens`` (None or -1: none, not scaled
    by a token row) of bucket ``fine`` and ``kind``, after token ``prev`` (-1
    or None: none, the token row alone) of kind ``before`` (-1 or None: none)
    (``calibration.probability``); ``weights`` are the shared, coarse and
    fine prior weights (0-d tensors or floats)."""
    ws, wc, wf = weights
    base = plane_base(agreement_of(fine))
    coarse = base + (fine - base - cal.N_COARSE) // (cal.N_STATE * cal.N_DEPTH)
    shared = (coarse - base) % cal.N_SHARED
    dtype = table.dtype
    prior = c.to(dtype) / (n.to(dtype) + 1.0 / torch.sqrt(matched.clamp(min=1).to(dtype)))
    ps = (table[shared, 0] + ws * prior) / (table[shared, 1] + ws)
    pc = (table[coarse, 0] + wc * ps) / (table[coarse, 1] + wc)
    p = (table[fine, 0] + wf * pc) / (table[fine, 1] + wf)
    if kind is not None:
        p = _lifted(table, (wc, wf), fine, base, coarse, pc, p, kind, before)
    if tokens is not None:
        row = cal.TOKEN_BASE + (tokens.clamp(min=0) & (cal.TOKEN_ROWS - 1))
        factor = ((table[row, 0] + cal.W_TOKEN) / (table[row, 1] + cal.W_TOKEN)).clamp(
            max=cal.TOKEN_MAX)
        if prev is not None:
            row = bigram_row(prev, tokens)
            factor = torch.where(prev >= 0, ((table[row, 0] + cal.W_BIGRAM * factor)
                                             / (table[row, 1] + cal.W_BIGRAM)).clamp(
                max=cal.TOKEN_MAX), factor)
        p = torch.where(tokens >= 0, p * factor, p)
    return p.clamp(max=cal.P_MAX)


def bigram_row(prev: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Rows of ``tokens`` after ``prev`` (``calibration.bigram_row``; negative ids as 0)."""
    p = prev.clamp(min=0) & (cal.BIGRAM_ROWS - 1)
    return cal.BIGRAM_BASE + ((tokens.clamp(min=0) ^ (p << 9) ^ (p >> 9)) & (cal.BIGRAM_ROWS - 1))


def _lifted(table, weights, fine, base, coarse, pc, p, kind, before):
    """``p`` with the lift of ``kind`` after ``before`` (``probability``)."""
    wc, wf = weights
    plane = agreement_of(fine)
    kind_at = plane * cal.N_KIND + kind.clamp(min=0)
    row = cal.BASE_ROWS + kind_at * cal.N_COARSE + coarse - base
    lift = (table[row, 0] + wc * pc) / (table[row, 1] + wc)
    if before is not None:
        row = (cal.BASE_ROWS + cal.LIFT_ROWS
               + ((plane * cal.N_KIND + before.clamp(min=0)) * cal.N_KIND + kind.clamp(min=0))
               * cal.N_COARSE + coarse - base)
        lift = torch.where(before >= 0, (table[row, 0] + wf * lift) / (table[row, 1] + wf), lift)
    lifted = p * lift / pc.clamp(min=1e-30)
    return torch.where((kind >= 0) & (pc > 0), lifted.clamp(max=cal.P_MAX), p)
