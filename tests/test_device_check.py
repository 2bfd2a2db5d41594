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


@pytest.mark.slow
def test_the_device_check_runs_on_the_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device_check.py"), "--device",
                           "cpu", "--out", str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    fused = [v for k, v in report["correctness"].items() if k.startswith("fused")]
    assert fused and all(v["mismatches"] == 0 for v in fused)
    assert report["correctness"]["scan"]["mismatches"] == 0
    assert all(v["step_us"] > 0 for v in report["device_time"].values())
    loop = report["loop"]
    for b in (8, 64):
        assert loop[f"none_b{b}"]["tokens_per_request_step"] == 1.0
        device = loop[f"device_b{b}"]
        assert device["tokens_per_request_step"] > 1.0  # its drafts are accepted
        assert device["feeder"]["taken"] > 0
