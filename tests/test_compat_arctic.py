"""``suffixspec.compat.arctic`` against arctic-inference itself.

In ``arctic`` mode the drop-in must give arctic's drafts at every step, on
real traces and under random calls; in both modes the API (keys, errors,
eviction order) must behave as arctic's.  Needs arctic-inference
(bench/setup_arctic.sh, part of the test set-up).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from suffixspec.compat.arctic import SuffixDecodingCache

arctic = pytest.importorskip("arctic_inference.suffix_decoding")

from test_index_properties import assert_arctic_order  # noqa: E402

def records(traces: Path, tokenizer: Path, name: str, n: int):
    """(prompt tail, output) token ids of a trace's first ``n`` records."""
    from suffixspec.replay.traces import hf_encoder, read_records

    encode = hf_encoder(tokenizer)
    recs = list(read_records(traces / f"{name}.jsonl.gz", max_records=n))
    prompts = encode([r["prompt"] for r in recs])
    return [(np.array(p[-1500:], np.int32), o)
            for p, o in zip(prompts, encode([r["output"] for r in recs]))]


def same(a, b) -> bool:
    return (list(a.token_ids) == b.token_ids and list(a.parents) == b.parents
            and list(np.float32(a.probs)) == list(np.float32(b.probs))
            and np.float32(a.score) == np.float32(b.score) and a.match_len == b.match_len)


@pytest.mark.parametrize("trace, n, cached, tree", [
    ("sql_spider_bird", 60, -1, False),
    ("tool_bfcl", 50, 8, False),
    ("code_humaneval_mbpp_leetcode", 12, 4, False),
    ("sql_spider_bird", 30, -1, True),
])
def test_arctic_mode_drafts_as_arctic_at_every_step(traces_dir, tokenizer_path, trace, n, cached,
                                                    tree):
    """Decode each record as arctic's simulator does (accept the drafted
    tokens the recorded output confirms, plus one), both caches side by side."""
    theirs = arctic.SuffixDecodingCache(64, cached)
    ours = SuffixDecodingCache(64, cached, mode="arctic")
    steps = 0
    for i, (prompt, output) in enumerate(records(traces_dir, tokenizer_path, trace, n)):
        for c in (theirs, ours):
            c.start_request(i, prompt)
        done: list[int] = []
        while len(done) < len(output):
            ctx = np.concatenate([prompt, np.array(done, np.int32)])[-64:]
            want = theirs.speculate(i, ctx, 16, 2.0, 0.0, 0.2, tree)
            got = ours.speculate(i, ctx, 16, 2.0, 0.0, 0.2, tree)
            assert same(want, got), f"record {i}, output token {len(done)}: {want} != {got}"
            steps += 1
            new = accepted(want, output[len(done):])
            done += new
            for c in (theirs, ours):
                c.add_active_response(i, new)
        for c in (theirs, ours):
            c.stop_request(i)
        assert list(ours.cached_requests) == list(theirs.cached_requests)
    assert steps > 300


def accepted(draft, rest: list[int]) -> list[int]:
    """The draft tokens ``rest`` confirms, then the next token of ``rest``."""
    out, node = [], -1
    for t in rest:
        hit = next((j for j, p in enumerate(draft.parents)
                    if p == node and draft.token_ids[j] == t), None)
        if hit is None:
            break
        out.append(t)
        node = hit
    return out + rest[len(out):len(out) + 1]


tokens = st.lists(st.integers(0, 5), max_size=10)


class SameAsArctic(RuleBasedStateMachine):
    """Random calls on both caches: same results, same errors."""

    @initialize(depth=st.integers(2, 8), cached=st.sampled_from([-1, 0, 1, 3]),
                mode=st.sampled_from(["arctic", "suffixspec"]))
    def setup(self, depth, cached, mode):
        self.theirs = arctic.SuffixDecodingCache(depth, cached)
        self.ours = SuffixDecodingCache(depth, cached, mode=mode)
        self.mode = mode

    def both(self, name, *args):
        results = []
        for cache in (self.theirs, self.ours):
            try:
                results.append(("ok", getattr(cache, name)(*args)))
            except ValueError as e:
                results.append(("error", str(e)))
        (kind_a, a), (kind_b, b) = results
        assert kind_a == kind_b, f"{name}{args}: arctic {results[0]}, ours {results[1]}"
        if kind_a == "error":
            assert a == b
        return a, b

    @rule(req=st.integers(0, 3), prompt=tokens)
    def start(self, req, prompt):
        self.both("start_request", req, np.array(prompt, np.int32))

    @rule(req=st.integers(0, 3), toks=tokens)
    def add(self, req, toks):
        self.both("add_active_response", req, toks)

    @rule(req=st.integers(0, 3))
    def stop(self, req):
        self.both("stop_request", req)

    @rule(req=st.integers(0, 3))
    def evict(self, req):
        self.both("evict_cached_response", req)

    @rule(req=st.integers(0, 3), ctx=tokens, k=st.integers(0, 8),
          factor=st.sampled_from([1.0, 0.5, 2.0]), offset=st.sampled_from([0.0, 1.0]),
          min_prob=st.sampled_from([0.1, 0.0, 0.3]), tree=st.booleans())
    def speculate(self, req, ctx, k, factor, offset, min_prob, tree):
        a, b = self.both("speculate", req, np.array(ctx, np.int32), k, factor, offset,
                         min_prob, tree)
        if isinstance(a, str) or self.mode != "arctic":
            return
        assert same(a, b), f"{a} != {b}"

    @invariant()
    def same_keys(self):
        if hasattr(self, "ours"):
            assert list(self.ours.active_requests) == list(self.theirs.active_requests)
            assert list(self.ours.cached_requests) == list(self.theirs.cached_requests)
            if self.mode == "arctic":
                for ix in (self.ours._trees.local, self.ours._trees.glob):
                    ix.check_integrity()
                    assert_arctic_order(ix)


TestSameAsArctic = SameAsArctic.TestCase
TestSameAsArctic.settings = settings(max_examples=80, stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


def test_array_checks_match_arctics():
    for bad in (np.zeros((2, 2), np.int32), np.zeros(3, np.int64), np.zeros(6, np.int32)[::2]):
        errors = []
        for cache in (arctic.SuffixDecodingCache(), SuffixDecodingCache()):
            with pytest.raises(ValueError) as e:
                cache.start_request("r", bad)
            errors.append(str(e.value))
        assert errors[0] == errors[1]
    with pytest.raises(ValueError, match="at most 2"):
        SuffixDecodingCache(max_cached_requests=1 << 31)


def test_a_tree_draft_that_outgrows_the_heap_is_drafted_again_in_a_larger_one():
    """The drop-in keeps its frontier between calls; one too small for a
    bushy tree is grown until the draft fits, and the draft is arctic's."""
    rng = np.random.default_rng(0)
    stem = rng.integers(100, 200, 20)
    # The stem, then one of 200 random tails: after it, many continuations.
    prompt = np.concatenate([np.concatenate([stem, rng.integers(0, 40, 6)])
                             for _ in range(200)]).astype(np.int32)
    theirs = arctic.SuffixDecodingCache(64, -1)
    ours = SuffixDecodingCache(64, -1, mode="arctic")
    for c in (theirs, ours):
        c.start_request("r", prompt)
    scratch = ours._trees.scratch
    scratch.out(16)
    scratch.grow(2)
    ctx = stem.astype(np.int32)
    want = theirs.speculate("r", ctx, 16, 2.0, 0.0, 0.0, True)
    got = ours.speculate("r", ctx, 16, 2.0, 0.0, 0.0, True)
    assert len(want.token_ids) == 16
    assert scratch.heap > 2
    assert same(want, got), f"{want} != {got}"


def test_suffixspec_mode_drafts_from_cached_responses_until_evicted():
    cache = SuffixDecodingCache(16)
    answer = [7, 8, 9, 10, 11, 12]
    cache.start_request("a", np.array([1, 2, 3], np.int32))
    cache.add_active_response("a", answer)
    cache.stop_request("a")
    cache.start_request("b", np.array([4, 5], np.int32))
    cache.add_active_response("b", [7, 8])
    ctx = np.array([4, 5, 7, 8], np.int32)
    assert cache.speculate("b", ctx, 4).token_ids[:2] == [9, 10]
    cache.evict_cached_response("a")
    assert "a" not in cache.cached_requests
    assert cache.speculate("b", ctx, 4).token_ids == []
    # A context that is not the request's own tokens is matched as given.
    other = np.array([1, 7, 8], np.int32)
    assert cache.speculate("b", other, 4, min_token_prob=0.0).token_ids == []
    cache.add_active_response("b", [9, 7, 8])
    assert cache.speculate("b", other, 4).token_ids[:1] == [9]


def test_install_puts_the_drop_in_where_arctics_api_is_imported(arctic_api_restored):
    from suffixspec.compat import arctic as compat

    compat.install("arctic")
    from arctic_inference.suffix_decoding import SuffixDecodingCache as Imported

    cache = Imported(8, 2)
    assert isinstance(cache, SuffixDecodingCache) and cache.mode == "arctic"
    cache.start_request(0, [1, 2, 3])
    cache.add_active_response(0, [4, 5])
    # What arctic's simulator reads off the global tree.
    assert cache._global_tree.check_integrity() == ""
    assert cache._global_tree.estimate_memory() > 0
    with pytest.raises(ValueError, match="mode must be one of"):
        compat.install("fast")
