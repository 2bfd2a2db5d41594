"""SuffixProposer: lifecycle, batching, limits, settings and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from suffixspec import Draft, SuffixProposer
from suffixspec.native import KERNELS, warmup
from suffixspec.tokens import as_token_ids

PATTERN = [11, 12, 13, 14, 15, 16, 17, 18]


def make(**kw):
    """A proposer whose path drafts follow the most frequent continuation as far as
    a ``match_len``-token cap allows: drafted tokens cost nothing, so none that
    ever followed is left out."""
    kw.setdefault("max_spec_tokens", 8)
    kw.setdefault("draft_cost", 0.0)
    kw.setdefault("max_spec_factor", 1.0)
    return SuffixProposer(max_depth=16, **kw)


def test_drafts_what_followed_in_the_prompt():
    p = make(max_spec_factor=2.0)
    p.start_request("r", PATTERN + [1, 2] + PATTERN[:3])
    d = p.propose(["r"])[0]
    # What followed the earlier occurrence, into what came after the pattern.
    assert d.token_ids.tolist() == PATTERN[3:] + [1]
    assert d.source == "request" and d.match_len == 3 and d.is_path
    # With factor 1 a 3-token match drafts at most 3 tokens.
    p1 = make()
    p1.start_request("r", PATTERN + [1, 2] + PATTERN[:3])
    assert p1.propose(["r"])[0].token_ids.tolist() == PATTERN[3:6]
    assert d.parents.tolist() == list(range(-1, len(d) - 1))
    assert d.score == pytest.approx(float(d.probs.sum()))


def test_finished_output_feeds_other_requests_and_abort_does_not():
    p = make(max_spec_factor=2.0)
    p.start_request("a", [1, 2, 3])
    p.extend("a", PATTERN)
    p.finish_request("a")
    p.start_request("b", [7, 7] + PATTERN[:4])
    d = p.propose(["b"])[0]
    assert d.source == "cross" and d.token_ids.tolist() == PATTERN[4:]

    before = p.cross.tokens
    p.start_request("c", [5])
    p.extend("c", [40, 41, 42, 43])
    p.abort_request("c")
    assert p.cross.tokens == before
    p.start_request("d", [40, 41])
    assert len(p.propose(["d"])[0]) == 0
    p.cross.delta.index.check_integrity()


def test_batched_propose_equals_one_by_one():
    rng = np.random.default_rng(1)
    p = make()
    ids = []
    for i in range(6):
        base = rng.integers(0, 5, 40).tolist()
        p.start_request(i, base)
        p.extend(i, base[:10])
        ids.append(i)
    batched = p.propose(ids)
    for i, d in zip(ids, batched):
        single = p.propose([i])[0]
        assert d.token_ids.tolist() == single.token_ids.tolist()
        assert d.score == single.score
    assert p.propose([]) == []


def test_limits_int_and_per_request():
    p = make(max_spec_factor=4.0)
    for r in ("x", "y"):
        p.start_request(r, PATTERN + PATTERN[:2])
    full = p.propose(["x", "y"])
    assert [len(d) for d in full] == [8, 8]
    assert [len(d) for d in p.propose(["x", "y"], max_spec_tokens=[2, 0])] == [2, 0]
    assert [len(d) for d in p.propose(["x", "y"], max_spec_tokens=3)] == [3, 3]
    # A limit above the configured one is capped, not an error.
    assert len(p.propose(["x"], max_spec_tokens=[100])[0]) == 8


def test_max_spec_factor_bounds_draft_by_match_length():
    p = make(max_spec_factor=0.5, max_spec_tokens=16)
    p.start_request("r", PATTERN * 2 + PATTERN[:4])
    d = p.propose(["r"])[0]
    assert 0 < len(d) <= int(d.match_len * 0.5)


def test_tree_drafts_are_trees():
    p = make(tree=True, min_token_prob=0.05, max_spec_factor=4.0)
    p.start_request("r", [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2])
    d = p.propose(["r"])[0]
    assert len(d) >= 3 and not d.is_path
    assert all(d.parents[i] < i for i in range(len(d)))
    assert sorted(d.token_ids[d.parents == -1].tolist()) == [3, 4, 5]


def test_cross_pool_budget_evicts_oldest_first():
    p = make(cross_pool_tokens=20, max_spec_factor=2.0)
    for i in range(4):
        p.start_request(i, [0])
        p.extend(i, [100 + 10 * i + j for j in range(8)])
        p.finish_request(i)
    assert p.cross.tokens <= 20
    p.start_request("new", [100, 101])
    assert len(p.propose(["new"])[0]) == 0  # request 0's output is gone
    p.start_request("recent", [130, 131])
    assert p.propose(["recent"])[0].token_ids.tolist()[:2] == [132, 133]


def test_many_requests_reuse_trees_and_rebuild_stays_sound():
    p = make(cross_pool_tokens=300)
    rng = np.random.default_rng(3)
    for i in range(200):
        p.start_request(i, rng.integers(0, 20, 30))
        for _ in range(3):
            p.propose([i])
            p.extend(i, rng.integers(0, 20, 3))
        (p.finish_request if i % 3 else p.abort_request)(i)
    assert not p.active_requests
    p.requests.index.check_integrity()
    p.cross.delta.index.check_integrity()
    assert p.cross.tokens <= 300


BAD_TOKENS = [
    ([1, -2], "-2"),
    (np.array([1, -2], np.int32), "-2"),
    ([1, 2**31], "2147483648"),
    ([1, 2**30], "1073741824"),
    (np.array([1.0, 2.0]), "integers"),
    (np.array([[1, 2]]), "one-dimensional"),
    (["a", "b"], "integers"),
    (np.array([True, False]), "integers"),
]


@pytest.mark.parametrize("tokens,words", BAD_TOKENS)
def test_bad_tokens_are_refused_and_change_nothing(tokens, words):
    p = make()
    p.start_request("r", PATTERN + PATTERN[:2])
    before = p.propose(["r"])[0].token_ids.tolist()
    assert before
    with pytest.raises(ValueError, match=words):
        p.extend("r", tokens)
    with pytest.raises(ValueError, match=words):
        p.start_request("s", tokens)
    assert "s" not in p.active_requests
    assert p.propose(["r"])[0].token_ids.tolist() == before
    p.requests.index.check_integrity()


def test_unknown_and_duplicate_request_ids():
    p = make()
    p.start_request("r", [1, 2])
    with pytest.raises(ValueError, match="already active"):
        p.start_request("r", [3])
    for call in (lambda: p.extend("nope", [1]), lambda: p.finish_request("nope"),
                 lambda: p.abort_request("nope"), lambda: p.propose(["r", "nope"])):
        with pytest.raises(ValueError, match="unknown request"):
            call()
    with pytest.raises(ValueError, match="unknown request"):
        p.propose([["unhashable"]])
    p.finish_request("r")
    with pytest.raises(ValueError, match="unknown request"):
        p.finish_request("r")


def test_bad_limits_and_settings():
    p = make()
    p.start_request("r", [1, 2])
    with pytest.raises(ValueError, match="2 requests|1 requests"):
        p.propose(["r"], max_spec_tokens=[1, 2])
    with pytest.raises(ValueError, match="negative"):
        p.propose(["r"], max_spec_tokens=-1)
    with pytest.raises(ValueError, match="integers"):
        p.propose(["r"], max_spec_tokens=[1.5])
    with pytest.raises(ValueError, match="max_depth"):
        SuffixProposer(max_depth=1)
    with pytest.raises(ValueError, match="min_token_prob"):
        SuffixProposer(min_token_prob=2.0)


def test_empty_draft_is_a_valid_draft():
    d = Draft()
    assert len(d) == 0 and d.is_path and d.score == 0.0


def _read_only(t) -> bool:
    """Whether a Numba argument type is, or holds, a read-only array."""
    if hasattr(t, "mutable"):
        return not t.mutable
    return any(_read_only(x) for x in getattr(t, "types", ()))


def test_warmup_compiles_every_kernel_including_read_only_variants():
    from suffixspec.native.warmup import DEVICE, STEPS

    warmup(steps=STEPS + DEVICE)  # the host's steps and what drafting on the device adds
    for kernel in KERNELS:
        assert kernel.signatures, f"{kernel.__name__} was not compiled"
    from suffixspec.native import propose, query, trie
    for kernel in (trie.longest_match, query.draft_path, query.draft_tree, trie.continuations,
                   propose.propose_batch):
        assert any(_read_only(t) for sig in kernel.signatures for t in sig), kernel.__name__


def test_kernels_take_records_not_long_argument_lists():
    import inspect

    from suffixspec import native
    from suffixspec.native.cache import cached_kernels
    kernels = list(cached_kernels())
    assert len(kernels) > 40 and set(native.KERNELS) <= set(kernels)
    for k in kernels:
        n = len(inspect.signature(k.py_func).parameters)
        assert n <= 13, f"{k.py_func.__module__}.{k.__name__} takes {n} parameters"


def test_extend_batch_equals_extend_one_by_one():
    rng = np.random.default_rng(5)
    one, many = make(), make()
    prompts = {i: rng.integers(0, 6, 30) for i in range(5)}
    for p in (one, many):
        for i, prompt in prompts.items():
            p.start_request(i, prompt)
    for _ in range(8):
        ids = [i for i in prompts if rng.random() < 0.8]
        emitted = [rng.integers(0, 6, int(rng.integers(0, 5))) for _ in ids]
        for i, toks in zip(ids, emitted):
            one.extend(i, toks)
        many.extend_batch(ids, emitted)
        a, b = one.propose(list(prompts)), many.propose(list(prompts))
        assert [d.token_ids.tolist() for d in a] == [d.token_ids.tolist() for d in b]
    assert one.cross.tokens == many.cross.tokens
    many.requests.index.check_integrity()
    many.cross.delta.index.check_integrity()


@pytest.mark.parametrize("prompt_len, emitted", [(40, 3000), (3000, 200)])
def test_extend_that_outgrows_an_index_scores_the_draft_once(monkeypatch, prompt_len, emitted):
    """Scoring and indexing run in one native call; where the request's own
    sequence (a long output) or only its output sequence in the cross pool
    (a long prompt leaves the own one room) has to grow, the call resumes
    there, and the pending draft is scored once, as ``learn`` alone scores it."""
    from suffixspec.index import SuffixIndex
    from suffixspec.native import calibration as cal

    resumed = []
    extend_many = SuffixIndex.extend_many

    def spy(self, seq_ids, tokens, offsets, resume=False):
        resumed.append(resume)
        extend_many(self, seq_ids, tokens, offsets, resume)

    monkeypatch.setattr(SuffixIndex, "extend_many", spy)
    rng = np.random.default_rng(3)
    p = make()
    prompt = rng.integers(0, 5, prompt_len)
    p.start_request("r", prompt)
    p.propose(["r"])  # a pending draft to score
    out = rng.integers(0, 5, emitted).astype(np.int32)
    table, pending = p.calibration_table().copy(), tuple(a.copy() for a in p.pending)
    seq = p.requests.requests["r"][1]
    cal.learn((table, p.stats.state.copy(), p.stats.kinds), pending, np.array([seq]), out,
              np.array([0, emitted]), np.empty(8, np.int64), np.empty(8, np.bool_))
    p.extend("r", out)
    assert True in resumed  # an index grew and the call went on where it stopped
    np.testing.assert_array_equal(p.calibration_table(), table)
    assert p.requests.index.sequence(seq).tolist() == prompt.tolist() + out.tolist()
    cross = p.cross.seq_of(p.output_sequence("r"))
    assert p.cross.delta.index.sequence(cross)[-emitted:].tolist() == out.tolist()
    p.requests.index.check_integrity()
    p.cross.delta.index.check_integrity()


def test_records_that_grow_are_the_ones_the_kernels_write():
    """The step kernels take the proposer's outputs and pending drafts as one
    held object: once they grow (more requests than rows), the kernels write
    the new records, and a request past the old rows keeps its draft pending
    until its tokens score it."""
    p = make(max_spec_factor=2.0)
    rows = p.pending.n.shape[0]
    ids = list(range(rows + 3))
    for i in ids:
        p.start_request(i, PATTERN + [1] + PATTERN[:3])
    assert p.pending.n.shape[0] > rows
    drafts = p.propose(ids)
    assert p.outputs.n.shape[0] >= len(ids)
    last = p.requests.requests[ids[-1]][1]
    assert last >= rows and len(drafts[-1]) > 0
    assert p.pending.n[last] == len(drafts[-1])
    assert p.pending.tokens[last, :len(drafts[-1])].tolist() == drafts[-1].token_ids.tolist()
    p.extend_batch(ids, [d.token_ids for d in drafts])
    assert p.pending.n[last] == 0  # scored, then cleared


def test_extend_batch_refuses_bad_input_before_appending_anything():
    p = make()
    p.start_request("a", [1, 2, 3])
    p.start_request("b", [1, 2, 3])
    tokens_before = p.requests.index.live_tokens
    cross_before = p.cross.tokens  # the requests' output-start anchors
    with pytest.raises(ValueError, match="-1"):
        p.extend_batch(["a", "b"], [[4, 5], [6, -1]])
    with pytest.raises(ValueError, match="unknown request"):
        p.extend_batch(["a", "zzz"], [[4], [5]])
    with pytest.raises(ValueError, match="token lists"):
        p.extend_batch(["a"], [[4], [5]])
    assert p.requests.index.live_tokens == tokens_before
    assert p.cross.tokens == cross_before


def test_namespaces_in_memory_and_a_shared_one_appearing_later():
    p = make(namespace="a", shared_namespace="s", max_spec_factor=4.0)
    p.start_request("r1", [1, 2, 3])
    p.propose(["r1"])  # caches where ("a", "s") draw from, before "s" exists
    p.start_request("w", [9], namespace="s")
    p.extend("w", PATTERN)
    p.finish_request("w")
    p.start_request("r2", PATTERN[:3])
    assert p.propose(["r2"])[0].token_ids.tolist() == PATTERN[3:]
    p.start_request("b-only", PATTERN[:3], namespace="b", draw_from=["b"])
    assert len(p.propose(["b-only"])[0]) == 0
    with pytest.raises(ValueError, match="namespace"):
        p.start_request("bad", [1], namespace="")
    assert "bad" not in p.active_requests


def test_threads_sharing_a_proposer_never_mix_requests_or_namespaces():
    import threading

    p = SuffixProposer(max_depth=8, max_spec_tokens=6, namespace="a")
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        ns = "a" if t % 2 else "b"
        base = 0 if ns == "a" else 100  # each namespace has its own token ids
        rng = np.random.default_rng(t)
        try:
            for n in range(40):
                rid = f"{t}-{n}"
                text = (base + rng.integers(0, 4, 30)).tolist()
                p.start_request(rid, text[:5], namespace=ns)
                for tok in text[5:]:
                    d = p.propose([rid])[0]
                    assert all(base <= x < base + 100 for x in d.token_ids.tolist()), (ns, d)
                    p.extend(rid, [tok])
                p.finish_request(rid)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    import sys

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors[0]
    p.requests.index.check_integrity()
    p.cross.delta.index.check_integrity()


def test_small_input_mistakes_are_refused():
    p = make()
    p.start_request("a", [1, 2])
    with pytest.raises(ValueError, match="twice"):
        p.propose(["a", "a"])
    p.start_request("b", [1, 2])
    with pytest.raises(ValueError, match="twice"):
        p.extend_batch(["a", "a"], [[3], [4]])
    with pytest.raises(ValueError, match="not the string"):
        p.start_request("c", [1], draw_from="abc")
    with pytest.raises(ValueError, match="valid text"):
        p.start_request("d", [1], namespace="\ud800")
    assert set(p.active_requests) == {"a", "b"}


@pytest.mark.parametrize("values, message", [
    ([1, -1], "holds -1, outside the token id range"),
    (np.array([3, 1 << 30], np.int64), "holds 1073741824, outside"),
    (np.array([2 ** 64 - 1], np.uint64), "holds 18446744073709551615, outside"),
    (np.array([1.0, 2.0]), "must hold integers"),
    ([[1, 2]], "must be one-dimensional"),
])
def test_bad_token_ids_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        as_token_ids(values)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.uint64])
@pytest.mark.parametrize("writeable", [True, False])
def test_token_ids_of_any_integer_type_become_int32(dtype, writeable):
    values = np.array([0, 5, (1 << 30) - 1 if np.iinfo(dtype).max >= 1 << 30 else 7], dtype)
    values.setflags(write=writeable)
    out = as_token_ids(values)
    assert out.dtype == np.int32 and out.flags.c_contiguous
    assert out.tolist() == values.astype(np.int64).tolist()


def test_adopted_drafts_are_pending_row_by_row_and_the_rest_untouched():
    """``adopt_drafts`` (the device's drafts, scored by ``extend``): each
    request's first ``n`` tokens, buckets and a path's parents; what lies past
    ``n`` stays as it was; an unknown request is refused before anything changes."""
    rng = np.random.default_rng(5)
    prop = SuffixProposer(max_depth=8, max_spec_tokens=6)
    ids = [f"r{i}" for i in range(7)]
    for r in ids:
        prop.start_request(r, rng.integers(0, 50, 20))
    pend = prop._pending
    before = (pend.tokens.copy(), pend.buckets.copy(), pend.parents.copy())
    k = pend.tokens.shape[1]
    tokens = rng.integers(0, 50, (len(ids), k)).astype(np.int32)
    buckets = rng.integers(0, 900, (len(ids), k)).astype(np.int32)
    n = rng.integers(0, k + 3, len(ids))
    prop.adopt_drafts(ids, tokens, buckets, n)
    for i, r in enumerate(ids):
        seq = prop.requests.requests[r][1]
        m = min(int(n[i]), k)
        assert pend.n[seq] == m
        assert pend.tokens[seq, :m].tolist() == tokens[i, :m].tolist()
        assert pend.buckets[seq, :m].tolist() == buckets[i, :m].tolist()
        assert pend.parents[seq, :m].tolist() == list(range(-1, m - 1))
        assert pend.tokens[seq, m:].tolist() == before[0][seq, m:].tolist()
        assert pend.buckets[seq, m:].tolist() == before[1][seq, m:].tolist()
        assert pend.parents[seq, m:].tolist() == before[2][seq, m:].tolist()
    snapshot = pend.n.copy()
    with pytest.raises(ValueError, match="unknown request"):
        prop.adopt_drafts(["r0", "nobody"], tokens[:2], buckets[:2], np.array([1, 1]))
    assert pend.n.tolist() == snapshot.tolist()


def _serve(p: SuffixProposer, outputs: dict, namespaces: dict, batched: bool,
           order=None) -> list:
    """Run requests to their recorded ``outputs`` as an engine would, all in
    flight together, in one batch or one at a time (in ``order``, a sort
    key); returns every step's drafts (token lists) by (step, request)."""
    for req in outputs:
        p.start_request(req, outputs[req][:4], namespace=namespaces[req])
    at = dict.fromkeys(outputs, 4)
    seen = {}
    step = 0
    while at:
        step += 1
        reqs = list(at) if order is None else sorted(at, key=order)
        drafts = (p.propose(reqs) if batched else [p.propose([r])[0] for r in reqs])
        emitted = []
        for req, d in zip(reqs, drafts):
            truth = outputs[req][at[req]:]
            ok = 0
            while ok < min(len(d), len(truth) - 1) and d.token_ids[ok] == truth[ok]:
                ok += 1
            emitted.append(truth[:ok + 1])
            seen[step, req] = d.token_ids.tolist()
        if batched:
            p.extend_batch(reqs, emitted)
        else:
            for req, e in zip(reqs, emitted):
                p.extend(req, e)
        for req, e in zip(reqs, emitted):
            at[req] += len(e)
            if at[req] >= len(outputs[req]):
                p.finish_request(req)
                del at[req]
    return seen


def _outputs(seed: int, n: int) -> dict:
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(1, 30, size=6).tolist() for _ in range(5)]
    return {f"r{seed}-{i}": sum((phrases[j] for j in rng.integers(0, 5, size=8)), [])
            for i in range(n)}


def test_each_namespace_learns_a_calibration_table_of_its_own():
    p = make()
    outputs = _outputs(1, 3)
    _serve(p, outputs, dict.fromkeys(outputs, "a"), batched=True)
    a, default = p.calibration_table("a"), p.calibration_table()
    assert a is not default and a[:, 1].sum() > 0 and default[:, 1].sum() == 0
    assert p.calibration_table("not-seen") is default
    one = make(namespace_tables=0)  # one table for all, as before
    _serve(one, outputs, dict.fromkeys(outputs, "a"), batched=True)
    assert one.calibration_table("a") is one.calibration_table()
    np.testing.assert_array_equal(one.calibration_table(), a)


def test_namespaces_past_the_table_limit_share_the_proposers_table():
    p = make(namespace_tables=1)
    outputs = _outputs(2, 3)
    _serve(p, outputs, dict(zip(outputs, ["a", "b", "a"])), batched=True)
    assert p.calibration_table("a") is not p.calibration_table()
    assert p.calibration_table("b") is p.calibration_table()
    assert p.calibration_table()[:, 1].sum() > 0  # b's drafts learned in it
    with pytest.raises(ValueError, match="namespace_tables"):
        make(namespace_tables=-1)


def test_a_batch_across_tables_drafts_and_learns_as_its_requests_one_at_a_time():
    outputs = {**_outputs(3, 3), **_outputs(4, 3)}
    names = dict(zip(outputs, ["a", "b", None, "a", "b", None]))
    together, apart = make(draft_cost=0.01), make(draft_cost=0.01)
    # A batch is drafted and learned table by table (the proposer's first,
    # then in the order namespaces got one): the same order one at a time.
    by_table = {None: 0, "a": 1, "b": 2}
    for rounds in range(2):  # the second round drafts with what the first learned
        got = _serve(together, outputs, names, batched=True)
        one_by_one = _serve(apart, outputs, names, batched=False,
                            order=lambda r, names=names: by_table[names[r]])
        assert got == one_by_one
        outputs = {f"{k}+": v for k, v in outputs.items()}
        names = {f"{k}+": v for k, v in names.items()}
    assert sum(len(d) for d in got.values()) > 0
    for ns in ("a", "b", None):
        np.testing.assert_array_equal(together.calibration_table(ns), apart.calibration_table(ns))


def test_candidate_windows_across_tables_are_each_requests_own():
    from suffixspec.native import layout as lay

    p = make(draft_cost=0.01)
    outputs = _outputs(5, 4)
    names = dict(zip(outputs, ["a", None, "a", None]))
    _serve(p, outputs, names, batched=True)  # each table learns from its namespace
    for (req, ns), output in zip((("x", "a"), ("y", None), ("z", "a")), outputs.values()):
        p.start_request(req, output[:10], namespace=ns)
    together = lay.windows(3, 8, 16)
    counts = p.candidate_windows(["x", "y", "z"], together)
    assert counts.sum() > 0
    for i, req in enumerate(["x", "y", "z"]):
        alone = lay.windows(1, 8, 16)
        assert p.candidate_windows([req], alone).tolist() == [counts[i]]
        for whole, one in zip(together, alone):
            np.testing.assert_array_equal(whole[i], one[0])
