"""Validation of token arrays at the public boundary."""

from __future__ import annotations

import numpy as np

from suffixspec.native.tokens import MAX_TOKEN_ID, first_bad_token


_INT32 = np.dtype(np.int32)


def as_token_ids(values, name: str = "token_ids") -> np.ndarray:
    """Return ``values`` as a 1-D, C-contiguous int32 array of token ids.

    Accepts any sequence or array of integers in ``[0, 2**30 - 1]`` (ids from
    ``2**30`` up are reserved for output-start anchors).  Raises
    ``ValueError`` naming the problem for anything else (floats, booleans,
    nested lists, negative or too-large ids).
    """
    if (type(values) is np.ndarray and values.dtype is _INT32 and values.ndim == 1
            and values.flags.c_contiguous and values.flags.writeable):
        # The engine's own arrays: one range check in the kernel, no copy.
        # Other arrays take numpy's check, so the kernel has one specialization.
        if first_bad_token(values) < 0:
            return values
    arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, np.int32)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr > MAX_TOKEN_ID))
    if bad.size:
        raise ValueError(f"{name} holds {arr[bad[0]]}, outside the token id range "
                         f"[0, {MAX_TOKEN_ID}]")
    return np.ascontiguousarray(arr, np.int32)
