"""Numba kernels of suffixspec: the only code with ``@njit``.

``suffix_index`` holds the suffix trie and the batched per-step driver,
``ngram`` the prompt-lookup baseline, ``warmup`` compiles them all.  Kernels
depend on numpy and numba only.
"""

from .warmup import KERNELS, warmup

__all__ = ["KERNELS", "warmup"]
