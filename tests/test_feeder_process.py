"""The window feeder in a process of its own (``device.feeder_process``), with real processes
(each test a child interpreter: the slow tier).

Its equivalence to the feeder's thread (the same drafts, step by step) is in
``test_vllm_device_speculator.py``; here: a payload buffer the worker holds
is never written, the child dying leaves the worker serving, and the worker's
process dying leaves nothing in flight unlearned.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.device.feeder import S_SAMPLED, S_SLOT, S_TOTAL, snapshot_columns
from suffixspec.device.feeder_process import FeederProcess
from suffixspec.device.layout import WindowSpec
from suffixspec.device.payload import Packer, PayloadSpec

K = 4
PROMPT = [1, 2, 3]


def _feeder(**kw) -> FeederProcess:
    spec = PayloadSpec(WindowSpec(k=K), rows=4)
    packer = Packer(spec, trash_slot=4, trash_key=100, corpus_tokens=0, corpus_buckets=1)
    return FeederProcess(spec, K, 100, packer, [0.0] * 9, **kw)


class Request:
    """One request in slot 0: its tokens grow a token a step; each step's snapshot."""

    def __init__(self, feeder: FeederProcess, req_id: str = "a"):
        self.feeder, self.req_id, self.tokens, self.step = feeder, req_id, list(PROMPT), 0
        feeder.add(req_id, 0, 1, np.array(PROMPT, np.int32), len(PROMPT))

    def advance(self, deadline: float = 30.0) -> int | None:
        """One step: a token emitted, the snapshot handed over, the payload taken."""
        self.step += 1
        self.tokens.append(10 + self.step % 7)
        col = snapshot_columns(K)
        rows = np.zeros((1, col["pair_tokens"].stop), np.int32)
        rows[0, S_SLOT], rows[0, S_TOTAL], rows[0, S_SAMPLED] = 0, len(self.tokens), 1
        rows[0, col["tail"]] = ([-1] * (K + 1) + self.tokens)[-(K + 1):]  # -1: none
        self.feeder.snapshot(self.step, rows, [self.req_id], None)
        return self.feeder.take(self.step + 1, deadline)


@pytest.mark.slow
def test_a_payload_buffer_the_worker_holds_is_never_written():
    """Ownership moves by message: a buffer taken is the worker's until it says
    it is free.  Holding one, the child packs the others; holding all, it
    handles steps and publishes nothing (counted); freed, it publishes again.
    The child, its proposer built as serving builds it, never loads torch."""
    from suffixspec.config import ProposerConfig
    from suffixspec.integrations.vllm.build import device_proposer
    from suffixspec.integrations.vllm.settings import Settings

    feeder = _feeder()
    try:
        feeder.ready(functools.partial(device_proposer, ProposerConfig(max_depth=16,
                                       max_spec_tokens=K), Settings(), None, None, K, 1))
        req = Request(feeder)
        held = req.advance()
        assert held is not None
        kept = feeder.buffers[held].copy()
        for _ in range(6):
            b = req.advance()
            assert b is not None and b != held
            feeder.sent(b, None)
        assert np.array_equal(feeder.buffers[held], kept)
        taken = {held}
        for _ in range(6):  # the worker frees nothing: the child runs out of buffers
            b = req.advance()
            if b is not None:
                taken.add(b)
        assert taken == set(range(len(feeder.buffers)))
        assert feeder.stats.unpublished > 0 and feeder.stats.snapshots == req.step
        for b in taken:
            feeder.sent(b, None)
        assert req.advance() is not None  # its own again: it publishes
        assert feeder.stats.windows_built > 0 and feeder.stats.lost_requests == 0
        with open(f"/proc/{feeder._proc.pid}/maps") as f:
            assert "libtorch" not in f.read()
    finally:
        feeder.close()


@pytest.mark.slow
def test_the_worker_goes_on_when_the_feeder_process_dies(caplog):
    """Killed, the child takes no more jobs: every later ``take`` returns None
    at once, the loss is said once, and ``close`` does not wait for it."""
    feeder = _feeder(logger=logging.getLogger("suffixspec.test_feeder"))
    feeder.ready(functools.partial(SuffixProposer, max_depth=16, max_spec_tokens=K))
    req = Request(feeder)
    assert req.advance() is not None
    os.kill(feeder._proc.pid, signal.SIGKILL)
    feeder._proc.wait(timeout=10)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="suffixspec.test_feeder"):
        for _ in range(5):
            assert req.advance(deadline=1.0) is None
        feeder.close()
    assert time.monotonic() - began < 3.0
    said = [r for r in caplog.records if "feeder process stopped" in r.getMessage()]
    assert len(said) == 1


WORKER = r"""
import functools, os, signal, sys
sys.path.insert(0, sys.argv[2])
import numpy as np
from test_feeder_process import Request, _feeder
from suffixspec.config import ProposerConfig
from suffixspec.fingerprint import BYTES
from suffixspec.integrations.vllm.build import build_proposer
from suffixspec.integrations.vllm.settings import Settings

feeder = _feeder()
feeder.ready(functools.partial(build_proposer, ProposerConfig(max_depth=16, max_spec_tokens=4),
                               Settings(pool=sys.argv[1], snapshot_every=0), BYTES))
req = Request(feeder)
for _ in range(12):
    req.advance()
print(feeder._proc.pid, " ".join(map(str, req.tokens)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the worker's process dies, the request in flight
"""


@pytest.mark.slow
def test_when_the_workers_process_dies_the_feeder_commits_what_was_in_flight(tmp_path):
    """The child sees the pipe close, commits the open request's output to the
    pool (the model's own text), closes the pool and exits: no orphan."""
    from suffixspec.pools.store import PoolStore

    path = tmp_path / "pool.lmdb"
    done = subprocess.run([sys.executable, "-c", WORKER, str(path), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    pid, tokens = done.stdout.split(maxsplit=1)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the feeder process outlived its worker"
    with PoolStore(path) as store:
        stored = [s.tokens.tolist() for s in store.sequences()]
    want = [int(t) for t in tokens.split()][len(PROMPT):]
    assert any(want == s[len(s) - len(want):] for s in stored), (stored, want)
