"""Replay through a fleet: several replicas serving one stream of requests.

Requests arrive in order and go round robin to ``replicas`` engines (a
session's turns all go to the replica of its first turn, as a sticky router
keeps an agent's conversation on one server).  Two ways to serve them:

* one at a time (``busy=False``): each request is served whole, in arrival
  order, on its replica, so every request comes after every earlier one
  finished, wherever it ran: what changes with the number of replicas is
  only where the history is (a shared pool file holds all of it, a
  per-process cache its replica's share);
* all busy (``busy=True``): each replica serves one request at a time and
  the replicas run in lockstep, one step each per tick; what one replica
  finishes at a tick is there for the others from then on, while ``replicas``
  requests are in flight (so a request no longer sees the ones that overlap it).

``restart_every`` closes a replica's proposer and opens a new one after
every that many requests it served (a restart, or a redeploy).
``settle(proposer)``, called after a request finishes and before one
starts, makes what was finished visible as it would be in a served fleet,
where a commit reaches the other replicas in milliseconds and a request
lasts seconds (replay compresses the seconds, not the milliseconds).

Counts are the harness's (``ReplayResult``): a step of a request drafts, the
longest matching draft prefix is accepted, one more token is emitted.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Hashable

from suffixspec.draft import Proposer
from suffixspec.replay.harness import ReplayResult, accepted_length
from suffixspec.replay.traces import Request


def route(requests: list[Request], replicas: int) -> list[list[Request]]:
    """Each replica's requests, in arrival order: round robin by session
    (a request without one is its own session)."""
    home: dict[Hashable, int] = {}
    queues: list[list[Request]] = [[] for _ in range(replicas)]
    turn = 0
    for req in requests:
        key = req.session if req.session is not None else ("request", req.req_id)
        if key not in home:
            home[key] = turn % replicas
            turn += 1
        queues[home[key]].append(req)
    return queues


def replay_fleet(requests: list[Request], replicas: int, make: Callable[[int], Proposer],
                 restart_every: int | None = None, busy: bool = False,
                 settle: Callable[[Proposer], None] | None = None) -> ReplayResult:
    """Replay ``requests`` through ``replicas`` proposers made by ``make(replica)``
    (called again at each restart), one at a time or all busy (see the
    module); returns the counts over the whole fleet."""
    if replicas < 1:
        raise ValueError("a fleet needs at least one replica")
    res = ReplayResult()
    queues = route(requests, replicas)
    proposers = [make(r) for r in range(replicas)]
    served = [0] * replicas

    def start(r: int, req: Request) -> list:
        if restart_every and served[r] and served[r] % restart_every == 0:
            _close(proposers[r])
            proposers[r] = make(r)
        served[r] += 1
        res.requests += 1
        res.output_tokens += req.output.shape[0]
        if settle is not None:
            settle(proposers[r])
        proposers[r].start_request(req.req_id, req.prompt)
        return [req, 0]

    def finish(r: int, req: Request) -> None:
        proposers[r].finish_request(req.req_id)
        if settle is not None:
            settle(proposers[r])

    try:
        if not busy:
            replica = {id(req): r for r, queue in enumerate(queues) for req in queue}
            for req in requests:
                r = replica[id(req)]
                entry = start(r, req)
                while entry[1] < req.output.shape[0]:
                    _step(proposers[r], entry, res)
                finish(r, req)
            return res
        pending = [deque(q) for q in queues]
        active: list[list | None] = [None] * replicas  # [request, position]
        while True:
            working = False
            for r in range(replicas):
                if active[r] is None:
                    if not pending[r]:
                        continue
                    active[r] = start(r, pending[r].popleft())
                working = True
                _step(proposers[r], active[r], res)
                req, pos = active[r]
                if pos >= req.output.shape[0]:
                    finish(r, req)
                    active[r] = None
            if not working:
                return res
    finally:
        for p in proposers:
            _close(p)


def _step(proposer: Proposer, entry: list, res: ReplayResult) -> None:
    req, pos = entry
    target = req.output[pos:]
    if target.shape[0] == 0:
        return
    draft = proposer.propose([req.req_id])[0]
    acc = accepted_length(draft, target)
    res.steps += 1
    res.drafted += len(draft)
    res.accepted += acc
    if len(draft) == 0:
        res.no_draft += 1
    emit = target[:acc + 1]
    proposer.extend(req.req_id, emit)
    entry[1] = pos + emit.shape[0]


def _close(proposer: Proposer) -> None:
    close = getattr(proposer, "close", None)
    if close is not None:
        close()
