"""Token-array checks for the public boundary (numpy reductions cost ~1 µs on tiny arrays)."""

from numba import njit

INT32_MAX = 2147483647


@njit(cache=True)
def first_bad_token(tokens):
    """Index of the first id outside ``[0, 2**31 - 1]``, or -1."""
    for i in range(tokens.shape[0]):
        t = tokens[i]
        if t < 0 or t > INT32_MAX:
            return i
    return -1
