"""What the benchmarks share: the trace files they replay and how much of each."""

from __future__ import annotations

import json
from pathlib import Path

from suffixspec.replay.traces import load_trace

# name -> (file under the traces folder, sessions to keep or None for all)
TRACES = {
    "sql": ("sql_spider_bird.jsonl.gz", None),
    "code": ("code_humaneval_mbpp_leetcode.jsonl.gz", None),
    "gorilla": ("tool_gorilla_apibench.jsonl.gz", None),
    "bfcl": ("tool_bfcl.jsonl.gz", None),
    "agent": ("agent_miniswe_swebench.jsonl.gz", 40),
}


def load(traces_dir: str | Path, name: str, encode):
    """The tokenized requests of one benchmark trace."""
    file, sessions = TRACES[name]
    return load_trace(Path(traces_dir) / file, encode, max_sessions=sessions)


def save_results(out: str | Path, name: str, data, md: str) -> None:
    """Write ``name``.json and ``name``.md under ``out`` and print the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (out / f"{name}.md").write_text(md + "\n")
    print(md)
