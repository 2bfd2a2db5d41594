"""The sizes of the device's drafting state and the host's side of it, without torch.

What the feeder (``device.feeder``, in the worker's process or a process of
its own) packs needs only these, so that a feeder process never imports
torch; ``layout`` holds the device's tensors and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from suffixspec.native import calibration as cal
from suffixspec.native.windows import W_AT, W_FIELDS, W_HEAD, W_LEN, W_MATCH, W_SOURCE  # noqa: F401
from suffixspec.pools.memory import FAMILY_OUTPUT_TOKENS

#: ``StepOutputs.pair``'s fields (``draft_ref``): the arbiter's pair per row.
PAIR_CELL, PAIR_PICK, PAIR_REFERENCE = range(3)
PAIR_FIELDS = 3

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
