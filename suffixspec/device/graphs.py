"""The device's drafting step replayed as CUDA graphs, one per batch size.

A drafting step is some seventy small kernels.  Launched one by one from
Python they cost the host 1.7-3.3 ms a step on an H100 machine, against
0.24-0.39 ms of GPU work (``bench/device_check.py``, ``device_time``, two runs): the
host, not the GPU, paid for drafting on the device.  A graph launches them
all in one call.

``Replay(fn)`` runs ``fn(key)`` eagerly the first ``warm`` times it sees a
``key`` (Triton compiles its kernels on a first launch, which a capture
cannot hold), then records it once and replays the recording from then on.
``fn`` must read and write only buffers that outlive it, at fixed
addresses, and never read a device value on the host: the speculator copies
each step's inputs into fixed buffers first.  A recording does not run: the
step that records has already run eagerly.

Captures take no device-wide sync (``capture_begin`` on a side stream,
errors confined to this thread: the feeder thread waits on events
meanwhile), and all recordings share one memory pool: they are replayed
one at a time, and what a step keeps lies in the caller's buffers.

On a CPU (the tests) and with ``enabled=False`` every call runs eagerly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

import torch


class Replay:
    """See the module docstring."""

    def __init__(self, fn: Callable[[Hashable], None], device: torch.device,
                 enabled: bool = True, warm: int = 2):
        self.fn = fn
        self.device = torch.device(device)
        self.enabled = enabled and self.device.type == "cuda"
        self.warm = warm
        self.graphs: dict = {}
        self.seen: Counter = Counter()
        self._pool = None
        self._stream = torch.cuda.Stream(self.device) if self.enabled else None
        self.failed: Exception | None = None  # a capture that failed: eager from then on

    def __call__(self, key: Hashable) -> None:
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        self.fn(key)
        if not self.enabled:
            return
        self.seen[key] += 1
        if self.seen[key] >= self.warm:
            self._record(key)

    def _record(self, key: Hashable) -> None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        try:
            with torch.cuda.stream(self._stream):
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    self.fn(key)
                finally:
                    graph.capture_end()
        except Exception as exc:  # drafting goes on, eagerly
            self.enabled = False
            self.failed = exc
            return
        current.wait_stream(self._stream)
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[key] = graph

    @property
    def recorded(self) -> int:
        return len(self.graphs)


__all__ = ["Replay"]
