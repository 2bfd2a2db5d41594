"""Where a benchmark's result comes from, written into its JSON.

Imports nothing from suffixspec, so a script carried to a bare GPU machine
(``device_check.py``) uses it too.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path


def run_meta(bench: str) -> dict:
    """Where a result comes from: the benchmark, the commit it ran at (with
    ``dirty`` when suffixspec/ or bench/ had changes not committed), when, the
    command, and the machine."""
    root = Path(__file__).resolve().parent.parent

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short=7", "HEAD") or None
    dirty = bool(git("status", "--porcelain", "--", "suffixspec", "bench")) if commit else None
    return {"bench": bench, "commit": commit, "dirty": dirty,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python " + shlex.join([os.path.relpath(sys.argv[0], root)] + sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                       f"{platform.python_version()}"}
