"""The drafters' counters reach /metrics through prometheus_client's multiprocess files.

Real processes publish; a real ``MultiProcessCollector`` sums them, both when
vLLM runs single-process metrics (the plugin's own folder) and when it runs
in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, read by vLLM's collector).
"""

import os
import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

PUBLISH = """
import sys
from suffixspec.integrations.vllm.prometheus import Publisher
steps = int(sys.argv[1])
Publisher(lambda: {"request_drafted_tokens": 10 * steps, "anchor_drafted_tokens": steps,
                   "steps": steps, "draft_cost": steps / 100}).close()
"""


def _publish(env, steps):
    subprocess.run([sys.executable, "-c", PUBLISH, str(steps)], env=env, check=True)


def _samples(registry) -> dict:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("suffixspec_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SUFFIXSPEC_METRICS_DIR", "PROMETHEUS_MULTIPROC_DIR")}
    return dict(env, **extra)


def test_counters_of_every_drafter_process_are_summed(tmp_path):
    env = _env(SUFFIXSPEC_METRICS_DIR=str(tmp_path))
    _publish(env, 3)
    _publish(env, 4)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    got = _samples(registry)
    assert got['suffixspec_drafted_tokens_total{pool="request"}'] == 70
    assert got['suffixspec_drafted_tokens_total{pool="anchor"}'] == 7
    assert got['suffixspec_drafted_tokens_total{pool="cross"}'] == 0
    assert got["suffixspec_proposer_steps_total"] == 7
    assert got["suffixspec_draft_cost"] == 0.04  # a gauge: the highest of the processes
    assert "suffixspec_step_token_seconds" not in got  # not measured: not published


def test_vllm_multiprocess_mode_reads_them_from_its_own_folder(tmp_path):
    ours, vllms = tmp_path / "ours", tmp_path / "vllm"
    ours.mkdir()
    vllms.mkdir()
    _publish(_env(SUFFIXSPEC_METRICS_DIR=str(ours), PROMETHEUS_MULTIPROC_DIR=str(vllms)), 5)
    assert not list(ours.iterdir())
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(vllms))
    assert _samples(registry)["suffixspec_proposer_steps_total"] == 5


def test_no_folder_no_files(tmp_path):
    _publish(_env(), 2)  # neither variable: nothing to write to, and no error
