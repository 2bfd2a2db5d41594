"""What the benchmarks share: the trace files they replay and how much of each."""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import pickle
import shutil
import sys
from pathlib import Path

from suffixspec.replay.traces import load_trace

from provenance import run_meta

#: Where this run comes from, taken when the benchmark starts (a commit made
#: while it runs is not the code it ran).
STARTED = run_meta(Path(sys.argv[0]).stem)

# name -> (file under the traces folder, sessions to keep or None for all)
TRACES = {
    "sql": ("sql_spider_bird.jsonl.gz", None),
    "code": ("code_humaneval_mbpp_leetcode.jsonl.gz", None),
    "gorilla": ("tool_gorilla_apibench.jsonl.gz", None),
    "bfcl": ("tool_bfcl.jsonl.gz", None),
    "agent": ("agent_miniswe_swebench.jsonl.gz", 40),
}


# Short slices of every trace, for quick comparisons (draft_digest, gpu_bench,
# device_gate): name -> (file, load_trace bounds).
SLICES = {"sql": ("sql_spider_bird.jsonl.gz", {"max_records": 5000}),
          "code": ("code_humaneval_mbpp_leetcode.jsonl.gz", {}),
          "gorilla": ("tool_gorilla_apibench.jsonl.gz", {"max_records": 4000}),
          "bfcl": ("tool_bfcl.jsonl.gz", {"max_records": 3000}),
          "agent": ("agent_miniswe_swebench.jsonl.gz", {"max_sessions": 10})}


def load_slice(traces, name: str, encode, fraction: float = 1.0):
    """The requests of slice ``name`` (``SLICES``), its bounds times ``fraction``."""
    file, kw = SLICES[name]
    kw = {k: max(1, int(v * fraction)) for k, v in kw.items()}
    return load_trace(Path(traces) / file, encode, **kw)


CACHE = Path(__file__).parent / "cache"


def load(traces_dir: str | Path, name: str, encode, tokenizer: str | Path | None = None):
    """The tokenized requests of one benchmark trace.

    With ``tokenizer`` (the tokenizer.json or its folder), the result is cached
    under bench/cache/, keyed by the trace file's and the tokenizer's bytes'
    sizes and times, so later runs skip tokenizing.
    """
    file, sessions = TRACES[name]
    path = Path(traces_dir) / file
    if tokenizer is None:
        return load_trace(path, encode, max_sessions=sessions)
    tok = Path(tokenizer)
    tok = tok / "tokenizer.json" if tok.is_dir() else tok
    stamp = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in (path, tok)]
    key = hashlib.sha256(repr((stamp, sessions)).encode()).hexdigest()[:16]
    cached = CACHE / f"{name}-{key}.pkl"
    if cached.is_file():
        with open(cached, "rb") as f:
            return pickle.load(f)
    requests = load_trace(path, encode, max_sessions=sessions)
    CACHE.mkdir(exist_ok=True)
    with open(cached.with_suffix(".tmp"), "wb") as f:
        pickle.dump(requests, f, protocol=pickle.HIGHEST_PROTOCOL)
    cached.with_suffix(".tmp").replace(cached)
    return requests


def save_results(out: str | Path, name: str, data, md: str, show: bool = True) -> Path:
    """Write ``name``.json under ``out``: where the run comes from (``run_meta``),
    its table (``md``, Markdown) and its ``data``; print the table (``show``).
    ``bench/report.py`` builds docs/results.md and README's headline from these files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({**STARTED, "table": md, "data": data}, indent=1) + "\n")
    if show:
        print(md)
    return path


def parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's arguments: ``--traces``, ``--tokenizer``, ``--out`` and
    ``--no-kinds``, described by the first paragraph of its docstring ``doc``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--traces", default="../shared/data/traces")
    ap.add_argument("--tokenizer", default="../shared/tokenizers/qwen")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--no-kinds", action="store_true",
                    help="suffixspec drafts without the tokenizer's token kinds")
    return ap


def token_kinds(args):
    """The tokenizer's token kinds for suffixspec (``SuffixProposer(token_kinds=)``),
    None with ``--no-kinds``."""
    from suffixspec.fingerprint import load_hf_tokenizer
    from suffixspec.token_kinds import token_kinds as kinds_of

    return None if args.no_kinds else kinds_of(load_hf_tokenizer(args.tokenizer))


def config_settings(items) -> dict:
    """``ProposerConfig`` settings from ``name=value`` strings (Python literals)."""
    settings = {}
    for item in items:
        name, _, value = item.partition("=")
        settings[name] = ast.literal_eval(value)
    return settings


def fill_store(store, sequences, target: int, namespace: str = "main") -> int:
    """Commit ``sequences`` to ``store`` in batches until ``target`` tokens; returns how many."""
    total = 0
    batch = []
    for s in sequences:
        batch.append((s, namespace, "bench", ""))
        total += len(s)
        if len(batch) >= 2000 or total >= target:
            store.add_many(batch)
            batch = []
        if total >= target:
            break
    if batch:
        store.add_many(batch)
    return total


def copy_pool(pool: Path, to: Path) -> Path:
    """Copy the pool file ``pool`` and its snapshot folder to the pool path ``to``
    (its lock files stay: each copy makes its own); returns ``to``."""
    for part in pool.parent.glob(pool.name + "*"):
        if not part.name.endswith(("-lock", "-gate")):
            target = to.with_name(to.name + part.name[len(pool.name):])
            (shutil.copytree if part.is_dir() else shutil.copy2)(part, target)
    return to
