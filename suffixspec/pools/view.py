"""``PoolView``: what one drafting step reads of a pool's snapshot, owned whole.

A view holds the mapped segments of one snapshot generation, the side table
that names their arrays to the drafting kernel (``native.union``) and each
namespace's roots in them.  It is immutable: a pool publishes a new view when
its segments change, and a proposer takes the current one for a whole step.
The side table addresses arrays the view's segments own, so nothing it names
can be freed while the view is referenced.

A segment is mapped by ``open_segment``: its files' checksums, then the
structure of its arrays (``validate``), both skipped for files that a
process able to write the pool checked before and that were not written
since, under the same description (the record of which lives in the pool
file, so copying files into a snapshot folder cannot forge it; a snapshot
stamps the segments it builds, ``built_stamps``).  The stamp
holds a digest of the segment's whole description (array shapes and types,
namespaces, checksums): a description edited after the check, however its
CRC was mended, is checked again in full.  Every open, stamped or not, also
checks what costs no pass over the nodes: the arrays' types and shapes and
each namespace's tree (``validate.check_entry_points``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import xxhash

from suffixspec.index import SuffixIndex
from suffixspec.native import layout as lay
from suffixspec.native import union
from suffixspec.pools import files
from suffixspec.pools.records import Segment
from suffixspec.pools.validate import SegmentError, check_entry_points, check_segment

#: Version of what ``validate`` checks: a stamp of another version is checked again.
CHECKS = 2


@dataclass(frozen=True, eq=False)
class MappedSegment:
    """A segment's description and its index over read-only memory maps."""

    segment: Segment
    index: SuffixIndex

    @property
    def tokens(self) -> int:
        return int(self.index.meta[lay.META_LIVE_TOKENS])

    def nbytes(self) -> int:
        ix = self.index
        return sum(a.nbytes for a in (ix.meta, ix.nodes, ix.hkeys, ix.hvals, ix.arena, ix.seqs,
                                      ix.roots))


def _stand_in() -> tuple:
    """A side with no tree, for slots no segment fills."""
    return SuffixIndex(4, node_capacity=16, token_capacity=16).read_only_arrays()


_EMPTY = _stand_in()


@dataclass(frozen=True, eq=False)
class PoolView:
    """The segments drafted from, oldest first (at most ``layout.SEGMENTS``)."""

    generation: int = 0
    segments: tuple[MappedSegment, ...] = ()
    table: np.ndarray = field(default=None, repr=False)
    _roots: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if len(self.segments) > lay.SEGMENTS:
            raise ValueError(f"a view holds at most {lay.SEGMENTS} segments")
        if self.table is None:
            sides = [s.index.read_only_arrays() for s in self.segments]
            object.__setattr__(self, "table", union.table(
                sides + [_EMPTY] * (lay.SEGMENTS - len(sides))))

    def roots(self, namespace: str) -> np.ndarray:
        """``namespace``'s root in each segment slot (-1: none), as the kernel takes them."""
        row = self._roots.get(namespace)
        if row is None:
            row = np.full(lay.SEGMENTS, -1, np.int64)
            for k, s in enumerate(self.segments):
                tree = s.segment.namespaces.get(namespace)
                if tree is not None:
                    row[k] = s.index.roots[tree]
            row.setflags(write=False)
            self._roots[namespace] = row
        return row

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    def by_folder(self) -> dict[str, MappedSegment]:
        return {s.segment.folder: s for s in self.segments}


EMPTY_VIEW = PoolView()


def open_segment(folder: Path, seg: Segment, max_depth: int, vocab_size: int | None,
                 stamps: dict | None) -> tuple[MappedSegment, dict | None]:
    """Map ``seg``'s files in ``folder`` and check them; returns the mapped segment
    and the stamps to record (None: nothing new to record).

    ``stamps`` are those recorded when the files were last checked (None:
    never).  ``vocab_size``: token ids must also lie below it (a segment from
    another pool); else any vocabulary id or start anchor passes.  A file written since is checked against its checksum, and the
    segment's structure is checked unless every file is as stamped.  Raises
    ``SegmentError`` (structure), ``ValueError`` (size, checksum) or
    ``FileNotFoundError``.
    """
    described = description_digest(seg)
    same = stamps and stamps.get("checks") == CHECKS and stamps.get("described") == described
    known = stamps.get("files", {}) if same else {}
    arrays, checked, fresh = files.open_arrays(folder, seg.arrays, known)
    if checked:  # some file is not as a check left it: the whole structure again
        check_segment(arrays, max_depth, seg.namespaces, vocab_size)
    else:
        check_entry_points(arrays, seg.namespaces)
    index = SuffixIndex.from_arrays(arrays, max_depth)
    keep = {name: stamp for name, stamp in known.items() if name not in checked} | fresh
    if same and keep == known:
        return MappedSegment(seg, index), None
    return MappedSegment(seg, index), {"checks": CHECKS, "described": described, "files": keep}


def built_stamps(folder: Path, seg: Segment) -> dict:
    """The stamps of a segment this process has just built into ``folder``: its
    files as written (their checksums computed while writing, their structure
    made by the builder from checked sequences), so the first open after a
    snapshot reads none of them.  Files are never written again in place: one
    changed since has another size, inode or file times."""
    stamped = {}
    for name, (_, _, checksum) in seg.arrays.items():
        st = os.stat(folder / f"{name}.bin")
        stamped[name] = [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, checksum]
    return {"checks": CHECKS, "described": description_digest(seg), "files": stamped}


def description_digest(seg: Segment) -> int:
    """XXH3-64 of the segment's description (msgpack of ``to_dict``), less the
    stale mark, which a delete sets and no kernel reads."""
    raw = seg.to_dict()
    raw.pop("stale")
    return xxhash.xxh3_64_intdigest(msgpack.packb(raw))


__all__ = ["CHECKS", "EMPTY_VIEW", "built_stamps", "description_digest", "MappedSegment", "PoolView", "SegmentError", "open_segment"]
