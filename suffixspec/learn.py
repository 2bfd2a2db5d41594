"""What a live pool learns, learned from logs: serve the newest logged requests.

A pool that served its requests live holds, beside their outputs, the
calibration table its proposer learned by drafting for them (how often a
draft of each kind was right).  A pool built by ``ingest`` from logs has the
outputs only.  ``calibrate`` closes the gap: ``ingest`` holds back the newest
logged requests (``hold_back``), and they are served here, in log order,
against the pool the rest built, by a proposer as an engine would run it.
Their outputs are committed as a live engine commits them, and the table it
learned is kept in the pool for the engines that open it next.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from suffixspec.anchors import start_anchors
from suffixspec.fingerprint import TokenizerId
from suffixspec.pools.store import PoolStore
from suffixspec.proposer import SuffixProposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import Request


def calibrate(pool: str | Path, tokenizer: TokenizerId, max_depth: int,
              held: list[tuple[np.ndarray, np.ndarray, str]]) -> dict:
    """Serve ``held`` (``(prompt, output, namespace)`` token arrays, oldest first)
    against ``pool``; returns the replay's figures for them."""
    if not held:
        return {}
    namespaces = {ns for _, _, ns in held}
    if len(namespaces) > 1:
        raise ValueError(f"held-back requests of several namespaces: {sorted(namespaces)}")
    requests = [Request(request_id(i), prompt, output)
                for i, (prompt, output, _) in enumerate(held)]
    with SuffixProposer(pool=pool, tokenizer=tokenizer, max_depth=max_depth,
                        namespace=namespaces.pop()) as proposer:
        result = replay(requests, proposer)
    m = result.metrics()
    return {"requests": m["requests"], "mean_tokens_per_step": m["mean_tokens_per_step"],
            "drafted_per_step": m["drafted_per_step"]}


def request_id(i: int) -> str:
    return f"log-{i}"


def commit_rest(pool: str | Path, held: list[tuple[np.ndarray, np.ndarray, str]]) -> int:
    """Commit what ``calibrate`` did not (it failed part way), as it would
    have; returns how many."""
    with PoolStore(pool) as store:
        done = {s.request_id for s in store.sequences()}
        rest = [(np.concatenate([start_anchors(prompt), output]), ns, "ingest", request_id(i))
                for i, (prompt, output, ns) in enumerate(held) if request_id(i) not in done]
        if rest:
            store.add_many(rest)
    return len(rest)
