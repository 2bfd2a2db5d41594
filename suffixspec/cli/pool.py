"""Pool commands: ``ingest``, ``stats``, ``prune``, ``forget``, ``export``, ``snapshot``,
``add-segment``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
from tqdm import tqdm

from suffixspec.cli.common import load_tokenizer, open_pool, parse_duration
from suffixspec.offline.ingest import FORMATS, export_tokenizer, ingest
from suffixspec.pools.store import PoolError, PoolStore

#: Logged requests ``ingest`` serves to learn the calibration (``--learn``).
LEARN_FROM = 256

_POOL = click.argument("pool", type=click.Path(dir_okay=False))


def _store(path: str, **kw) -> PoolStore:
    if kw.get("tokenizer") is None and not Path(path).exists():
        raise click.ClickException(f"no pool at {path}")
    try:
        return PoolStore(path, **kw)
    except PoolError as e:
        raise click.ClickException(str(e)) from e


def _snapshot_with_progress(store: PoolStore, jobs: int) -> int:
    """Bring ``store``'s snapshot segments up to date with a progress bar on stderr
    (tokens indexed) once it takes a second."""
    from suffixspec.pools.segments import write_snapshot

    with tqdm(desc="snapshot", unit="tok", unit_scale=True, file=sys.stderr, delay=1) as bar:
        return write_snapshot(store, jobs=jobs, progress=bar.update)


#: Snapshot builders by default: every core, up to 8 (each holds the segment's
#: token file, 4 bytes a token, and one partition's index).
DEFAULT_JOBS = max(1, min(os.cpu_count() or 1, 8))

_JOBS = click.option("--jobs", type=click.IntRange(1, 256), default=DEFAULT_JOBS,
                     show_default="every core, up to 8",
                     help="Processes that build each snapshot segment.")


def _emit(obj: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(obj))
    else:
        width = max(len(k) for k in obj)
        for k, v in obj.items():
            click.echo(f"{k.ljust(width)}  {json.dumps(v) if isinstance(v, (dict, list)) else v}")


@click.command(name="ingest")
@_POOL
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", type=click.Path(exists=True),
              help="tokenizer.json or a model folder holding one (not needed for export files).")
@click.option("--namespace",
              help="Namespace the sequences join (default: \"default\"; exported records "
                   "keep the namespace the file names unless this is given).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="auto", show_default=True,
              help="Input format; auto decides per file from its first record.")
@click.option("--role", "roles", multiple=True, default=("assistant",), show_default=True,
              help="openai-chat roles to ingest (repeatable).")
@click.option("--include-prompts", is_flag=True, help="trace format: also ingest prompts.")
@click.option("--strict", is_flag=True, help="Stop at the first bad line (what came before stays).")
@click.option("--max-depth", type=click.IntRange(2, 1024), default=64, show_default=True,
              help="Index depth, when the pool is created.")
@click.option("--learn", type=click.IntRange(0), default=LEARN_FROM, show_default=True,
              help="Serve the last N logged requests (trace format, with prompts) against "
                   "the pool the rest built, so the pool keeps the calibration a live server "
                   "would have learned; 0: off.")
@click.option("--no-snapshot", is_flag=True, help="Skip writing the index snapshot at the end.")
@_JOBS
@click.option("--json", "as_json", is_flag=True, help="Summary as JSON on stdout.")
def ingest_cmd(pool, files, tokenizer, namespace, fmt, roles, include_prompts, strict, max_depth,
               learn, no_snapshot, jobs, as_json):
    """Add the outputs in FILES to POOL (created if missing).

    \b
    Example:
      suffixspec ingest pool.lmdb ../shared/data/traces/sql_spider_bird.jsonl.gz \\
          --tokenizer ../shared/tokenizers/qwen --namespace sql
    """
    tok, encode = load_tokenizer(tokenizer) if tokenizer else (None, None)
    depth = max_depth if tok else None
    if tok is None and not Path(pool).exists():
        # A new pool from export files takes the tokenizer and depth they name.
        named = export_tokenizer(files)
        if named is None:
            raise click.UsageError(f"no pool at {pool}; creating one from logs needs "
                                   f"--tokenizer (export files name their own)")
        tok, depth = named
    from suffixspec.offline import learn as learning

    t0 = time.perf_counter()
    recovered = learning.recover(pool)  # what a killed run held back
    with _store(pool, tokenizer=tok, max_depth=depth) as store:
        try:
            with tqdm(desc="ingest", unit="tok", unit_scale=True, file=sys.stderr,
                      delay=1) as bar:
                report = ingest(store, list(files), encode, namespace=namespace, fmt=fmt,
                                roles=tuple(roles), include_prompts=include_prompts,
                                strict=strict, progress=bar.update,
                                warn=lambda m: tqdm.write(m, file=sys.stderr),
                                hold_back=learn if tok is not None else 0,
                                keep_held=lambda held: learning.keep(pool, held))
            depth = store.max_depth
            snapshot_s = 0.0
            if not no_snapshot and report.sequences:
                # Before learning: the held-back requests draft from the pool
                # as engines opening it will (its segments).
                t1 = time.perf_counter()
                _snapshot_with_progress(store, jobs)
                snapshot_s = time.perf_counter() - t1
        except (PoolError, ValueError) as e:
            raise click.ClickException(str(e)) from e
    learned = {}
    if report.held:
        t1 = time.perf_counter()
        learned, problem = learning.learn(pool, tok, depth, report.held)
        if problem is not None:
            click.echo(f"ingest: {problem}", err=True)
        elif learned:
            learned["learn_s"] = round(time.perf_counter() - t1, 3)
        report.sequences += len(report.held)
        report.tokens += sum(h.output.shape[0] for h in report.held)
        if not no_snapshot:
            with _store(pool) as store:
                t1 = time.perf_counter()
                _snapshot_with_progress(store, jobs)
                snapshot_s += time.perf_counter() - t1
    summary = {**report.summary(), **({"learned_from": learned} if learned else {}),
               **({"recovered": recovered} if recovered else {}),
               "snapshot_s": round(snapshot_s, 3), "wall_s": round(time.perf_counter() - t0, 3)}
    _emit(summary, as_json)
    if report.stopped:
        raise click.ClickException(f"stopped at a bad line (--strict): {report.stopped}")


@click.command(name="stats")
@_POOL
@click.option("--json", "as_json", is_flag=True, help="As JSON on stdout.")
def stats_cmd(pool, as_json):
    """Sequences, tokens, namespaces, size on disk, tokenizer and snapshot age of POOL.

    \b
    Example:
      suffixspec stats pool.lmdb --json
    """
    with _store(pool, readonly=True) as store:
        _emit(store.stats(), as_json)


@click.command(name="prune")
@_POOL
@click.option("--max-tokens", type=click.IntRange(0), help="Keep at most this many tokens "
              "(oldest deleted first).")
@click.option("--older-than", help="Delete sequences older than this (7d, 12h, 30m, 45s).")
@click.option("--namespace", help="Only within this namespace.")
@click.option("--json", "as_json", is_flag=True, help="Result as JSON on stdout.")
def prune_cmd(pool, max_tokens, older_than, namespace, as_json):
    """Delete the oldest sequences of POOL beyond a budget, or older than an age.

    \b
    Example:
      suffixspec prune pool.lmdb --max-tokens 10000000 --older-than 7d
    """
    if max_tokens is None and older_than is None:
        raise click.UsageError("give --max-tokens and/or --older-than")
    age = parse_duration(older_than) if older_than else None
    with open_pool(pool, recover=True) as p:
        deleted = p.prune(max_tokens=max_tokens, older_than=age, namespace=namespace)
        _emit({"deleted": deleted, "tokens": p.tokens}, as_json)


@click.command(name="forget")
@_POOL
@click.option("--request-id", help="Delete this request's sequences.")
@click.option("--namespace", help="Delete every sequence of this namespace.")
@click.option("--json", "as_json", is_flag=True, help="Result as JSON on stdout.")
def forget_cmd(pool, request_id, namespace, as_json):
    """Delete data from POOL for real: the file is compacted so the tokens are gone.

    \b
    Examples:
      suffixspec forget pool.lmdb --request-id chat-123
      suffixspec forget pool.lmdb --namespace tenant-a
    """
    if (request_id is None) == (namespace is None):
        raise click.UsageError("give exactly one of --request-id and --namespace")
    from suffixspec.offline import learn as learning

    try:  # what a killed `ingest --learn` held back is stored first, then forgotten with the rest
        learning.recover(pool)
    except PoolError as e:
        raise click.ClickException(str(e)) from e
    with open_pool(pool, recover=True) as p:
        deleted = p.forget(request_id=request_id, namespace=namespace)
        _emit({"deleted": deleted, "tokens": p.tokens, "compacted": p.compacted}, as_json)
        if not p.compacted:
            click.echo("warning: other processes kept the pool open, so the file is not "
                       "compacted yet: no process drafts the forgotten tokens, but they stay "
                       "in free pages on disk until `suffixspec snapshot` (or the next "
                       "forget) can compact it", err=True)


@click.command(name="export")
@_POOL
@click.option("--namespace", help="Only this namespace.")
def export_cmd(pool, namespace):
    """Write POOL's sequences as JSON lines to stdout; `ingest` reads them back.

    \b
    Example:
      suffixspec export pool.lmdb --namespace sql > sql.jsonl
    """
    from suffixspec.offline.ingest import export

    damaged: list[int] = []
    with _store(pool, readonly=True) as store:
        n = export(store, sys.stdout, namespace=namespace, damaged=damaged)
    click.echo(f"exported {n} sequences", err=True)
    if damaged:
        shown = ", ".join(map(str, damaged[:10])) + (", ..." if len(damaged) > 10 else "")
        raise click.ClickException(f"{len(damaged)} damaged sequences left out (ids {shown}): "
                                   f"they fail their checks; the rest is exported")


@click.command(name="snapshot")
@_POOL
@_JOBS
@click.option("--json", "as_json", is_flag=True, help="Result as JSON on stdout.")
def snapshot_cmd(pool, jobs, as_json):
    """Bring POOL's index snapshot up to date, for fast opening.

    Indexes what no snapshot segment covers yet, rebuilds segments that lost
    sequences or whose files are damaged, and merges segments of about the
    same size.

    \b
    Example:
      suffixspec snapshot pool.lmdb --jobs 2
    """
    t0 = time.perf_counter()
    with _store(pool) as store:
        pending = store.compaction_pending()
        if not pending:
            try:
                generation = _snapshot_with_progress(store, jobs)
            except PoolError as e:
                raise click.ClickException(str(e)) from e
            tokens, compacted = store.snapshot().tokens, True
    if pending:  # a cut-short forget: recovering the pool finishes it (snapshot, compaction)
        with open_pool(pool, recover=True, snapshot_jobs=jobs) as p:
            generation = p.store.snapshot().generation
            tokens, compacted = p.tokens, p.compacted
    _emit({"generation": generation, "tokens": tokens, "compacted": compacted,
           "seconds": round(time.perf_counter() - t0, 3)}, as_json)


@click.command(name="add-segment")
@_POOL
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_JOBS
@click.option("--json", "as_json", is_flag=True, help="Result as JSON on stdout.")
def add_segment_cmd(pool, sources, jobs, as_json):
    """Add pools built elsewhere (SOURCES) to POOL, with their snapshot segments.

    Each source is a pool file, with its ``.snapshots`` folder beside it,
    that `suffixspec ingest` built from a shard of the logs, with the same
    tokenizer and --max-depth as POOL.  Its sequences and segment files are
    checked and copied in; nothing is indexed again.  POOL is created, with
    the first source's tokenizer, when missing.

    \b
    Example:
      suffixspec add-segment pool.lmdb shard-0.lmdb shard-1.lmdb
    """
    from suffixspec.pools.segments import AlreadyAdded, add_pool

    t0 = time.perf_counter()
    if not Path(pool).exists():
        with _store(sources[0], readonly=True) as first:
            tokenizer, depth = first.tokenizer, first.max_depth
        store = _store(pool, tokenizer=tokenizer, max_depth=depth)
    else:
        store = _store(pool)
    added = 0
    skipped = []
    with store:
        for source in sources:
            try:
                added += add_pool(store, source, jobs=jobs,
                                  say=lambda line: click.echo(line, err=True))
            except AlreadyAdded as e:  # a retried run goes on with the others
                click.echo(f"skipped: {e}", err=True)
                skipped.append(source)
            except PoolError as e:
                raise click.ClickException(str(e)) from e
        snap = store.snapshot()
    _emit({"sequences": added, "skipped": skipped, "segments": len(snap.segments) if snap else 0,
           "snapshot_tokens": snap.tokens if snap else 0,
           "seconds": round(time.perf_counter() - t0, 3)}, as_json)


@click.command(name="fleet-build")
@_POOL
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", type=click.Path(exists=True), required=True,
              help="tokenizer.json or a model folder holding one.")
@click.option("--work-dir", type=click.Path(file_okay=False), required=True,
              help="Where the shard pools are written: a folder every node and this host "
                   "reach (a shared file system on a multi-node cluster).")
@click.option("--namespace", help="Namespace the sequences join (default: \"default\").")
@click.option("--max-depth", type=click.IntRange(2, 1024), default=64, show_default=True)
@click.option("--learn", type=click.IntRange(0), default=LEARN_FROM, show_default=True,
              help="As for ingest: the last N logged requests of the last shard teach the "
                   "merged pool its calibration; 0: off.")
@click.option("--address", help="Ray cluster to join (default: start a local one).")
@_JOBS
@click.option("--json", "as_json", is_flag=True, help="Result as JSON on stdout.")
def fleet_build_cmd(pool, logs, tokenizer, work_dir, namespace, max_depth, learn, address, jobs,
                    as_json):
    """Build POOL from log shards (LOGS) on a Ray cluster: one ingest task per
    shard, then the shard pools are added as add-segment does.

    \b
    Example:
      suffixspec fleet-build fleet.lmdb logs/part-*.jsonl.gz \\
          --tokenizer ../shared/tokenizers/qwen --work-dir /shared/shards
    """
    from suffixspec.offline.fleet_build import fleet_build

    t0 = time.perf_counter()
    try:
        result = fleet_build(pool, list(logs), tokenizer, work_dir, namespace=namespace,
                             max_depth=max_depth, jobs=jobs, learn=learn, address=address)
    except (PoolError, ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from e
    _emit({**result, "seconds": round(time.perf_counter() - t0, 3)}, as_json)
