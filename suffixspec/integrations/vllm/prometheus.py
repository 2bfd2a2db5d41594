"""The drafter's counters on the server's ``/metrics`` (Prometheus).

Drafters run in vLLM's worker processes, while ``/metrics`` is served by the
API server process.  prometheus_client's multiprocess mode does exactly this
job: each process writes its samples to a file of its own, and a
``MultiProcessCollector`` in the serving process sums them at every scrape.

Its usual switch, ``PROMETHEUS_MULTIPROC_DIR``, is read when prometheus_client
is first imported, and vLLM imports it before plugins load; setting it late
would move vLLM's own metrics to a registry that no longer holds them.  So
the drafters write prometheus_client's file format directly:

* if vLLM runs in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set, as with
  several API servers), into that folder, which vLLM's collector already reads;
* otherwise into a folder that the first process to load the plugin makes and
  names in ``SUFFIXSPEC_METRICS_DIR`` (inherited by the engine and worker
  processes it starts), read by a ``MultiProcessCollector`` registered there.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

ENV = "SUFFIXSPEC_METRICS_DIR"
PROMETHEUS_ENV = "PROMETHEUS_MULTIPROC_DIR"
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
    "suffixspec_proposer_steps_before_ready": ("Engine steps without drafts while the "
                                               "kernels compiled", "steps_before_ready"),
    "suffixspec_proposer_seconds": ("Seconds spent drafting", "seconds"),
    "suffixspec_proposer_failures": ("Drafting failures (those steps got no draft)",
                                     "failures"),
    "suffixspec_finished_requests": ("Requests whose output joined the cross-request pool",
                                     "finished"),
}

_GAUGES = {
    "suffixspec_draft_cost": ("Draft cost in use at the last step: one drafted token's share "
                              "of the step, for that step's batch", "draft_cost"),
    "suffixspec_step_fixed_seconds": ("Measured step time without drafted tokens",
                                      "step_fixed_seconds"),
    "suffixspec_step_token_seconds": ("Measured step time per verified token",
                                      "step_token_seconds"),
}


def serve_from_this_process() -> None:
    """In the first process to load the plugin: make the folder and register
    its collector.  Processes it starts find the folder in the environment."""
    if os.environ.get(ENV) or os.environ.get(PROMETHEUS_ENV):
        return
    folder = tempfile.mkdtemp(prefix="suffixspec-metrics-")
    os.environ[ENV] = folder
    atexit.register(shutil.rmtree, folder, True)
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.multiprocess import MultiProcessCollector
    except ImportError:
        return
    MultiProcessCollector(REGISTRY, path=folder)


def _folder() -> Path | None:
    folder = os.environ.get(PROMETHEUS_ENV) or os.environ.get(ENV)
    return Path(folder) if folder else None


class Publisher:
    """Writes one drafter's counters (``counters()``) as prometheus_client's
    multiprocess samples, every ``PUBLISH_INTERVAL`` seconds from a daemon
    thread, and on ``close``."""

    def __init__(self, counters):
        self._counters = counters
        self._stop = threading.Event()
        self._file = None
        folder = _folder()
        if folder is None:
            return
        try:
            from prometheus_client.mmap_dict import MmapedDict
        except ImportError:
            return
        try:
            self._file = MmapedDict(str(folder / f"counter_suffixspec_{os.getpid()}.db"))
            # Gauges: the file name carries the mode (the highest value of all processes).
            self._gauges = MmapedDict(str(folder / f"gauge_max_{os.getpid()}.db"))
        except OSError:
            return
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="suffixspec-metrics", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.publish()

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL):
            self.publish()

    def publish(self) -> None:
        if self._file is None:
            return
        try:
            counters = self._counters()
        except Exception:  # noqa: BLE001 - a torn read while the engine runs: next time
            return
        from prometheus_client.mmap_dict import mmap_key

        from suffixspec.integrations.vllm.metrics import POOLS

        samples = [(name, ("pool",), (pool,), text, counters.get(f"{pool}_{key}", 0))
                   for name, (text, key) in _PER_POOL.items() for pool in POOLS]
        samples += [(name, (), (), text, counters.get(key, 0))
                    for name, (text, key) in _TOTALS.items()]
        with self._lock:
            try:
                for name, labels, values, text, value in samples:
                    key = mmap_key(name, name + "_total", labels, values, text)
                    self._file.write_value(key, float(value), 0.0)
                for name, (text, key) in _GAUGES.items():
                    if key in counters:
                        self._gauges.write_value(mmap_key(name, name, (), (), text),
                                                 float(counters[key]), 0.0)
            except (OSError, ValueError):
                self._file = None  # the folder is gone (server shut down): stop publishing


_announced: set[str] = set()


def announce(method: str, runner: str, async_on: bool) -> None:
    """Say once per process that suffixspec drafts ``method`` on ``runner``
    (``v1``: vLLM <= 0.33's V1 runner, on the host; ``mrv2``: Model Runner
    V2, on the device): one log line, and ``suffixspec_drafter{method,
    runner, async_scheduling} 1`` on ``/metrics``."""
    label = f"{method}-{runner}"
    if label in _announced:
        return
    _announced.add(label)
    import logging

    place = {"v1": "on vLLM's V1 model runner, on the host",
             "mrv2": "on Model Runner V2, on the device"}[runner]
    logging.getLogger("vllm.suffixspec").info(
        "suffixspec: method \"%s\" is drafted by suffixspec %s (async scheduling %s)",
        method, place, "on" if async_on else "off")
    publish_drafter(method, runner, async_on)


def publish_drafter(method: str, runner: str, async_on: bool) -> None:
    """``suffixspec_drafter{method, runner, async_scheduling} 1``: which
    method suffixspec drafts in this engine, on which model runner."""
    folder = _folder()
    if folder is None:
        return
    try:
        from prometheus_client.mmap_dict import MmapedDict, mmap_key

        gauges = MmapedDict(str(folder / f"gauge_mostrecent_{os.getpid()}.db"))
        gauges.write_value(mmap_key("suffixspec_drafter", "suffixspec_drafter",
                                    ("method", "runner", "async_scheduling"),
                                    (method, runner, "on" if async_on else "off"),
                                    "The method suffixspec drafts, on which model runner "
                                    "(v1: the host; mrv2: the device)"), 1.0, time.time())
        gauges.close()
    except (ImportError, OSError, ValueError):
        pass  # no metrics: the log line says it
