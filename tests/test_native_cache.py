"""Numba's on-disk cache follows every kernel source, not just a kernel's own file."""

import json
import os
import shutil
import subprocess
import sys

import pytest

PROBE = """
import json
import numpy as np
from suffixspec.native import tokens
tokens.first_bad_token(np.zeros(3, np.int32))
stats = tokens.first_bad_token.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
"""


def _probe(cache_dir) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_changed_source_digest_drops_the_cached_kernels(tmp_path):
    from suffixspec.native.cache import STAMP, source_digest

    assert _probe(tmp_path) == {"hits": 0, "misses": 1}  # compiled and cached
    stamps = list(tmp_path.rglob(STAMP))
    assert len(stamps) == 1 and stamps[0].read_text() == source_digest()
    assert _probe(tmp_path) == {"hits": 1, "misses": 0}  # a fresh process loads it
    # As if another kernel source had changed since the cache was written.
    stamps[0].write_text("an older digest")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"hits": 0, "misses": 1}
    assert run.stderr.count("was written for other kernel sources") == 1  # said, once
    assert stamps[0].read_text() == source_digest()
    assert _probe(tmp_path) == {"hits": 1, "misses": 0}


def test_every_cached_kernel_of_the_package_is_flushed_when_stale():
    import importlib

    from suffixspec.native.cache import HERE, NOT_KERNELS, cached_kernels

    known = set(map(id, cached_kernels()))
    for path in sorted(HERE.glob("*.py")):
        if path.name in NOT_KERNELS:
            continue
        module = importlib.import_module(f"suffixspec.native.{path.stem}")
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__ and hasattr(
                    getattr(value, "_cache", None), "flush"):
                assert id(value) in known, f"{path.stem}.{name} is not in cached_kernels()"


NEW_VARIANT_THEN_PROBE = """
import subprocess, sys
import numpy as np
from suffixspec.native import tokens
tokens.first_bad_token(np.zeros(3, np.int64))  # a variant the cache did not hold
# Another process starting while this one still runs finds the cache whole.
print(subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True,
                     check=True).stdout)
"""


@pytest.mark.slow
def test_a_process_that_adds_a_variant_leaves_the_cache_whole_for_the_others(tmp_path):
    assert _probe(tmp_path) == {"hits": 0, "misses": 1}
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", NEW_VARIANT_THEN_PROBE, PROBE], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"hits": 1, "misses": 0}



SAVE_BEFORE_LISTING = """
import numpy as np
from suffixspec.native import cache, tokens
cache.record_cache_files = lambda: None  # stopped between Numba's save and the listing
tokens.first_bad_token(np.zeros(3, np.int64))  # a new variant: the index is saved anew
"""


@pytest.mark.slow
def test_a_process_starting_while_another_saves_a_kernel_does_not_drop_the_cache(tmp_path):
    # Numba saves a kernel's index by rename; until the saving process lists
    # the files again, the listing is behind.  That is no damage.
    assert _probe(tmp_path) == {"hits": 0, "misses": 1}
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", SAVE_BEFORE_LISTING], env=env, check=True)
    assert _probe(tmp_path) == {"hits": 1, "misses": 0}


@pytest.mark.parametrize("kind, damage", [("nbi", "cut"),
                                          pytest.param("nbc", "flip", marks=pytest.mark.slow)])
def test_a_damaged_file_in_a_copied_cache_is_found_although_every_inode_changed(
        tmp_path, kind, damage):
    # Inodes vouch for a file only in the folder they were listed in: in a copy
    # (an image build, a restored backup) each listed file is read.
    first, intact, damaged = tmp_path / "first", tmp_path / "intact", tmp_path / "damaged"
    assert _probe(first) == {"hits": 0, "misses": 1}
    shutil.copytree(first, intact)
    shutil.copytree(first, damaged)
    assert _probe(intact) == {"hits": 1, "misses": 0}
    victim = next(damaged.rglob(f"tokens.first_bad_token-*.{kind}"))
    data = bytearray(victim.read_bytes())
    if damage == "cut":
        del data[len(data) // 2:]
    else:
        data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(damaged))
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"hits": 0, "misses": 1}
    assert run.stderr.count("has a damaged file") == 1


@pytest.mark.slow  # five child interpreters; a damaged cache file stays in the fast tier
def test_a_lost_or_damaged_list_of_cache_files_drops_the_cache(tmp_path):
    # The list is what vouches for the files: without it nothing loads unchecked.
    from suffixspec.native.cache import MANIFEST

    first = tmp_path / "first"
    assert _probe(first) == {"hits": 0, "misses": 1}
    for name, damage, said in (("lost", lambda f: f.unlink(), "lost its list of files"),
                               ("cut", lambda f: f.write_text(f.read_text()[:9]),
                                "has a damaged file")):
        cache = tmp_path / name
        shutil.copytree(first, cache)
        damage(next(cache.rglob(MANIFEST)))
        env = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
        run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                             text=True, check=True)
        assert json.loads(run.stdout.strip().splitlines()[-1]) == {"hits": 0, "misses": 1}
        assert run.stderr.count(said) == 1
        assert _probe(cache) == {"hits": 1, "misses": 0}  # listed again as it was saved
