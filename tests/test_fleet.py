"""The fleet replay: routing, one-at-a-time versus busy replicas, restarts."""

from __future__ import annotations

from suffixspec import SuffixProposer
from suffixspec.pools.memory import CrossPool
from suffixspec.replay.fleet import replay_fleet, route
from suffixspec.replay.harness import replay
from suffixspec.replay.workload import default_workload


def test_a_conversation_stays_on_the_replica_of_its_first_turn():
    requests = default_workload()[:60]
    queues = route(requests, 4)
    home = {}
    for r, queue in enumerate(queues):
        for req in queue:
            assert home.setdefault(req.session, r) == r
    assert sorted(req.req_id for q in queues for req in q) == sorted(r.req_id for r in requests)
    assert len({r for r in home.values()}) == min(4, len(home))


def test_one_replica_is_the_harness_and_a_shared_pool_serves_every_replica_alike():
    requests = default_workload()[:60]
    alone = replay(requests, SuffixProposer()).metrics()
    fleet = replay_fleet(requests, 1, lambda r: SuffixProposer()).metrics()
    assert fleet["steps"] == alone["steps"] and fleet["drafted_per_step"] == \
        alone["drafted_per_step"]
    # One at a time, replicas that share one pool draft from every earlier
    # output; replicas with pools of their own only from theirs.
    pool = CrossPool(64, None)
    shared = replay_fleet(requests, 4, lambda r: SuffixProposer(pool=pool)).metrics()
    own = replay_fleet(requests, 4, lambda r: SuffixProposer()).metrics()
    assert shared["mean_tokens_per_step"] > own["mean_tokens_per_step"]
    # Busy replicas serve the same tokens.
    busy = replay_fleet(requests, 4, lambda r: SuffixProposer(), busy=True).metrics()
    assert busy["output_tokens"] == alone["output_tokens"]


def test_a_replica_restarts_after_every_that_many_requests():
    requests = default_workload()[:50]
    made = []

    def make(r):
        made.append(r)
        return SuffixProposer()

    res = replay_fleet(requests, 2, make, restart_every=10)
    per_replica = [len(q) for q in route(requests, 2)]
    assert len(made) == 2 + sum((n - 1) // 10 for n in per_replica)
    assert res.requests == 50
