"""What the device keeps per request slot, and the sizes that fix it.

Each request slot ``s`` of the engine (a row of MRV2's ``RequestState``) holds
``rows`` candidate windows of ``width`` tokens (``native.windows``), the slot's
epoch (bumped whenever a new request takes the slot, so an update built for
the slot's last request is dropped), how many tokens its last draft held and
how that draft fared (``recent``, calibration's feature), and its *family
row*: the family outputs (``family_outputs``) the host's own tree indexes
beside the request, each followed by -1, which no context token equals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from suffixspec.native import arbiter, calibration as cal
from suffixspec.pools.memory import FAMILY_OUTPUT_TOKENS
from suffixspec.native.windows import W_AT, W_FIELDS, W_HEAD, W_LEN, W_MATCH, W_SOURCE  # noqa: F401

#: A window's head (the context's last tokens, which the device lines up) is at
#: most this share of its width.
HEAD_SHARE = 4

# ``params`` (float32, shape [PARAMS]): what the host sets each step.
P_THR = 0        # the cost threshold a drafted token's probability must beat
P_FACTOR = 1     # draft length cap: match length * factor + offset (-1: none)
P_OFFSET = 2
P_DEPTH = 3      # the trie depth: the longest match length calibration sees
P_W_SHARED = 4   # calibration's prior weights (``calibration.ST_W_*``)
P_W_COARSE = 5
P_W_FINE = 6
P_REFERENCE = 7  # 1: a candidate's tokens agree with the own-history scan or not (calibration)
P_ARBITRATE = 8  # 1: the arbiter's cells (``Calibration.prefer``) may draft the scan instead
PARAMS = 9


@dataclass(frozen=True)
class WindowSpec:
    """Sizes of the device state: ``rows`` windows of ``width`` tokens per slot,
    drafts of ``k`` tokens, an own-history scan of matches up to ``scan_depth``
    tokens (vLLM's drafter scans 24), a family row of ``family`` tokens per
    slot (0: none; ``family_width``)."""

    rows: int = 8
    width: int = 64
    k: int = 16
    scan_depth: int = 24
    family: int = 0

    def __post_init__(self):
        if self.rows < 1 or self.k < 1 or self.scan_depth < 1:
            raise ValueError("rows, k and scan_depth must be positive")
        if self.family < 0:
            raise ValueError("family must be 0 or more tokens")
        if self.width < 2 * HEAD_SHARE:
            raise ValueError(f"a window must hold at least {2 * HEAD_SHARE} tokens")

    @property
    def head(self) -> int:
        return self.width // HEAD_SHARE


def family_width(outputs: int) -> int:
    """A family row's tokens for ``outputs`` family outputs, each whole and
    its separator."""
    return max(int(outputs), 0) * (FAMILY_OUTPUT_TOKENS + 1)


def family_row(outputs, width: int) -> np.ndarray:
    """``outputs`` (oldest first) each followed by -1, the newest ``width``
    tokens of that (int32)."""
    if width <= 0 or not outputs:
        return np.zeros(0, np.int32)
    parts = []
    for o in outputs:
        parts += [np.asarray(o, np.int32), np.full(1, -1, np.int32)]
    return np.concatenate(parts)[-width:]


class DeviceWindows:
    """Per-slot windows and state on ``device``: ``tokens``, ``c``, ``n``
    (int32, ``[slots, rows, width]``), ``meta`` (int32, ``[slots, rows,
    W_FIELDS]``), ``epoch``, ``last_valid``, ``recent``, ``start`` (where the
    request's output starts: its prompt's length) (int32, ``[slots]``),
    the family rows ``family`` (int32, ``[slots, max(spec.family, 1)]``, -1
    past ``family_len``) and ``family_len`` (int32, ``[slots]``).
    One more slot than asked for: the trash row of updates that name no slot
    (``payload.apply``)."""

    def __init__(self, spec: WindowSpec, slots: int, device="cpu"):
        self.spec = spec
        slots += 1
        shape = (slots, spec.rows, spec.width)
        self.tokens = torch.full(shape, -1, dtype=torch.int32, device=device)
        self.c = torch.zeros(shape, dtype=torch.int32, device=device)
        self.n = torch.zeros(shape, dtype=torch.int32, device=device)
        self.meta = torch.zeros(slots, spec.rows, W_FIELDS, dtype=torch.int32, device=device)
        self.epoch = torch.zeros(slots, dtype=torch.int32, device=device)
        self.last_valid = torch.zeros(slots, dtype=torch.int32, device=device)
        self.recent = torch.full((slots,), cal.RECENT_NONE, dtype=torch.int32, device=device)
        self.start = torch.zeros(slots, dtype=torch.int32, device=device)
        self.family = torch.full((slots, max(spec.family, 1)), -1, dtype=torch.int32,
                                 device=device)
        self.family_len = torch.zeros(slots, dtype=torch.int32, device=device)

    def reset(self, slots, prompt_len) -> None:
        """Slots that a new request takes, its prompt ``prompt_len`` tokens: no
        windows, no last draft, no family."""
        self.family_len[slots] = 0
        self.meta[slots] = 0
        self.last_valid[slots] = 0
        self.recent[slots] = cal.RECENT_NONE
        self.start[slots] = prompt_len


class Calibration:
    """The calibration table on the device (``table``: ``[TABLE_ROWS + 1, 2]``,
    the last row the trash row of payload entries that name none),
    ``params`` (``P_*``), in ``dtype``, and the arbiter's choice per cell
    (``prefer``, int32 ``[arbiter.ARB_ROWS]``: 1 where the reference's draft
    has done better than the policy's pick, ``arbiter.preferred``), and the
    kind of each of ``vocab`` token ids (``kinds``, int32; -1, none, until
    ``set_kinds``)."""

    def __init__(self, device="cpu", dtype=torch.float32, vocab: int = 1):
        self.table = torch.zeros(cal.TABLE_ROWS + 1, 2, dtype=dtype, device=device)
        self.kinds = torch.full((max(vocab, 1),), -1, dtype=torch.int32, device=device)
        self.params = torch.zeros(PARAMS, dtype=dtype, device=device)
        self.prefer = torch.zeros(arbiter.ARB_ROWS, dtype=torch.int32, device=device)

    def set_kinds(self, kinds) -> None:
        """The host proposer's ``stats.kinds`` (checked there), sent once, in
        place (a captured graph holds ``self.kinds``): ids past ``vocab`` are
        of no kind, as are ids past ``kinds``."""
        n = min(int(kinds.shape[0]), self.kinds.shape[0])
        self.kinds[n:] = -1
        self.kinds[:n] = torch.as_tensor(kinds[:n]).to(self.kinds)

    @staticmethod
    def host_params(state, thr: float, factor: float, offset: float, depth: int,
                    reference: bool = False, arbitrate: bool = False) -> list[float]:
        """``params`` as a host list, from calibration's ``state`` and the step's
        threshold; ``reference``: the proposer drafts with a reference
        (``ProposerConfig.newest_window``); ``arbitrate``: and arbitrates
        between it and its pick (``ProposerConfig.arbitrate``, path drafts)."""
        out = [0.0] * PARAMS
        out[P_THR], out[P_FACTOR], out[P_OFFSET], out[P_DEPTH] = thr, factor, offset, depth
        out[P_REFERENCE] = 1.0 if reference else 0.0
        out[P_ARBITRATE] = 1.0 if reference and arbitrate else 0.0
        out[P_W_SHARED] = float(state[cal.ST_W_SHARED])
        out[P_W_COARSE] = float(state[cal.ST_W_COARSE])
        out[P_W_FINE] = float(state[cal.ST_W_FINE])
        return out
