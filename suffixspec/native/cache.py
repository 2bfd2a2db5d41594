"""Keep Numba's on-disk cache in step with every kernel source file.

Numba's cache checks only the source file of the function it compiled, but
kernels inline and call helpers from the other modules here: editing
``calibration.py`` alone would leave ``propose_batch`` compiled with the old
helper.  So the cache holds a digest of all the kernel sources; when it
differs from the sources on disk, every cached kernel of this package is
dropped and compiled afresh on first use.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

HERE = Path(__file__).resolve().parent
STAMP = "suffixspec-native.digest"


#: Modules that hold no kernel and no constant a kernel reads.
NOT_KERNELS = ("__init__.py", "cache.py", "warmup.py")


def source_digest() -> str:
    """Digest of the kernel modules of this package, and of the Numba version."""
    h = hashlib.sha256(numba.__version__.encode())
    for path in sorted(p for p in HERE.glob("*.py") if p.name not in NOT_KERNELS):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cached_kernels():
    """Every ``cache=True`` dispatcher defined in this package."""
    from . import (arctic, calibrated, calibration, heap, merge, ngram, partition, propose,
                   query, tokens, trie, union)

    for module in (arctic, calibrated, calibration, heap, merge, ngram, partition, propose,
                   query, tokens, trie, union):
        for value in vars(module).values():
            cache = getattr(value, "_cache", None)
            if getattr(value, "__module__", None) == module.__name__ and hasattr(cache, "flush"):
                yield value


def drop_stale_cache() -> bool:
    """Flush the cached kernels if the sources changed since they were cached.

    Returns True when it flushed.  The digest lives next to the cache files
    (``__pycache__`` here, or under ``NUMBA_CACHE_DIR``); where that folder
    cannot be written, Numba does not cache either, and nothing is done.
    """
    kernels = list(cached_kernels())
    folders = {Path(k._cache._cache_path) for k in kernels}
    digest = source_digest()
    stale = [f for f in folders if _read(f / STAMP) != digest]
    if not stale:
        return False
    for k in kernels:
        if Path(k._cache._cache_path) in stale:
            k._cache.flush()
    for folder in stale:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
            tmp.write_text(digest)
            tmp.replace(folder / STAMP)
        except OSError:
            pass
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
