"""What makes two stored sequences the same record, so nothing is stored twice.

A record is its namespace, its record id (the request id an engine or a log
gave it, else its source) and its tokens.  Ingesting a log, an export or a
shard again (a re-run, a task Ray retried, a copy) finds each of its records
stored and adds nothing; two records with the same output stay two, since
their ids differ.  Serving commits are never checked: each request is its
own record.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np


def tokens_digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(tokens, np.int32).tobytes(),
                           digest_size=16).digest()


def record_key(namespace: str, record_id: str, tokens: np.ndarray) -> tuple:
    """The identity of a record: namespace, record id and a digest of its tokens."""
    return namespace, record_id, tokens_digest(tokens)


class StoredRecords:
    """The records a store holds, each to be matched once (``take``).  Reads
    every sequence when made: an offline command's cost.

    ``add_missing`` commits a batch, checking it in the commit's own
    transaction against what was stored since (by another ingest of the
    same log running at once, say): every record is stored once, however
    many commands store it together.  What this object committed itself is
    not counted as found."""

    def __init__(self, store):
        self._counts: Counter = Counter()
        self._upto = 0  # stored ids up to this were read
        self._own: set[int] = set()  # ids this object committed, not read yet
        with store.read() as txn:
            self._read(store, txn)

    def _read(self, store, txn) -> None:
        for record in store.records_in(txn, after=self._upto):
            if record.seq_id not in self._own:
                q = store.decode(record)
                self._counts[record_key(q.namespace, q.request_id or q.source, q.tokens)] += 1
            self._upto = record.seq_id
        self._own = {i for i in self._own if i > self._upto}

    def take(self, namespace: str, record_id: str, tokens: np.ndarray) -> bool:
        """Whether the store holds this record (not matched yet); it is matched now."""
        key = record_key(namespace, record_id, tokens)
        if self._counts[key] > 0:
            self._counts[key] -= 1
            return True
        return False

    def add_missing(self, store, items: list[tuple]) -> list[tuple]:
        """Commit those of ``(tokens, namespace, source, request_id)`` ``items``
        that the store does not hold (a record's id: its request id, else its
        source), in one transaction that first reads what was stored since;
        returns those committed."""
        def put(txn):
            self._read(store, txn)
            keep = [it for it in items if not self.take(it[1], it[3] or it[2], it[0])]
            self._own.update(store.append(txn, keep))
            return keep

        return store.write(put) if items else []
