"""What a pool file says of its snapshot: typed records, parsed and checked once.

A snapshot is a list of segments (``segments``), each an index over the
stored sequences with ids in ``(first, last]`` kept as files in a folder
beside the pool (``files``).  Its description lives in the pool file as
msgpack; ``Snapshot.parse`` turns it into these records and refuses, entry by
entry, what does not hold together, so a damaged or crafted description
costs the segments it names, never the pool.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np

#: Version of a segment's arrays (``native.layout``: node and sequence fields,
#: meta slots).  A segment of any other is not used; the next snapshot
#: rebuilds its range from the stored sequences.
LAYOUT = 2

#: What a segment folder may be named (a build's own names are 32 hex digits).
FOLDER = re.compile(r"[0-9a-f]{32}")

#: The arrays of a segment, in ``native.layout.Index`` order, plus its roots.
ARRAY_NAMES = ("meta", "nodes", "hkeys", "hvals", "arena", "seqs", "roots")


@dataclass(frozen=True)
class Segment:
    """One snapshot segment: the sequences with ids in ``(first, last]``.

    ``arrays`` gives each array's ``[dtype, shape, checksum]``;
    ``namespaces`` each namespace's tree (a row of ``roots``); ``stale``: some
    of its sequences were deleted since it was built.
    """

    first: int
    last: int
    tokens: int
    folder: str
    namespaces: dict = field(hash=False)
    arrays: dict = field(hash=False)
    stale: bool = False
    layout: int = LAYOUT

    @classmethod
    def parse(cls, raw) -> Segment:
        """The segment ``raw`` describes; ``ValueError`` naming what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError("a segment entry is not a record")
        missing = [k for k in ("first", "last", "folder", "arrays", "namespaces") if k not in raw]
        if missing:
            raise ValueError(f"a segment entry lacks {', '.join(missing)}")
        first, last, tokens = raw["first"], raw["last"], raw.get("tokens", 0)
        if not all(isinstance(v, int) and v >= 0 for v in (first, last, tokens)) or first > last:
            raise ValueError(f"a segment covers ids ({first!r}, {last!r}]")
        folder = raw["folder"]
        if not isinstance(folder, str) or not FOLDER.fullmatch(folder):
            raise ValueError(f"segment folder name {folder!r}")
        layout = raw.get("layout")
        if layout != LAYOUT:
            raise ValueError(f"segment {folder} has array layout {layout!r}, this suffixspec "
                             f"reads {LAYOUT}")
        arrays = raw["arrays"]
        if (not isinstance(arrays, dict) or set(arrays) != set(ARRAY_NAMES)
                or not all(_array_entry(v) for v in arrays.values())):
            raise ValueError(f"segment {folder} describes its arrays wrongly")
        namespaces = raw["namespaces"]
        if not isinstance(namespaces, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and v >= 0
                for k, v in namespaces.items()):
            raise ValueError(f"segment {folder} maps its namespaces wrongly")
        return cls(first, last, tokens, folder, dict(namespaces),
                   {k: list(v) for k, v in arrays.items()}, bool(raw.get("stale", False)),
                   layout)

    def to_dict(self) -> dict:
        return asdict(self)

    def marked_stale(self) -> Segment:
        return replace(self, stale=True)


def _array_entry(v) -> bool:
    """``[dtype, shape, checksum]`` with a known dtype, a shape of counts, an integer."""
    if not isinstance(v, (list, tuple)) or len(v) != 3:
        return False
    dtype, shape, checksum = v
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return (isinstance(shape, (list, tuple)) and all(isinstance(d, int) and d >= 0 for d in shape)
            and isinstance(checksum, int))


@dataclass(frozen=True)
class Snapshot:
    """A pool's snapshot: its generation and segments, oldest first.

    ``refused`` says why entries were left out (``parse``); their ranges are
    indexed from the stored sequences, and the next snapshot rebuilds them.
    """

    generation: int
    created: float
    segments: tuple[Segment, ...]
    refused: tuple[str, ...] = ()

    @property
    def watermark(self) -> int:
        """The highest id a segment covers."""
        return max((seg.last for seg in self.segments), default=0)

    @property
    def tokens(self) -> int:
        return sum(seg.tokens for seg in self.segments)

    @classmethod
    def parse(cls, raw) -> Snapshot:
        """The snapshot ``raw`` (the stored description) names.

        A description that is no record, or has no generation, is
        ``ValueError``; a segment entry that does not parse, or overlaps an
        earlier one, is left out and named in ``refused``.
        """
        if not isinstance(raw, dict) or not isinstance(raw.get("generation"), int):
            raise ValueError("the description has no generation")
        segments, refused = [], []
        entries = raw.get("segments", [])
        for entry in entries if isinstance(entries, list) else []:
            try:
                seg = Segment.parse(entry)
            except ValueError as e:
                refused.append(str(e))
                continue
            if segments and seg.first < segments[-1].last:
                refused.append(f"segment {seg.folder} overlaps the one before it")
                continue
            segments.append(seg)
        if not isinstance(entries, list):
            refused.append("the segment list is not a list")
        created = raw.get("created", 0.0)
        return cls(raw["generation"], float(created) if isinstance(created, (int, float)) else 0.0,
                   tuple(segments), tuple(refused))
