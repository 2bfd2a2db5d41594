"""Ingestion and the pool commands, through click's CliRunner on real files."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from suffixspec.cli import main
from suffixspec.anchors import BOS
from suffixspec.fingerprint import tokenizer_id
from suffixspec.pools.store import PoolStore
from suffixspec.proposer import SuffixProposer


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture()
def trace_slice(traces_dir, tmp_path):
    """The first 60 records of the SQL trace, as a gzipped JSON-lines file."""
    out = tmp_path / "slice.jsonl.gz"
    with gzip.open(traces_dir / "sql_spider_bird.jsonl.gz", "rt") as src, \
            gzip.open(out, "wt") as dst:
        for _, line in zip(range(60), src):
            dst.write(line)
    return out


def test_ingest_stats_export_round_trip(tmp_path, trace_slice, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--namespace", "sql",
            "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["lines"] == 60 and summary["sequences"] == 60 and summary["skipped"] == 0
    assert summary["tokens"] > 60

    stats = json.loads(run("stats", pool, "--json").stdout)
    assert stats["sequences"] == 60 and stats["tokens"] == summary["tokens"]
    assert stats["namespaces"]["sql"]["sequences"] == 60
    assert stats["snapshot_tokens"] == summary["tokens"]
    assert stats["fingerprint"] == tokenizer_id(tokenizer_path).fingerprint

    exported = tmp_path / "out.jsonl"
    r = CliRunner().invoke(main, ["export", str(pool)])
    assert r.exit_code == 0
    exported.write_text(r.stdout)
    copy = tmp_path / "copy.lmdb"
    r = run("ingest", copy, exported, "--tokenizer", tokenizer_path, "--json")
    assert r.exit_code == 0, r.output
    a = list(PoolStore(pool, readonly=True).sequences())
    b = list(PoolStore(copy, readonly=True).sequences())
    assert [(x.namespace, x.source, x.tokens.tolist()) for x in a] == \
           [(x.namespace, x.source, x.tokens.tolist()) for x in b]


def test_outputs_of_the_trace_are_what_is_stored(tmp_path, trace_slice, tokenizer_path):
    from suffixspec.replay.traces import hf_encoder, load_trace

    pool = tmp_path / "pool.lmdb"
    assert run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path).exit_code == 0
    want = [r.output.tolist() for r in load_trace(trace_slice, hf_encoder(tokenizer_path))]
    stored = list(PoolStore(pool, readonly=True).sequences())
    assert [s.output.tolist() for s in stored] == want


@pytest.mark.parametrize("trace, records", [("sql_spider_bird.jsonl.gz", 40),
                                             ("agent_miniswe_swebench.jsonl.gz", 40)])
def test_ingested_outputs_keep_the_anchors_of_their_prompts(tmp_path, traces_dir,
                                                            tokenizer_path, trace, records):
    """As a live commit does: replay's prompt (a conversation's turns rebuilt)
    gives the anchors each stored output starts with."""
    from suffixspec.anchors import start_anchors
    from suffixspec.replay.traces import hf_encoder, load_trace

    log = tmp_path / "log.jsonl.gz"
    with gzip.open(traces_dir / trace, "rt") as src, gzip.open(log, "wt") as dst:
        for _, line in zip(range(records), src):
            dst.write(line)
    pool = tmp_path / "pool.lmdb"
    assert run("ingest", pool, log, "--tokenizer", tokenizer_path).exit_code == 0
    requests = load_trace(log, hf_encoder(tokenizer_path))
    stored = list(PoolStore(pool, readonly=True).sequences())
    assert len(stored) == len(requests) == records
    for s, req in zip(stored, requests):
        assert s.output.tolist() == req.output.tolist()
        assert s.tokens[:s.anchors].tolist() == start_anchors(req.prompt).tolist()


def test_outputs_without_a_prompt_get_the_global_anchor(tmp_path, tokenizer_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"output": "SELECT 1"}) + "\n")
    pool = tmp_path / "pool.lmdb"
    assert run("ingest", pool, log, "--tokenizer", tokenizer_path).exit_code == 0
    (stored,) = PoolStore(pool, readonly=True).sequences()
    assert stored.tokens[:stored.anchors].tolist() == [BOS]


def test_openai_chat_and_text_formats(tmp_path, tokenizer_path):
    chat = tmp_path / "chat.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "earlier answer"}],
         "response": {"choices": [{"message": {"role": "assistant", "content": "SELECT 1;"}}]}},
        {"messages": [{"role": "system", "content": "be brief"}],
         "choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
             {"function": {"name": "run_sql", "arguments": "{\"q\": \"SELECT 2\"}"}}]}}]},
    ]
    chat.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code = tmp_path / "module.py"
    code.write_text("def f(x):\n    return x + 1\n")
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, chat, code, "--tokenizer", tokenizer_path, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    # Two assistant messages in line 1, one tool call in line 2, one document.
    assert summary["sequences"] == 4 and summary["skipped"] == 0
    r = run("ingest", tmp_path / "roles.lmdb", chat, "--tokenizer", tokenizer_path,
            "--role", "system", "--role", "user", "--json")
    assert json.loads(r.stdout.strip().splitlines()[-1])["sequences"] == 2


def bad_file(tmp_path):
    good = json.dumps({"id": 1, "prompt": "p", "output": "SELECT a FROM t;"}).encode()
    rows = [good,
            b'{"id": 2, "prompt": "p", "output": "SELECT',  # truncated JSON
            json.dumps({"id": 3, "prompt": "p", "output": 42}).encode(),  # wrong type
            json.dumps({"id": 4, "prompt": "p", "output": ""}).encode(),  # empty output
            b'{"id": 5, "prompt": "p", "output": "caf\xe9"}',  # not UTF-8
            json.dumps([1, 2]).encode(),  # not an object
            good.replace(b'"id": 1', b'"id": 7')]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def test_bad_lines_are_reported_and_skipped(tmp_path, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, bad_file(tmp_path), "--tokenizer", tokenizer_path,
            "--format", "trace", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert (summary["lines"], summary["sequences"], summary["skipped"]) == (7, 2, 5)
    for line, words in ((2, "invalid JSON"), (3, "not a string"), (4, "empty output"),
                        (5, "UTF-8"), (6, "not an object")):
        assert f"bad.jsonl:{line}: " in r.output and words in r.output


def test_strict_stops_at_the_first_bad_line_keeping_what_came_before(tmp_path, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, bad_file(tmp_path), "--tokenizer", tokenizer_path,
            "--format", "trace", "--strict")
    assert r.exit_code == 1 and "bad.jsonl:2" in r.output
    assert PoolStore(pool, readonly=True).stats()["sequences"] == 1


def test_ingest_into_a_pool_of_another_tokenizer_is_refused(tmp_path, trace_slice,
                                                            tokenizer_path):
    from suffixspec.fingerprint import BYTES

    pool = tmp_path / "pool.lmdb"
    PoolStore(pool, tokenizer=BYTES, max_depth=64).add(np.arange(3, dtype=np.int32), "x")
    r = run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path)
    assert r.exit_code == 1 and "utf8-bytes" in r.output and "was built with" in r.output
    assert PoolStore(pool, readonly=True).stats()["sequences"] == 1


def test_prune_forget_and_snapshot_commands(tmp_path, trace_slice, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--namespace", "a")
    run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--namespace", "b")
    total = json.loads(run("stats", pool, "--json").stdout)["tokens"]
    r = run("prune", pool, "--max-tokens", total // 2, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tokens"] <= total // 2
    stats = json.loads(run("stats", pool, "--json").stdout)
    assert set(stats["namespaces"]) == {"b"}  # namespace a was older
    r = run("forget", pool, "--namespace", "b", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["tokens"] == 0
    assert run("snapshot", pool, "--json").exit_code == 0
    assert run("prune", pool).exit_code == 2
    assert run("forget", pool).exit_code == 2
    assert run("prune", pool, "--older-than", "soon").exit_code == 2


def test_replay_against_a_pool_warms_up(tmp_path):
    pool = tmp_path / "pool.lmdb"
    first = json.loads(run("replay", "--pool", pool, "--json", "-k", "8").stdout)
    second = json.loads(run("replay", "--pool", pool, "--json", "-k", "8").stdout)
    assert second["mean_tokens_per_step"] > first["mean_tokens_per_step"]


def _export_file(path, records, fingerprint):
    from suffixspec.offline.ingest import EXPORT_HEADER

    with open(path, "w") as f:
        f.write(json.dumps({EXPORT_HEADER: 1, "fingerprint": fingerprint}) + "\n")
        for rec in records:
            f.write((rec if isinstance(rec, str) else json.dumps(rec)) + "\n")


def test_bad_lines_of_every_kind_are_reported_and_skipped(tmp_path, tokenizer_path):
    good = json.dumps({"output": "SELECT 1"})
    lines = [good,
             '{"output": ' + "[" * 100_000 + "]" * 100_000 + "}",
             '{"output": "x", "n": ' + "9" * 5000 + "}",
             '{"output": "lone \\ud800 surrogate"}',
             good]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(lines) + "\n")
    chat = tmp_path / "chat.jsonl"
    chat.write_text("\n".join([
        json.dumps({"messages": [{"role": "assistant", "content": "hi"}]}),
        json.dumps({"messages": [{"role": "assistant", "content": "x", "tool_calls": "oops"}]}),
        json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"function": "str"}]}]}),
        json.dumps({"messages": [{"role": "assistant", "content": "bye"}]})]) + "\n")
    whole = gzip.compress(("\n".join(json.dumps({"output": f"row {i} " * 30})
                                     for i in range(3000)) + "\n").encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    plain_named_gz = tmp_path / "plain.jsonl.gz"
    plain_named_gz.write_text(good + "\n")
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, mixed, chat, cut, plain_named_gz, "--tokenizer", tokenizer_path,
            "--json")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    for where in ("mixed.jsonl:2: JSON nested too deeply", "mixed.jsonl:3: unreadable JSON",
                  "mixed.jsonl:4: 'output' is not valid text", "chat.jsonl:2: tool_calls is str",
                  "chat.jsonl:3: a tool call has no 'function'", "cut.jsonl.gz:"):
        assert where in r.stderr, (where, r.stderr)
    assert summary["skipped"] == 6
    stored = PoolStore(pool, readonly=True).stats()["sequences"]
    assert stored == summary["sequences"] == summary["lines"] - summary["skipped"]
    assert summary["sequences"] > 100  # the readable half of the cut file


def test_export_records_honour_the_namespace_and_the_vocabulary(tmp_path, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    fingerprint = tokenizer_id(tokenizer_path).fingerprint
    export = tmp_path / "export.jsonl"
    _export_file(export, [{"namespace": "n" * 500, "token_ids": [1, 2, 3]},
                          {"namespace": "theirs", "token_ids": [999_999_999]},
                          {"namespace": "theirs", "token_ids": [4, 5, 6]}], fingerprint)
    r = run("ingest", pool, export, "--tokenizer", tokenizer_path)
    assert "export.jsonl:2: namespace must be" in r.stderr
    assert "export.jsonl:3: token id 999999999 is outside the pool's vocabulary" in r.stderr
    store = PoolStore(pool, readonly=True)
    assert store.stats()["namespaces"] == {"theirs": {"sequences": 1, "tokens": 3}}
    store.close()
    r = run("ingest", pool, export, "--tokenizer", tokenizer_path, "--namespace", "mine")
    store = PoolStore(pool, readonly=True)
    assert store.stats()["namespaces"]["mine"] == {"sequences": 1, "tokens": 3}
    store.close()


def test_an_export_makes_a_new_pool_alone_and_ingesting_it_again_adds_nothing(
        tmp_path, trace_slice, tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    assert run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path).exit_code == 0
    exported = tmp_path / "out.jsonl"
    exported.write_text(run("export", pool).stdout)
    copy = tmp_path / "copy.lmdb"
    r = run("ingest", copy, exported, "--json")  # no --tokenizer: the export names it
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["sequences"] == 60
    a, b = PoolStore(pool, readonly=True), PoolStore(copy, readonly=True)
    assert a.tokenizer == b.tokenizer and a.vocab_size == b.vocab_size is not None
    assert a.max_depth == b.max_depth
    a.close()
    b.close()
    r = run("ingest", copy, exported, "--json")
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["sequences"] == 0 and summary["duplicates"] == 60
    assert PoolStore(copy, readonly=True).stats()["sequences"] == 60


@pytest.mark.parametrize("command", [["stats"], ["export"], ["snapshot"], ["forget",
                                     "--namespace", "x"], ["prune", "--max-tokens", "5"]])
def test_commands_on_a_missing_pool_say_so_in_one_line(tmp_path, command):
    missing = tmp_path / "missing.lmdb"
    r = run(command[0], missing, *command[1:])
    assert r.exit_code == 1 and r.exception is None or isinstance(r.exception, SystemExit)
    assert r.output.strip().splitlines() == [f"Error: no pool at {missing}"]
    assert not list(tmp_path.iterdir())  # nothing created beside it


def test_a_new_pool_from_logs_needs_the_tokenizer(tmp_path, trace_slice):
    r = run("ingest", tmp_path / "new.lmdb", trace_slice)
    assert r.exit_code == 2
    assert "creating one from logs needs --tokenizer" in r.output
    assert not list(tmp_path.glob("new.lmdb*"))


def test_the_text_summary_names_no_empty_fields(tmp_path, trace_slice, tokenizer_path):
    r = run("ingest", tmp_path / "pool.lmdb", trace_slice, "--tokenizer", tokenizer_path)
    assert r.exit_code == 0 and "None" not in r.stdout and "stopped" not in r.stdout


def test_ingest_learns_the_calibration_from_the_newest_logged_requests(tmp_path, trace_slice,
                                                                       tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--learn", "20", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["sequences"] == 60 and summary["learned_from"]["requests"] == 20
    assert summary["learned_from"]["drafted_per_step"] > 0  # it drafted from the other 40
    with PoolStore(pool, readonly=True) as store:
        table = store.load_table("calibration")
        assert len(list(store.sequences())) == 60
        assert store.stats()["snapshot_tokens"] == summary["tokens"]
    fresh = SuffixProposer().stats.table
    assert table.shape == fresh.shape and not np.array_equal(table, fresh)
    # Nothing learned when asked not to.
    plain = tmp_path / "plain.lmdb"
    assert run("ingest", plain, trace_slice, "--tokenizer", tokenizer_path, "--learn", "0"
               ).exit_code == 0
    with PoolStore(plain, readonly=True) as store:
        assert store.load_table("calibration") is None


def _held(i: int):
    from suffixspec.anchors import start_anchors
    from suffixspec.offline.ingest import Held

    prompt = np.arange(5, dtype=np.int32) + i
    return Held(prompt, start_anchors(prompt), np.arange(10, 20, dtype=np.int32) + i, "default",
                f"rec-{i}")


def test_held_back_outputs_a_failed_calibration_left_are_committed_once(tmp_path,
                                                                         tokenizer_path):
    from suffixspec.offline.learn import commit_rest

    pool = tmp_path / "pool.lmdb"
    held = [_held(i) for i in range(4)]
    with PoolStore(pool, tokenizer=tokenizer_id(tokenizer_path), max_depth=64) as store:
        store.add(held[0].stored, "default", "engine", held[0].request_id)
        # Another record with the same output is another record.
        store.add(held[1].stored, "default", "engine", "another-id")
    assert commit_rest(pool, held) == 3
    assert commit_rest(pool, held) == 0
    with PoolStore(pool, readonly=True) as store:
        stored = sorted(s.output.tolist() for s in store.sequences())
    assert stored == sorted([h.output.tolist() for h in held] + [held[1].output.tolist()])


def test_what_a_killed_learn_held_back_is_stored_once_by_the_next_offline_command(
        tmp_path, tokenizer_path):
    from suffixspec.offline import learn

    pool = tmp_path / "pool.lmdb"
    held = [_held(i) for i in range(5)]
    with PoolStore(pool, tokenizer=tokenizer_id(tokenizer_path), max_depth=64) as store:
        store.add(held[0].stored, "default", "engine", held[0].request_id)  # served, then killed
    learn.keep(pool, held)
    assert learn.learning_file(pool).exists()
    assert learn.recover(pool) == 4 and not learn.learning_file(pool).exists()
    assert learn.recover(pool) == 0
    with PoolStore(pool, readonly=True) as store:
        assert sorted(s.request_id for s in store.sequences()) == [f"rec-{i}" for i in range(5)]


def test_ingesting_a_log_again_adds_nothing_and_learns_from_nothing_twice(tmp_path, trace_slice,
                                                                          tokenizer_path):
    pool = tmp_path / "pool.lmdb"
    first = run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--learn", "20",
                "--json")
    assert first.exit_code == 0, first.output
    again = run("ingest", pool, trace_slice, "--tokenizer", tokenizer_path, "--learn", "20",
                "--json")
    assert again.exit_code == 0, again.output
    summary = json.loads(again.stdout.strip().splitlines()[-1])
    assert summary["sequences"] == 0 and summary["duplicates"] == 60
    assert "learned_from" not in summary
    with PoolStore(pool, readonly=True) as store:
        ids = [s.request_id for s in store.sequences()]
    assert len(ids) == 60 and len(set(ids)) == 60 and all(ids)


def test_a_byte_order_mark_and_a_call_without_its_function_are_clear(tmp_path, tokenizer_path):
    """A log written with a UTF-8 byte order mark keeps its first record; a tool
    call with no 'function' is a bad line, not the text '()'."""
    log = tmp_path / "bom.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps({"output": f"SELECT {i}"})
                                                for i in range(3)).encode() + b"\n")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "assistant",
                                              "tool_calls": [{"id": "c1"}]}]}) + "\n")
    pool = tmp_path / "pool.lmdb"
    r = run("ingest", pool, log, chat, "--tokenizer", tokenizer_path, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["sequences"] == 3 and summary["skipped"] == 1
    assert "chat.jsonl:1: a tool call has no 'function'" in r.stderr
