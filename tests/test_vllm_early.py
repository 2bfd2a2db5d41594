"""Outputs served while the kernels compile join the pool once the proposer exists."""

from types import SimpleNamespace

import numpy as np

from suffixspec import SuffixProposer
from suffixspec.fingerprint import BYTES
from suffixspec.integrations.vllm.early import BeforeReady
from suffixspec.pools.store import PoolStore

WIDTH = 64


class Engine:
    """The fields of vLLM's input batch that the drafter reads, for a few requests."""

    def __init__(self):
        self.rows: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}

    def add(self, req: str, prompt: list[int]) -> None:
        self.rows[req] = list(prompt)
        self.prompt_len[req] = len(prompt)

    def batch(self):
        reqs = list(self.rows)
        ids = np.zeros((len(reqs), WIDTH), np.int32)
        for i, r in enumerate(reqs):
            ids[i, :len(self.rows[r])] = self.rows[r]
        return SimpleNamespace(req_ids=reqs, token_ids_cpu=ids,
                               num_tokens_no_spec=np.array([len(self.rows[r]) for r in reqs]),
                               num_prompt_tokens=np.array([self.prompt_len[r] for r in reqs]))

    def step(self, early: BeforeReady, emit: dict[str, list[int]]) -> None:
        for req, tokens in emit.items():
            self.rows[req] += tokens
        batch = self.batch()
        early.see(batch, [[1]] * len(batch.req_ids))

    def remove(self, early: BeforeReady, req: str) -> None:
        del self.rows[req]
        early.removed(req)


def pooled_outputs(early: BeforeReady, path) -> tuple[int, list[list[int]]]:
    """Hand ``early`` over to a proposer on a pool file; what the file then holds."""
    proposer = SuffixProposer(max_depth=8, max_spec_tokens=4, pool=path, tokenizer=BYTES)
    kept = early.hand_over(proposer)
    proposer.cross.close()
    with PoolStore(path) as store:
        return kept, sorted(s.output.tolist() for s in store.sequences())


def test_finished_requests_are_handed_over_with_exactly_their_output(tmp_path):
    engine, early = Engine(), BeforeReady()
    engine.add("a", [1, 2, 3])
    engine.add("b", [4, 5])
    engine.add("c", [6])
    engine.step(early, {"a": [10], "b": [20], "c": [30]})
    engine.step(early, {"a": [11, 12], "b": [21], "c": [31]})
    engine.remove(early, "a")
    # b's last token is taken back (the engine recomputes it): b starts over.
    engine.rows["b"] = engine.rows["b"][:3]
    engine.step(early, {"b": [], "c": [32]})
    engine.step(early, {"b": [22, 23], "c": []})
    engine.remove(early, "b")
    # a and b are in the cross-request pool, c (still running) is not.
    assert pooled_outputs(early, tmp_path / "pool") == (2, [[10, 11, 12], [20, 22, 23]])
    assert early.open == {} and early.finished == [] and early.tokens == 0


def test_requests_past_the_token_budget_are_not_kept(tmp_path):
    engine, early = Engine(), BeforeReady(max_tokens=6)
    engine.add("a", [1, 2, 3])
    engine.add("b", [4, 5, 6, 7])
    engine.step(early, {"a": [10], "b": [20]})
    engine.remove(early, "a")
    engine.remove(early, "b")
    assert pooled_outputs(early, tmp_path / "pool") == (1, [[10]])
