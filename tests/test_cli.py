"""The command line, through click's CliRunner."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from suffixspec.cli import main
from suffixspec.replay.harness import METRIC_KEYS


def run(*args):
    result = CliRunner().invoke(main, list(args))
    return result


def test_replay_builtin_workload_table():
    result = run("replay", "-k", "8", "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    result = run("replay", "-k", "8")
    assert result.exit_code == 0, result.output
    header, row, *note = result.stdout.strip().splitlines()
    assert header.split("  ")[0].strip() == "trace"
    for column in ("tokens/step", "est", "accepted", "drafted/step", "µs/step p50",
                   "µs/step p99", "start ms", "B/token"):
        assert column in header
    cells = row.split()
    assert cells[:3] == ["built-in", "360", f"{figures['mean_tokens_per_step']:.2f}"]
    assert f"{figures['acceptance_rate']:.0%}" in cells
    assert note and "tokens/step:" in note[0]


def test_replay_json_has_the_trace_and_exactly_the_metric_keys():
    result = run("replay", "--json", "--engine", "ngram")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert tuple(obj) == ("trace", *METRIC_KEYS) and obj["trace"] == "built-in"
    assert obj["mean_tokens_per_step"] > 1.0


def test_replay_real_trace_slice(traces_dir, tokenizer_path):
    trace = traces_dir / "tool_bfcl.jsonl.gz"
    result = run("replay", str(trace), str(trace), "--tokenizer", str(tokenizer_path),
                 "--records", "40", "--json", "-c", "4")
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stdout.strip().splitlines()]
    assert len(lines) == 2 and all(x["requests"] == 40 for x in lines)
    assert [x["trace"] for x in lines] == ["tool_bfcl", "tool_bfcl"]


def test_replay_needs_a_tokenizer_for_traces(traces_dir):
    result = run("replay", str(traces_dir / "tool_bfcl.jsonl.gz"))
    assert result.exit_code == 2 and "--tokenizer" in result.output


def test_replay_reports_a_file_that_is_not_a_trace(tmp_path, tokenizer_path):
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"id": 1, "prompt": "x"}\n')
    result = run("replay", str(bad), "--tokenizer", str(tokenizer_path))
    assert result.exit_code == 1 and "not a trace file" in result.output


@pytest.mark.slow  # a child interpreter
def test_arctic_engine_when_installed():
    pytest.importorskip("arctic_inference.suffix_decoding")
    result = run("replay", "--engine", "arctic", "--json", "-k", "8")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mean_tokens_per_step"] > 1.0


def test_arctic_engine_without_arctic_inference_is_one_line_before_any_work(tmp_path):
    code = ("import sys; sys.modules['arctic_inference'] = None; "
            "from suffixspec.cli import main; sys.exit(main())")
    proc = subprocess.run([sys.executable, "-c", code, "replay", "--engine", "arctic"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "--engine arctic needs arctic-inference" in proc.stderr
    assert "Traceback" not in proc.stderr and "compiling" not in proc.stderr


@pytest.mark.parametrize("make, words", [
    (lambda d: d / "README.md", "is not a Hugging Face tokenizer.json"),
    (lambda d: d, "no tokenizer.json at"),
])
def test_a_tokenizer_that_is_not_one_is_one_line(tmp_path, traces_dir, make, words):
    (tmp_path / "README.md").write_text("# not a tokenizer\n")
    result = run("replay", str(traces_dir / "tool_bfcl.jsonl.gz"), "--tokenizer",
                 str(make(tmp_path)))
    assert result.exit_code == 2 and words in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
