"""The drafter's counters on the server's ``/metrics`` (Prometheus).

Drafters run in vLLM's worker processes, while ``/metrics`` is served by the
API server process from its own registry.  So the first process that loads
the plugin (the API server, or the process running ``LLM``) makes a folder
and names it in ``SUFFIXSPEC_METRICS_DIR``, which the engine and worker
processes it starts inherit; each drafter writes its counters there as one
small JSON file (every second from a background thread, and at shutdown),
and a collector in the first process's registry sums the files at every
scrape.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

ENV = "SUFFIXSPEC_METRICS_DIR"
PUBLISH_INTERVAL = 1.0  # seconds between a drafter's writes

# name -> (help, metrics key per pool, or a whole-drafter key)
_PER_POOL = {
    "suffixspec_drafted_tokens": ("Draft tokens the engine scheduled, by source pool",
                                  "drafted_tokens"),
    "suffixspec_accepted_tokens": ("Draft tokens the engine accepted, by source pool",
                                   "accepted_tokens"),
    "suffixspec_drafts": ("Drafts the engine scheduled, by source pool", "drafts"),
}
_TOTALS = {
    "suffixspec_proposer_steps": ("Engine steps the drafter proposed for", "steps"),
    "suffixspec_proposer_seconds": ("Seconds spent drafting", "seconds"),
    "suffixspec_proposer_failures": ("Drafting failures (those steps got no draft)",
                                     "failures"),
    "suffixspec_finished_requests": ("Requests whose output joined the cross-request pool",
                                     "finished"),
}


def serve_from_this_process() -> None:
    """In the first process to load the plugin: make the folder and register
    the collector.  Processes it starts find the folder in the environment."""
    if os.environ.get(ENV):
        return
    folder = tempfile.mkdtemp(prefix="suffixspec-metrics-")
    os.environ[ENV] = folder
    atexit.register(shutil.rmtree, folder, True)
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    REGISTRY.register(_Collector(Path(folder)))


class Publisher:
    """Writes one drafter's counters (``counters()``) into the metrics folder,
    every ``PUBLISH_INTERVAL`` seconds from a daemon thread, and on ``close``."""

    def __init__(self, counters):
        folder = os.environ.get(ENV)
        self.path = Path(folder) / f"drafter-{os.getpid()}.json" if folder else None
        self._counters = counters
        self._stop = threading.Event()
        if self.path is not None:
            threading.Thread(target=self._run, name="suffixspec-metrics", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.publish()

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL):
            self.publish()

    def publish(self) -> None:
        if self.path is None:
            return
        try:
            counters = self._counters()
        except Exception:  # noqa: BLE001 - a torn read while the engine runs: next time
            return
        tmp = self.path.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(counters, default=float))
            os.replace(tmp, self.path)  # a scrape never reads half a file
        except OSError:
            self.path = None  # the folder is gone (server shut down): stop publishing


class _Collector:
    def __init__(self, folder: Path):
        self.folder = folder

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        from suffixspec.integrations.vllm.metrics import POOLS

        drafters = []
        for f in self.folder.glob("drafter-*.json"):
            try:
                drafters.append(json.loads(f.read_text()))
            except (OSError, ValueError):
                continue
        for name, (text, key) in _PER_POOL.items():
            family = CounterMetricFamily(name, text, labels=["pool"])
            for pool in POOLS:
                family.add_metric([pool], sum(d.get(f"{pool}_{key}", 0) for d in drafters))
            yield family
        for name, (text, key) in _TOTALS.items():
            yield CounterMetricFamily(name, text, value=sum(d.get(key, 0) for d in drafters))
