"""Compilation happens once, before serving: nothing compiles after ``warmup``."""

import json
import os
import subprocess
import sys

import pytest

# Serving as engines do it, after ``warmup`` of the serving steps: batches of one and several
# requests, read-only, writeable int32 and int64 token arrays, paths and trees, a cross pool in
# memory and a persistent pool with a snapshot.
SERVE = """
import tempfile
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool

rng = np.random.default_rng(0)
text = rng.integers(0, 50, 400)

def serve(prop, rounds=3):
    for r in range(rounds):
        ids = [f"{r}-{i}" for i in range(r + 1)]  # batches of 1, 2 and 3
        for i, rid in enumerate(ids):
            prompt = text[i:i + 40]
            if i:  # int32 arrays as engines pass them: read-only (i == 1), writeable (i == 2)
                prompt = prompt.astype(np.int32)
                prompt.setflags(write=i == 2)
            prop.start_request(rid, prompt)
        for step in range(6):
            prop.propose(ids)
            prop.propose(ids, max_spec_tokens=[4] * len(ids))
            prop.extend_batch(ids, [text[40 + 3 * step:43 + 3 * step] for _ in ids])
            prop.extend(ids[0], [int(text[60 + step])])
        for rid in ids[:-1]:
            prop.finish_request(rid)
        prop.abort_request(ids[-1])

for settings in ({}, {"tree": True}, {"anchors": False}, {"cross_pool_tokens": 0}):
    serve(SuffixProposer(**settings))
folder = tempfile.mkdtemp()
for day in range(2):
    pool = PersistentPool(folder + "/pool.lmdb", tokenizer=BYTES, max_depth=64)
    prop = SuffixProposer(pool=pool, shared_namespace="shared" if day else None)
    serve(prop)
    pool.write_snapshot()
    prop.save_calibration()
    pool.close()
"""


def _grown_after_warmup(steps: str, script: str) -> dict:
    """Run ``script`` in a fresh process after ``warmup(steps=<steps>)``; the
    kernels that gained a specialization (compiled, or loaded from Numba's
    cache) meanwhile, with how many."""
    watch = ("import json\nimport numpy as np\n"
             "from suffixspec.native.cache import cached_kernels\n"
             "from suffixspec.native.warmup import DEVICE, SERVING, warmup\n"
             f"warmup(steps={steps})\n"
             "before = {k: len(k.signatures) for k in cached_kernels()}\n")
    report = ("\nprint(json.dumps({f'{k.py_func.__module__}.{k.__name__}': len(k.signatures) - n"
              " for k, n in before.items() if len(k.signatures) > n}))\n")
    out = subprocess.run([sys.executable, "-c", watch + script + report], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_serving_after_warmup_compiles_no_kernel_again():
    grew = _grown_after_warmup("SERVING", SERVE)
    assert grew == {}, f"kernels specialized again while serving: {grew}"


# Drafting on the device, as its feeder and speculator call the host (in the
# replay of that path, which calls the same kernels on CPU tensors): windows,
# one-token paths, the arbiter's pairs adopted, the threshold, the own-history
# scan and the corpus lookup, over requests that finish into the corpus.
DEVICE_SERVE = """
from suffixspec.device.replay import DeviceWindowsProposer

text = np.random.default_rng(0).integers(0, 50, 400)
p = DeviceWindowsProposer(max_spec_tokens=4, corpus_tokens=1 << 12, vocab_size=64)
for r in range(3):
    ids = [f"{r}-{i}" for i in range(r + 1)]
    for i, rid in enumerate(ids):
        p.start_request(rid, text[i:i + 40])
    for step in range(6):
        p.propose(ids)
        for rid in ids:
            p.extend(rid, text[40 + 3 * step:43 + 3 * step])
    for rid in ids[:-1]:
        p.finish_request(rid)
    p.abort_request(ids[-1])
"""


@pytest.mark.slow  # a child interpreter (the serving one stays fast)
def test_drafting_on_the_device_after_warmup_compiles_no_kernel_again():
    pytest.importorskip("torch")
    grew = _grown_after_warmup("SERVING + DEVICE", DEVICE_SERVE)
    assert grew == {}, f"kernels specialized again while drafting on the device: {grew}"


@pytest.mark.slow
def test_a_first_run_compiles_on_two_cores_and_fills_the_cache_for_the_next(
        first_run_kernel_cache):
    first = first_run_kernel_cache  # empty cache: the drafting kernel compiled in a child
    probe = ("from suffixspec.kernels import from_cache; from suffixspec.native.warmup import "
             "SERVING; print(from_cache(SERVING))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, "NUMBA_CACHE_DIR": str(first.path)}, check=True)
    assert loaded.stdout.strip() == "True"  # every serving kernel is in the cache now
    assert first.replay(first.path) == first.row


def test_step_groups_put_the_longest_step_alone_and_share_the_rest_by_core():
    from suffixspec.kernels import LONGEST, step_groups
    from suffixspec.native.warmup import SERVING

    assert step_groups(SERVING, 1) == [SERVING]
    assert step_groups(SERVING, 2) == [(LONGEST,), ("indexing", "learning", "maintenance")]
    assert step_groups(SERVING, 3) == [(LONGEST,), ("indexing", "maintenance"), ("learning",)]
    assert step_groups(SERVING, 64) == [(LONGEST,), ("indexing",), ("learning",),
                                        ("maintenance",)]
    assert step_groups(("learning", "checks"), 4) == [("learning",), ("checks",)]
    for n in range(1, 8):  # every step once, in no more groups than cores
        groups = step_groups(SERVING, n)
        assert sorted(s for g in groups for s in g) == sorted(SERVING) and len(groups) <= n


@pytest.mark.slow
def test_a_background_start_loads_what_its_children_compiled(tmp_path):
    """On an empty cache the children compile; this process only loads."""
    script = (
        "import importlib, json, logging, threading\n"
        "from suffixspec.kernels import BackgroundStart\n"
        "w = importlib.import_module('suffixspec.native.warmup')\n"
        "ready = threading.Event()\n"
        "start = BackgroundStart(lambda s: ready.set(), logging.getLogger('t'),\n"
        "                        ('learning', 'checks')).start()\n"
        "assert start.join(600) and ready.is_set()\n"
        "print(json.dumps([len(start._children),\n"
        "                  sum(sum(k._cache_misses.values()) for k in w.KERNELS),\n"
        "                  sum(sum(k._cache_hits.values()) for k in w.KERNELS)]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, check=True)
    children, misses, hits = json.loads(out.stdout.strip().splitlines()[-1])
    from suffixspec.kernels import cores

    assert children == min(2, cores())
    assert misses == 0 and hits > 0
