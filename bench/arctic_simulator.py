"""arctic-inference's own offline simulator, unmodified, on arctic and on
``suffixspec.compat.arctic`` (both modes), in one run.

    python bench/arctic_simulator.py [--trace sql_spider_bird --trace tool_bfcl] [--records 600]

The simulator (``arctic_inference/suffix_decoding/simulator.py``) replays
recorded responses: per step it speculates, accepts what the recorded
response confirms plus one token, and reports the mean accepted tokens,
acceptance rate and speedup (output tokens per step) over a train / eval split.
Its input is a trace's first records (as text, written to bench/cache),
tokenized by the simulator with the shared Qwen tokenizer.  Each engine runs the simulator file in its own
process; for suffixspec, ``suffixspec.compat.arctic.install(mode)`` first puts
the drop-in where the simulator imports arctic's API.  Reported: each
summary, and how many steps' drafts (match length, score, drafted and
accepted tokens) are identical to arctic's.  Needs arctic-inference
(bench/setup_arctic.sh) and pandas (the ``bench`` extra).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import save_results  # noqa: E402

from suffixspec.replay.harness import EST_TOKEN_COST  # noqa: E402

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared"
ENGINES = {"arctic": None, "drop-in arctic mode": "arctic",
           "drop-in suffixspec mode": "suffixspec"}
RUN = """
import runpy, sys
mode, simulator = sys.argv[1], sys.argv[2]
if mode != "-":
    from suffixspec.compat import arctic
    arctic.install(mode)
sys.argv = [simulator] + sys.argv[3:]
runpy.run_path(simulator, run_name="__main__")
"""


def dataset(trace: str, records: int, cache: Path) -> tuple[Path, Path]:
    """The trace's first records as a jsonl of prompts (their last 6,000
    characters) and responses, and a Hugging Face folder of the Qwen
    tokenizer the simulator tokenizes them with."""
    tokenizer = cache / "qwen-tokenizer"
    if not (tokenizer / "tokenizer.json").is_file():
        tokenizer.mkdir(parents=True, exist_ok=True)
        (tokenizer / "tokenizer.json").write_bytes(
            (SHARED / "tokenizers" / "qwen" / "tokenizer.json").read_bytes())
        (tokenizer / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    out = cache / f"{trace}-{records}.jsonl"
    if not out.is_file():
        rows = []
        with gzip.open(SHARED / "data" / "traces" / f"{trace}.jsonl.gz", "rt") as f:
            for line in f:
                r = json.loads(line)
                rows.append({"prompt": r["prompt"][-6000:], "response": r["output"]})
                if len(rows) == records:
                    break
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out, tokenizer


def simulate(mode: str | None, data: Path, csv: Path, args: list[str]) -> tuple[str, float]:
    """One simulator run; returns its printed summary and the seconds it took."""
    from arctic_inference.suffix_decoding import simulator

    cmd = [sys.executable, "-c", RUN, mode or "-", simulator.__file__, str(data),
           "--output", str(csv), *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"simulator ({mode or 'arctic'}) failed:\n{proc.stderr[-3000:]}")
    summary = proc.stdout[proc.stdout.index("Summary of results:"):].split("Detailed")[0]
    return summary.strip(), seconds


COST = EST_TOKEN_COST  # est's cost of a drafted token, relative to a target-model step
CONFIGS = {  # name -> simulator arguments
    "simulator defaults (tree drafts, factor 1.0, min prob 0.1)": [],
    "arctic's cost-aware best (path, factor 2.0, min prob 0.2)": [
        "--use-tree-spec", "False", "--max-spec-factor", "2.0", "--min-token-prob", "0.2"],
}


@click.command()
@click.option("--trace", "traces", multiple=True, show_default=True,
              default=["sql_spider_bird", "tool_bfcl"])
@click.option("--records", default=600, show_default=True, help="First records of the trace.")
@click.option("--num-train", default=400, show_default=True)
@click.option("--num-eval", default=200, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=HERE / "results",
              show_default=True, help="Folder for arctic_simulator.json and .md.")
def main(traces, records, num_train, num_eval, out):
    text, results = [], {}
    for trace in traces:
        results[trace] = run_trace(trace, records, num_train, num_eval, text)
    save_results(out, "arctic_simulator", {"records": records, "traces": results},
                 "\n".join(text))


def run_trace(trace, records, num_train, num_eval, text: list[str]) -> dict:
    """Every config and engine on one trace; appends its report to ``text``."""
    import pandas as pd

    data, tokenizer = dataset(trace, records, HERE / "cache" / "simulator")
    cols = ["task_id", "request_id", "step", "match_len", "score", "num_spec_toks",
            "num_accept_toks", "num_out_toks"]
    text.append(f"# {trace}\n\narctic-inference's simulator, unmodified (first {records} "
                f"records: {num_train} cached, {num_eval} evaluated).  `python "
                f"bench/arctic_simulator.py --records {records}`\n")
    results = {}
    for config, extra in CONFIGS.items():
        args = ["--tokenizer", str(tokenizer), "--num-train", str(num_train), "--num-eval",
                str(num_eval), *extra]
        runs, steps = {}, {}
        for name, mode in ENGINES.items():
            csv = HERE / "cache" / "simulator" / f"{name.replace(' ', '-')}.csv"
            summary, seconds = simulate(mode, data, csv, args)
            runs[name] = {"summary": summary, "seconds": seconds}
            steps[name] = pd.read_csv(csv)[cols]
            print(f"{config}, {name}: {seconds:.1f} s\n{summary}\n", flush=True)
        base = steps["arctic"]
        text.append(f"## {trace}: {config}\n")
        for name, df in steps.items():
            # Step-by-step comparison only where both took the same steps.
            same = (int((df.round(5) == base.round(5)).all(axis=1).sum())
                    if len(df) == len(base) else None)
            runs[name].update(steps=len(df), identical_steps=same)
            agree = ("" if same is None else f", identical to arctic's: {same}")
            mts = df["num_out_toks"].sum() / len(df)
            est = mts / (1 + COST * df["num_spec_toks"].mean())
            runs[name].update(mts=float(mts), est=float(est))
            text.append(f"### {name}\n\nsteps {len(df)}{agree}; MTS {mts:.3f}, est {est:.3f} "
                        f"(MTS / (1 + {COST} x drafted per step)); {runs[name]['seconds']:.1f} s "
                        f"in all (tokenizing included)\n\n```\n{runs[name]['summary']}\n```\n")
        results[config] = runs
    return results


if __name__ == "__main__":
    main()
