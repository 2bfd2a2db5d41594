"""PoolStore: real LMDB files in temporary folders, tiny maps to force growth."""

from __future__ import annotations

import stat
from pathlib import Path
import zlib

import msgpack
import numpy as np
import pytest

from suffixspec.fingerprint import BYTES, TokenizerId, tokenizer_id
from suffixspec.pools.store import (CorruptPoolError, PoolError, PoolStore, TokenizerMismatchError,
                              _key)

OTHER = TokenizerId("other-tok", "0123456789abcdef")


def new_store(tmp_path, **kw):
    kw.setdefault("map_size", 64 * 1024)
    return PoolStore(tmp_path / "pool.lmdb", tokenizer=BYTES, max_depth=16, **kw)


def test_round_trip_and_reopen(tmp_path):
    store = new_store(tmp_path)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 2**30 - 1, int(rng.integers(1, 300))).astype(np.int32)
            for _ in range(20)]
    ids = [store.add(s, "ns-a" if i % 2 else "ns-b", source="test", request_id=f"r{i}")
           for i, s in enumerate(seqs)]
    assert ids == list(range(1, 21))
    store.close()
    again = PoolStore(tmp_path / "pool.lmdb", tokenizer=BYTES)
    got = list(again.sequences())
    assert [g.seq_id for g in got] == ids
    for g, s, i in zip(got, seqs, range(20)):
        assert np.array_equal(g.tokens, s)
        assert (g.namespace, g.source, g.request_id) == ("ns-a" if i % 2 else "ns-b", "test", f"r{i}")
    assert [g.seq_id for g in again.sequences(after=15)] == [16, 17, 18, 19, 20]
    assert {g.namespace for g in again.sequences(namespace="ns-a")} == {"ns-a"}
    assert again.check() == 20
    stats = again.stats()
    assert stats["sequences"] == 20 and stats["tokens"] == sum(len(s) for s in seqs)
    assert stats["namespaces"]["ns-a"]["sequences"] == 10


def test_pool_file_is_private(tmp_path):
    new_store(tmp_path).add(np.arange(5, dtype=np.int32), "x")
    for p in (tmp_path / "pool.lmdb", tmp_path / "pool.lmdb-lock"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_map_grows_when_full(tmp_path):
    store = new_store(tmp_path, map_size=32 * 1024)
    before = store.env.info()["map_size"]
    for i in range(60):
        store.add(np.full(2000, i, np.int32), "x")
    assert store.env.info()["map_size"] > before
    assert store.check() == 60


def test_another_tokenizer_is_refused_by_name(tmp_path):
    new_store(tmp_path).close()
    with pytest.raises(TokenizerMismatchError) as e:
        PoolStore(tmp_path / "pool.lmdb", tokenizer=OTHER)
    assert "utf8-bytes" in str(e.value) and "other-tok" in str(e.value)
    with pytest.raises(PoolError, match="max_depth 16"):
        PoolStore(tmp_path / "pool.lmdb", tokenizer=BYTES, max_depth=32)


def test_real_tokenizer_fingerprint_is_stable_and_distinct(tokenizer_path):
    a, b = tokenizer_id(tokenizer_path), tokenizer_id(tokenizer_path.parent)
    assert a == b and a.fingerprint != BYTES.fingerprint and len(a.fingerprint) == 16


def test_missing_or_foreign_files_give_clear_errors(tmp_path):
    with pytest.raises(PoolError, match="no pool"):
        PoolStore(tmp_path / "absent.lmdb", readonly=True)
    with pytest.raises(PoolError, match="needs a tokenizer"):
        PoolStore(tmp_path / "absent.lmdb")
    junk = tmp_path / "junk.lmdb"
    junk.write_bytes(b"not an lmdb file" * 1000)
    with pytest.raises(CorruptPoolError):
        PoolStore(junk, tokenizer=BYTES, max_depth=16)


def test_corrupt_sequence_is_reported_not_crashed(tmp_path):
    store = new_store(tmp_path)
    store.add(np.arange(10, dtype=np.int32), "x")
    bad = msgpack.packb({"ns": "x", "src": "", "rid": "", "t": 0.0, "n": 3,
                         "crc": zlib.crc32(b"abc"), "tok": b"\x00" * 12})

    def put(txn):
        txn.put(_key(2), bad, db=store.db("seqs"))
        txn.put(b"next_id", _key(3), db=store.db("meta"))

    store.write(put)
    with pytest.raises(CorruptPoolError, match="sequence 2"):
        store.check()


def test_bad_namespaces_are_refused(tmp_path):
    store = new_store(tmp_path)
    for ns in ("", 5, "x" * 200):
        with pytest.raises(ValueError, match="namespace"):
            store.add(np.arange(3, dtype=np.int32), ns)
    assert store.last_id() == 0


def test_readonly_store_refuses_writes(tmp_path):
    new_store(tmp_path).add(np.arange(3, dtype=np.int32), "x")
    ro = PoolStore(tmp_path / "pool.lmdb", readonly=True)
    assert ro.check() == 1
    with pytest.raises(PoolError, match="read-only"):
        ro.add(np.arange(3, dtype=np.int32), "x")


_FILL = """
import resource, signal, sys, numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.offline.ingest import ingest
from suffixspec.pools.store import DiskFullError, PoolStore
# Writes past this size fail as on a full disk (EFBIG instead of ENOSPC).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))
store = PoolStore(sys.argv[1], tokenizer=BYTES, max_depth=16, map_size=64 << 20)
path = sys.argv[2]
try:
    ingest(store, [path], None, fmt="export", batch_tokens=20000)
except DiskFullError as e:
    print(e)
"""


def test_full_disk_says_what_was_committed(tmp_path):
    import json
    import subprocess
    import sys

    from suffixspec.offline.ingest import EXPORT_HEADER

    pool = tmp_path / "pool.lmdb"
    PoolStore(pool, tokenizer=BYTES, max_depth=16).close()
    export = tmp_path / "big.jsonl"
    with open(export, "w") as f:
        f.write(json.dumps({EXPORT_HEADER: 1, "fingerprint": BYTES.fingerprint}) + "\n")
        for i in range(400):
            f.write(json.dumps({"token_ids": [(i + j) % 256 for j in range(5000)]}) + "\n")
    out = subprocess.run([sys.executable, "-c", _FILL, str(pool), str(export)],
                         capture_output=True, text=True, timeout=120)
    assert "could not write" in out.stdout, out.stdout + out.stderr
    committed = int(out.stdout.split("committed before this batch: ")[1].split()[0])
    store = PoolStore(pool, tokenizer=BYTES)
    assert store.check() == committed > 0


def _set_format(store, **changes):
    def put(txn):
        info = msgpack.unpackb(txn.get(b"format", db=store.db("meta")))
        txn.put(b"format", msgpack.packb({**info, **changes}), db=store.db("meta"))
    store.write(put)


def _put_v1_sequence(store, seq_id, tokens):
    """A sequence as format 1 wrote it: no anchor count."""
    data = np.asarray(tokens, np.int32).tobytes()
    rec = {"ns": "default", "src": "", "rid": "", "t": 0.0, "n": len(tokens),
           "crc": zlib.crc32(data), "tok": data}
    store.write(lambda txn: txn.put(_key(seq_id), msgpack.packb(rec), db=store.db("seqs")))
    store.write(lambda txn: txn.put(b"next_id", _key(seq_id + 1), db=store.db("meta")))


@pytest.mark.parametrize("version", [1, 99])
def test_another_format_version_is_refused_with_what_to_do(tmp_path, version):
    store = new_store(tmp_path)
    _set_format(store, version=version)
    store.close()
    with pytest.raises(CorruptPoolError, match=f"version {version}, this suffixspec reads "
                                               f"version 2; `suffixspec export`"):
        PoolStore(tmp_path / "pool.lmdb", tokenizer=BYTES)


def test_another_applications_file_is_refused_and_left_untouched(tmp_path):
    import lmdb

    foreign = tmp_path / "app.db"
    env = lmdb.open(str(foreign), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"user:1", b"alice")
    env.close()
    (tmp_path / "app.db-lock").unlink()
    before = foreign.read_bytes()
    with pytest.raises(CorruptPoolError, match="LMDB file of something else.*user:1"):
        PoolStore(foreign, tokenizer=BYTES, max_depth=16)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(CorruptPoolError, match="not a suffixspec pool"):
        PoolStore(text, tokenizer=BYTES, max_depth=16)
    assert foreign.read_bytes() == before and text.read_text() == "hello"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "notes.txt"]


@pytest.mark.slow
def test_the_fingerprint_covers_added_tokens_special_or_not_and_the_size(tmp_path,
                                                                         tokenizer_path):
    """Qwen plus <sql_block> and Qwen plus <json_block> at the same id are two
    tokenizers: a pool of one refuses the other's ids.  A tokenizer with no
    added tokens beyond its special ones still opens pools of the earlier
    fingerprint."""
    import json

    from suffixspec.fingerprint import fingerprint_vocab, load_hf_tokenizer, tokenizer_id
    from suffixspec.pools.store import TokenizerMismatchError

    base = json.loads(Path(tokenizer_path).read_text())
    next_id = max(t["id"] for t in base["added_tokens"]) + 1
    ids = {}
    for word in ("sql_block", "json_block"):
        data = json.loads(json.dumps(base))
        data["added_tokens"].append({"id": next_id, "content": f"<{word}>", "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": False})
        folder = tmp_path / word
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(data))
        ids[word] = tokenizer_id(folder)
    qwen = tokenizer_id(tokenizer_path)
    assert len({qwen.fingerprint, ids["sql_block"].fingerprint,
                ids["json_block"].fingerprint}) == 3
    assert ids["sql_block"].legacy is None  # the earlier fingerprint cannot tell them apart
    PoolStore(tmp_path / "sql.lmdb", ids["sql_block"], 16).close()
    with pytest.raises(TokenizerMismatchError):
        PoolStore(tmp_path / "sql.lmdb", ids["json_block"], 16)
    # A pool holding Qwen's earlier fingerprint opens with Qwen.
    tok = load_hf_tokenizer(tokenizer_path)
    special = [(t.content, i) for i, t in tok.get_added_tokens_decoder().items() if t.special]
    assert qwen.legacy == fingerprint_vocab(tok.get_vocab(with_added_tokens=False), special)
    assert qwen.matches(qwen.legacy) and not ids["sql_block"].matches(qwen.legacy)


def test_records_tell_their_size_before_they_are_read_and_decode_as_sequences(tmp_path):
    store = new_store(tmp_path)
    lengths = [3, 5000, 7]
    for n in lengths:
        store.add(np.arange(n, dtype=np.int32) % 200, "a", "src", f"r{n}")
    records = [r.kept() for r in store.records()]
    assert [r.seq_id for r in records] == [s.seq_id for s in store.sequences()]
    assert all(4 * n <= r.nbytes <= 4 * n + 200 for n, r in zip(lengths, records))
    decoded = [store.decode(r) for r in records]
    for got, want in zip(decoded, store.sequences()):
        assert got.request_id == want.request_id and np.array_equal(got.tokens, want.tokens)
    assert [r.seq_id for r in store.records(after=records[0].seq_id)] == [
        r.seq_id for r in records[1:]]
    raw = bytearray(records[0].raw)
    raw[-4] ^= 0x01  # a token's low byte
    damaged = type(records[0])(records[0].seq_id, records[0].nbytes, bytes(raw))
    with pytest.raises(CorruptPoolError):
        store.decode(damaged)
    store.close()
