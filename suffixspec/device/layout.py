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

import torch

from suffixspec.device.spec import (HEAD_SHARE, P_ARBITRATE, P_DEPTH, P_FACTOR,  # noqa: F401
                                    P_OFFSET, P_REFERENCE, P_THR, P_W_COARSE, P_W_FINE,
                                    P_W_SHARED, PARAMS, W_AT, W_FIELDS, W_HEAD, W_LEN, W_MATCH,
                                    W_SOURCE, WindowSpec, family_row, family_width, host_params)
from suffixspec.native import arbiter, calibration as cal

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

    host_params = staticmethod(host_params)
