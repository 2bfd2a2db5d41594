"""Real vLLM on CPU with SmolLM2-135M-Instruct: no speculation, vLLM ``ngram``,
vLLM ``suffix`` (arctic-inference) and suffixspec, in one run.

    python bench/vllm_bench.py [--traces ../shared/data/traces] [--prompts 48]

Workloads: the first 48 Spider gold records of the SQL trace and the first 48
single-turn BFCL records, sent as chat messages, greedy, max_tokens 128; and
``agent``, multi-turn: the first 6 turns of the first 8 sessions of the agent
trace, each turn a new request whose messages are the session so far (the
model's own earlier answers included) plus the turn's new messages (each cut
to 3,000 characters), while the prompt fits the 8,192-token context.
Each (method, workload, mode) runs in a fresh process: ``sequential`` sends
one request at a time, ``concurrent`` keeps 8 in flight (agent: the 8
sessions advance together, one turn each per round).  Reported: output
tokens/s, vLLM's mean acceptance length (1 + accepted / drafts), drafted
tokens per draft, and whether every output equals the run without
speculation token for token.  Needs vLLM (CPU build) and, for the arctic
row, arctic-inference (bench/setup_arctic.sh).

Scenarios: ``cold`` (the above: every row on a fresh server) and
``restart`` (sql and agent: the first half of the requests is day 1, the
second half day 2, timed on a server just started; arctic restarted starts
with an empty cache, suffixspec reopens the pool file day 1 filled, or a
pool ``suffixspec ingest`` built from day 1's log; against arctic never
restarted, which serves both days in one process) and ``replicas`` (sql:
two servers at once, one core each, every other request to each; arctic
keeps a cache per server, suffixspec's share one pool file).
``--empty-kernel-cache``: every cold row's server starts with an empty Numba
cache, as the first server after install does.

    python bench/vllm_bench.py --scenarios restart,replicas --restart-workloads sql \
        --prompts 400 --modes concurrent --name vllm_history

is the history run: day 1 of 200 requests, day 2 of 200.

"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402
from smollm2 import ensure_model  # noqa: E402

from suffixspec.replay.traces import read_records  # noqa: E402  (loads no Numba)

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"

METHODS = ("none", "ngram", "arctic", "suffixspec", "suffixspec c0.03", "suffixspec c0.1")
# "suffixspec": its defaults, the draft cost measured from the engine's step
# times.  "c0.03": the draft cost fixed at 0.03 of a step per drafted token
# (the earlier default); "c0.1": fixed at about what a drafted token costs
# SmolLM2 on this CPU (each adds ~3 ms to a ~27 ms step).
DRAFT_COSTS = {"suffixspec c0.03": "0.03", "suffixspec c0.1": "0.1"}
# A method may end in " kN": that row runs with num_speculative_tokens N
# instead of --k (the draft cap compared within one run).
CAP = re.compile(r"^(?P<method>.+?)(?: k(?P<k>\d+))?$")
WORKLOADS = ("sql", "bfcl", "agent")
SESSIONS = 8  # agent workload
TURNS = 6  # agent: turns per session (48 requests, as the other workloads)
MESSAGE_CHARS = 3_000  # agent: a turn's new messages are cut to this
AGENT_LEN = 8_192  # SmolLM2's context; other workloads run at 4,096
MODES = {"sequential": 1, "concurrent": 8}
PHASES = ("all", "day1", "day2", "both")
# Restart scenario rows: (row name, method, phases run in turn on fresh servers,
# the last one timed).  suffixspec keeps its pool in a file across the restart.
RESTART = (("none", "none", ("day2",)),
           ("arctic restarted", "arctic", ("day2",)),
           ("arctic never restarted", "arctic", ("both",)),
           ("suffixspec restarted, pool kept", "suffixspec", ("day1", "day2")),
           ("suffixspec, pool ingested from day 1's log", "suffixspec", ("log", "day2")))
REPLICA_METHODS = ("none", "arctic", "suffixspec")
ROLE = re.compile(r"<\|(system|user|assistant|tool)\|>\n")


def chat(prompt: str) -> list[dict]:
    """A trace prompt rendered ``<|role|>\\ncontent`` as chat messages."""
    parts = ROLE.split(prompt)
    if len(parts) == 1:
        return [{"role": "user", "content": prompt}]
    messages = [{"role": parts[i], "content": parts[i + 1].rstrip("\n")}
                for i in range(1, len(parts) - 1, 2)]
    return [m if m["role"] != "tool" else {"role": "user", "content": m["content"]}
            for m in messages if m["content"]]


def sessions(traces: Path, n: int = SESSIONS) -> list[list[list[dict]]]:
    """The first ``n`` agent sessions: per turn, the messages it adds."""
    out: dict[str, list] = {}
    for r in read_records(traces / "agent_miniswe_swebench.jsonl.gz"):
        if r["session"] not in out and len(out) == n:
            break
        out.setdefault(r["session"], []).append(r)
    return [[[dict(m, content=m["content"][:MESSAGE_CHARS]) for m in chat(t["prompt_delta"])]
             for t in sorted(turns, key=lambda t: t["turn"])[:TURNS]] for turns in out.values()]


def workload(name: str, traces: Path, n: int):
    if name == "agent":
        return sessions(traces)
    if name == "sql":
        recs = (r for r in read_records(traces / "sql_spider_bird.jsonl.gz")
                if "spider" in r["source"] and r["model"] == "gold")
    else:
        recs = (r for r in read_records(traces / "tool_bfcl.jsonl.gz") if "session" not in r)
    out = []
    for r in recs:
        if len(r["prompt"]) <= 12_000:  # keep prompts well inside the context window
            out.append(chat(r["prompt"]))
        if len(out) == n:
            break
    return out


def split_cap(method: str) -> tuple[str, int | None]:
    """``"arctic k32"`` -> ``("arctic", 32)``; ``"arctic"`` -> ``("arctic", None)``."""
    m = CAP.match(method)
    base = m["method"]
    if base not in METHODS:
        raise click.BadParameter(f"unknown method {method!r}; choose from {', '.join(METHODS)}, "
                                 "each optionally followed by ' kN'")
    return base, None if m["k"] is None else int(m["k"])


def spec_config(method: str, k: int, depth: int, factor: float, min_prob: float):
    method, cap = split_cap(method)
    k = cap or k
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}
    config = {"method": "suffix", "num_speculative_tokens": k,
              "suffix_decoding_max_tree_depth": depth}
    if method == "arctic":  # its cost-aware best on these traces; suffixspec runs its defaults
        config.update(suffix_decoding_max_spec_factor=factor,
                      suffix_decoding_min_token_prob=min_prob)
    return config


def modes(baseline_once: bool) -> list[tuple[str, int]]:
    """The modes in the order they run.  With ``baseline_once`` the run without
    speculation is made once per workload and scenario, in the concurrent mode
    (the quickest), and its outputs are what every row of both modes must
    equal: greedy outputs do not depend on the batch, which earlier runs of
    both modes checked token for token."""
    return sorted(MODES.items(), key=lambda m: -m[1]) if baseline_once else list(MODES.items())


def halves(work: list) -> tuple[list, list]:
    """Day 1 and day 2 of the restart scenario: the first and second half."""
    return work[:len(work) // 2], work[len(work) // 2:]


def run_one(model: str, method: str, wl: str, work, concurrency: int, spec,
            phase: str = "all", replica: tuple[int, int, Path] | None = None) -> dict:
    """Serve ``work`` and time it.  ``phase``: ``all`` (a cold server, after one
    warm-up request), ``day1`` / ``day2`` (one half, on a server just started:
    a restart between the days), ``both`` (day 1, then day 2 timed on the
    same server: never restarted).  With ``replica`` (index, count, barrier
    folder), the timed part starts once every replica has touched a file in
    that folder."""
    from vllm import LLM, SamplingParams

    multi_turn = wl == "agent"
    llm = LLM(model, dtype="float32", enforce_eager=True,
              max_model_len=AGENT_LEN if multi_turn else 4096,
              max_num_seqs=concurrency, speculative_config=spec, seed=0,
              kv_cache_memory_bytes=(4 if multi_turn else 1) << 30, disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=128)

    def serve(part):
        if multi_turn:
            return run_sessions(llm, part, concurrency, params)
        if concurrency == 1:
            return [llm.chat([c], params, use_tqdm=False)[0] for c in part]
        return llm.chat(part, params, use_tqdm=False)

    day1, day2 = halves(work)
    if phase == "all":
        warm = work[0][0] if multi_turn else work[0]
        llm.chat([warm], params, use_tqdm=False)  # warm-up request, not timed
    elif phase == "both":
        serve(day1)
    timed = {"all": work, "day1": day1, "day2": day2, "both": day2}[phase]
    if replica is not None:
        wait_for_replicas(*replica)
    before = spec_counts(llm)
    started = time.time()
    start = time.perf_counter()
    outs = serve(timed)
    seconds = time.perf_counter() - start
    after = spec_counts(llm)
    counts = {k: after[k] - before.get(k, 0) for k in after}
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    n_out = sum(len(t) for t in tokens)
    drafts = counts.get("vllm:spec_decode_num_drafts", 0)
    return {"method": method, "seconds": seconds, "started": started, "ended": time.time(),
            "output_tokens": n_out, "requests": len(outs),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
            **drafter_info(llm),
            "tokens_per_s": n_out / seconds,
            "acceptance_length": 1 + counts.get("vllm:spec_decode_num_accepted_tokens", 0)
            / drafts if drafts else 1.0,
            "draft_tokens_per_draft": counts.get("vllm:spec_decode_num_draft_tokens", 0)
            / drafts if drafts else 0.0,
            "outputs": tokens, "prompt_ids": [list(o.prompt_token_ids) for o in outs]}


def wait_for_replicas(me: int, total: int, barrier: Path, timeout: float = 600.0) -> None:
    """Touch this replica's file in ``barrier``, then wait for all of them."""
    (barrier / str(me)).touch()
    deadline = time.monotonic() + timeout
    while len(list(barrier.iterdir())) < total:
        if time.monotonic() > deadline:
            raise SystemExit("the other replicas never started")
        time.sleep(0.05)


def run_sessions(llm, work, concurrency: int, params) -> list:
    """Play the sessions turn by turn, ``concurrency`` sessions at a time; a
    session ends when its next prompt would not leave room for the answer.
    Returns the answers session by session, turns in order."""
    tokenizer = llm.get_tokenizer()
    outs = []
    for first in range(0, len(work), concurrency):
        group = work[first:first + concurrency]
        history: list[list[dict] | None] = [[] for _ in group]  # None: session ended
        for turn in range(max(map(len, group))):
            asked = []
            for i, turns in enumerate(group):
                if history[i] is None or turn >= len(turns):
                    continue
                messages = history[i] + turns[turn]
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                       tokenize=False)
                if len(tokenizer.encode(prompt, add_special_tokens=False)) \
                        + params.max_tokens > AGENT_LEN:
                    history[i] = None
                    continue
                asked.append((i, messages))
            if not asked:
                break
            answers = llm.chat([m for _, m in asked], params, use_tqdm=False)
            for (i, messages), answer in zip(asked, answers):
                history[i] = messages + [{"role": "assistant", "content": answer.outputs[0].text}]
                outs.append((first + i, turn, answer))
    return [answer for *_, answer in sorted(outs, key=lambda o: o[:2])]  # session by session


def drafter_info(llm) -> dict:
    """suffixspec's reused prompt tokens and, when it measured its draft cost,
    the online fit against an offline least-squares fit of the same steps."""
    def info(worker):
        drafter = getattr(worker.model_runner, "drafter", None)
        if not hasattr(drafter, "stats"):
            return {}
        out = {"reused_prompt_tokens": drafter.stats().get("reused_prompt_tokens")}
        est = getattr(drafter, "step_cost", None)
        if est is not None and len(est.recent) > 10:
            import numpy as np

            tokens, seconds = np.asarray(est.recent, np.float64).T
            slope, intercept = np.polyfit(tokens, seconds, 1)
            fit = est.estimate()
            out.update(cost_steps=est.steps, step_fixed_ms=1e3 * fit.fixed,
                       step_token_ms=1e3 * fit.per_token, offline_fixed_ms=1e3 * intercept,
                       offline_token_ms=1e3 * slope)
        return out

    return llm.collective_rpc(info)[0]


def spec_counts(llm) -> dict:
    return {m.name: m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}


@click.group(invoke_without_command=True)
@click.option("--traces", type=click.Path(path_type=Path), default=TRACES, show_default=True)
@click.option("--prompts", default=48, show_default=True, help="Requests per workload.")
@click.option("--k", default=16, show_default=True, help="num_speculative_tokens.")
@click.option("--depth", default=64, show_default=True, help="suffix_decoding_max_tree_depth.")
@click.option("--factor", default=2.0, show_default=True,
              help="suffix_decoding_max_spec_factor (arctic).")
@click.option("--min-prob", default=0.2, show_default=True,
              help="suffix_decoding_min_token_prob (arctic).")
@click.option("--methods", default=",".join(METHODS), show_default=True)
@click.option("--workloads", default=",".join(WORKLOADS), show_default=True)
@click.option("--scenarios", default="cold,restart,replicas", show_default=True,
              help="cold: every row on a fresh server; restart: day 1 and day 2 on "
                   "fresh servers (see RESTART); replicas: two servers at once, "
                   "requests shared round-robin (see replica_rows).")
@click.option("--restart-workloads", default="sql,agent", show_default=True)
@click.option("--replica-workloads", default="sql", show_default=True)
@click.option("--repeats", default=1, show_default=True,
              help="Cold scenario: rounds per workload and mode, the methods interleaved; "
                   "each ratio is taken within a round and reported as the median of rounds.")
@click.option("--baseline-once/--baseline-per-mode", default=True, show_default=True,
              help="Serve without speculation once per workload and scenario (concurrent) "
                   "and check both modes' outputs against it.")
@click.option("--modes", "mode_names", default=",".join(MODES), show_default=True,
              help="sequential (one request at a time) and / or concurrent (8 in flight).")
@click.option("--out", type=click.Path(path_type=Path),
              default=Path(__file__).parent / "results", show_default=True,
              help="Folder for NAME.json and NAME.md.")
@click.option("--name", default="vllm", show_default=True, help="Name of the results files.")
@click.option("--empty-kernel-cache", is_flag=True,
              help="cold rows: each server with an empty Numba cache of its own, as the "
                   "first after install (suffixspec compiles its kernels as it serves)")
@click.pass_context
def main(ctx, traces, prompts, k, depth, factor, min_prob, methods, workloads, scenarios,
         restart_workloads, replica_workloads, repeats, baseline_once, mode_names, out, name,
         empty_kernel_cache):
    if ctx.invoked_subcommand is not None:
        return
    for method in methods.split(","):
        split_cap(method)  # a misspelt method fails here, not after an hour of rows
    model = str(ensure_model())
    knobs = dict(k=k, depth=depth, factor=factor, min_prob=min_prob)
    run_modes = [m for m in modes(baseline_once) if m[0] in mode_names.split(",")]
    rows = []

    def save(part):  # after every row, so a stopped run keeps what it measured
        write(rows + part, out, name, knobs, prompts, show=False)

    if "replicas" in scenarios.split(","):  # first: it needs both cores
        rows += replica_rows(model, traces, prompts, knobs, replica_workloads.split(","),
                             run_modes, save)
    if "restart" in scenarios.split(","):
        rows += restart_rows(model, traces, prompts, knobs, restart_workloads.split(","),
                             run_modes, save)
    for wl in (workloads.split(",") if "cold" in scenarios.split(",") else ()):
        base = None
        for mode, conc in run_modes:
            for rnd in range(repeats):  # rounds interleave the methods: A B A B ...
                for method in methods.split(","):
                    if method == "none" and base is not None:
                        continue
                    res = child(model, method, wl, traces, prompts, conc, knobs,
                                empty_kernel_cache=empty_kernel_cache)
                    if method == "none":
                        base = res["outputs"]
                    res["identical"] = None if base is None else res["outputs"] == base
                    res.update(workload=wl, mode=mode, scenario="cold", round=rnd)
                    rows.append(res)
                    save([])
                    print(f"{wl:5s} {mode:10s} {method:10s} round {rnd} "
                          f"{res['tokens_per_s']:7.1f} tok/s  accept {res['acceptance_length']:.2f}"
                          f"  identical {res['identical']}", flush=True)
    write(rows, out, name, knobs, prompts)


def restart_rows(model, traces, prompts, knobs, workloads, run_modes, save) -> list[dict]:
    """The restart scenario: day 2 served by a restarted server (arctic starts
    cold, suffixspec reopens its pool file) and by one never restarted."""
    import tempfile

    rows = []
    for wl in workloads:
        base = None
        for mode, conc in run_modes:
            for name, method, phases in RESTART:
                if method == "none" and base is not None:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    pool = Path(tmp) / "pool.lmdb" if method.startswith("suffixspec") else None
                    for phase in phases:
                        if phase == "log":
                            ingest_day1_log(model, wl, traces, prompts, conc, knobs, pool)
                            continue
                        res = child(model, method, wl, traces, prompts, conc, knobs, phase, pool)
                if method == "none":
                    base = res["outputs"]
                res["identical"] = None if base is None else res["outputs"] == base
                res.update(workload=wl, mode=mode, scenario="restart", method=name)
                rows.append(res)
                save(rows)
                print(f"restart {wl:5s} {mode:10s} {name:32s} {res['tokens_per_s']:7.1f} tok/s  "
                      f"accept {res['acceptance_length']:.2f}  identical {res['identical']}",
                      flush=True)
    return rows


def ingest_day1_log(model, wl, traces, prompts, conc, knobs, pool: Path) -> None:
    """Day 1 served without speculation, its log written as a gateway in front
    of the server keeps one (a JSON line per request: the prompt as the engine
    saw it, chat template applied, and the output text; docs/vllm.md), and
    ``suffixspec ingest`` run on it, as a user builds a pool from logs."""
    from tokenizers import Tokenizer

    res = child(model, "none", wl, traces, prompts, conc, knobs, "day1")
    tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    log = pool.with_name("day1.jsonl")
    with log.open("w") as f:
        for prompt, output in zip(res["prompt_ids"], res["outputs"]):
            f.write(json.dumps({"prompt": tok.decode(prompt, skip_special_tokens=False),
                                "output": tok.decode(output, skip_special_tokens=True)}) + "\n")
    subprocess.run([sys.executable, "-m", "suffixspec", "ingest", str(pool), str(log),
                    "--tokenizer", model, "--max-depth", str(knobs["depth"])],
                   check=True, stdout=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[1])


def child(model, method, wl, traces, prompts, conc, knobs, phase="all", pool=None,
          empty_kernel_cache: bool = False) -> dict:
    """One row on a fresh server in a child process (``empty_kernel_cache``: with
    a Numba cache of its own, empty, as the first server after install)."""
    with (tempfile.TemporaryDirectory(prefix="kernel-cache-") if empty_kernel_cache
          else contextlib.nullcontext()) as cache:
        return collect(start_child(model, method, wl, traces, prompts, conc, knobs, phase, pool,
                                   numba_cache=cache), method, wl)


def start_child(model, method, wl, traces, prompts, conc, knobs, phase="all", pool=None,
                replica: str | None = None, barrier: Path | None = None,
                numba_cache: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               NUMBA_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if numba_cache is not None:
        env["NUMBA_CACHE_DIR"] = numba_cache
    env.pop("SUFFIXSPEC_POOL", None)
    if pool is not None:
        env["SUFFIXSPEC_POOL"] = str(pool)
    env.pop("SUFFIXSPEC_ENABLE", None)
    if method.startswith("suffixspec"):
        env["SUFFIXSPEC_ENABLE"] = "1"
        env["SUFFIXSPEC_LOG_INTERVAL"] = "0"
        env.pop("SUFFIXSPEC_DRAFT_COST", None)
        if split_cap(method)[0] in DRAFT_COSTS:
            env["SUFFIXSPEC_DRAFT_COST"] = DRAFT_COSTS[split_cap(method)[0]]
    cmd = [sys.executable, __file__, "one", "--model", model, "--method", method, "--workload", wl,
           "--traces", str(traces), "--prompts", str(prompts), "--concurrency", str(conc),
           "--knobs", json.dumps(knobs), "--phase", phase]
    if replica is not None:
        cmd += ["--replica", replica, "--barrier", str(barrier)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[1])


def collect(proc: subprocess.Popen, method: str, wl: str) -> dict:
    stdout, stderr = proc.communicate()
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{method} {wl} failed:\n{stderr[-4000:]}")
    return json.loads(lines[-1])


def replica_rows(model, traces, prompts, knobs, workloads, run_modes, save,
                 replicas: int = 2) -> list[dict]:
    """The replicas scenario: ``replicas`` servers on this host, each taking
    every ``replicas``-th request (agent: session) as a round-robin client
    would, with the timed parts started together.  arctic keeps a cache per
    server; suffixspec's servers share one pool file (SUFFIXSPEC_POOL), so
    each drafts from the other's outputs too.  Each server keeps 1 (sequential)
    or 8 / ``replicas`` (concurrent) requests in flight."""
    import tempfile

    rows = []
    for wl in workloads:
        base = None
        for mode, conc in run_modes:
            for method in REPLICA_METHODS:
                if method == "none" and base is not None:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    barrier = Path(tmp) / "barrier"
                    barrier.mkdir()
                    pool = Path(tmp) / "pool.lmdb" if method == "suffixspec" else None
                    procs = [start_child(model, method, wl, traces, prompts,
                                         max(conc // replicas, 1), knobs, "all", pool,
                                         f"{i}/{replicas}", barrier) for i in range(replicas)]
                    parts = [collect(p, method, wl) for p in procs]
                res = merge_replicas(parts)
                if method == "none":
                    base = res["outputs"]
                res["identical"] = None if base is None else res["outputs"] == base
                res.update(workload=wl, mode=mode, scenario="replicas")
                rows.append(res)
                save(rows)
                print(f"replicas {wl:5s} {mode:10s} {method:10s} {res['tokens_per_s']:7.1f} tok/s  "
                      f"accept {res['acceptance_length']:.2f}  identical {res['identical']}",
                      flush=True)
    return rows


def merge_replicas(parts: list[dict]) -> dict:
    """One row from the replicas' rows: tokens over the wall time from the
    first start to the last end; acceptance and drafted tokens per draft
    weighted by each replica's drafts (approximated by its output tokens)."""
    seconds = max(p["ended"] for p in parts) - min(p["started"] for p in parts)
    out = sum(p["output_tokens"] for p in parts)
    weights = [p["output_tokens"] / out for p in parts]
    row = {k: v for k, v in parts[0].items() if k not in ("outputs", "prompt_ids")}
    row.update(seconds=seconds, output_tokens=out, tokens_per_s=out / seconds,
               requests=sum(p["requests"] for p in parts),
               prompt_tokens=sum(p["prompt_tokens"] for p in parts),
               acceptance_length=sum(w * p["acceptance_length"] for w, p in zip(weights, parts)),
               draft_tokens_per_draft=sum(w * p["draft_tokens_per_draft"]
                                          for w, p in zip(weights, parts)),
               outputs=[o for p in parts for o in p["outputs"]])
    return row


@main.command()
@click.option("--model", required=True)
@click.option("--method", required=True, help="One of METHODS, optionally ' kN'.")
@click.option("--workload", "wl", type=click.Choice(WORKLOADS), required=True)
@click.option("--traces", type=click.Path(path_type=Path), required=True)
@click.option("--prompts", type=int, required=True)
@click.option("--concurrency", type=int, required=True)
@click.option("--knobs", required=True)
@click.option("--phase", type=click.Choice(PHASES), default="all")
@click.option("--replica", default=None, metavar="I/N",
              help="Serve every N-th request from the I-th (replicas scenario).")
@click.option("--barrier", type=click.Path(path_type=Path), default=None,
              help="Replicas: the folder where they meet to start timing together.")
def one(model, method, wl, traces, prompts, concurrency, knobs, phase, replica, barrier):
    """One (method, workload, mode) in this process; prints a JSON line."""
    work = workload(wl, traces, prompts)
    if replica is not None:
        me, total = (int(x) for x in replica.split("/"))
        work = work[me::total]
        replica = (me, total, barrier)
    spec = spec_config(method, **json.loads(knobs)) if method != "none" else None
    res = run_one(model, method, wl, work, concurrency, spec,
                  phase, replica)
    print(json.dumps(res))


def write(rows, out: Path, name: str, knobs: dict, prompts: int, show: bool = True) -> None:
    from tabulate import tabulate

    slim = [{k: v for k, v in r.items() if k not in ("outputs", "prompt_ids")} for r in rows]

    def same(a, r):
        return all(a.get(k) == r.get(k) for k in ("workload", "mode", "scenario", "round"))

    def ratio(r, anchor, text=True):
        a = next((a for a in slim if a["method"] == anchor and same(a, r)), None)
        if a is None or not r["method"].startswith("suffixspec"):
            return "" if text else None
        value = r["tokens_per_s"] / a["tokens_per_s"]
        return f"{value:.3f}" if text else value

    table = []
    for r in slim:
        restart = r["scenario"] == "restart"
        table.append([r["scenario"], r["workload"], r["mode"], r["method"],
                      f"{r['tokens_per_s']:.1f}",
                      ratio(r, "arctic restarted" if restart else "arctic"),
                      ratio(r, "arctic never restarted") if restart else "",
                      f"{r['acceptance_length']:.3f}", f"{r['draft_tokens_per_draft']:.2f}",
                      r["requests"], r["output_tokens"], reused(r), measured(r),
                      {None: "", True: "yes", False: "NO"}[r["identical"]]])
    md = tabulate(table, headers=["scenario", "workload", "mode", "method", "tok/s",
                                  "vs arctic (restarted)", "vs arctic never restarted",
                                  "accept len", "drafted/draft", "requests", "out tokens",
                                  "prompt reused", "ms/token online / offline", "identical"],
                  tablefmt="github")
    rounds = {}
    for r in slim:
        value = ratio(r, "arctic", text=False) if r["scenario"] == "cold" else None
        if value is not None:
            rounds.setdefault((r["workload"], r["mode"], r["method"]), []).append(value)
    if any(len(v) > 1 for v in rounds.values()):
        import statistics

        md += "\n\nCold, vs arctic in the same round: median (min-max) over rounds\n\n" + tabulate(
            [[*key, len(v), f"{statistics.median(v):.3f}", f"{min(v):.3f}-{max(v):.3f}"]
             for key, v in rounds.items()],
            headers=["workload", "mode", "method", "rounds", "median", "range"],
            tablefmt="github")
    save_results(out, name, {"knobs": knobs, "prompts": prompts, "rows": slim},
                 f"SmolLM2-135M-Instruct fp32, vLLM CPU, greedy, max_tokens 128; sql and bfcl: "
                 f"{prompts} prompts each; agent: {SESSIONS} sessions of {TURNS} turns, one request "
                 f"per turn. "
                 f"Suffix knobs {knobs}. \"prompt reused\": share of prompt tokens suffixspec "
                 f"found indexed already (the earlier turn a request continues).  restart: the "
                 f"second half of the prompts (agent: of the sessions) timed on a server "
                 f"restarted after serving the first half; suffixspec keeps its pool in a file "
                 f"(SUFFIXSPEC_POOL), or opens one `suffixspec ingest` built from the first "
                 f"half's log.  replicas: two servers at once on this host, every other "
                 f"request (agent: session) to each, tok/s over the wall time of both; "
                 f"suffixspec's servers share one pool file.\n\n{md}", show=show)


def measured(row: dict) -> str:
    if "step_token_ms" not in row:
        return ""
    return f"{row['step_token_ms']:.2f} / {row['offline_token_ms']:.2f}"


def reused(row: dict) -> str:
    if row.get("reused_prompt_tokens") is None or not row["prompt_tokens"]:
        return ""
    return f"{row['reused_prompt_tokens'] / row['prompt_tokens']:.1%}"


if __name__ == "__main__":
    main()
