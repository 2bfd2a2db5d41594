"""Build one pool from sharded logs on a Ray cluster (``suffixspec fleet-build``).

Each log shard is ingested into a shard pool (its file and ``.snapshots``
folder) by a Ray task, all at once across the cluster; the driver then adds
the shard pools to the target pool with ``segments.add_pool`` (what
``suffixspec add-segment`` does: segment files checked and copied, nothing
indexed again).  The newest logged requests (``learn``) are held back by the
last shard's task and served against the merged pool by ``learn.learn``, as
``suffixspec ingest`` does, so the pool keeps a calibration table too.

Running it again (over the same ``work_dir``, or a task Ray retried) adds
nothing twice: a shard's ingest skips the records its pool holds already
(``pools.identity``), an unchanged shard is not added again
(``AlreadyAdded``), and held-back requests the pool holds are not served
again.

Shard pools are written under ``work_dir``, which every node and the driver
must reach (one machine, or a shared file system); the driver reads them from
there.  Ray is an optional extra: ``pip install "suffixspec[ray]"``.
"""

from __future__ import annotations

from pathlib import Path


def build_shard(log: str, out: str, tokenizer: str, namespace: str | None, max_depth: int,
                jobs: int, hold_back: int) -> tuple[str, dict, list]:
    """Ingest one log shard into the shard pool ``out`` and snapshot it; returns
    ``(out, the ingest summary, the held-back requests)``."""
    from suffixspec.fingerprint import id_and_encoder
    from suffixspec.offline.ingest import ingest
    from suffixspec.pools.segments import write_snapshot
    from suffixspec.pools.store import PoolStore

    tok, encode = id_and_encoder(tokenizer)
    with PoolStore(out, tokenizer=tok, max_depth=max_depth) as store:
        report = ingest(store, [log], encode, namespace=namespace, hold_back=hold_back)
        if report.sequences:
            write_snapshot(store, jobs=jobs)
    return out, {**report.summary(), "problems": report.problems[:100]}, report.held


def fleet_build(pool: str | Path, logs: list[str | Path], tokenizer: str | Path,
                work_dir: str | Path, namespace: str | None = None, max_depth: int = 64,
                jobs: int = 1, learn: int = 0, address: str | None = None) -> dict:
    """Ingest ``logs`` (one Ray task each) and merge them into ``pool``; returns counts.

    ``address``: the Ray cluster to join (None: the one this process is
    connected to, else a local one).  ``jobs``: processes per shard's
    snapshot build (the task asks Ray for as many CPUs).
    """
    try:
        import ray
    except ImportError:
        raise RuntimeError('fleet-build needs Ray: pip install "suffixspec[ray]"') from None
    from suffixspec.fingerprint import tokenizer_id
    from suffixspec.offline import learn as learning
    from suffixspec.pools.segments import AlreadyAdded, add_pool, write_snapshot
    from suffixspec.pools.store import PoolStore

    if not logs:
        raise ValueError("fleet-build needs at least one log shard")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    recovered = learning.recover(pool)  # what a killed run held back
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=jobs)(build_shard)
    last = len(logs) - 1
    refs = [task.remote(str(Path(log).resolve()), str((work / f"shard-{i:05d}.lmdb").resolve()),
                        str(tokenizer), namespace, max_depth, jobs, learn if i == last else 0)
            for i, log in enumerate(logs)]
    built = ray.get(refs)
    held = built[-1][2]
    added, skipped = 0, []
    with PoolStore(pool, tokenizer=tokenizer_id(tokenizer), max_depth=max_depth) as store:
        for shard, _, _ in built:
            try:
                added += add_pool(store, shard)
            except AlreadyAdded:  # a rerun over shards added before
                skipped.append(shard)
    learned, problem = learning.learn(pool, tokenizer_id(tokenizer), max_depth, held)
    if held:
        with PoolStore(pool) as store:
            write_snapshot(store, jobs=jobs)
    return {"shards": len(built), "sequences": added + len(held), "skipped": skipped,
            **({"recovered": recovered} if recovered else {}),
            **({"learn_problem": problem} if problem else {}),
            "shard_tokens": sum(s["tokens"] for _, s, _ in built),
            "problems": [p for _, s, _ in built for p in s.get("problems", [])][:100],
            **({"learned_from": learned} if learned else {})}
