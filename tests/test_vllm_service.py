"""The V1 runner's drafting service (vLLM <= 0.33), driven by a stand-in engine."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.integrations.vllm.build import build_proposer
from suffixspec.integrations.vllm.v1_runner import service as svc
from suffixspec.integrations.vllm.settings import Settings
from suffixspec.pools.store import PoolStore

VOCAB = 100


class Engine:
    """An engine's decoding requests, as a runner adapter hands them to the service."""

    def __init__(self):
        self.rows: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}
        self.verified: dict[str, int] = {}
        self.named: dict[str, object] = {}

    def add(self, req: str, prompt: list[int], named=None) -> None:
        """``named``: what the request names as its namespace (its ``vllm_xargs``)."""
        self.rows[req] = list(prompt)
        self.prompt_len[req] = len(prompt)
        self.verified[req] = 0
        self.named[req] = named

    def step(self, service: svc.DraftService, emit: dict[str, list[int]], k: int = 4):
        for req, tokens in emit.items():
            self.rows[req] += tokens
        reqs = list(self.rows)
        step = svc.Step(req_ids=reqs,
                        totals=np.array([len(self.rows[r]) for r in reqs]),
                        prompt_lens=np.array([self.prompt_len[r] for r in reqs]),
                        verified=np.array([self.verified[r] for r in reqs]),
                        tokens=lambda i, lo, hi: np.array(self.rows[reqs[i]][lo:hi], np.int32),
                        named=lambda i: self.named[reqs[i]])
        drafts = service.step(step, k, budget=1000)
        for req, draft in zip(reqs, drafts):
            self.verified[req] = 0 if draft is None else draft.shape[0]
        return dict(zip(reqs, drafts))

    def remove(self, service: svc.DraftService, req: str) -> None:
        del self.rows[req]
        del self.named[req]
        service.removed(req)


def new_service(**settings) -> svc.DraftService:
    return svc.DraftService(4, 1 << 16, VOCAB, Settings(log_interval=0, **settings),
                            measured=False)


def pooled_outputs(service: svc.DraftService, path) -> list[list[int]]:
    """Outputs in a pool file, once the service's proposer closed it."""
    service.close()
    with PoolStore(path) as store:
        return sorted(s.output.tolist() for s in store.sequences())


def test_outputs_finished_while_compiling_join_the_pool_once_ready(tmp_path):
    engine, service = Engine(), new_service()
    engine.add("a", [1, 2, 3])
    engine.add("b", [4, 5])
    engine.add("c", [6])
    assert engine.step(service, {"a": [10], "b": [20], "c": [30]}) == dict.fromkeys("abc")
    engine.step(service, {"a": [11, 12], "b": [21], "c": [31]})
    engine.remove(service, "a")
    # b's last token is taken back (the engine recomputes it): b starts over.
    engine.rows["b"] = engine.rows["b"][:3]
    engine.step(service, {"b": [], "c": [32]})
    engine.step(service, {"b": [22, 23], "c": []})
    assert service.metrics.steps_before_ready == 4
    service.ready(SuffixProposer(max_depth=8, max_spec_tokens=4, pool=tmp_path / "pool",
                                 tokenizer=BYTES))
    engine.remove(service, "b")  # the engine dropped b before the proposer's first step
    engine.step(service, {"c": [33]})  # c, still running, starts over from its tokens
    assert service.metrics.finished_before_ready == 2 and service.finished_early == []
    engine.remove(service, "c")
    # a, b and c are in the cross-request pool, each exactly its output.
    assert pooled_outputs(service, tmp_path / "pool") == [[10, 11, 12], [20, 22, 23],
                                                        [30, 31, 32, 33]]


def test_requests_running_when_the_engine_stops_before_any_draft_join_the_pool(tmp_path):
    engine, service = Engine(), new_service()
    engine.add("a", [1, 2])
    engine.step(service, {"a": [5, 6]})
    service.ready(SuffixProposer(max_depth=8, max_spec_tokens=4, pool=tmp_path / "pool",
                                 tokenizer=BYTES))
    assert pooled_outputs(service, tmp_path / "pool") == [[5, 6]]


def test_requests_past_the_early_token_budget_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(svc, "EARLY_TOKENS", 6)
    engine, service = Engine(), new_service()
    engine.add("a", [1, 2, 3])
    engine.add("b", [4, 5, 6, 7])
    engine.step(service, {"a": [10], "b": [20]})
    engine.remove(service, "a")
    engine.remove(service, "b")
    service.ready(SuffixProposer(max_depth=8, max_spec_tokens=4, pool=tmp_path / "pool",
                                 tokenizer=BYTES))
    engine.step(service, {})
    assert pooled_outputs(service, tmp_path / "pool") == [[10]]


def test_drafts_are_counted_per_pool_and_never_hold_an_id_the_model_cannot_take():
    engine, service = Engine(), new_service()
    prop = SuffixProposer(max_depth=8, max_spec_tokens=4, draft_cost=0.0)
    service.ready(prop)
    pattern = [7, 8, 9, 10, 11, 12]
    engine.add("r", pattern + pattern[:2])
    drafts = engine.step(service, {})
    assert drafts["r"].tolist() == pattern[2:6]
    # The engine accepts two of them and emits its own third token.
    engine.step(service, {"r": [9, 10, 99]})
    request = service.metrics.pools["request"]
    assert (request.drafts, request.drafted_tokens, request.accepted_tokens) == (1, 4, 2)
    # A pool shared with another model may hold ids past this one's vocabulary.
    engine.add("s", [1, 2, 150, 3, 1, 2])
    assert engine.step(service, {})["s"] is None
    assert service.stats()["active_requests"] == 2


def test_a_proposer_failure_costs_one_step_its_drafts_and_is_logged_once(caplog):
    engine, service = Engine(), new_service()
    prop = SuffixProposer(max_depth=8, max_spec_tokens=4, draft_cost=0.0)
    service.ready(prop)
    engine.add("r", [5, 6, 7, 5, 6])

    def broken(*args, **kwargs):
        raise RuntimeError("broken kernel")

    real, prop.propose = prop.propose, broken
    with caplog.at_level(logging.WARNING, logger="vllm.suffixspec"):
        assert engine.step(service, {}) == {"r": None}
        assert engine.step(service, {"r": [7]}) == {"r": None}
    assert sum("drafting failed" in r.getMessage() for r in caplog.records) == 1
    assert service.metrics.failures == 2
    prop.propose = real
    assert engine.step(service, {"r": [5]})["r"].tolist()[:2] == [6, 7]  # started over


def test_a_persistent_pool_gets_the_deployment_defaults_and_the_settings(tmp_path):
    from suffixspec.config import ProposerConfig

    config = ProposerConfig(max_depth=8)
    made = build_proposer(config, Settings(pool=str(tmp_path / "a.lmdb")), BYTES)
    assert made.cross.snapshot_every == 1 << 20 and made.cross.refresh_interval == 1.0
    made.close()
    made = build_proposer(config, Settings(pool=str(tmp_path / "b.lmdb"), snapshot_every=0,
                                               refresh_interval=0.25), BYTES)
    assert made.cross.snapshot_every is None and made.cross.refresh_interval == 0.25
    made.close()


def test_a_request_joins_and_drafts_from_the_namespace_it_names(tmp_path):
    engine, service = Engine(), new_service(request_namespaces="sql, agent")
    service.ready(SuffixProposer(max_depth=8, max_spec_tokens=4, draft_cost=0.0,
                                 pool=tmp_path / "pool", tokenizer=BYTES))
    engine.add("a", [1, 2, 3], named="sql")
    engine.step(service, {"a": [40, 41, 42, 43, 44]})
    engine.remove(service, "a")
    # The same context in each namespace: only sql's holds what followed it.
    engine.add("in-sql", [5, 40, 41], named="sql")
    engine.add("in-agent", [5, 40, 41], named="agent")
    engine.add("in-default", [5, 40, 41])
    drafts = engine.step(service, {})
    assert drafts["in-sql"].tolist()[:3] == [42, 43, 44]
    assert drafts["in-agent"] is None and drafts["in-default"] is None
    engine.step(service, {"in-agent": [50], "in-default": [60], "in-sql": [42]})
    for req in ("in-sql", "in-agent", "in-default"):
        engine.remove(service, req)
    service.close()
    with PoolStore(tmp_path / "pool") as store:
        stored = {tuple(q.output.tolist()): q.namespace for q in store.sequences()}
    assert stored == {(40, 41, 42, 43, 44): "sql", (42,): "sql", (50,): "agent",
                      (60,): "default"}


def test_a_namespace_the_server_does_not_list_is_refused_with_one_line(caplog):
    engine, service = Engine(), new_service(request_namespaces="sql")
    service.ready(SuffixProposer(max_depth=8, max_spec_tokens=4, draft_cost=0.0))
    engine.add("a", [1, 2, 3])  # the server's namespace
    engine.step(service, {"a": [40, 41, 42, 43]})
    engine.remove(service, "a")
    with caplog.at_level(logging.WARNING, logger="vllm.suffixspec"):
        for n, named in enumerate(["other", "other", 7, ["sql"]]):
            engine.add(f"r{n}", [5, 40, 41], named=named)
        drafts = engine.step(service, {})
    # Each drafts from the server's namespace, as if it had named nothing.
    assert all(drafts[f"r{n}"].tolist()[:2] == [42, 43] for n in range(4))
    refused = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
    assert len(refused) == 3 and all("'default'" in m for m in refused)


def test_request_namespaces_are_checked_when_read():
    assert Settings(request_namespaces=" sql,agent ,, ").allowed_namespaces() == {"sql", "agent"}
    assert Settings().allowed_namespaces() == frozenset()
    with pytest.raises(ValueError, match="SUFFIXSPEC_REQUEST_NAMESPACES: namespace must be"):
        Settings(request_namespaces="sql," + "x" * 200)
    env = {"SUFFIXSPEC_REQUEST_NAMESPACES": "sql,agent"}
    assert Settings.from_env(env).allowed_namespaces() == {"sql", "agent"}
