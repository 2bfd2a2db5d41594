"""forget and prune next to live writers and readers in other processes, and killed forgets.

Real processes on a real pool file: writers commit continuously, a reader
drafts continuously, while ``suffixspec forget`` and ``prune`` run beside
them.  Nothing untargeted may be lost, and forgotten tokens must be gone from
the file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
from suffixspec.pools.store import PoolStore

from suffixspec.testing.pool_children import FORGET, WRITER

DEPTH = 16
# Tokens no other sequence holds, so their bytes can be searched for in the file.
DOOMED = [901_001, 902_002, 903_003, 904_004]

READER = r"""
import sys, time
import numpy as np
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
path, seconds = sys.argv[1], float(sys.argv[2])
pool = PersistentPool(path, tokenizer=BYTES, max_depth=16, refresh_interval=0.05)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace="keep")
end = time.monotonic() + seconds
drafts = 0
n = 0
while time.monotonic() < end:
    prop.start_request(n, [1, 2, 3])
    for t in (5, 6, 7):
        drafts += len(prop.propose([n])[0])
        prop.extend(n, [t])
    prop.abort_request(n)
    n += 1
pool.close()
print(n, drafts, flush=True)
"""


def _spawn(script, *args, out=None):
    """A child running ``script``; ``out``: a file for its stdout (a pipe left
    unread would fill up and block the child while it holds the pool open)."""
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                            stdout=out or subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _cli(*args):
    code = "import sys; from suffixspec.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args), "--json"],
                          capture_output=True, text=True, timeout=120)


def _doomed_bytes_in(path) -> bool:
    return np.asarray(DOOMED, np.int32).tobytes() in path.read_bytes()

@pytest.mark.slow
def test_forget_and_prune_beside_live_writers_and_a_reader(tmp_path):
    path = tmp_path / "pool.lmdb"
    PoolStore(path, tokenizer=BYTES, max_depth=DEPTH).close()
    logs = [open(tmp_path / f"writer{tag}.log", "w+") for tag in (1, 2)]
    keep = [_spawn(WRITER, path, "keep", tag, 8.0, "keep", out=log)
            for tag, log in zip((1, 2), logs)]
    reader = _spawn(READER, path, 8.0)
    doomed = _spawn(WRITER, path, "doomed", 3, 1.5, "doomed")
    assert doomed.communicate(timeout=60) and doomed.returncode == 0, doomed.stderr
    assert _doomed_bytes_in(path)
    results = [_cli("forget", path, "--namespace", "doomed")]
    doomed2 = _spawn(WRITER, path, "doomed2", 4, 1.0, "doomed")
    assert doomed2.communicate(timeout=60) and doomed2.returncode == 0, doomed2.stderr
    results.append(_cli("prune", path, "--namespace", "doomed2", "--max-tokens", "0"))
    results.append(_cli("forget", path, "--namespace", "doomed2"))
    for r in results:
        assert r.returncode == 0, r.stderr
    outs = [p.communicate(timeout=120) for p in keep + [reader]]
    for p, (_, err) in zip(keep + [reader], outs):
        assert p.returncode == 0, err
    requests, drafts = map(int, outs[-1][0].split())
    assert requests > 10 and drafts > 0
    # The file was swapped beside the live processes, both times.
    assert [json.loads(r.stdout)["compacted"] for r in (results[0], results[2])] == [True, True]
    for log in logs:
        log.seek(0)
    outs[:2] = [(log.read(), "") for log in logs]
    store = PoolStore(path, tokenizer=BYTES)
    assert store.check() > 0
    stored = {s.request_id: s for s in store.sequences()}
    committed = [line.split() for out, _ in outs[:2] for line in out.splitlines()]
    assert len(committed) > 20
    for tag, i in committed:
        seq = stored[f"{tag}-{i}"]  # every untargeted commit is there, whole
        head = [int(tag), int(i) % 997, int(i) // 997]
        assert seq.namespace == "keep" and seq.output.tolist() == head + [5, 6, 7, 8]
    assert not any(s.namespace.startswith("doomed") for s in stored.values())
    store.close()
    assert not _doomed_bytes_in(path)
    assert not path.with_name(path.name + ".compact").exists()
    assert oct(path.stat().st_mode & 0o777) == "0o600"



IDLE = r"""
import sys, time
from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1], tokenizer=BYTES, max_depth=16)
prop = SuffixProposer(max_depth=16, max_spec_tokens=8, pool=pool, namespace="keep")
prop.start_request("a", [1, 2, 3])
print(len(prop.propose(["a"])[0]), flush=True)
sys.stdin.readline()  # idle, the pool open, until told to go on
# The swapped file is loaded behind the serving calls, which never wait for it:
# the kept sequence is drafted again once it is in.
deadline = time.monotonic() + 30
while len(d := prop.propose(["a"])[0]) == 0 and time.monotonic() < deadline:
    time.sleep(0.01)
print(len(d), flush=True)
pool.close()
"""


@pytest.mark.slow  # a child interpreter
def test_an_idle_process_holding_the_pool_does_not_block_forget(tmp_path):
    path = tmp_path / "pool.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH)
    pool.add(np.asarray([1, 2, 3, 4, 5, 6], np.int32), "keep")
    pool.add(np.asarray(DOOMED, np.int32), "doomed")
    pool.write_snapshot()
    pool.close()
    idle = subprocess.Popen([sys.executable, "-c", IDLE, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert idle.stdout.readline().strip() == "3"  # it drafts [4, 5, 6], then idles
    r = _cli("forget", path, "--namespace", "doomed")
    assert r.returncode == 0 and json.loads(r.stdout)["compacted"], r.stderr
    assert not _doomed_bytes_in(path)
    out, err = idle.communicate("go\n", timeout=60)
    assert idle.returncode == 0 and out.strip() == "3", err  # drafts from the new file


@pytest.mark.parametrize("trial", [0, *(pytest.param(t, marks=pytest.mark.slow)
                                      for t in range(1, 6))])
def test_a_killed_forget_never_leaves_forgotten_data_draftable(tmp_path, trial):
    path = tmp_path / "pool.lmdb"
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH)
    rng = np.random.default_rng(trial)
    for i in range(300):
        pool.add(rng.integers(0, 500, 40).astype(np.int32), "keep")
    for _ in range(50):
        pool.add(np.asarray(DOOMED + [8, 9], np.int32), "doomed")
    pool.write_snapshot()
    pool.close()
    proc = _spawn(FORGET, path)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(float(rng.random()) * 0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    # A fresh process sees the forget either not begun or whole, never half done:
    # serving (an open that does no maintenance) and after `recover` alike.
    pool = PersistentPool(path, tokenizer=BYTES, max_depth=DEPTH)
    prop = SuffixProposer(max_depth=DEPTH, max_spec_tokens=4, pool=pool, namespace="doomed")
    prop.start_request("r", DOOMED[:2])
    serving = prop.propose(["r"])[0].token_ids.tolist()
    prop.abort_request("r")
    assert pool.recover()  # what `suffixspec snapshot` does
    prop.start_request("r", DOOMED[:2])
    drafted = prop.propose(["r"])[0].token_ids.tolist()
    assert drafted == serving
    stats = pool.store.stats()
    assert stats["namespaces"]["keep"]["sequences"] == 300
    assert not pool.store.compaction_pending() and pool.compacted
    pool.close()
    if "doomed" in stats["namespaces"]:  # killed before its delete committed
        assert stats["namespaces"]["doomed"]["sequences"] == 50 and drafted[:2] == DOOMED[2:]
    else:  # deleted: never drafted, and recovering finished the erasure
        assert drafted == [] and not _doomed_bytes_in(path)
