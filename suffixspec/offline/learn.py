"""What a live pool learns, learned from logs: serve the newest logged requests.

A pool that served its requests live holds, beside their outputs, the
calibration table its proposer learned by drafting for them (how often a
draft of each kind was right).  A pool built by ``ingest`` from logs has the
outputs only.  ``learn`` closes the gap: ``ingest`` holds back the newest
logged requests (``hold_back``), and they are served here, in log order,
against the pool the rest built, by a proposer as an engine would run it.
Their outputs are committed as a live engine commits them, and the table it
learned is kept in the pool for the engines that open it next.

Nothing held back is lost or stored twice, whatever stops the run:

* the held-back requests are written to ``<pool>.learning`` (``keep``)
  before ingestion commits its last batch, and the file goes only once
  every one of them is stored;
* ``recover`` (the offline commands call it first; a server never does)
  stores what a killed run left in that file;
* a held-back request the pool holds already (``pools.identity``) is not
  served again, and a failed calibration stores the rest as they are.

Each request is served with the newest ``ingest.HELD_PROMPT_TOKENS`` of its
prompt and the anchors of the whole, so learning costs time and memory
linear in the log however long its conversations grow.  The table learned
so reflects prompts cut to that length, where a live server sees them whole.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import numpy as np

from suffixspec.config import NO_REFRESH
from suffixspec.fingerprint import TokenizerId
from suffixspec.offline.ingest import Held
from suffixspec.pools import files
from suffixspec.pools.identity import StoredRecords
from suffixspec.pools.store import PoolStore
from suffixspec.proposer import SuffixProposer
from suffixspec.replay.harness import replay
from suffixspec.replay.traces import Request


def learning_file(pool: str | Path) -> Path:
    """Where a pool's held-back requests wait while they are served."""
    pool = Path(pool)
    return pool.with_name(pool.name + ".learning")


def keep(pool: str | Path, held: list[Held]) -> None:
    """Write ``held`` to the pool's learning file, durably (written whole or not at all)."""
    path = learning_file(pool)
    tmp = path.with_name(path.name + ".tmp")
    records = [[h.prompt.astype("<i4").tobytes(), h.anchors.astype("<i4").tobytes(),
                h.output.astype("<i4").tobytes(), h.namespace, h.request_id] for h in held]
    with open(tmp, "wb") as f:
        f.write(msgpack.packb({"held": records}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    files.sync_folder(path.parent)


def _load(path: Path) -> list[Held]:
    raw = msgpack.unpackb(path.read_bytes())
    return [Held(*(np.frombuffer(b, "<i4").astype(np.int32) for b in r[:3]), r[3], r[4])
            for r in raw["held"]]


def recover(pool: str | Path) -> int:
    """Store what a killed ``learn`` left in the pool's learning file; returns how many."""
    path = learning_file(pool)
    if not path.exists() or not Path(pool).exists():
        return 0
    n = commit_rest(pool, _load(path))
    path.unlink()
    return n


def learn(pool: str | Path, tokenizer: TokenizerId, max_depth: int,
          held: list[Held]) -> tuple[dict, str | None]:
    """Serve ``held`` against ``pool`` and store them; returns the replay's figures
    and, when calibration failed (the requests then stored as they are), why."""
    if not held:
        return {}, None
    keep(pool, held)
    with PoolStore(pool, readonly=True) as store:
        fresh = _not_stored(store, held)  # stored by an earlier run: not served again
    problem = None
    figures = {}
    try:
        figures = calibrate(pool, tokenizer, max_depth, fresh)
    except Exception as e:  # the outputs are stored whatever happens
        problem = (f"calibration not learned ({type(e).__name__}: {e}); "
                   f"{commit_rest(pool, fresh)} held-back outputs stored as they are")
    learning_file(pool).unlink(missing_ok=True)
    return figures, problem


def calibrate(pool: str | Path, tokenizer: TokenizerId, max_depth: int,
              held: list[Held]) -> dict:
    """Serve ``held`` (oldest first) against ``pool``; returns the replay's figures."""
    if not held:
        return {}
    namespaces = {h.namespace for h in held}
    if len(namespaces) > 1:
        raise ValueError(f"held-back requests of several namespaces: {sorted(namespaces)}")
    requests = [Request(h.request_id, h.prompt, h.output, anchors=h.anchors) for h in held]
    # The only writer is this proposer, whose commits it indexes itself: no
    # looks for others' commits on a timer, so what is learned never rests on
    # when one fell between two requests (two ingests of one log learn alike).
    with SuffixProposer(pool=pool, tokenizer=tokenizer, max_depth=max_depth,
                        namespace=namespaces.pop(),
                        pool_options={"refresh_interval": NO_REFRESH}) as proposer:
        result = replay(requests, proposer)
    m = result.metrics()
    return {"requests": m["requests"], "mean_tokens_per_step": m["mean_tokens_per_step"],
            "drafted_per_step": m["drafted_per_step"]}


def commit_rest(pool: str | Path, held: list[Held]) -> int:
    """Store those of ``held`` the pool does not hold yet, as a live commit
    would; returns how many."""
    with PoolStore(pool) as store:
        return len(StoredRecords(store).add_missing(
            store, [(h.stored, h.namespace, "ingest", h.request_id) for h in held]))


def _not_stored(store: PoolStore, held: list[Held]) -> list[Held]:
    """Those of ``held`` that ``store`` does not hold (each stored record counts once)."""
    stored = StoredRecords(store)
    return [h for h in held if not stored.take(h.namespace, h.request_id, h.stored)]
