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
    every sequence when made: an offline command's cost."""

    def __init__(self, store):
        self._counts = Counter(record_key(q.namespace, q.request_id or q.source, q.tokens)
                               for q in store.sequences())

    def take(self, namespace: str, record_id: str, tokens: np.ndarray) -> bool:
        """Whether the store holds this record (not matched yet); it is matched now."""
        key = record_key(namespace, record_id, tokens)
        if self._counts[key] > 0:
            self._counts[key] -= 1
            return True
        return False
