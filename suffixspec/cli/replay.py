"""``suffixspec replay``: measure a proposer on recorded requests."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import click
from tqdm import tqdm

from suffixspec.cli.common import KernelLoader, load_tokenizer, open_pool
from suffixspec.config import DEFAULT_DRAFT_COST, DEFAULT_NAMESPACE, ProposerConfig
from suffixspec.fingerprint import BYTES
from suffixspec.native.warmup import SERVING
from suffixspec.replay.engines import ENGINES, make_proposer
from suffixspec.replay.harness import METRIC_KEYS, replay
from suffixspec.replay.traces import load_trace
from suffixspec.replay.workload import default_workload
from suffixspec.stepcost import StepCost

# (header, metric key, format, scale) of the human table; --json keeps the raw keys.
_COLUMNS = (("trace", "trace", "{}", None), ("requests", "requests", "{}", None),
            ("tokens/step", "mean_tokens_per_step", "{:.2f}", None),
            ("est", "est", "{:.2f}", None),
            ("accepted", "acceptance_rate", "{:.0%}", None),
            ("drafted/step", "drafted_per_step", "{:.1f}", None),
            ("µs/step p50", "proposer_us_per_step_p50", "{:.0f}", None),
            ("µs/step p99", "proposer_us_per_step_p99", "{:.0f}", None),
            ("start ms", "start_us_mean", "{:.2f}", 1e-3),
            ("B/token", "index_bytes_per_token", "{:.0f}", None))
_TIME_COLUMN = (("tokens/time", "tokens_per_time", "{:.3f}", None),)
_NOTE = ("tokens/step: output tokens per target-model step (1.00 without speculation); "
         "est: the same, discounted 3% per drafted token; accepted: share of drafted tokens "
         "accepted; µs/step: proposer time per request-step; start: indexing a prompt; "
         "B/token: index memory per indexed token.")


def _step_cost(ctx, param, value):
    if value is None:
        return None
    try:
        return StepCost.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command(name="replay")
@click.argument("traces", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", type=click.Path(exists=True),
              help="Hugging Face tokenizer.json (or its folder); required with TRACE files.")
@click.option("--engine", type=click.Choice(ENGINES), default="suffixspec", show_default=True,
              help="Proposer to replay through.")
@click.option("--max-spec-tokens", "-k", type=click.IntRange(0), default=ProposerConfig.max_spec_tokens, show_default=True,
              help="Draft length limit per step.")
@click.option("--max-depth", type=click.IntRange(2, 1024), default=ProposerConfig.max_depth, show_default=True,
              help="Longest indexed substring (suffixspec, arctic).")
@click.option("--draft-cost", type=click.FloatRange(0, 1, max_open=True), default=DEFAULT_DRAFT_COST,
              show_default=True,
              help="Verification cost of one drafted token, as a share of a step "
                   "(suffixspec).")
@click.option("--max-spec-factor", type=click.FloatRange(0), default=None,
              help="Draft at most match_len * factor tokens (default: arctic 1.0; suffixspec "
                   "no cap).")
@click.option("--min-token-prob", type=click.FloatRange(0, 1), default=None,
              help="Stop drafting below this estimated probability (default: arctic 0.1; "
                   "suffixspec none).")
@click.option("--tree/--path", default=False, show_default=True,
              help="Draft token trees instead of single paths.")
@click.option("--concurrency", "-c", type=click.IntRange(1), default=1, show_default=True,
              help="Requests in flight; each step proposes for all of them in one call.")
@click.option("--sessions", type=click.IntRange(1), default=None,
              help="Replay only the first N sessions of each trace.")
@click.option("--records", type=click.IntRange(1), default=None,
              help="Replay only the first N records of each trace.")
@click.option("--ngram-min", type=click.IntRange(1), default=2, show_default=True,
              help="Shortest n-gram (ngram engine).")
@click.option("--ngram-max", type=click.IntRange(1), default=5, show_default=True,
              help="Longest n-gram (ngram engine).")
@click.option("--pool", type=click.Path(dir_okay=False),
              help="Replay against this persistent pool (suffixspec engine); finished "
                   "requests are added to it.")
@click.option("--namespace", default=DEFAULT_NAMESPACE, show_default=True,
              help="Pool namespace the replayed requests use.")
@click.option("--step-cost", callback=_step_cost, metavar="FIXED,PER_TOKEN",
              help="Price an engine step at FIXED + PER_TOKEN x verified tokens: suffixspec's "
                   "length rule drafts for it (in place of --draft-cost) and tokens/time reports "
                   "output tokens per unit of that time (e.g. 1,0.1 for a CPU, 1,0.01 for a GPU "
                   "at small batch).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per trace on stdout.")
def replay_cmd(traces, tokenizer, engine, max_spec_tokens, max_depth, draft_cost,
               max_spec_factor, min_token_prob, tree, concurrency, sessions, records, ngram_min, ngram_max,
               pool, namespace, step_cost, as_json):
    """Replay recorded requests and report what speculation would save.

    With no TRACE, replays a built-in synthetic agent workload (byte tokens).

    \b
    Examples:
      suffixspec replay
      suffixspec replay ../shared/data/traces/sql_spider_bird.jsonl.gz \\
          --tokenizer ../shared/tokenizers/qwen --engine arctic --json
    """
    if traces and tokenizer is None:
        raise click.UsageError("replaying TRACE files needs --tokenizer")
    if pool is not None and engine != "suffixspec":
        raise click.UsageError("--pool works with the suffixspec engine only")
    if engine == "arctic" and importlib.util.find_spec("arctic_inference") is None:
        raise click.UsageError("--engine arctic needs arctic-inference (bench/setup_arctic.sh "
                               "builds it)")
    kernels = KernelLoader(SERVING).start()  # compiles (first run) while traces load
    workloads = []
    if not traces:
        workloads.append(("built-in", default_workload()))
    else:
        tok_id, encode = load_tokenizer(tokenizer)
        for path in traces:
            with tqdm(desc=f"tokenizing {Path(path).name}", unit="text", file=sys.stderr,
                      delay=1, leave=False) as bar:
                def progress(done, total, bar=bar):
                    bar.total = total
                    bar.update(done - bar.n)

                try:
                    requests = load_trace(path, encode, max_sessions=sessions,
                                          max_records=records, progress=progress)
                except (ValueError, KeyError) as e:
                    raise click.ClickException(f"{path}: not a trace file ({e})") from e
            workloads.append((_trace_name(path), requests))
    kernels.wait()
    rows = []
    options = {}
    pool_obj = None
    if engine == "suffixspec":
        options = {"cross_pool_tokens": None, "namespace": namespace, "draft_cost": draft_cost}
        if pool is not None:
            tok_id = tok_id if traces else BYTES
            pool_obj = options["pool"] = open_pool(pool, tok_id, max_depth)
    try:
        for name, requests in workloads:
            proposer = make_proposer(engine, requests, max_depth=max_depth,
                                     max_spec_tokens=max_spec_tokens,
                                     max_spec_factor=max_spec_factor,
                                     min_token_prob=min_token_prob, tree=tree,
                                     ngram_min=ngram_min, ngram_max=ngram_max, **options)
            if step_cost is not None and engine == "suffixspec":
                proposer.step_cost = step_cost
            with tqdm(total=len(requests), desc=name, unit="req", file=sys.stderr, delay=2,
                      leave=False) as bar:
                result = replay(requests, proposer, concurrency=concurrency,
                                progress=bar.update, step_cost=step_cost)
            row = {"trace": name, **{k: v for k, v in result.metrics().items()
                                     if k in METRIC_KEYS}}
            if as_json:
                click.echo(json.dumps(row))
            rows.append(row)
    finally:
        if pool_obj is not None:
            pool_obj.close()
    if not as_json:
        click.echo(_table(rows, _COLUMNS + (_TIME_COLUMN if step_cost is not None else ())))
        click.echo(click.wrap_text(_NOTE, width=100))


def _trace_name(path: str) -> str:
    name = Path(path).name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def _table(rows: list[dict], columns) -> str:
    cells = [[header for header, *_ in columns]]
    for row in rows:
        cells.append([fmt.format(row[key] * scale if scale else row[key])
                      if row[key] is not None else "-" for _, key, fmt, scale in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    # Trace names left-aligned, figures right-aligned.
    return "\n".join("  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in
                                                          zip(r[1:], widths[1:])])
                     for r in cells)

