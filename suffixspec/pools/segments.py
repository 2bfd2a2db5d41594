"""A pool's snapshot as segments, kept up to date like an LSM tree.

The snapshot is a list of segments, oldest first; a segment indexes the
stored sequences with ids in ``(first, last]`` (``store``), and ranges never
overlap.  Sequences no segment covers (new ones, or a range whose segment a
``forget`` dropped) are indexed in memory by each process that opens the
pool.  Drafting reads every segment at once and adds their counts up
(``native.union``), so a segmented pool drafts as one index over all its
sequences would.

``write_snapshot`` brings the list up to date, holding the snapshot lock.
It plans first, then builds each planned range once:

1. every range no segment covers, and every ``stale`` segment (some of its
   sequences were deleted since), is to be built anew from the store;
2. adjacent segments of about the same size (neither more than ``RATIO``
   times the other) are merged, a merge being one build over both ranges,
   and so are the two smallest neighbours while there are more than
   ``layout.SEGMENTS`` (what the drafting kernel reads at once);
3. each range to build is built (``build``): a new range that merges with
   its neighbour at once is indexed once, over both.

Snapshots that add about the same number of tokens each merge like a binary
counter: a sequence is indexed again about log2(pool / snapshot) times over
its life, and the segments number about as many.  A large segment added from
elsewhere (``add_pool``) is not merged with small ones.  A delete rebuilds
only the segments that held what it deleted.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from suffixspec.native import layout as lay
from suffixspec.pools import build, files
from suffixspec.pools.identity import StoredRecords
from suffixspec.pools.records import LAYOUT, Segment
from suffixspec.pools.store import (CorruptPoolError, DiskFullError, PoolError, PoolStore,
                                    TokenizerMismatchError)


@dataclass(frozen=True)
class Planned:
    """A range ``(first, last]`` of stored sequences to index into a new segment."""

    first: int
    last: int
    tokens: int


class AlreadyAdded(PoolError):
    """The pool holds this shard's sequences already (``add_pool``)."""

#: Adjacent segments merge when neither holds more than this many times the other's tokens.
RATIO = 2

#: Stored tokens per segment, at most: a range with more is built as several
#: segments, and segments merge only below it (unless there are more than
#: ``layout.SEGMENTS``).  A build's memory grows with its segment (about
#: 2.4 GB at 100M tokens, ``bench/scale_bench.py``), so this bounds it.
MAX_TOKENS = 100_000_000


def write_snapshot(store: PoolStore, jobs: int = 1, progress=None, upto: int | None = None,
                   merge: bool = True) -> int:
    """Index what no segment covers, rebuild stale segments, merge; returns the generation.

    Each build runs in ``jobs`` processes into a new folder of files, and
    one transaction swaps the new list in; folders no longer named are then
    removed.  ``progress(tokens)`` follows the reading of the store.  Needs
    no open pool: nothing is indexed in memory besides the builds' own
    partitions.  A build that fails leaves the last snapshot in use.
    ``upto`` indexes new sequences only up to that id; ``merge`` False
    leaves segments unmerged.
    """
    root = store.snapshot_folders
    try:
        return _write_snapshot(store, root, jobs, progress, upto, merge)
    except OSError as e:  # making the folder, its lock, removing old folders
        raise _clear_error(store, e) from e


def _write_snapshot(store, root, jobs, progress, upto, merge) -> int:
    with files.folder_lock(root) as lock:
        with store.read() as txn:
            started = store.snapshot(txn)
            deletes = store.deletes(txn)
        last = store.last_id() if upto is None else min(upto, store.last_id())
        builder = _Builder(store, root, jobs, progress, lock)
        try:
            plan = _fill(store, list(started.segments) if started else [], last)
            if merge:
                plan = _merge(plan)
            made = [(builder.build(item.first, item.last), _replaced(item, started))
                    if isinstance(item, Planned) else (item, ()) for item in plan]
            made = [(seg, old) for seg, old in made if seg is not None]
            generation = store.update_segments(
                lambda current, txn: _reconcile(store, txn, current, deletes, made, builder.ids))
        except BaseException as e:
            builder.discard()
            raise _clear_error(store, e) from e
        remove_unnamed(store)
        _stamp_built(store, root, [seg for seg, _ in made if seg.folder in builder.ids])
    return generation


def _stamp_built(store: PoolStore, root: Path, built: list[Segment]) -> None:
    """Record the segments just built as checked (``view.built_stamps``), those
    the snapshot names, so the next open maps them without reading them."""
    from suffixspec.pools.view import built_stamps

    for seg in built:
        try:
            store.record_stamps(seg.folder, built_stamps(root / seg.folder, seg))
        except FileNotFoundError:  # replaced meanwhile: nothing to stamp
            continue


def add_pool(store: PoolStore, source: str | Path, jobs: int = 1,
             say: Callable[[str], None] | None = None) -> int:
    """Add another pool's sequences and its snapshot segments to ``store``; returns how many sequences.

    ``source`` is a pool built elsewhere (``suffixspec ingest`` over a shard
    of the logs) with the same tokenizer and ``max_depth``, whose snapshot
    covers every sequence it holds.  Its segments are checked (checksums,
    structure, token ids) and copied, then one transaction adds its
    sequences (with new ids) and the segments over them, so nothing is
    indexed again here.  Then ``write_snapshot`` indexes what else is new and
    merges as usual.  A shard added before (``AlreadyAdded``), even if its
    segments were merged away since, is refused, and so is one added by
    another process at the same time, or one whose records the pool holds
    already (``pools.identity``: a copy of a pool, a shard built twice).  Of
    one holding some of them, only the records missing are added, without
    its segments (they would count the others twice): ``write_snapshot``
    indexes them here, and ``say`` is told how many were held.
    """
    if Path(source).resolve() == store.path.resolve():
        raise PoolError(f"{source} is the pool it would be added to")
    shard = PoolStore(source, readonly=True)
    try:
        if shard.tokenizer.fingerprint != store.tokenizer.fingerprint:
            raise TokenizerMismatchError(
                f"{source} was built with tokenizer {shard.info['tokenizer']} "
                f"({shard.info['fingerprint']}), {store.path} with {store.info['tokenizer']} "
                f"({store.info['fingerprint']}); pools never mix token ids of different "
                f"tokenizers")
        if shard.max_depth != store.max_depth:
            raise PoolError(f"{source} has max_depth {shard.max_depth}, {store.path} has "
                            f"{store.max_depth}")
        snap = shard.snapshot()
        if snap is not None and snap.refused:
            raise PoolError(f"{source}: {'; '.join(snap.refused)}; run `suffixspec snapshot "
                            f"{source}` first")
        segments = list(snap.segments) if snap else []
        if any(seg.stale for seg in segments):
            raise PoolError(f"{source} has a snapshot segment to rebuild; run `suffixspec "
                            f"snapshot {source}` first")
        mark = _shard_mark(segments)
        if _added(store, mark):
            raise AlreadyAdded(f"{store.path} holds the sequences of {source} already (added "
                               f"before); adding them again would count them twice")
        items, ranks, held = [], [], []
        present = StoredRecords(store)
        for seq in shard.sequences():
            held.append(present.take(seq.namespace, seq.request_id or seq.source, seq.tokens))
            at = next((k for k, seg in enumerate(segments)
                       if seg.first < seq.seq_id <= seg.last), None)
            if at is None:
                raise PoolError(f"{source}: sequence {seq.seq_id} is in no snapshot segment; "
                                f"run `suffixspec snapshot {source}` first")
            items.append((seq.tokens, seq.namespace, seq.source, seq.request_id, seq.added))
            ranks.append(at)
        if items and all(held):
            raise AlreadyAdded(f"{store.path} holds every record of {source} already; adding "
                               f"them again would count them twice")
        if any(held):
            def no_segments(ids, txn):
                _mark_added(store, txn, mark, source)
                return []

            missing = [item for item, h in zip(items, held) if not h]
            ids = store.add_with_segments(missing, no_segments)
            if say is not None:
                say(f"{store.path} held {sum(held)} of the {len(items)} records of {source} "
                    f"already: the other {len(ids)} are added and indexed here, without its "
                    f"segments")
            write_snapshot(store, jobs)
            return len(ids)
        with files.folder_lock(store.snapshot_folders):
            try:
                names = [_copy_segment(shard, seg, store) for seg in segments]
            except OSError as e:
                raise _clear_error(store, e) from e

            def segments_for(ids, txn):
                _mark_added(store, txn, mark, source)
                return _mapped(segments, names, ranks, ids)

            try:
                ids = store.add_with_segments(items, segments_for)
            except BaseException:
                for name in names:
                    shutil.rmtree(store.snapshot_folders / name, ignore_errors=True)
                raise
    finally:
        shard.close()
    write_snapshot(store, jobs)
    return len(ids)


_ADDED = b"added:"


def _shard_mark(segments: list[Segment]) -> bytes:
    """What identifies a shard's contents: a digest of its segments' checksums."""
    h = hashlib.sha256()
    for seg in segments:
        h.update(repr((seg.first, seg.last, sorted(seg.arrays.items()))).encode())
    return h.hexdigest()[:32].encode()


def _mark_added(store: PoolStore, txn, mark: bytes, source) -> None:
    """Record in ``txn`` that the shard ``mark`` is added (``AlreadyAdded``: it was, just now)."""
    if txn.get(_ADDED + mark, db=store.db("meta")) is not None:
        raise AlreadyAdded(f"{store.path} holds the sequences of {source} already "
                           f"(added by another process just now)")
    txn.put(_ADDED + mark, b"1", db=store.db("meta"))


def _added(store: PoolStore, mark: bytes) -> bool:
    with store.read() as txn:
        return txn.get(_ADDED + mark, db=store.db("meta")) is not None


# ----------------------------------------------------------------- internal
class _Builder:
    """Builds segments over id ranges of one store; remembers what it made."""

    def __init__(self, store: PoolStore, root: Path, jobs: int, progress, lock: int):
        self.store, self.root, self.jobs, self.lock = store, root, jobs, lock
        self.progress = progress
        self.ids: dict[str, np.ndarray] = {}  # folder -> ids of the sequences it indexed
        self.made: list[Path] = []

    def build(self, first: int, last: int) -> Segment | None:
        """A new segment over the stored sequences with ids in ``(first, last]``; None: there are none."""
        head = next(self.store.sequences(after=first, with_tokens=False), None)
        if head is None or head.seq_id > last:
            return None
        ids: list[int] = []

        def sequences():
            for seq in self.store.sequences(after=first):
                if seq.seq_id > last:
                    return
                ids.append(seq.seq_id)
                yield seq

        tmp = self.root / f"{uuid.uuid4().hex}.build"  # a folder name ``records.FOLDER`` takes
        try:
            info = build.build(sequences(), self.store.max_depth, tmp, jobs=self.jobs,
                               progress=self.progress, hold_fds=(self.lock,))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = tmp.with_suffix("")
        os.rename(tmp, final)
        files.sync_folder(self.root)
        self.made.append(final)
        self.ids[final.name] = np.asarray(ids, np.int64)
        return Segment(first, last, info["tokens"], final.name, info["namespaces"],
                       info["arrays"], layout=LAYOUT)

    def discard(self) -> None:
        for folder in self.made:
            shutil.rmtree(folder, ignore_errors=True)


def _fill(store: PoolStore, segments: list[Segment], last: int) -> list:
    """The plan over every stored sequence up to id ``last``: segments kept,
    and ranges to build (``Planned``, tokens counted in the store):
    uncovered ranges (those of entries the description refused included),
    stale segments, and segments whose files are damaged or malformed."""
    out = []
    prev = 0
    for seg in [*segments, None]:
        upto = last if seg is None else seg.first
        if upto > prev:
            out += _planned(store, prev, upto)
        if seg is None:
            return out
        if seg.stale or not _intact(store, seg):
            out += _planned(store, seg.first, seg.last)
        else:
            out.append(seg)
        prev = max(prev, seg.last)
    return out


def _planned(store: PoolStore, first: int, last: int) -> list[Planned]:
    """Ranges to build over the stored sequences with ids in ``(first, last]``:
    none if there are none, else about even ones of at most ``MAX_TOKENS``
    tokens each (a longer sequence alone), as many as that takes."""
    cap = MAX_TOKENS
    ids, lengths = [], []
    for seq in store.sequences(after=first, with_tokens=False):
        if seq.seq_id > last:
            break
        ids.append(seq.seq_id)
        lengths.append(seq.length)
    if not ids:
        return []
    total = sum(lengths)
    share = -(-total // -(-total // cap)) if total else 0  # even parts of at most cap
    out = []
    start, tokens = first, 0
    for i, n in enumerate(lengths):
        if tokens and (tokens >= share or tokens + n > cap):
            out.append(Planned(start, ids[i - 1], tokens))
            start, tokens = ids[i - 1], 0
        tokens += n
    out.append(Planned(start, last, tokens))
    return out


def _intact(store: PoolStore, seg: Segment) -> bool:
    """Whether a segment's files pass their checks (stamps recorded as it opens)."""
    from suffixspec.pools.view import open_segment

    folder = store.snapshot_folders / seg.folder
    try:
        _, stamps = open_segment(folder, seg, store.max_depth, None, store.stamps(seg.folder))
    except (OSError, ValueError):
        return False
    if stamps is not None:
        store.record_stamps(seg.folder, stamps)
    return True


def merge_pick(tokens: list[int], cap: int | None = None) -> int | None:
    """Which adjacent pair ``(i, i + 1)`` of segments with these sizes to merge next (None: none).

    The two smallest neighbours while there are more than ``SEGMENTS``,
    else the smallest pair of about the same size (``RATIO``) that together
    hold at most ``cap`` tokens (``MAX_TOKENS`` unless given).
    """
    cap = MAX_TOKENS if cap is None else cap
    pairs = [(tokens[i] + tokens[i + 1], i) for i in range(len(tokens) - 1)]
    if len(tokens) > lay.SEGMENTS:
        return min(pairs)[1]
    alike = [(size, i) for size, i in pairs if size <= cap and
             max(tokens[i], tokens[i + 1]) <= RATIO * max(min(tokens[i], tokens[i + 1]), 1)]
    return min(alike)[1] if alike else None


def _merge(plan: list) -> list:
    """The plan with merges (``merge_pick``): a merged pair is one range to build."""
    plan = list(plan)
    while len(plan) > 1:
        i = merge_pick([item.tokens for item in plan])
        if i is None:
            break
        plan[i:i + 2] = [Planned(plan[i].first, plan[i + 1].last,
                                 plan[i].tokens + plan[i + 1].tokens)]
    return plan


def _replaced(item: Planned, started) -> tuple[Segment, ...]:
    """The segments of the snapshot as it was (``started``) within a planned range."""
    return tuple(seg for seg in (started.segments if started else ())
                 if item.first <= seg.first and seg.last <= item.last)


def _reconcile(store: PoolStore, txn, current, deletes: int, made: list,
               built: dict[str, np.ndarray]) -> list[Segment]:
    """The list to commit, given what deletes did while the builds ran.

    ``made`` pairs each segment of the new list with the segments of the old
    one it replaces (none for a kept one).  A kept segment takes its current
    state (a delete since may have marked it stale, or dropped it).  A built
    one that indexed a sequence deleted since is left out, and the segments
    it replaced stay in their current state, unless a ``forget`` dropped
    them too: only the ranges of those are indexed from the store until the
    next snapshot (which the deleting ``forget`` or ``prune`` writes).
    """
    now = {seg.folder: seg for seg in (current.segments if current else ())}
    changed = store.deletes(txn) != deletes
    out = []
    for seg, replaced in made:
        if seg.folder not in built:
            if seg.folder in now:
                out.append(now[seg.folder])
        elif changed and not store.holds(txn, built[seg.folder]):
            out += [now[old.folder] for old in replaced if old.folder in now]
        else:
            out.append(seg)
    return sorted(out, key=lambda seg: seg.first)


def remove_unnamed(store: PoolStore) -> None:
    """Remove the folders the snapshot no longer names (hold the snapshot lock)."""
    snap = store.snapshot()
    files.remove_except(store.snapshot_folders,
                        {seg.folder for seg in (snap.segments if snap else ())})


def _clear_error(store: PoolStore, e: BaseException) -> BaseException:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return DiskFullError(f"could not write the snapshot of {store.path} (disk full?): {e}")
    if isinstance(e, OSError):
        return PoolError(f"could not write the snapshot of {store.path}: {e}")
    if isinstance(e, RuntimeError) and not isinstance(e, PoolError):  # a build worker failed
        return PoolError(f"{store.path}: {e}")
    return e


def _copy_segment(shard: PoolStore, seg: Segment, store: PoolStore) -> str:
    """Check a segment's files and structure against ``store`` (its depth and
    vocabulary) and copy them into its snapshot folders; returns the new folder's name."""
    from suffixspec.pools.view import open_segment

    src = shard.snapshot_folders / seg.folder
    try:
        open_segment(src, seg, store.max_depth, store.vocab_size, None)
    except (OSError, ValueError) as e:
        raise CorruptPoolError(f"{shard.path}: snapshot segment {seg.folder} is damaged, "
                               f"malformed or missing ({e})") from e
    root = store.snapshot_folders
    tmp = root / f"{uuid.uuid4().hex}.build"
    tmp.mkdir(mode=0o700)
    try:
        for name, (_, _, checksum) in seg.arrays.items():
            with open(src / f"{name}.bin", "rb") as f, files.Writer(tmp / f"{name}.bin") as out:
                while chunk := f.read(1 << 24):
                    out.write(np.frombuffer(chunk, np.uint8))
            if out.checksum != checksum:
                raise CorruptPoolError(f"{src / name}.bin changed while it was copied")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = tmp.with_suffix("")
    os.rename(tmp, final)
    files.sync_folder(root)
    return final.name


def _mapped(segments: list[Segment], names: list[str], ranks: list[int],
            ids: list[int]) -> list[Segment]:
    """The copied segments over the new ids: segment k covers the ids of the sequences it held."""
    out = []
    for k, (seg, name) in enumerate(zip(segments, names)):
        held = [i for i, r in zip(ids, ranks) if r == k]
        if held:
            out.append(Segment(held[0] - 1, held[-1], seg.tokens, name, seg.namespaces,
                               seg.arrays))
    return out
