"""The replay harness, the baseline engines and trace loading."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixspec.draft import Draft
from suffixspec.native.ngram import ngram_propose
from suffixspec.replay.engines import make_proposer
from suffixspec.replay.harness import accepted_length, replay
from suffixspec.replay.traces import Request, hf_encoder, load_trace
from suffixspec.replay.workload import default_workload


def path_draft(tokens):
    t = np.asarray(tokens, np.int32)
    return Draft(t, np.arange(-1, len(t) - 1, dtype=np.int32), np.ones(len(t), np.float32), 1.0)


def test_accepted_length_path_and_tree():
    target = np.array([5, 6, 7, 8], np.int32)
    assert accepted_length(path_draft([5, 6, 9, 8]), target) == 2
    assert accepted_length(path_draft([5, 6, 7, 8, 9]), target) == 4
    assert accepted_length(path_draft([1]), target) == 0
    assert accepted_length(Draft(), target) == 0
    # Tree: 5 -> {9, 6 -> 7}; the matching branch is 5, 6, 7.
    tree = Draft(np.array([5, 9, 6, 7], np.int32), np.array([-1, 0, 0, 2], np.int32),
                 np.ones(4, np.float32), 4.0)
    assert accepted_length(tree, target) == 3
    # A child of a rejected node never counts.
    tree = Draft(np.array([1, 6, 5], np.int32), np.array([-1, 0, -1], np.int32),
                 np.ones(3, np.float32), 3.0)
    assert accepted_length(tree, target) == 1


def naive_ngram(tokens, n_min, n_max, k):
    n = len(tokens)
    for size in range(min(n_max, n - 1), n_min - 1, -1):
        pattern = tokens[n - size:]
        for start in range(0, n - size):
            if tokens[start:start + size] == pattern:
                return tokens[start + size:start + size + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 3), st.integers(0, 3),
       st.integers(0, 6))
def test_ngram_kernel_matches_naive_scan(tokens, n_min, extra, k):
    n_max = n_min + extra
    arr = np.asarray(tokens, np.int32)
    out = np.empty(max(k, 1), np.int32)
    n = ngram_propose(arr, arr.shape[0], n_min, n_max, k, np.empty(n_max, np.int32), out)
    assert out[:n].tolist() == naive_ngram(tokens, n_min, n_max, k)


def test_oracle_accepts_everything_and_bounds_the_others():
    reqs = default_workload(sessions=8, turns=3)
    k = 8
    oracle = replay(reqs, make_proposer("oracle", reqs, max_spec_tokens=k)).metrics()
    assert oracle["acceptance_rate"] == 1.0
    ours = replay(reqs, make_proposer("suffixspec", max_spec_tokens=k)).metrics()
    ngram = replay(reqs, make_proposer("ngram", max_spec_tokens=k)).metrics()
    assert oracle["output_tokens"] == ours["output_tokens"] == sum(len(r.output) for r in reqs)
    assert 1.0 < ngram["mean_tokens_per_step"] < ours["mean_tokens_per_step"]
    assert ours["mean_tokens_per_step"] < oracle["mean_tokens_per_step"] <= k + 1
    assert ours["index_bytes_per_token"] > 0


def test_concurrency_counts_every_token_once():
    reqs = default_workload(sessions=6, turns=3)
    one = replay(reqs, make_proposer("suffixspec", max_spec_tokens=8))
    many = replay(reqs, make_proposer("suffixspec", max_spec_tokens=8), concurrency=5)
    assert one.output_tokens == many.output_tokens
    assert many.steps == len(many.step_us)
    assert len(many.engine_step_us) < many.steps  # several requests per engine step
    assert many.metrics()["mean_tokens_per_step"] > 1.5


def test_empty_outputs_finish_without_steps():
    reqs = [Request("a", np.array([1, 2], np.int32), np.empty(0, np.int32)),
            Request("b", np.array([1, 2], np.int32), np.array([3], np.int32))]
    res = replay(reqs, make_proposer("suffixspec"), concurrency=2)
    assert res.requests == 2 and res.steps == 1 and res.output_tokens == 1


@pytest.fixture(scope="module")
def encode(tokenizer_path):
    return hf_encoder(tokenizer_path)


def test_multi_turn_prompts_rebuild_the_conversation(traces_dir, encode):
    reqs = load_trace(traces_dir / "agent_miniswe_swebench.jsonl.gz", encode, max_sessions=1)
    assert len(reqs) > 3
    for prev, cur in zip(reqs, reqs[1:]):
        # Turn k+1's prompt starts with turn k's prompt and output.
        assert np.array_equal(cur.prompt[:len(prev.prompt)], prev.prompt)
        tail = cur.prompt[len(prev.prompt):len(prev.prompt) + len(prev.output)]
        assert np.array_equal(tail, prev.output)


def test_single_turn_trace_slice_replays_with_every_engine(traces_dir, encode):
    reqs = load_trace(traces_dir / "sql_spider_bird.jsonl.gz", encode, max_records=150)
    assert len(reqs) == 150 and all(r.output.dtype == np.int32 for r in reqs)
    mts = {e: replay(reqs, make_proposer(e, reqs)).metrics()["mean_tokens_per_step"]
           for e in ("suffixspec", "ngram", "oracle")}
    assert mts["ngram"] < mts["suffixspec"] < mts["oracle"]
