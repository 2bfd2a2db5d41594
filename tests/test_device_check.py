"""``bench/device_check.py --device cpu``: the GPU script runs end to end here, small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

from suffixspec.device.feeder import PHASES  # noqa: E402


@pytest.mark.slow
def test_the_device_check_runs_on_the_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device_check.py"), "--device",
                           "cpu", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    checks = report["correctness"]
    assert {"fused_b1", "fused_b8", "scan", "family_scan", "live"} <= set(checks)
    for name, check in checks.items():  # each ran its cases, and none differed
        assert check["cases"] > 0 and check["mismatches"] == 0, (name, check)
    assert all(v["step_us"] > 0 for v in report["device_time"].values())
    loop = report["loop"]
    for b in (8, 64):
        assert loop[f"none_b{b}"]["tokens_per_request_step"] == 1.0
        device = loop[f"device_b{b}"]
        assert device["tokens_per_request_step"] > 1.0  # its drafts are accepted
        assert device["feeder"]["taken"] > 0
        phases = device["feeder_phase_cpu_ms_per_step"]
        assert set(phases) == set(PHASES) and phases["windows"] > 0


@pytest.mark.slow
def test_the_feeder_replays_recorded_jobs_to_the_same_payloads(monkeypatch):
    """``bench/feeder_bench.py``: a replay of the loop's jobs is deterministic
    (its A/B timings compare equal work), publishes a payload per step and
    accounts its CPU by phase."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    monkeypatch.setenv("SUFFIXSPEC_LOG_INTERVAL", "0")
    import feeder_bench

    steps = feeder_bench.record(None, None, level=8, steps=30)
    assert len(steps) >= 20 and all(group[-1][0] == "snapshot" for group in steps)
    first, second = feeder_bench.replay(steps, 8), feeder_bench.replay(steps, 8)
    assert first["digest"] == second["digest"]
    assert first["published"] == len(steps) and first["windows_built"] > 0
    assert first["lost_requests"] == 0
    assert set(first["phases"]) == set(PHASES) and first["phases"]["add"] > 0
