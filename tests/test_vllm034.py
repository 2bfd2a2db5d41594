"""``method: "suffixspec"`` on vLLM 0.34 (Model Runner V2 only), through vLLM's own objects.

vLLM 0.34 has no CPU build: ``scripts/install_vllm034.sh`` installs its
Python code in a venv of its own, where the README's test command runs these
tests.  vLLM's ``SpeculativeConfig`` resolves ``method: "suffixspec"``
through its registry from the plugin its entry point loads, vLLM's
``init_speculator`` builds suffixspec's speculator, and a loop of vLLM's
``RequestState`` (its staged writes and ``post_update`` run by vLLM's own
Triton kernels, under Triton's interpreter) and ``InputBatch`` drives it as
the runner does.  The model is a config and the shared tokenizer: no engine
starts, no weights load.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.vllm034

torch = pytest.importorskip("torch")

from mrv2 import Tripwire  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
K = 8            # num_speculative_tokens
IN_FLIGHT = 8    # requests at once
SEQS = 16        # max_num_seqs: the slots
MAX_LEN = 2048
STEPS = 320


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tokenizer_path) -> Path:
    """A model vLLM's config reads: a Llama config with the shared tokenizer's
    vocabulary, and that tokenizer."""
    folder = tmp_path_factory.mktemp("model")
    (folder / "tokenizer.json").write_bytes(tokenizer_path.read_bytes())
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 151936,
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2,
        "max_position_embeddings": 4096, "torch_dtype": "float32"}))
    return folder


@pytest.fixture(scope="module")
def plugins():
    """vLLM's general plugins, loaded as every vLLM process loads them."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()


@pytest.fixture(autouse=True)
def cpu_buffers(monkeypatch):
    """vLLM's own fallback where host memory cannot be pinned (the CPU torch)."""
    import vllm.v1.worker.gpu.buffer_utils as buffers

    monkeypatch.setattr(buffers, "is_uva_available", lambda: False)


def _config(model_folder: Path, **speculative):
    from vllm.config import (ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig,
                             VllmConfig)

    model = ModelConfig(model=str(model_folder), max_model_len=MAX_LEN)
    spec = SpeculativeConfig(target_model_config=model, target_parallel_config=ParallelConfig(),
                             **speculative)
    scheduler = SchedulerConfig(max_num_seqs=SEQS, max_model_len=MAX_LEN,
                                is_encoder_decoder=False)
    return VllmConfig(model_config=model, speculative_config=spec, scheduler_config=scheduler)


def _request_state(vc):
    from vllm.v1.worker.gpu.states import RequestState

    spec = vc.speculative_config
    return RequestState(max_num_reqs=vc.scheduler_config.max_num_seqs, max_model_len=MAX_LEN,
                        max_num_batched_tokens=vc.scheduler_config.max_num_batched_tokens,
                        num_speculative_steps=spec.num_speculative_tokens,
                        vocab_size=vc.model_config.get_vocab_size(), device=torch.device("cpu"),
                        use_dense_all_token_ids=spec.speculator_config.prefer_dense_token_history)


def test_vllm_resolves_suffixspec_through_its_registry_and_keeps_suffix_its_own(
        plugins, model_folder, caplog):
    from vllm.v1.worker.gpu.spec_decode.speculator_config import registered_speculative_methods
    from vllm.v1.worker.gpu.spec_decode.suffix.config import SuffixSpeculatorConfig

    from suffixspec.integrations.vllm.speculator_config import (DEFAULT_SPECULATIVE_TOKENS,
                                                                SuffixSpecSpeculatorConfig)

    assert "suffixspec" in registered_speculative_methods()
    with caplog.at_level(logging.INFO):
        vc = _config(model_folder, method="suffixspec",
                     speculator_options={"namespace": "sql", "log_interval": 0})
    spec = vc.speculative_config
    assert (spec.custom_method, spec.method) == ("suffixspec", "suffix")
    assert type(spec.speculator_config) is SuffixSpecSpeculatorConfig
    assert spec.speculator_config.speculator_class.endswith("DeviceSuffixSpeculator")
    assert spec.num_speculative_tokens == DEFAULT_SPECULATIVE_TOKENS  # not set: our default
    assert "num_speculative_tokens defaults to" in caplog.text
    assert "Using custom speculative method 'suffixspec'" in caplog.text
    vllms = _config(model_folder, method="suffix", num_speculative_tokens=4)
    assert type(vllms.speculative_config.speculator_config) is SuffixSpeculatorConfig
    # Our options are checked where vLLM checks its config: one line naming it.
    with pytest.raises(Exception, match="unknown suffixspec setting 'poool'"):
        _config(model_folder, method="suffixspec", speculator_options={"poool": "/x"})
    with pytest.raises(Exception, match="speculator_options is not supported"):
        _config(model_folder, method="suffix", speculator_options={"pool": "/x"})


# What a fresh interpreter shows of vLLM with and without the plugin: every
# function and class that vLLM's modules bind, the config and speculator each
# method builds (suffix and ngram_gpu built for real on CPU tensors; eagle and
# mtp need a draft checkpoint, so their configs' classes as vLLM resolves them).
PROBE = r"""
import json, sys, types
import torch
import vllm.v1.worker.gpu.buffer_utils as buffers
buffers.is_uva_available = lambda: False
from vllm.config import ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
from vllm.v1.worker.gpu.spec_decode import init_speculator
from vllm.v1.worker.gpu.spec_decode.speculator_config import get_method_config_class
from vllm.v1.worker.gpu.states import RequestState

from suffixspec.testing.vllm_bindings import vllm_bindings as bindings

def built(method, **options):
    model = ModelConfig(model=sys.argv[1], max_model_len=512)
    spec = SpeculativeConfig(method=method, num_speculative_tokens=4, target_model_config=model,
                             target_parallel_config=ParallelConfig(), **options)
    vc = VllmConfig(model_config=model, speculative_config=spec,
                    scheduler_config=SchedulerConfig(max_num_seqs=4, max_model_len=512,
                                                     is_encoder_decoder=False))
    states = RequestState(4, 512, 2048, 4, model.get_vocab_size(), torch.device("cpu"),
                          use_dense_all_token_ids=True)
    speculator = init_speculator(vc, torch.device("cpu"), states)
    return [type(spec.speculator_config).__qualname__, type(speculator).__module__,
            type(speculator).__qualname__, spec.method, spec.num_speculative_tokens]

def resolved(method):
    return get_method_config_class(types.SimpleNamespace(method=method, custom_method=None)).__qualname__

from vllm.plugins import load_general_plugins
report = {}
for phase in ("before", "after"):
    if phase == "after":
        load_general_plugins()
        report["ours"] = built("suffixspec", speculator_options={"log_interval": 0})
    report[phase] = {**{"built " + m: built(m) for m in ("suffix", "ngram_gpu")},
                     **{"config " + m: resolved(m) for m in ("eagle", "mtp", "ngram", "suffix")}}
    report[phase]["bindings"] = bindings()
import vllm.v1.worker.gpu.spec_decode.speculator_config as registry
report["registered"] = registry.registered_speculative_methods()
print(json.dumps(report))
"""


def test_installing_suffixspec_rebinds_no_vllm_name_and_builds_every_method_alike(
        model_folder, tmp_path):
    """In a fresh interpreter: what vLLM builds for suffix, ngram_gpu, eagle and
    mtp, and every function and class its modules bind, before the plugin
    loads and after it loaded (registering ``suffixspec``) and vLLM built
    suffixspec's speculator."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script), str(model_folder)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    before, after = report["before"], report["after"]
    assert "suffixspec" in report["registered"]
    methods = [k for k in before if k != "bindings"]
    assert len(methods) == 6
    for method in methods:
        assert after[method] == before[method], method
    assert before["built suffix"][1:3] == ["vllm.v1.worker.gpu.spec_decode.suffix.speculator",
                                           "SuffixSpeculator"]
    assert before["config eagle"] == "EagleSpeculatorConfig"
    assert report["ours"][1:3] == ["suffixspec.integrations.vllm.device_speculator",
                                   "DeviceSuffixSpeculator"]
    assert len(before["bindings"]) > 3000  # vLLM's config, state and speculator modules
    changed = [name for name, ident in before["bindings"].items()
               if after["bindings"].get(name, ident) != ident]
    assert changed == []


def test_the_tripwire_trips_on_every_way_of_reading_the_device_back(monkeypatch):
    """The loop's check can fail: each read back, in a guarded call, raises."""
    device = torch.device("cpu")
    wire = Tripwire(monkeypatch, device)
    x = torch.arange(6, dtype=torch.int64)
    reads = [lambda: x[0].item(), lambda: x.tolist(), lambda: x.numpy(), lambda: int(x[0]),
             lambda: float(x[0]), lambda: bool(x[0]), lambda: [0, 1][x[1]], lambda: x.cpu(),
             lambda: x.to("cpu"), lambda: x.to(torch.device("cpu")),
             lambda: torch.equal(x, x), lambda: torch.allclose(x.float(), x.float()),
             lambda: torch.where(x > 2), lambda: x.nonzero(), lambda: x[x > 2],
             lambda: torch.masked_select(x, x > 2), lambda: x.unique(),
             lambda: torch.empty(6, dtype=torch.int64).copy_(x)]
    for read in reads:
        with pytest.raises(AssertionError, match="in propose"):
            wire.guard(read)()
    assert len(wire.hits) == len(reads)
    wire.guard(lambda: x.to(device) + torch.where(x > 2, x, 0))()  # on the device: fine


class Runner:
    """Model Runner V2's side of a step, with vLLM's own objects: requests take
    ``RequestState`` slots (``add_request``, ``apply_staged_writes``), each
    step's tokens land by ``post_update``, the speculator hears of requests
    through its hooks and drafts with ``propose`` for an ``InputBatch``."""

    def __init__(self, speculator, states, max_num_tokens: int):
        from vllm.v1.worker.gpu.input_batch import InputBuffers

        self.spec, self.states = speculator, states
        self.buffers = InputBuffers(states.max_num_reqs, max_num_tokens, torch.device("cpu"))

    def add(self, req_id: str, tokens: np.ndarray, max_tokens: int) -> None:
        self.states.add_request(req_id, int(tokens.shape[0]), tokens.tolist(), 0, max_tokens)
        self.spec.add_request(self.states.req_id_to_index[req_id])

    def emit(self, req_ids: list[str], emitted: list[np.ndarray], rejected: list[int]) -> None:
        from vllm.v1.worker.gpu.input_batch import post_update

        n = len(req_ids)
        self.states.apply_staged_writes()
        idx = torch.tensor([self.states.req_id_to_index[r] for r in req_ids], dtype=torch.int32)
        sampled = torch.zeros(n, K + 1, dtype=torch.int64)
        for i, tokens in enumerate(emitted):
            sampled[i, :tokens.shape[0]] = torch.from_numpy(tokens.astype(np.int64))
        num_sampled = torch.tensor([t.shape[0] for t in emitted], dtype=torch.int32)
        num_rejected = torch.tensor(rejected, dtype=torch.int32)
        post_update(idx, self.states.num_computed_tokens.gpu, self.states.last_sampled_tokens,
                    None, sampled, num_sampled, num_rejected, None,
                    self.states.all_token_ids.gpu, self.states.total_len.gpu)
        self.verdict = {r: (t.shape[0], j) for r, t, j in zip(req_ids, emitted, rejected)}

    def propose(self, req_ids: list[str]) -> np.ndarray:
        from vllm.v1.worker.gpu.input_batch import InputBatch

        n = len(req_ids)
        slots = np.array([self.states.req_id_to_index[r] for r in req_ids], np.intp)
        batch = dataclasses.replace(InputBatch.make_dummy(n, n, self.buffers),
                                    req_ids=list(req_ids),
                                    idx_mapping=torch.from_numpy(slots.astype(np.int64)),
                                    idx_mapping_np=slots)
        num_sampled = torch.tensor([self.verdict[r][0] for r in req_ids], dtype=torch.int32)
        num_rejected = torch.tensor([self.verdict[r][1] for r in req_ids], dtype=torch.int32)
        drafts = self.spec.propose(batch, None, None, None, None, num_sampled, num_rejected,
                                   self.states.last_sampled_tokens,
                                   self.states.next_prefill_tokens, None, None,
                                   num_speculative_tokens=K)
        return drafts.numpy().copy()

    def finish(self, req_ids: list[str]) -> None:
        self.spec.on_requests_finished(set(req_ids))
        for r in sorted(req_ids):  # as vLLM's runner frees slots
            self.states.remove_request(r)


def _trace_requests(traces_dir: Path, tokenizer_path: Path, count: int):
    from suffixspec.replay.traces import hf_encoder, load_trace

    got = load_trace(traces_dir / "sql_spider_bird.jsonl.gz", hf_encoder(tokenizer_path),
                     max_records=count)
    return [(f"cmpl-{r.req_id}", r.prompt[-1024:], r.output[:160]) for r in got
            if r.output.shape[0] >= 2 and r.prompt.shape[0] >= 4]


@pytest.mark.parametrize("feeder_process", [False, True], ids=["lockstep", "process"])
def test_300_steps_through_vllms_objects_draft_as_replay_and_keep_exactly_the_outputs(
        plugins, model_folder, traces_dir, tokenizer_path, tmp_path, monkeypatch,
        feeder_process):
    """vLLM's config and ``init_speculator`` build the speculator (its pool an
    LMDB file); warmup's requests run and end, then ``reset_state``; then real
    requests of the sql trace arrive, decode and finish for 320 steps, each
    step's drafts verified against the recorded output.  Every step's drafts
    equal those of the replay engine ``suffixspec-device`` fed the same
    requests and tokens, its own pool another file; the pool holds exactly
    the finished requests' outputs, warmup's none; and no ``propose`` reads
    the device back (its feeder, in lockstep here so that both runs share one
    schedule, left out: on a GPU it runs in a thread of its own), or in a
    process of its own (``device_feeder_process``), in lockstep too."""
    from suffixspec.device import drafter as drafter_module
    from suffixspec.device.feeder import WindowFeeder
    from suffixspec.device.feeder_process import FeederProcess
    from suffixspec.device.replay import DeviceWindowsProposer
    from suffixspec.fingerprint import load_hf_tokenizer, tokenizer_id
    from suffixspec.integrations.vllm.build import build_proposer
    from suffixspec.integrations.vllm.device_speculator import DeviceSuffixSpeculator
    from suffixspec.integrations.vllm.settings import Settings
    from suffixspec.pools.store import PoolStore
    from suffixspec.token_kinds import token_kinds
    from vllm.v1.worker.gpu.spec_decode import init_speculator

    def lockstep(*args, **kwargs):
        return WindowFeeder(*args, **{**kwargs, "threaded": False})

    def lockstep_process(*args, **kwargs):
        return FeederProcess(*args, **{**kwargs, "lockstep": True})

    monkeypatch.setattr(drafter_module, "WindowFeeder", lockstep)
    monkeypatch.setattr(drafter_module, "FeederProcess", lockstep_process)
    pool = tmp_path / "served.lmdb"
    options = {"pool": str(pool), "tokenizer": str(tokenizer_path), "log_interval": 0,
               "snapshot_every": 0, "device_feeder_process": feeder_process}
    vc = _config(model_folder, method="suffixspec", num_speculative_tokens=K,
                 speculator_options=options)
    states = _request_state(vc)
    spec = init_speculator(vc, torch.device("cpu"), states)
    assert isinstance(spec, DeviceSuffixSpeculator)
    if spec._start is not None:  # kernels compiling: drafting starts when they are ready
        assert spec._start.join(timeout=600)
    runner = Runner(spec, states, vc.scheduler_config.max_num_batched_tokens)
    tokenizer = tokenizer_id(tokenizer_path)
    replay_settings = Settings(**{**options, "pool": str(tmp_path / "replayed.lmdb")})
    replay = DeviceWindowsProposer(
        slots=SEQS, max_len=MAX_LEN, host=build_proposer(
            spec.drafter.config, replay_settings, tokenizer,
            token_kinds(load_hf_tokenizer(str(tokenizer_path)))))
    wire = Tripwire(monkeypatch, spec.drafter.device)
    spec.propose = wire.guard(spec.propose)
    feeder = spec.drafter.feeder
    if feeder_process:  # what the relay thread does, here in the worker's (lockstep)
        feeder._send_queued = wire.unguarded(feeder._send_queued)
    else:
        feeder._drain = wire.unguarded(feeder._drain)

    # Warmup, as vLLM's: requests of its own, a few steps, ended, then reset_state.
    rng = np.random.default_rng(0)
    warm = [f"_warmup_{i}_" for i in range(3)]
    for r in warm:
        runner.add(r, rng.integers(0, 1000, 40).astype(np.int32), 16)
    runner.emit(warm, [rng.integers(0, 1000, 1).astype(np.int32) for _ in warm], [0] * 3)
    for _ in range(3):
        runner.propose(warm)
        runner.emit(warm, [rng.integers(0, 1000, 2).astype(np.int32) for _ in warm], [0] * 3)
    runner.finish(warm)
    spec.reset_state()
    # The same requests in the same slots (the open outputs' tables are keyed by slot).
    replay.states.free = list(states.free_indices)

    pending = iter(_trace_requests(traces_dir, tokenizer_path, 200))
    active: dict[str, list] = {}  # request -> [output, emitted so far, last draft]
    finished: dict[str, np.ndarray] = {}
    differ = steps = accepted = 0
    while steps < STEPS or active:
        done = [r for r, (out, pos, _) in active.items() if pos >= out.shape[0]]
        if done:
            runner.finish(done)
            for r in sorted(done):  # as the speculator takes them (every rank alike)
                replay.finish_request(r)
                finished[r] = active.pop(r)[0]
        new = []
        while steps < STEPS and len(active) < IN_FLIGHT:
            item = next(pending, None)
            if item is None:
                break
            req_id, prompt, output = item
            runner.add(req_id, prompt, output.shape[0])
            replay.start_request(req_id, prompt)
            active[req_id] = [output, 0, None]
            new.append(req_id)
        if not active:
            break
        ids = list(active)
        emitted, rejected = [], []
        for r in ids:  # the target model's tokens for the last drafts (prefill: one token)
            output, pos, draft = active[r]
            if draft is None:
                emit = output[pos:pos + 1]
            else:
                ok = int(np.cumprod(draft[:output.shape[0] - pos] == output[pos:pos + K]).sum())
                emit = output[pos:pos + ok + 1]
                accepted += ok
            emitted.append(emit)
            rejected.append(0 if draft is None else K - (emit.shape[0] - 1))
            active[r][1] += emit.shape[0]
        runner.emit(ids, emitted, rejected)
        for r, emit in zip(ids, emitted):
            replay.extend(r, emit)
        ids = [r for r in ids if active[r][1] < active[r][0].shape[0]]  # the rest end next step
        if not ids:
            for r in list(active):
                active[r][2] = None
            continue
        served = runner.propose(ids)
        replayed = replay.propose(ids)
        for i, r in enumerate(ids):
            valid = int(spec.drafter.out.num_valid[i])
            ours = served[i, :valid]
            theirs = replayed[i].token_ids
            differ += not np.array_equal(ours, theirs)
            active[r][2] = served[i]  # vLLM verifies every slot
        steps += 1
    spec.close()
    replay.close()
    assert steps >= 300 and len(finished) >= 20 and accepted > 0
    assert differ == 0, f"{differ} drafts differ from the replay engine's"
    assert wire.hits == []
    store = PoolStore(pool, tokenizer=tokenizer)
    try:
        kept = {q.request_id: q.tokens[q.anchors:] for q in store.sequences()}
    finally:
        store.close()
    assert set(kept) == set(finished)  # warmup's requests: none
    for r, output in finished.items():
        assert kept[r].tolist() == output.tolist(), r
