"""``suffixspec fleet-build`` on a local Ray cluster: shard pools built as Ray
tasks and merged draft exactly as one ingest of the same logs."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from click.testing import CliRunner

from suffixspec import SuffixProposer
from suffixspec.cli import main
from suffixspec.fingerprint import tokenizer_id
from suffixspec.pools.store import PoolStore
from suffixspec.replay.traces import hf_encoder, load_trace

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

SHARDS, PER_SHARD, LEARN = 3, 40, 16


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _logs(tmp_path, traces_dir):
    """Shards of the SQL trace's first records, the same records in one log, and
    the records that follow them."""
    with gzip.open(traces_dir / "sql_spider_bird.jsonl.gz", "rt") as f:
        lines = [line for _, line in zip(range(SHARDS * PER_SHARD + 20), f)]
    logs = []
    for k in range(SHARDS):
        log = tmp_path / f"part-{k}.jsonl"
        log.write_text("".join(lines[k * PER_SHARD:(k + 1) * PER_SHARD]))
        logs.append(log)
    whole, follow = tmp_path / "whole.jsonl", tmp_path / "follow.jsonl"
    whole.write_text("".join(lines[:SHARDS * PER_SHARD]))
    follow.write_text("".join(lines[SHARDS * PER_SHARD:]))
    return logs, whole, follow


def _build_both(tmp_path, logs, whole, tokenizer_path, learn: int, tag: str):
    fleet, single = tmp_path / f"fleet-{tag}.lmdb", tmp_path / f"single-{tag}.lmdb"
    r = run("fleet-build", fleet, *logs, "--tokenizer", tokenizer_path, "--work-dir",
            tmp_path / f"shards-{tag}", "--learn", learn, "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["shards"] == SHARDS and result["sequences"] == SHARDS * PER_SHARD
    r = run("ingest", single, whole, "--tokenizer", tokenizer_path, "--learn", learn)
    assert r.exit_code == 0, r.output
    return fleet, single, result


def _stored(path):
    with PoolStore(path, readonly=True) as store:
        return sorted(s.tokens.tolist() for s in store.sequences()), \
            store.load_table("calibration")


def test_a_ray_build_drafts_as_one_ingest_of_the_same_logs(tmp_path, traces_dir, tokenizer_path,
                                                           local_ray):
    logs, whole, follow = _logs(tmp_path, traces_dir)
    fleet, single, _ = _build_both(tmp_path, logs, whole, tokenizer_path, 0, "plain")
    assert _stored(fleet)[0] == _stored(single)[0]  # each output with its prompt's anchors
    requests = load_trace(follow, hf_encoder(tokenizer_path))
    tok = tokenizer_id(tokenizer_path)
    drafts = []
    for path in (fleet, single):
        with SuffixProposer(pool=path, tokenizer=tok) as prop:
            got = []
            for req in requests:
                prop.start_request(req.req_id, req.prompt)
                for cut in range(0, req.output.shape[0], 7):
                    prop.extend(req.req_id, req.output[cut:cut + 7])
                    got.append(prop.propose([req.req_id])[0].token_ids.tolist())
                prop.abort_request(req.req_id)
            drafts.append(got)
    assert drafts[0] == drafts[1]
    assert sum(len(d) for d in drafts[0]) > 50  # drafted from the pool


def test_a_ray_build_learns_the_calibration_one_ingest_learns(tmp_path, traces_dir,
                                                              tokenizer_path, local_ray):
    logs, whole, _ = _logs(tmp_path, traces_dir)
    fleet, single, result = _build_both(tmp_path, logs, whole, tokenizer_path, LEARN, "learn")
    assert result["learned_from"]["requests"] == LEARN
    (seqs_f, table_f), (seqs_s, table_s) = _stored(fleet), _stored(single)
    assert seqs_f == seqs_s
    assert table_f is not None and np.array_equal(table_f, table_s)


def test_a_rerun_a_retried_task_or_a_copy_adds_nothing_twice(tmp_path, traces_dir,
                                                           tokenizer_path, local_ray):
    from suffixspec.offline.fleet_build import build_shard

    logs, _, _ = _logs(tmp_path, traces_dir)
    fleet = tmp_path / "fleet.lmdb"
    args = ("fleet-build", fleet, *logs, "--tokenizer", tokenizer_path, "--work-dir",
            tmp_path / "shards", "--learn", LEARN, "--json")
    assert run(*args).exit_code == 0
    before = _stored(fleet)[0]
    assert len(before) == SHARDS * PER_SHARD
    again = run(*args)  # the same command over the same work dir
    assert again.exit_code == 0, again.output
    assert _stored(fleet)[0] == before
    # A shard's task run twice, as Ray retries a killed worker: its pool holds each record once.
    shard = tmp_path / "retried.lmdb"
    for _ in range(2):
        build_shard(str(logs[0]), str(shard), str(tokenizer_path), None, 64, 1, 0)
    with PoolStore(shard, readonly=True) as store:
        assert store.stats()["sequences"] == PER_SHARD
    # A copy of the fleet's pool added to it: skipped as added already, nothing added.
    copy = tmp_path / "copy.lmdb"
    import shutil

    shutil.copy(fleet, copy)
    shutil.copytree(fleet.with_name(fleet.name + ".snapshots"),
                    copy.with_name(copy.name + ".snapshots"))
    r = run("add-segment", fleet, copy)
    assert r.exit_code == 0 and "holds every record" in r.output, r.output
    assert _stored(fleet)[0] == before


def test_fleet_build_without_ray_says_how_to_get_it(tmp_path, tokenizer_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"output": "x"}) + "\n")
    r = run("fleet-build", tmp_path / "p.lmdb", log, "--tokenizer", tokenizer_path,
            "--work-dir", tmp_path / "w")
    assert r.exit_code != 0 and 'pip install "suffixspec[ray]"' in r.output
