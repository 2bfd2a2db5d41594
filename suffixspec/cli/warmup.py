"""``suffixspec warmup``: compile every kernel into Numba's cache, once."""

from __future__ import annotations

import json
from pathlib import Path

import click

from suffixspec.cli.common import KernelLoader


@click.command(name="warmup")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON line.")
def warmup_cmd(as_json):
    """Compile every kernel into Numba's on-disk cache, so later processes load it.

    The cache is NUMBA_CACHE_DIR when set, else __pycache__ beside the
    package.  Run it where the kernels will run (a container image's build,
    a node's set-up): the cached code is for this machine's CPU (Numba's
    NUMBA_CPU_NAME=generic makes it portable, a little slower).  Exits 1 when
    the cache could not be written.
    """
    from suffixspec.native import KERNELS

    seconds = KernelLoader().start().wait()
    used = [k for k in KERNELS if k.signatures]
    compiled = sum(sum(k.stats.cache_misses.values()) for k in used)  # those loaded: hits
    folders = sorted({k._cache._cache_path for k in used})
    missing = [f"{k.py_func.__module__}.{k.__name__}" for k in used
               if not Path(k._cache._cache_file._index_path).is_file()]
    result = {"cache": folders[0] if len(folders) == 1 else folders, "seconds": round(seconds, 1),
              "kernels": len(used), "compiled": compiled, "not_cached": missing}
    if as_json:
        click.echo(json.dumps(result))
    else:
        how = f"compiled {compiled}" if compiled else "all loaded from the cache"
        click.echo(f"{len(used)} kernels ready in {seconds:.1f} s ({how}); cache: "
                   f"{result['cache']}")
    if missing:
        raise click.ClickException(f"Numba could not write {len(missing)} kernels to its cache "
                                   f"(is {result['cache']} writeable?): later processes will "
                                   "compile them again")
