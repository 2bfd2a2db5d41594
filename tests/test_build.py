"""A snapshot built as partitions, apart or in worker processes, equals the index built in one piece."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixspec.index import SuffixIndex
from suffixspec.pools import build, files
from suffixspec.pools.store import StoredSequence

SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
DEPTH = 6


def build_index(sequences, max_depth):
    """The index built in one piece: one tree per namespace, every suffix.

    Returns the index, namespace -> tree, the highest id and the output tokens.
    """
    ix = SuffixIndex(max_depth)
    trees: dict[str, int] = {}
    for seq in sequences:
        tree = trees.get(seq.namespace)
        if tree is None:
            tree = trees[seq.namespace] = ix.add_tree()
        s = ix.add_sequence(tree, capacity=max(seq.length, 1))
        ix.extend(s, seq.tokens)
        ix.close(s)
    return (ix, trees, max(s.seq_id for s in sequences),
            sum(s.length - s.anchors for s in sequences))


def _stored(seqs):
    return [StoredSequence(i + 1, ns, "", "", 0.0, len(t), np.array(t, np.int32), 0)
            for i, (ns, t) in enumerate(seqs)]


def _snapshot(folder, seqs, **kw):
    info = build.build(seqs, DEPTH, folder, **kw)
    arrays, _, _ = files.open_arrays(folder, info["arrays"])
    ix = SuffixIndex.from_arrays({k: np.array(v) for k, v in arrays.items()}, DEPTH)
    ix.check_integrity()
    return ix, info


def _assert_same(one, one_trees, ix, trees, seqs):
    """Every substring: same match, count, continuations and path draft."""
    assert trees == one_trees
    for t in trees.values():
        for s in seqs:
            a = s.tokens
            for end in range(len(a) + 1):
                for length in range(min(DEPTH, end) + 1):
                    ctx = a[end - length:end]
                    m1, m2 = one.match(t, ctx), ix.match(t, ctx)
                    assert (m1 is None) == (m2 is None)
                    if m1 is None:
                        continue
                    assert (m1.length, m1.count) == (m2.length, m2.count)
                    c1 = dict(zip(*(x.tolist() for x in one.continuations(m1))))
                    c2 = dict(zip(*(x.tolist() for x in ix.continuations(m2))))
                    assert c1 == c2
                    if m1.length:  # drafts start below the root
                        assert (one.draft_path(m1, DEPTH, 0.0)[0].tolist()
                                == ix.draft_path(m2, DEPTH, 0.0)[0].tolist())


# Ids beyond the partitions' buckets (anchors are) share a bucket with a small id.
TOKENS = st.sampled_from([0, 1, 2, 3, 4, 5, build.BUCKETS + 1, build.BUCKETS + 2, 1 << 30])
corpus = st.lists(st.tuples(st.sampled_from(["a", "b"]),
                            st.lists(TOKENS, min_size=0, max_size=40)),
                  min_size=1, max_size=12)


@pytest.mark.slow
@SLOW
@given(corpus, st.integers(1, 60))
def test_partitions_laid_together_equal_one_index(tmp_path_factory, seqs, partition_tokens):
    stored = _stored(seqs)
    one, one_trees, watermark, tokens = build_index(stored, DEPTH)
    folder = tmp_path_factory.mktemp("snap") / "s"
    ix, info = _snapshot(folder, stored, partition_tokens=partition_tokens)
    assert (info["watermark"], info["tokens"]) == (watermark, tokens)
    assert ix.live_tokens == one.live_tokens
    _assert_same(one, one_trees, ix, info["namespaces"], stored)


@pytest.mark.slow
def test_worker_processes_build_the_same_index(tmp_path):
    rng = np.random.default_rng(0)
    seqs = [("a" if i % 3 else "b", rng.integers(0, 8, rng.integers(1, 200)).tolist())
            for i in range(80)]
    stored = _stored(seqs)
    one, one_trees, _, _ = build_index(stored, DEPTH)
    ix, info = _snapshot(tmp_path / "s", stored, jobs=2, partition_tokens=1000)
    assert info["partitions"] > 2
    _assert_same(one, one_trees, ix, info["namespaces"], stored)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(
        f"{name}.bin" for name in info["arrays"])  # the build's own files are gone


def test_a_small_pool_is_built_in_process_whatever_jobs_asks(tmp_path, monkeypatch):
    """``--jobs 16`` on a pool of a few tokens starts no worker process (each
    costs an interpreter: sixteen took 3.2 GB for 27 tokens)."""
    def no_workers(*args, **kwargs):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(build, "_in_workers", no_workers)
    stored = _stored([("a", [1, 2, 3, 1, 2, 4] * 4), ("b", [5, 1, 2, 3])])
    one, one_trees, _, _ = build_index(stored, DEPTH)
    ix, info = _snapshot(tmp_path / "s", stored, jobs=16)
    _assert_same(one, one_trees, ix, info["namespaces"], stored)


def test_dealing_tokens_evens_out_the_partitions():
    freq = np.array([100, 1, 50, 50, 0, 30, 20], np.int64)
    owner = build.deal(freq, 2)
    loads = [int(freq[owner == p].sum()) for p in range(2)]
    assert sum(loads) == freq.sum() and max(loads) <= freq.sum() / 2 + freq.max()
    # Token frequencies of real text fall off like 1/rank: 8 partitions come out even.
    zipf = (1e7 / np.arange(1, 150_000)).astype(np.int64)
    owner = build.deal(zipf, 8)
    loads = np.array([zipf[owner == p].sum() for p in range(8)])
    assert loads.max() / loads.min() < 1.01
