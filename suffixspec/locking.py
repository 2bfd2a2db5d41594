"""``locked``: run a method holding its object's ``_lock`` (a ``threading.RLock``).

A proposer and the pool it drafts from share one lock, so a pool's
background thread (see ``PersistentPool``) never changes the pool during a
proposer call.
"""

from __future__ import annotations

import functools


def locked(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return call
