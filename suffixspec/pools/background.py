"""The pool's own threads and processes run behind the serving threads."""

from __future__ import annotations

import os
import threading

#: CPU priority (nice) of the pool's own threads and snapshot child, so that
#: on a busy machine the serving threads run first.
BACKGROUND_NICE = 10


def in_background() -> None:
    """Let the serving threads go first: this thread (or process) at a lower
    CPU priority, where the platform allows it."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass
