"""The replay engine ``suffixspec-device``: serving's device drafter, on recorded traffic.

``DeviceWindowsProposer`` puts the proposer protocol (``start_request``,
``propose``, ``extend``, ``finish_request``) in front of the very
``DeviceDrafter`` that vLLM's speculator drives (``device.drafter``), on CPU
tensors, its feeder in lockstep (``threaded=False``: the feeder's work on a
step is done when the next step asks for it, as a feeder that keeps up
does).  So replay drafts as serving does: windows one step old, the
calibration table and the pool's device tiers as the payloads bring them,
every draft scored by the host policy one step later.  What staleness costs
against drafting on the host shows before any kernel or engine work
(``bench/device_gate.py``).

A ``step_cost`` with ``admit`` (a GPU ``Roofline``) also cuts each step's
drafts to what it admits for the whole batch (``fit.fit_batch``): a model of
a fit serving does not make, for ``bench/gpu_bench.py``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Hashable, Sequence

import numpy as np
import torch

from suffixspec.device.draft_ref import (FROM_CORPUS, FROM_FAMILY, FROM_LIVE, FROM_SCAN,
                                         FROM_SHORT, StepOutputs)
from suffixspec.device.drafter import DeviceDrafter
from suffixspec.device.fit import fit_batch
from suffixspec.draft import Draft
from suffixspec.native import calibration as cal
from suffixspec.native.warmup import warmup
from suffixspec.proposer import SuffixProposer
from suffixspec.tokens import as_token_ids


#: The token ids replay's drafts may hold (every shared trace's tokenizer has fewer).
VOCAB = 1 << 18


class HostRequests:
    """Requests' tokens in slots of CPU tensors, as vLLM's ``RequestState``
    holds them (the fields ``DeviceDrafter`` reads); rows grow as needed."""

    def __init__(self, slots: int, max_len: int):
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros(slots, max_len, dtype=torch.int32))
        self.total_len = SimpleNamespace(gpu=torch.zeros(slots, dtype=torch.int32))
        self.prompt_len = SimpleNamespace(np=np.zeros(slots, np.int32))
        self.prefill_len = SimpleNamespace(np=np.zeros(slots, np.int32))
        self.req_id_to_index: dict[Hashable, int] = {}
        self.free = list(range(slots))  # taken from the end, as vLLM's

    def add(self, req_id, prompt: np.ndarray) -> int:
        if not self.free:
            raise ValueError(f"more requests in flight than the {len(self.prompt_len.np)} "
                             f"slots of suffixspec-device (its slots setting)")
        slot = self.free.pop()
        self.req_id_to_index[req_id] = slot
        self.prompt_len.np[slot] = self.prefill_len.np[slot] = prompt.shape[0]
        self.total_len.gpu[slot] = 0
        self.append(slot, prompt)
        return slot

    def append(self, slot: int, tokens: np.ndarray) -> bool:
        """``tokens`` after the row's; True when the rows had to grow (moved)."""
        rows = self.all_token_ids.gpu
        n = int(self.total_len.gpu[slot])
        need = n + tokens.shape[0]
        grown = need > rows.shape[1]
        if grown:
            wider = torch.zeros(rows.shape[0], max(2 * rows.shape[1], need), dtype=rows.dtype)
            wider[:, :rows.shape[1]] = rows
            self.all_token_ids.gpu = rows = wider
        rows[slot, n:need] = torch.from_numpy(tokens)
        self.total_len.gpu[slot] = need
        return grown

    def remove(self, req_id) -> None:
        self.free.append(self.req_id_to_index.pop(req_id))


class DeviceWindowsProposer:
    """Drafts as serving's ``DeviceDrafter`` does, behind the proposer protocol.

    ``slots``: requests in flight at most; ``max_len``: the rows' first length
    (they grow); ``corpus_tokens``: the device corpus tier (0: none);
    ``vocab_size``: the one-token paths' table (0: none); ``branch_points``:
    branch windows per request; ``arbiter``, ``family``, ``live``: the
    device's options (``SUFFIXSPEC_DEVICE_ARBITER``, the family rows, the
    open outputs); ``host``: the host policy (else a ``SuffixProposer`` of the
    remaining settings).
    """

    def __init__(self, slots: int = 256, max_len: int = 4096, corpus_tokens: int = 1 << 20,
                 vocab_size: int = 1 << 18, branch_points: int = 4, arbiter: bool = True,
                 family: bool = True, live: bool = True, host: SuffixProposer | None = None,
                 **settings):
        self.host = SuffixProposer(**settings) if host is None else host
        warmup(steps=("windows",))
        self.max_spec_tokens = k = self.host.max_spec_tokens
        self.states = HostRequests(slots, max_len)
        self.drafter = DeviceDrafter(self.host.config, self.states, k=k,
                                     vocab_size=VOCAB, slots=slots, max_len=1 << 30,
                                     device="cpu", corpus_tokens=corpus_tokens,
                                     arbiter=arbiter, live=live, family=family,
                                     one_token_paths=vocab_size > 0, threaded=False,
                                     fit=self._fit, branch_points=branch_points)
        self.drafter.ready(self.host)
        self._emitted: dict[Hashable, int] = {}
        self.counts = dict.fromkeys(("window", "scan", "corpus", "live", "short", "family",
                                     "none"), 0)

    @property
    def step_cost(self):
        return self.host.step_cost

    @step_cost.setter
    def step_cost(self, cost) -> None:
        self.host.step_cost = cost

    def _fit(self, out: StepOutputs) -> None:
        roofline = self.host.step_cost
        if getattr(roofline, "admit", None) is not None:
            fit_batch(out, roofline)

    # ------------------------------------------------------------ lifecycle
    def start_request(self, req_id, prompt_token_ids, anchors=None) -> None:
        """``anchors`` are not used: serving has none from a trace."""
        prompt = as_token_ids(prompt_token_ids)
        slot = self.states.add(req_id, prompt)
        self.drafter.rebind()
        self.drafter.add(req_id, slot, prompt.shape[0])
        self._emitted[req_id] = 1

    def extend(self, req_id, token_ids) -> None:
        tokens = as_token_ids(token_ids)
        if self.states.append(self.states.req_id_to_index[req_id], tokens):
            self.drafter.rebind()
        self._emitted[req_id] = max(tokens.shape[0], 1)

    def finish_request(self, req_id) -> None:
        self.drafter.finish([req_id])
        self._release(req_id)

    def abort_request(self, req_id) -> None:
        self._release(req_id)
        self.drafter.finish([req_id])  # no slot left: forgotten, not learned

    def _release(self, req_id) -> None:
        self.states.remove(req_id)
        del self._emitted[req_id]

    def index_memory(self):
        return self.host.index_memory()

    def close(self) -> None:
        self.drafter.close()

    # ------------------------------------------------------------- drafting
    def propose(self, req_ids: Sequence[Hashable], max_spec_tokens: int | None = None
                ) -> list[Draft]:
        b = len(req_ids)
        if b == 0:
            return []
        if getattr(self.host.step_cost, "admit", None) is not None:
            # Candidates as long as they go; the fit prices the batch.
            self.host.stats.state[cal.ST_COST] = 0.0
        slots = np.array([self.states.req_id_to_index[r] for r in req_ids], np.int64)
        sampled = torch.as_tensor([self._emitted[r] for r in req_ids], dtype=torch.int64)
        out = self.drafter.step(list(req_ids), torch.from_numpy(slots), slots, sampled,
                                limit=max_spec_tokens)
        n = out.num_valid.numpy().astype(np.int64)
        tokens = out.drafts.numpy().astype(np.int32)
        probs, choice, match = out.probs.numpy(), out.choice.numpy(), out.match.numpy()
        drafts = []
        for i in range(b):
            m = int(n[i])
            kind = ("none" if m == 0 else "scan" if choice[i] == FROM_SCAN
                    else "corpus" if choice[i] == FROM_CORPUS
                    else "short" if choice[i] == FROM_SHORT
                    else "family" if choice[i] == FROM_FAMILY
                    else "live" if choice[i] == FROM_LIVE else "window")
            self.counts[kind] += 1
            if m == 0:
                drafts.append(Draft(match_len=int(match[i])))
                continue
            p = probs[i, :m].copy()
            drafts.append(Draft(tokens[i, :m].copy(), np.arange(-1, m - 1, dtype=np.int32), p,
                                float(p.sum()), int(match[i]), kind))
        return drafts
