"""Step cost: the online fit, the batch-aware draft cost, and replay under a cost model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixspec import SuffixProposer
from suffixspec.replay.harness import replay
from suffixspec.replay.workload import default_workload
from suffixspec.proposer import _fit
from suffixspec.stepcost import Roofline, StepCost, StepCostEstimator


def test_estimator_recovers_a_known_cost_from_noisy_step_timings():
    rng = np.random.default_rng(3)
    true = StepCost(0.027, 0.0029)  # ~27 ms a step, ~3 ms a verified token (a small CPU model)
    est = StepCostEstimator(StepCost.from_draft_cost(0.03))
    for _ in range(3000):
        tokens = int(rng.integers(1, 18)) * int(rng.integers(1, 4))
        est.observe(tokens, true.seconds(tokens) * rng.lognormal(0.0, 0.05))
    got = est.estimate()
    assert got.per_token == pytest.approx(true.per_token, rel=0.05)
    assert got.fixed == pytest.approx(true.fixed, rel=0.05)
    assert est.draft_cost(1) == pytest.approx(true.draft_cost(1), rel=0.05)


def test_estimator_follows_a_change_and_answers_with_its_prior_before_any_step():
    prior = StepCost.from_draft_cost(0.03)
    est = StepCostEstimator(prior, half_life=200)
    assert est.draft_cost(1) == pytest.approx(0.03)
    for cost in (StepCost(1.0, 0.1), StepCost(1.0, 0.01)):
        for i in range(4000):
            tokens = 1 + i % 17
            est.observe(tokens, cost.seconds(tokens))
        assert est.estimate().per_token / est.estimate().fixed == pytest.approx(
            cost.per_token / cost.fixed, rel=0.02)


def test_estimator_ignores_steps_it_cannot_use():
    est = StepCostEstimator(StepCost(1.0, 0.1))
    for tokens, seconds in ((0, 1.0), (3, 0.0), (3, float("nan")), (3, -1.0)):
        est.observe(tokens, seconds)
    assert est.steps == 0 and est.estimate() == StepCost(1.0, 0.1)


def test_batch_draft_cost_is_the_goodput_bar():
    cost = StepCost(1.0, 0.1)
    assert cost.draft_cost(1) == pytest.approx(0.1 / 1.1)
    # One more drafted token delays every request of the batch: dearer with more requests.
    assert cost.draft_cost(1) < cost.draft_cost(8) < cost.draft_cost(64) < 1.0
    with pytest.raises(ValueError, match="FIXED,PER_TOKEN"):
        StepCost.parse("0.1")
    with pytest.raises(ValueError, match="fixed > 0"):
        StepCost(0.0, 0.1)


def test_replay_prices_steps_and_drafts_for_the_cost():
    requests = default_workload()[:40]
    rows = {}
    for name, cost in (("cpu", StepCost(1.0, 0.1)), ("gpu", StepCost(1.0, 0.005))):
        prop = SuffixProposer(max_spec_tokens=16)
        prop.step_cost = cost
        res = replay(requests, prop, step_cost=cost)
        rows[name] = res.metrics()
        steps = res.steps
        # Sequential: each engine step is one request-step verifying 1 + its draft.
        assert rows[name]["tokens_per_time"] == pytest.approx(
            res.output_tokens / (cost.fixed * steps + cost.per_token * (steps + res.drafted)),
            rel=1e-3)
    # A dearer drafted token: shorter drafts.
    assert rows["cpu"]["drafted_per_step"] < rows["gpu"]["drafted_per_step"]
    assert replay(requests, SuffixProposer(max_spec_tokens=16)).metrics()["tokens_per_time"] is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, width=32), max_size=40), st.integers(1, 64),
       st.floats(0.5, 2.0), st.floats(1e-3, 0.2))
def test_roofline_admits_the_count_that_maximises_goodput(probs, batch, flat, per_token):
    roof = Roofline(flat=flat, per_token=per_token)
    probs = np.sort(np.asarray(probs, np.float64))[::-1]
    best = max(range(len(probs) + 1),
               key=lambda m: ((batch + probs[:m].sum()) / roof.seconds(batch + m), -m))
    m = roof.admit(batch, probs)
    goodput = lambda m: (batch + probs[:m].sum()) / roof.seconds(batch + m)
    assert goodput(m) == pytest.approx(goodput(best), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_batch_fit_keeps_the_likeliest_tokens_with_their_parents(data):
    b = data.draw(st.integers(1, 6))
    width = 8
    parents = np.full((b, width), -1, np.int32)
    probs = np.zeros((b, width), np.float32)
    n = np.zeros(b, np.int64)
    for i in range(b):
        n[i] = data.draw(st.integers(0, width))
        for j in range(int(n[i])):
            parents[i, j] = data.draw(st.integers(-1, j - 1))
            probs[i, j] = data.draw(st.floats(0.0, 1.0, width=32))
    budget = data.draw(st.integers(0, int(n.sum())))
    score = probs.sum(axis=1)
    keep, n_out, _ = _fit(parents, probs, n, score, lambda batch, p: budget)
    if budget == int(n.sum()):
        assert keep is None
        return
    assert keep.sum() <= budget
    for i in range(b):
        kept = np.flatnonzero(keep[i])
        assert kept.max(initial=-1) < n[i]
        for j in kept:  # a kept token's parent is kept
            assert parents[i, j] < 0 or keep[i, parents[i, j]]
        if (parents[i, :n[i]] == np.arange(-1, n[i] - 1)).all():  # a path keeps a prefix
            assert n_out[i] == keep[i].sum() and keep[i, :n_out[i]].all()
    # Nothing dropped that beats a kept token, unless its parent went.
    chosen = [(probs[i, j], i, j) for i in range(b) for j in range(n[i])]
    bar = sorted(chosen, key=lambda t: -t[0])[budget - 1][0] if budget else np.inf
    for p, i, j in chosen:
        if p > bar and not keep[i, j]:
            k = parents[i, j]
            while k >= 0 and keep[i, k]:
                k = parents[i, k]
            assert k >= 0  # some ancestor was dropped


def test_a_roofline_batch_fit_cuts_drafts_and_raises_goodput():
    requests = default_workload()[:40]
    roof = Roofline(flat=1.0, per_token=1.0 / 40)  # ridge: 40 verified tokens
    fitted = SuffixProposer(max_spec_tokens=16)
    fitted.step_cost = roof
    res = replay(requests, fitted, concurrency=8, step_cost=roof)
    free = SuffixProposer(max_spec_tokens=16)
    free.step_cost = Roofline(flat=1.0, per_token=1e-6)  # every token free: no cut
    unfitted = replay(requests, free, concurrency=8, step_cost=roof)
    assert res.drafted < unfitted.drafted
    assert res.metrics()["tokens_per_time"] > unfitted.metrics()["tokens_per_time"]
