"""Token-array checks for the public boundary (numpy reductions cost ~1 µs on tiny arrays)."""

from numba import njit

# Vocabulary ids lie in [0, MAX_TOKEN_ID]; ids from SYNTHETIC_BASE up are
# synthetic (output-start anchors, ``suffixspec.anchors``): no engine sends
# them and no draft holds them.
MAX_TOKEN_ID = (1 << 30) - 1
SYNTHETIC_BASE = MAX_TOKEN_ID + 1


@njit(cache=True)
def first_bad_token(tokens):
    """Index of the first id outside ``[0, MAX_TOKEN_ID]``, or -1."""
    for i in range(tokens.shape[0]):
        t = tokens[i]
        if t < 0 or t > MAX_TOKEN_ID:
            return i
    return -1
