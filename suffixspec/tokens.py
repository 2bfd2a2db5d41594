"""Validation of token arrays at the public boundary."""

from __future__ import annotations

import numpy as np

INT32_MAX = np.iinfo(np.int32).max


def as_token_ids(values, name: str = "token_ids") -> np.ndarray:
    """Return ``values`` as a 1-D, C-contiguous int32 array of token ids.

    Accepts any sequence or array of integers in ``[0, 2**31 - 1]``.  Raises
    ``ValueError`` naming the problem for anything else (floats, booleans,
    nested lists, negative or too-large ids).
    """
    arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.dtype != np.int32:
        lo = arr.min()
        hi = arr.max()
        if lo < 0 or hi > INT32_MAX:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds {bad}, outside the token id range [0, {INT32_MAX}]")
        arr = arr.astype(np.int32)
    elif arr.min() < 0:
        raise ValueError(f"{name} holds {arr.min()}, token ids must not be negative")
    return np.ascontiguousarray(arr)
