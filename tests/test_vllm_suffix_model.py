"""The model of vLLM's GPU suffix drafter against a plain rewrite, and its replay engine."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from naive_vllm_suffix import NaiveDrafter
from suffixspec.native import vllm_suffix as gpu
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import Request
from suffixspec.stepcost import Roofline

TOKENS = st.integers(0, 5)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.lists(TOKENS, max_size=8), st.lists(TOKENS, min_size=1,
                                                                 max_size=30)),
                min_size=1, max_size=6),
       st.integers(1, 6), st.integers(1, 6), st.sampled_from([0, 12, 40, 200]),
       st.sampled_from([16, 32]))
def test_drafts_equal_the_plain_rewrite_step_by_step(requests, k, depth, cap, nb):
    corpus = np.full(cap, -1, np.int32)
    table = np.full((2, nb, gpu.SLOTS), -1, np.int64)
    head = np.zeros(2, np.int64)
    naive = NaiveDrafter(cap, nb, depth, k)
    out = np.empty(k, np.int32)
    for prompt, output in requests:
        seq = list(prompt)
        for tok in output:
            if seq:
                row = np.asarray(seq, np.int32)
                got = gpu.propose(row, len(seq), corpus, table, depth, k, out)
                want = naive.propose(seq)
                assert (out.tolist(), *got) == want, (seq, naive.corpus)
            seq.append(tok)
        if cap:
            start = max(len(prompt) - gpu.PROMPT_CONTEXT, 0)
            gpu.ingest(corpus, table, head, np.asarray(seq, np.int32), start, len(seq))
            naive.ingest(seq[start:])
            assert corpus.tolist() == naive.corpus


def _requests(n=12, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 50, 40)
    reqs = []
    for i in range(n):
        out = base.copy()
        out[rng.integers(0, 40, 3)] = rng.integers(0, 50, 3)  # mostly what came before
        reqs.append(Request(f"r{i}", rng.integers(0, 50, 10).astype(np.int32),
                            out.astype(np.int32)))
    return reqs


def test_plain_mode_verifies_every_slot_and_adaptive_mode_drops_the_fillers():
    reqs = _requests()
    plain = replay(reqs, make_proposer("vllm-gpu", max_spec_tokens=16, max_depth=24))
    adaptive = replay(reqs, make_proposer("vllm-gpu", max_spec_tokens=16, max_depth=24,
                                          adaptive=True))
    assert plain.drafted == 16 * plain.steps  # always k, fillers included
    assert adaptive.drafted < plain.drafted  # filler slots have confidence 0
    assert adaptive.output_tokens == plain.output_tokens
    assert plain.accepted > 0 and adaptive.accepted > 0


def test_adaptive_mode_admits_fewer_slots_when_tokens_cost_more():
    reqs = _requests(20, seed=1)
    cheap = Roofline(flat=1.0, per_token=1e-4)   # memory-bound: slots are free
    dear = Roofline(flat=1.0, per_token=0.2)     # every verified token costs a fifth of a step
    runs = [replay(reqs, make_proposer("vllm-gpu", max_depth=24, adaptive=True,
                                       step_cost=cost)) for cost in (cheap, dear)]
    assert runs[1].drafted < runs[0].drafted
