"""Damaged pool files: every byte flip or truncation gives a clear error or the right drafts.

Each damaged copy is opened in a child process, so a crash (SIGSEGV, SIGBUS)
shows as the child's death instead of taking the test runner down.
"""

from __future__ import annotations

import json
import subprocess
import sys

from suffixspec.testing.pool_children import PROBE, damaged_pool_copies


def _probe(paths):
    """Open each path in a child; returns one result per path (None: the child died)."""
    results = {}
    rest = list(paths)
    while rest:
        proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, rest)],
                              capture_output=True, text=True, timeout=600)
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            results[rec["path"]] = rec
        done = [p for p in rest if str(p) in results]
        if proc.returncode != 0:
            dead = rest[len(done)]
            results[str(dead)] = {"path": str(dead), "died": proc.returncode,
                                  "stderr": proc.stderr[-2000:]}
            done.append(dead)
        rest = [p for p in rest if p not in done]
    return [results[str(p)] for p in paths]


def test_byte_flips_and_truncations_never_crash_or_change_drafts(tmp_path):
    path, copies, unsnapshotted = damaged_pool_copies(tmp_path, 40)
    reference, without, *results = _probe([path, unsnapshotted] + copies)
    assert "drafts" in reference and any(reference["drafts"])
    for result in results:
        assert "died" not in result, result
        if "drafts" in result:  # the snapshot was used, or was not and the sequences were
            assert result["drafts"] in (reference["drafts"], without["drafts"]), result
    assert any("error" in r for r in results)  # the damage was noticed somewhere
