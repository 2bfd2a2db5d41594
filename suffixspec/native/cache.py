"""Keep Numba's on-disk cache in step with every kernel source file, and whole.

Numba's cache checks only the source file of the function it compiled, but
kernels inline and call helpers from the other modules here: editing
``calibration.py`` alone would leave ``propose_batch`` compiled with the old
helper.  So the cache holds a digest of all the kernel sources; when it
differs from the sources on disk, every cached kernel of this package is
dropped and compiled afresh on first use.

Numba does not check its cache files either: a damaged one fails to load
(``warmup`` then drops the cache) or, worse, loads damaged machine code.  So
each time a process saves one of these kernels to the cache, the cache folder
lists each of its files with its size, XXH3-64 and inode (``MANIFEST``); a
listed file that differs in place drops the cache at import, before anything
loads from it.  Numba saves a file whole, by rename, so a file with another
inode is a save by another process since the listing, not damage: it is left
alone, and a process starting while another saves does not drop everything.
Inodes mean that only in the folder they were listed in: the listing names
its folder (device and inode), and in a copied folder (an image build, a
restored backup) every listed file is checked by content.  A listing that
cannot be read, or is gone while cache files are there, drops the cache too:
nothing loads unchecked because its list was lost.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from pathlib import Path

import numba
import xxhash

logger = logging.getLogger("suffixspec")

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


_MODULES = tuple(sorted(p.stem for p in HERE.glob("*.py") if p.name not in NOT_KERNELS))


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
    stamps = {f: _read(f / STAMP) for f in folders}
    problems = {f: _problem(f) for f in folders if stamps[f] == digest}
    stale = [f for f in folders if stamps[f] != digest or problems[f] is not None]
    if not stale:
        return False
    for folder in sorted(stale):
        if stamps[folder] is None:  # a first use
            continue
        why = problems.get(folder) or "was written for other kernel sources"
        logger.warning("suffixspec: the kernel cache in %s %s; its kernels compile afresh",
                       folder, why)
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
    record_cache_files()  # what is left (emptied indexes) is listed as it is now


def record_cache_files() -> None:
    """List this package's cache files with their sizes and checksums (``MANIFEST``)."""
    for folder in {Path(k._cache._cache_path) for k in cached_kernels()}:
        try:
            listed = {p.name: _file_stamp(p) for p in _cache_files(folder)}
            tmp = folder / f"{MANIFEST}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"folder": _folder_id(folder), "files": listed}))
            tmp.replace(folder / MANIFEST)
        except OSError:
            pass  # a cache folder we cannot write: Numba does not cache there either


def watch_compiles() -> None:
    """List the cache files again each time this process saves a compiled kernel.

    At once, not at exit: a process that compiles a new variant rewrites that
    kernel's index file, and another process starting meanwhile must find it
    listed as it is, or it would take it for damage and compile everything.
    """
    for kernel in cached_kernels():
        cache = kernel._cache
        if getattr(cache.save_overload, "_listed", False):
            continue
        save = cache.save_overload

        def save_and_list(sig, cres, save=save):
            save(sig, cres)
            record_cache_files()

        save_and_list._listed = True
        cache.save_overload = save_and_list


def _cache_files(folder: Path):
    prefixes = tuple(f"{m}." for m in _MODULES)
    return [p for p in folder.iterdir() if p.name.startswith(prefixes)
            and p.suffix in (".nbi", ".nbc")]


def _file_stamp(path: Path) -> list:
    """Size, XXH3-64 and inode of a cache file."""
    with open(path, "rb") as f:
        inode = os.fstat(f.fileno()).st_ino
        data = f.read()
    return [len(data), xxhash.xxh3_64_intdigest(data), inode]


def _folder_id(folder: Path) -> list:
    """Device and inode of a folder: which folder a listing's inodes belong to."""
    st = os.stat(folder)
    return [st.st_dev, st.st_ino]


def _damaged(path: Path, listed: list, same_folder: bool) -> bool:
    """Whether a listed cache file differs from its listing.

    In the folder it was listed in, a file replaced since (another inode) was
    saved whole by Numba, by rename: it is not read.  Elsewhere (a copy of
    the folder) every file has another inode, and each is read.
    """
    with open(path, "rb") as f:
        if same_folder and len(listed) > 2 and os.fstat(f.fileno()).st_ino != listed[2]:
            return False
        data = f.read()
    return [len(data), xxhash.xxh3_64_intdigest(data)] != listed[:2]


def _problem(folder: Path) -> str | None:
    """Why the cache files in ``folder`` cannot be trusted, or None: every
    listed file is as listed (files written since are not listed)."""
    damaged = "has a damaged file"
    try:
        listing = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        # Each save is listed at once, and emptying the cache lists what is left.
        try:
            return "lost its list of files" if _cache_files(folder) else None
        except OSError:
            return None  # no folder: nothing cached
    except (OSError, ValueError):
        return damaged
    if not isinstance(listing, dict):
        return damaged
    # A listing written before listings named their folder is checked by content.
    listed, listed_in = listing.get("files", listing), listing.get("folder")
    if not isinstance(listed, dict):
        return damaged
    try:
        same_folder = listed_in == _folder_id(folder)
    except OSError:
        return damaged
    for name, stamp in listed.items():
        try:
            if not isinstance(stamp, list) or _damaged(folder / name, stamp, same_folder):
                return damaged
        except FileNotFoundError:
            continue  # replaced since (a recompile): nothing of it is loaded
        except OSError:
            return damaged
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
