"""Step cost: the online fit, the batch-aware draft cost, and replay under a cost model."""

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.replay.harness import replay
from suffixspec.replay.workload import default_workload
from suffixspec.stepcost import StepCost, StepCostEstimator


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
