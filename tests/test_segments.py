"""Snapshot segments: merging, deletes that rebuild only what they touch, pools added from elsewhere."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from suffixspec import SuffixProposer
from suffixspec.cli import main
from suffixspec.fingerprint import BYTES, TokenizerId
from suffixspec.native import layout as lay
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools import segments
from suffixspec.pools.segments import merge_pick, write_snapshot
from suffixspec.pools.store import PoolStore

DEPTH = 16


def _outputs(n, seed):
    rng = np.random.default_rng(seed)
    return [np.concatenate([[7, 8, 9], rng.integers(0, 12, rng.integers(5, 40))]).astype(np.int32)
            for _ in range(n)]


def _store(path, chunks, request_ids=None):
    """A pool whose snapshot has one segment per chunk of outputs (unmerged)."""
    store = PoolStore(path, tokenizer=BYTES, max_depth=DEPTH)
    n = 0
    for chunk in chunks:
        store.add_many([(out, "a", "", f"r{n + i}") for i, out in enumerate(chunk)])
        n += len(chunk)
        write_snapshot(store, merge=False)
    return store


def _folders(store):
    return [seg.folder for seg in store.snapshot().segments]


def _proposer(pool=None):
    return SuffixProposer(max_depth=DEPTH, max_spec_tokens=1, draft_cost=0.0, pool=pool,
                          tokenizer=BYTES if pool is not None else None, anchors=False,
                          cross_pool_tokens=None, namespace="a")


def _drafts(pool, contexts):
    """Each context's one-token draft: (probability, match length, drafted).

    ``pool`` is a pool to draft from, or a proposer."""
    prop = pool if isinstance(pool, SuffixProposer) else _proposer(pool)
    out = []
    for i, ctx in enumerate(contexts):
        prop.start_request(i, ctx)
        d = prop.propose([i])[0]
        out.append((d.score, d.match_len, len(d.token_ids)))
        prop.abort_request(i)
    return out, prop


def _contexts(seed=3, n=30):
    rng = np.random.default_rng(seed)
    return [[7, 8, 9, *rng.integers(0, 12, 3).tolist()] for _ in range(n)]


def test_merge_pick_merges_alike_sizes_and_bounds_the_count():
    assert merge_pick([100]) is None
    assert merge_pick([100, 10]) is None  # unlike: a large segment is left alone
    assert merge_pick([100, 10, 8]) == 1  # alike neighbours merge, smallest pair first
    assert merge_pick([1000, 400, 300, 10]) == 1
    many = [4 ** (lay.SEGMENTS - k) for k in range(lay.SEGMENTS + 1)]  # all unlike
    assert merge_pick(many) == lay.SEGMENTS - 1  # too many: the smallest neighbours


def test_merge_pick_keeps_merged_segments_under_the_cap():
    assert merge_pick([60, 50], cap=100) is None  # alike, but over the cap together
    assert merge_pick([40, 50], cap=100) == 0
    many = [90] * (lay.SEGMENTS + 1)  # too many: merged even over the cap
    assert merge_pick(many, cap=100) is not None


def test_a_range_over_the_cap_is_built_as_segments_under_it(tmp_path, monkeypatch):
    outs = _outputs(120, 5)
    total = sum(len(o) for o in outs)
    cap = total // 3
    monkeypatch.setattr(segments, "MAX_TOKENS", cap)
    store = PoolStore(tmp_path / "p.lmdb", tokenizer=BYTES, max_depth=DEPTH)
    store.add_many([(out, "a", "", "") for out in outs])
    write_snapshot(store)
    segs = store.snapshot().segments
    assert len(segs) == -(-total // cap)
    assert all(seg.tokens <= cap for seg in segs) and sum(s.tokens for s in segs) == total
    assert segs[0].first == 0 and segs[-1].last == len(outs)
    assert all(a.last == b.first for a, b in zip(segs, segs[1:]))
    store.close()
    memory = _proposer()
    for out in outs:
        memory.cross.add(out, "a")
    pool = PersistentPool(tmp_path / "p.lmdb")
    assert len(pool.view.segments) == len(segs)
    contexts = _contexts(seed=6)
    got, _ = _drafts(pool, contexts)
    want, _ = _drafts(memory, contexts)
    assert got == want and sum(n for _, _, n in got) > 10
    pool.close()


def test_new_sequences_that_merge_at_once_are_indexed_once(tmp_path, monkeypatch):
    store = _store(tmp_path / "p.lmdb", [_outputs(60, 7)])
    store.add_many([(out, "a", "", "") for out in _outputs(60, 8)])  # about as many tokens
    built = []
    real = segments.build.build

    def counted(sequences, *args, **kwargs):
        seqs = list(sequences)
        built.append((seqs[0].seq_id, seqs[-1].seq_id))
        return real(iter(seqs), *args, **kwargs)

    monkeypatch.setattr(segments.build, "build", counted)
    write_snapshot(store)
    assert built == [(1, 120)]  # one build over both ranges, not the new one and then both
    segs = store.snapshot().segments
    assert [(s.first, s.last) for s in segs] == [(0, 120)]
    store.close()


def test_snapshots_of_one_size_merge_and_drafts_stay_those_of_one_index(tmp_path):
    outs = _outputs(160, 0)
    store = PoolStore(tmp_path / "p.lmdb", tokenizer=BYTES, max_depth=DEPTH)
    memory = _proposer()
    counts = []
    for k in range(8):
        chunk = outs[20 * k:20 * (k + 1)]
        store.add_many([(out, "a", "", "") for out in chunk])
        for out in chunk:
            memory.cross.add(out, "a")
        write_snapshot(store)
        counts.append(len(store.snapshot().segments))
    assert max(counts) <= 3 and counts[-1] < 8  # merged as they came
    segs = store.snapshot().segments
    assert segs[0].first == 0 and segs[-1].last == 160
    assert all(a.last == b.first for a, b in zip(segs, segs[1:]))
    store.close()
    pool = PersistentPool(tmp_path / "p.lmdb")
    for seg in pool.view.segments:
        seg.index.check_integrity()
    contexts = _contexts()
    got, _ = _drafts(pool, contexts)
    want, _ = _drafts(memory, contexts)
    assert got == want and sum(n for _, _, n in got) > 10
    pool.close()


def test_forget_rebuilds_only_the_segments_that_held_the_request(tmp_path):
    chunks = [_outputs(80, 1), _outputs(10, 2)]
    store = _store(tmp_path / "p.lmdb", chunks)
    before = _folders(store)
    assert len(before) == 2
    store.close()
    pool = PersistentPool(tmp_path / "p.lmdb")
    secret = pool.store.add(np.array([7, 8, 9, 66, 67, 68, 69, 70], np.int32), "a",
                            request_id="secret")
    pool.write_snapshot()  # a third, small segment holds it...
    assert len(pool.view.segments) == 2 or len(pool.view.segments) == 3
    assert pool.forget(request_id="secret") == 1
    after = _folders(pool.store)
    assert after[0] == before[0]  # ...and the large segment was not rebuilt
    assert all(secret > seg.last or secret <= seg.first or seg.folder not in before
               for seg in pool.store.snapshot().segments)
    data = b"".join(p.read_bytes() for p in pool.store.snapshot_folders.rglob("*.bin"))
    assert np.array([66, 67, 68, 69, 70], np.int32).tobytes() not in data
    pool.close()


def test_prune_marks_segments_stale_and_the_next_snapshot_rebuilds_them(tmp_path):
    store = _store(tmp_path / "p.lmdb", [_outputs(80, 1), _outputs(10, 2)])
    old, new = _folders(store)
    assert store.delete([85]) == 1
    segs = store.snapshot().segments
    assert [bool(s.stale) for s in segs] == [False, True]
    write_snapshot(store, merge=False)
    folders = _folders(store)
    assert folders[0] == old and folders[1] != new
    assert not any(s.stale for s in store.snapshot().segments)
    store.close()


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_pools_built_elsewhere_are_added_with_their_segments(tmp_path):
    shards = [_outputs(60, 10), _outputs(25, 11)]
    for k, chunk in enumerate(shards):
        _store(tmp_path / f"shard{k}.lmdb", [chunk]).close()
    whole = _store(tmp_path / "whole.lmdb", [shards[0] + shards[1]])
    whole.close()
    host = _store(tmp_path / "host.lmdb", [_outputs(5, 12)])  # live outputs of its own
    host.close()
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "shard0.lmdb",
             tmp_path / "shard1.lmdb", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sequences"] == 85
    store = PoolStore(tmp_path / "host.lmdb")
    assert store.stats()["sequences"] == 90
    shard0 = PoolStore(tmp_path / "shard0.lmdb", readonly=True)
    copied = shard0.snapshot().segments[0].arrays
    assert any(seg.arrays == copied for seg in store.snapshot().segments)  # not rebuilt
    shard0.close()
    store.close()
    # The host drafts as one index over its own outputs and both shards would.
    reference = _store(tmp_path / "ref.lmdb", [_outputs(5, 12) + shards[0] + shards[1]])
    reference.close()
    contexts = _contexts()
    pools = [PersistentPool(tmp_path / name) for name in ("host.lmdb", "ref.lmdb")]
    got, want = (_drafts(pool, contexts)[0] for pool in pools)
    assert got == want
    for pool in pools:
        pool.close()
    # Adding a shard again (a retried run) skips it, and goes on with the others.
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "shard1.lmdb")
    assert r.exit_code == 0 and "skipped" in r.output and "already" in r.output
    assert PoolStore(tmp_path / "host.lmdb", readonly=True).stats()["sequences"] == 90


def test_a_shard_the_pool_holds_in_part_adds_only_the_records_missing(tmp_path):
    """A shard whose first records the pool holds already (an export ingested
    before, a half-merged run): only the rest are added, indexed here, each
    record once; the pool drafts as one holding each record once would."""
    held, rest = _outputs(30, 20), _outputs(12, 21)
    _store(tmp_path / "shard.lmdb", [held + rest]).close()
    _store(tmp_path / "host.lmdb", [held]).close()  # the same records: namespace, id, tokens
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "shard.lmdb", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sequences"] == len(rest)
    assert f"held {len(held)} of the {len(held) + len(rest)} records" in r.stderr
    with PoolStore(tmp_path / "host.lmdb", readonly=True) as store:
        assert sorted(s.tokens.tolist() for s in store.sequences()) == \
            sorted(t.tolist() for t in held + rest)
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "shard.lmdb")  # again: nothing
    assert r.exit_code == 0 and "skipped" in r.output
    with PoolStore(tmp_path / "host.lmdb", readonly=True) as store:
        assert store.stats()["sequences"] == len(held) + len(rest)
    pools = [PersistentPool(tmp_path / name) for name in ("host.lmdb", "shard.lmdb")]
    got, want = (_drafts(pool, _contexts())[0] for pool in pools)
    assert got == want
    for pool in pools:
        pool.close()


def test_adding_a_pool_refuses_another_tokenizer_and_an_incomplete_snapshot(tmp_path):
    host = _store(tmp_path / "host.lmdb", [_outputs(5, 12)])
    before = (host.stats()["sequences"], _folders(host))
    host.close()
    other = TokenizerId(name="other", fingerprint="1" * 16, vocab_size=300)
    foreign = PoolStore(tmp_path / "foreign.lmdb", tokenizer=other, max_depth=DEPTH)
    foreign.add(np.arange(5, dtype=np.int32), "a")
    write_snapshot(foreign)
    foreign.close()
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "foreign.lmdb")
    assert r.exit_code == 1 and "tokenizer" in r.output and len(r.output.splitlines()) == 1
    unsnapshotted = _store(tmp_path / "new.lmdb", [_outputs(5, 13)])
    unsnapshotted.add(np.arange(5, dtype=np.int32), "a")
    unsnapshotted.close()
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "new.lmdb")
    assert r.exit_code == 1 and "suffixspec snapshot" in r.output
    damaged = _store(tmp_path / "bad.lmdb", [_outputs(5, 14)])
    folder = damaged.snapshot_folders / _folders(damaged)[0]
    damaged.close()
    nodes = folder / "nodes.bin"
    data = bytearray(nodes.read_bytes())
    data[len(data) // 2] ^= 0x20
    nodes.write_bytes(bytes(data))
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "bad.lmdb")
    assert r.exit_code == 1 and "damaged" in r.output
    r = _cli("add-segment", tmp_path / "host.lmdb", tmp_path / "host.lmdb")
    assert r.exit_code == 1 and "the pool it would be added to" in r.output
    host = PoolStore(tmp_path / "host.lmdb")
    assert (host.stats()["sequences"], _folders(host)) == before  # nothing added
    assert sorted(p.name for p in host.snapshot_folders.iterdir() if p.is_dir()) == before[1]
    host.close()


def test_a_forget_during_a_merge_keeps_the_segments_that_hold_nothing_it_deletes(tmp_path,
                                                                                 monkeypatch):
    store = _store(tmp_path / "p.lmdb", [_outputs(40, 1), _outputs(40, 2)],
                   request_ids=None)
    first, second = store.snapshot().segments
    real = segments._Builder.build

    def build_and_forget(self, lo, hi):  # the merge builds while a forget lands
        made = real(self, lo, hi)
        store.delete([first.first + 3], forget=True)
        return made

    monkeypatch.setattr(segments._Builder, "build", build_and_forget)
    write_snapshot(store)  # would merge the two
    kept = store.snapshot().segments
    # The merged segment indexed the deleted sequence: left out.  The segment
    # the forget dropped is gone; the other one stays, so only the forgotten
    # segment's range is indexed from the store until the next snapshot.
    assert [seg.folder for seg in kept] == [second.folder]
    store.close()
