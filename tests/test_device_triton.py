"""The Triton kernel of the device drafting step, held to its torch reference.

Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors, in a child
process (the interpreter is chosen when a kernel is defined); it must write
exactly what ``draft_ref.fused_ref`` writes on random cases: tiny
vocabularies (windows overlap the context everywhere), empty and short
windows, -1 padding, rows with ``num_sampled = 0``.  It must also compile
for sm_90 with no GPU present.
"""

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
CHILD = Path(__file__).with_name("device_triton_child.py")


def _child(mode: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}")
    if mode in ("interpret", "serving"):
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, str(CHILD), mode, *args], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cases", [pytest.param(6), pytest.param(60, marks=pytest.mark.slow)])
def test_the_kernels_write_what_the_reference_writes(cases):
    """The fused kernel; the own-history, family, corpus and live-corpus kernels against
    their torch twins."""
    got = _child("interpret", str(cases))
    assert got["cases"] == cases and got["rows"] > cases
    assert got["mismatches"] == [], got["mismatches"][:3]


@pytest.mark.slow  # a child interpreter, 11 s here; the 6-case run above stays fast
def test_the_fused_kernel_writes_what_the_reference_writes_at_serving_shapes():
    """8 windows of 64 tokens a slot, drafts of 16, 8 rows: the shapes the vLLM
    drafter serves with, where the small random cases above do not reach."""
    got = _child("serving", "4")
    assert got["cases"] == 4 and got["rows"] == 32
    assert got["mismatches"] == [], got["mismatches"][:3]


def test_the_kernel_compiles_for_sm90():
    got = _child("compile")
    assert got["target"] == "cuda:90" and got["cubin_bytes"] > 0 and got["scan_cubin_bytes"] > 0
    assert got["corpus_cubin_bytes"] > 0 and got["live_cubin_bytes"] > 0
    for shared in (got["shared_bytes"], got["scan_shared_bytes"]):
        assert shared <= 228 * 1024  # an H100's shared memory per block
