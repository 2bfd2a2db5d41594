"""Numba kernels of suffixspec.  The only code with ``@njit``.

``suffix_index`` holds the suffix trie, ``batch`` the per-step drivers over many
requests, ``ngram`` the prompt-lookup baseline.  ``warmup()`` compiles them all.
"""
