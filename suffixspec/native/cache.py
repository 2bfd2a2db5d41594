"""Keep Numba's on-disk cache in step with every kernel source file, and whole.

Numba's cache checks only the source file of the function it compiled, but
kernels inline and call helpers from the other modules here: editing
``calibration.py`` alone would leave ``propose_batch`` compiled with the old
helper.  So the cache holds a digest of all the kernel sources; when it
differs from the sources on disk, every cached kernel of this package is
dropped and compiled afresh on first use.

Numba does not check its cache files either: a damaged one fails to load
(``warmup`` then drops the cache) or, worse, loads damaged machine code.  So
after a process compiles one of these kernels (at ``warmup``, and at exit
for kernels compiled on first use) the cache folder lists each of its files
with its size and XXH3-64 (``MANIFEST``); a listed file that differs drops
the cache at import, before anything loads from it.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import os
from pathlib import Path

import numba
import numba.core.event
import xxhash

HERE = Path(__file__).resolve().parent
STAMP = "suffixspec-native.digest"
MANIFEST = "suffixspec-native.files"


#: Modules that hold no kernel and no constant a kernel reads.
NOT_KERNELS = ("__init__.py", "cache.py", "warmup.py")


def source_digest() -> str:
    """Digest of the kernel modules of this package, and of the Numba version."""
    h = hashlib.sha256(numba.__version__.encode())
    for path in sorted(p for p in HERE.glob("*.py") if p.name not in NOT_KERNELS):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


_MODULES = ("arctic", "calibrated", "calibration", "heap", "merge", "ngram", "partition",
            "propose", "query", "tokens", "trie", "union")


def cached_kernels():
    """Every ``cache=True`` dispatcher defined in this package."""
    for name in _MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
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
    stale = [f for f in folders if _read(f / STAMP) != digest or not _whole(f)]
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


def drop_cache() -> None:
    """Forget every cached kernel of this package: each compiles afresh on next use."""
    for k in cached_kernels():
        k._cache.flush()
    for folder in {Path(k._cache._cache_path) for k in cached_kernels()}:
        (folder / MANIFEST).unlink(missing_ok=True)


def record_cache_files() -> None:
    """List this package's cache files with their sizes and checksums (``MANIFEST``)."""
    for folder in {Path(k._cache._cache_path) for k in cached_kernels()}:
        try:
            listed = {p.name: _file_stamp(p) for p in _cache_files(folder)}
            tmp = folder / f"{MANIFEST}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(listed))
            tmp.replace(folder / MANIFEST)
        except OSError:
            pass  # a cache folder we cannot write: Numba does not cache there either


class _CompileWatch(numba.core.event.Listener):
    """Notes that this process compiled one of the package's kernels."""

    compiled = False

    def on_start(self, ev):
        pass

    def on_end(self, ev):
        if ev.data["dispatcher"].py_func.__module__.startswith(__package__ + "."):
            _CompileWatch.compiled = True


def watch_compiles() -> None:
    """List the cache files again at exit if this process compiled a kernel."""
    numba.core.event.register("numba:compile", _CompileWatch())
    atexit.register(lambda: _CompileWatch.compiled and record_cache_files())


def _cache_files(folder: Path):
    prefixes = tuple(f"{m}." for m in _MODULES)
    return [p for p in folder.iterdir() if p.name.startswith(prefixes)
            and p.suffix in (".nbi", ".nbc")]


def _file_stamp(path: Path) -> list:
    data = path.read_bytes()
    return [len(data), xxhash.xxh3_64_intdigest(data)]


def _whole(folder: Path) -> bool:
    """Whether every listed cache file is as listed (files written since are not listed)."""
    try:
        listed = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return True  # no list yet: nothing to check against
    for name, stamp in listed.items():
        try:
            if _file_stamp(folder / name) != stamp:
                return False
        except FileNotFoundError:
            continue  # replaced since (a recompile): nothing of it is loaded
        except OSError:
            return False
    return True


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
