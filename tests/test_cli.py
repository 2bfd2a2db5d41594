"""The command line, through click's CliRunner."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from suffixspec.cli import main
from suffixspec.replay.harness import METRIC_KEYS


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result


def test_replay_builtin_workload_table():
    result = run("replay", "-k", "8")
    assert result.exit_code == 0, result.output
    header, row = result.stdout.strip().splitlines()
    assert "mean_tokens_per_step" in header and row.strip().startswith("built-in")


def test_replay_json_has_exactly_the_metric_keys():
    result = run("replay", "--json", "--engine", "ngram")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert tuple(obj) == METRIC_KEYS
    assert obj["mean_tokens_per_step"] > 1.0


def test_replay_real_trace_slice(traces_dir, tokenizer_path):
    trace = traces_dir / "tool_bfcl.jsonl.gz"
    result = run("replay", str(trace), str(trace), "--tokenizer", str(tokenizer_path),
                 "--records", "40", "--json", "-c", "4")
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stdout.strip().splitlines()]
    assert len(lines) == 2 and all(x["requests"] == 40 for x in lines)


def test_replay_needs_a_tokenizer_for_traces(traces_dir):
    result = run("replay", str(traces_dir / "tool_bfcl.jsonl.gz"))
    assert result.exit_code == 2 and "--tokenizer" in result.output


def test_replay_reports_a_file_that_is_not_a_trace(tmp_path, tokenizer_path):
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"id": 1, "prompt": "x"}\n')
    result = run("replay", str(bad), "--tokenizer", str(tokenizer_path))
    assert result.exit_code == 1 and "not a trace file" in result.output


def test_arctic_engine_when_installed():
    pytest.importorskip("arctic_inference.suffix_decoding")
    result = run("replay", "--engine", "arctic", "--json", "-k", "8")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mean_tokens_per_step"] > 1.0
