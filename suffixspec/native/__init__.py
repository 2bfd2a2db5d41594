"""Numba kernels of suffixspec: the only code with ``@njit``.

One job per module:

* ``layout``: array fields, flags and the named records kernels exchange;
* ``trie``: the suffix trie (insert, remove, match, check);
* ``heap``: the frontier of tree drafts;
* ``calibrated``: the drafting policy (calibrated probabilities, cost-aware
  length), with ``calibration``, its online acceptance statistics, and
  ``merge``, one tree draft from every candidate's;
* ``arctic``: arctic-inference's rule, for ``suffixspec.compat.arctic``;
* ``query``: raw-count drafts from one position (``SuffixIndex``'s queries);
* ``union``: a string's continuations in several indexes at once (a
  persistent pool's snapshot segments and in-memory part), counts added up;
* ``propose``: the batched per-step driver;
* ``ngram`` (the prompt-lookup baseline), ``tokens`` (token-id checks);
* ``warmup`` compiles them all, and ``cache`` keeps Numba's on-disk cache in
  step with the sources.

Kernels depend on numpy and numba only.  They release the interpreter lock
(``nogil``): a pool's loader thread indexes beside the serving thread.
"""

from .cache import drop_stale_cache, watch_compiles
from .warmup import KERNELS, warmup

drop_stale_cache()
watch_compiles()

__all__ = ["KERNELS", "warmup"]
