"""Numba kernels of suffixspec: the only code with ``@njit``.

``suffix_index`` holds the suffix trie, ``propose`` the batched per-step
driver and both drafting policies, ``calibration`` the online acceptance
statistics, ``ngram`` the prompt-lookup baseline, ``tokens`` the token-id
checks, and ``warmup`` compiles them all.  Kernels depend on numpy and numba
only.
"""

from .warmup import KERNELS, warmup

__all__ = ["KERNELS", "warmup"]
