"""``locked``: run a method holding its object's ``_lock`` (a ``threading.RLock``).

A proposer and the pool it drafts from share one lock, so a pool's
background thread (see ``PersistentPool``) never changes the pool during a
proposer call.  An object whose ``_closed`` is true refuses every locked
call in one line (``Closed``), instead of working on a closed pool.
"""

from __future__ import annotations

import functools


class Closed(RuntimeError):
    """The object was closed; it takes no more calls."""


def locked(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            if getattr(self, "_closed", False):
                raise Closed(f"{type(self).__name__}.{method.__name__}: it was closed "
                             f"(close() or the end of its with block); make a new one")
            return method(self, *args, **kwargs)
    return call
