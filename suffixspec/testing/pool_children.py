"""Scripts the pool's tests and benchmarks run as child processes.

Each runs in its own interpreter (``python -c SCRIPT ARGS``), so a crash or a
SIGKILL hits the child, not the runner.
"""

# Opens each pool path given and drafts three prompts from it (drafted tokens free);
# prints one JSON line per path: its drafts, or the CorruptPoolError it raised.
PROBE = r"""
import json, shutil, sys
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import CorruptPoolError
for path in sys.argv[1:]:
    try:
        pool = PersistentPool(path, tokenizer=BYTES, max_depth=16)
        prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace="a",
                              draft_cost=0.0, max_spec_factor=8.0)
        drafts = []
        for n, prompt in enumerate(([1, 2, 3], [40, 41], [7, 8, 9, 10])):
            prop.start_request(n, prompt)
            drafts.append(prop.propose([n])[0].token_ids.tolist())
        pool.close()
        print(json.dumps({"path": path, "drafts": drafts}), flush=True)
    except CorruptPoolError as e:
        assert str(e).startswith(path) or path in str(e), e
        print(json.dumps({"path": path, "error": str(e)}), flush=True)
"""


# Commits sequences to namespace ``ns`` for ``seconds``, printing "tag i" after
# each commit returned; with marker "doomed" every sequence holds DOOMED's tokens.
WRITER = r"""
import sys, time
import numpy as np
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
path, ns, tag, seconds, marker = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, refresh_interval=0.05)
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    head = [901001, 902002, 903003, 904004] if marker == "doomed" else [tag, i % 997, i // 997]
    seq = pool.begin(ns)
    pool.extend(seq, np.array(head + [5, 6, 7, 8], np.int32))
    pool.commit(seq, request_id=f"{tag}-{i}")
    print(tag, i, flush=True)
    i += 1
    pool.refresh()
pool.close()
"""


# Opens the pool, prints "start", then forgets namespace "doomed".
FORGET = r"""
import sys
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], tokenizer=BYTES)
print("start", flush=True)
pool.forget(namespace="doomed")
print("done", flush=True)
"""


def damaged_pool_copies(folder, cases: int) -> tuple:
    """A small pool (part snapshot, part sequences after it) and ``cases`` damaged
    copies of it: a bit flipped or the file cut short, in the pool file or in one
    of its snapshot files, or the snapshot folder gone.  Returns (pool path, copy
    paths, the path of the same pool never snapshotted: a copy whose snapshot is
    not used drafts as that one does).  Used by the damage test and the fault
    benchmark."""
    import shutil
    from pathlib import Path

    import numpy as np

    from suffixspec.fingerprint import BYTES
    from suffixspec.pools.persistent import PersistentPool

    path = Path(folder) / "pool.lmdb"
    for name, snapshot in (("pool.lmdb", 40), ("unsnapshotted.lmdb", None)):
        pool = PersistentPool(Path(folder) / name, tokenizer=BYTES, max_depth=16)
        rng = np.random.default_rng(0)
        for i in range(60):
            pool.add(np.asarray([1, 2, 3, 4, 5, 6] if i % 3 else [40, 41, 42, 43], np.int32),
                     "a")
            pool.add(rng.integers(0, 60, 30).astype(np.int32), "a" if i % 2 else "b")
            if i == snapshot:
                pool.write_snapshot()
        pool.close()
    pool = PersistentPool(path)
    snapshots = pool.store.snapshot_folders
    pool.close()
    copies = []
    for n in range(cases):
        # Kind n % 8: 0, 4 a flipped bit and 3, 7 cut short in the pool file;
        # 1, 6 a flipped bit and 2 cut short in a snapshot file; 5 no snapshot folder.
        kind = n % 8
        copy = Path(folder) / f"damaged{n}.lmdb"
        shutil.copy(path, copy)
        copied = snapshots.with_name(copy.name + ".snapshots")
        if kind != 5:
            shutil.copytree(snapshots, copied)
        target = copy
        if kind in (1, 2, 6):
            arrays = sorted(p for p in copied.rglob("*.bin") if p.stat().st_size)
            target = arrays[int(rng.integers(0, len(arrays)))]
        data = bytearray(target.read_bytes())
        if kind in (2, 3, 7):
            data = data[:int(rng.integers(0, len(data)))]
        elif kind != 5:
            at = int(rng.integers(0, len(data)))
            data[at] ^= 1 << int(rng.integers(0, 8))
        target.write_bytes(bytes(data))
        copies.append(copy)
    return path, copies, Path(folder) / "unsnapshotted.lmdb"


#: Opens the pool, starts a read transaction and holds it a minute (the
#: stale readers' case: the process is killed meanwhile).
READ_AND_WAIT = r"""
import sys, time
from suffixspec.pools.store import PoolStore
store = PoolStore(sys.argv[1])
txn = store.read()
txn.get(b"format", db=store.db("meta"))
print("reading", flush=True)
time.sleep(60)
"""
