"""Prompt lookup: draft what followed an earlier occurrence of the last n tokens.

The baseline of vLLM's ``ngram`` method: the longest n in ``[n_min, n_max]``
whose last-n-token pattern occurs earlier in the context, earliest occurrence
first.  One KMP pass over the reversed context finds it in O(len(context)).
"""

import numpy as np
from numba import njit


@njit(cache=True)
def ngram_propose(tokens, n_tokens, n_min, n_max, max_tokens, lps, out):
    """Write the draft for ``tokens[:n_tokens]`` into ``out``; return its length.

    ``lps`` is scratch space of at least ``n_max`` int32.  Read the context
    reversed, ``r[i] = tokens[n_tokens - 1 - i]``: an earlier occurrence of the
    last L tokens is a copy of ``r[0:L]`` starting at some ``j >= 1``, and its
    continuation begins at ``tokens[n_tokens - j]``.  KMP of the pattern
    ``r[0:n_max]`` over ``r[1:]`` yields the longest such L; among equals the
    largest j, which is the earliest occurrence in ``tokens``.
    """
    m = min(n_max, n_tokens - 1)
    if m < n_min or max_tokens <= 0:
        return 0
    last = n_tokens - 1
    # Failure function of the pattern r[0:m].
    lps[0] = 0
    k = 0
    for i in range(1, m):
        while k > 0 and tokens[last - i] != tokens[last - k]:
            k = lps[k - 1]
        if tokens[last - i] == tokens[last - k]:
            k += 1
        lps[i] = k
    best_len = 0
    best_j = 0
    k = 0
    for e in range(1, n_tokens):
        t = tokens[last - e]
        while k > 0 and (k == m or t != tokens[last - k]):
            k = lps[k - 1]
        if t == tokens[last - k]:
            k += 1
        if k >= best_len and k > 0:
            best_len = k
            best_j = e - k + 1
    if best_len < n_min:
        return 0
    start = n_tokens - best_j
    n = min(max_tokens, n_tokens - start)
    for i in range(n):
        out[i] = tokens[start + i]
    return n
