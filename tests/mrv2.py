"""MRV2's side of a step, for the speculators' tests: requests in vLLM's own
``RequestState`` slots, tokens emitted, ``propose`` called as the runner does."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch


class Engine:
    """MRV2's side of the step: requests in RequestState slots, tokens emitted."""

    def __init__(self, speculator):
        self.spec, self.states = speculator, speculator.req_states
        self.reqs: list[str] = []
        self.sampled: dict[str, int] = {}

    def add(self, req: str, prompt: list[int]) -> None:
        self.states.add_request(req, len(prompt), prompt, 0, 100)
        slot = self.states.req_id_to_index[req]  # what the staged writes would do
        self.states.all_token_ids.gpu[slot, :len(prompt)] = torch.tensor(prompt)
        self.states.total_len.gpu[slot] = len(prompt)
        self.reqs.append(req)
        self.sampled[req] = 1

    def emit(self, req: str, tokens: list[int], accepted: int | None = None) -> None:
        """``tokens`` emitted this step: ``accepted`` drafted ones and its own
        (default: all but the last were drafted)."""
        slot = self.states.req_id_to_index[req]
        n = int(self.states.total_len.gpu[slot])
        self.states.all_token_ids.gpu[slot, n:n + len(tokens)] = torch.tensor(tokens)
        self.states.total_len.gpu[slot] = n + len(tokens)
        self.sampled[req] = len(tokens) if accepted is None else accepted + 1

    def step(self):
        n = len(self.reqs)
        slots = np.array([self.states.req_id_to_index[r] for r in self.reqs], np.intp)
        batch = SimpleNamespace(req_ids=list(self.reqs), num_reqs=n,
                                idx_mapping=torch.tensor(slots, dtype=torch.int64),
                                idx_mapping_np=slots)
        sampled = torch.tensor([self.sampled[r] for r in self.reqs], dtype=torch.int32)
        rejected = torch.zeros(n, dtype=torch.int32)
        drafts = self.spec.propose(batch, None, None, None, None, sampled, rejected, None, None,
                                   None, None)
        return drafts.clone(), self.spec.draft_token_confidence_probs[:n].clone()

    def finish(self, req: str) -> None:
        self.spec.on_requests_finished([req])
        self.states.remove_request(req)
        self.reqs.remove(req)
