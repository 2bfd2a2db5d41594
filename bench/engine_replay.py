"""Replay what SmolLM2 really generated in vLLM, through arctic and suffixspec.

    python bench/vllm_bench.py record --prompts 32     # once: serve without speculation
    python bench/engine_replay.py [--prompts 32] [--step-cost 0.118,0.0057]

``vllm_bench.py record`` keeps each workload's prompt and output token ids
(bench/cache/).  This replays them in the order the vLLM bench sends them,
one request at a time and 8 in flight, through arctic-inference (the vLLM
bench's knobs) and suffixspec, and prices every engine step with the step
cost suffixspec measured in vLLM on this machine (seconds: fixed, per
verified token).  Minutes instead of the vLLM bench's hour, so a drafting
change can be judged on the target model's own outputs before the real run.
Reported per row: vLLM's acceptance length (1 + accepted / drafts), drafted
tokens per draft, tokens per engine step, and tokens per second under the
step cost, against arctic's.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import CACHE, save_results  # noqa: E402

from suffixspec.replay.traces import Request  # noqa: E402
from suffixspec.stepcost import StepCost  # noqa: E402

MODES = {"sequential": 1, "concurrent": 8}


def requests(wl: str, prompts: int) -> list[Request]:
    path = CACHE / f"vllm-outputs-{wl}-{prompts}.json.gz"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run python bench/vllm_bench.py record "
                         f"--prompts {prompts} --workloads {wl}")
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return [Request(f"{wl}-{i}", np.asarray(p, np.int32), np.asarray(o, np.int32))
            for i, (p, o) in enumerate(zip(data["prompts"], data["outputs"]))]


def engines(knobs: dict, settings: dict) -> dict:
    from suffixspec.replay.engines import make_proposer

    return {
        "arctic": lambda: make_proposer("arctic", max_depth=knobs["depth"], max_spec_tokens=knobs["k"],
                                        max_spec_factor=knobs["factor"],
                                        min_token_prob=knobs["min_prob"]),
        "suffixspec": lambda: make_proposer("suffixspec", max_depth=knobs["depth"],
                                            max_spec_tokens=knobs["k"], **settings),
    }


def run(reqs, make, concurrency: int, cost: StepCost, is_suffixspec: bool) -> dict:
    from suffixspec.replay.harness import replay

    proposer = make()
    if is_suffixspec:
        proposer.step_cost = cost
    res = replay(reqs, proposer, concurrency=concurrency, step_cost=cost)
    drafts = res.steps - res.no_draft
    return {"accept_len": 1 + res.accepted / max(drafts, 1),
            "drafted_per_draft": res.drafted / max(drafts, 1),
            "tokens_per_step": res.output_tokens / res.steps,
            "tokens_per_s": res.output_tokens / res.model_time,
            "first_token_miss": res.first_token_miss / max(drafts, 1)}


@click.command()
@click.option("--prompts", default=32, show_default=True, help="As recorded.")
@click.option("--workloads", default="sql,bfcl,agent", show_default=True)
@click.option("--step-cost", "step_cost", default="0.118,0.0057", show_default=True,
              help="FIXED,PER_TOKEN seconds (suffixspec's fit in the vLLM bench).")
@click.option("--setting", "-s", multiple=True, metavar="NAME=VALUE",
              help="A suffixspec setting (ProposerConfig field), e.g. -s draft_cost=0.05.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder for engine_replay.json and .md (bench/results to keep them).")
def main(prompts, workloads, step_cost, setting, out):
    from tabulate import tabulate

    knobs = dict(k=16, depth=64, factor=2.0, min_prob=0.2)  # vllm_bench.py's defaults
    settings = {}
    for item in setting:
        name, _, value = item.partition("=")
        try:
            settings[name] = json.loads(value)  # numbers, true/false, null
        except ValueError:
            settings[name] = value  # text, e.g. namespace=sql
    cost = StepCost.parse(step_cost)
    rows, results = [], []
    for wl in workloads.split(","):
        reqs = requests(wl, prompts)
        for mode, conc in MODES.items():
            base = None
            for name, make in engines(knobs, settings).items():
                r = run(reqs, make, conc, cost, name == "suffixspec")
                base = base or r["tokens_per_s"]
                results.append(dict(r, workload=wl, mode=mode, engine=name))
                rows.append([wl, mode, name, f"{r['accept_len']:.3f}",
                             f"{r['drafted_per_draft']:.2f}", f"{r['tokens_per_step']:.3f}",
                             f"{r['first_token_miss']:.3f}", f"{r['tokens_per_s']:.2f}",
                             f"{r['tokens_per_s'] / base:.3f}"])
                print(*rows[-1], flush=True)
    md = tabulate(rows, headers=["workload", "mode", "engine", "accept len", "drafted/draft",
                                 "tokens/step", "first-token miss", "tok/s (model)",
                                 "vs arctic"], tablefmt="github")
    if out is None:
        print(md)
        return
    save_results(out, "engine_replay", {"step_cost": step_cost, "settings": settings,
                                        "prompts": prompts, "rows": results},
                 f"SmolLM2-135M-Instruct's own outputs (vLLM CPU, greedy, recorded by "
                 f"`vllm_bench.py record --prompts {prompts}`) replayed through arctic "
                 f"(k 16, depth 64, factor 2, min prob 0.2) and suffixspec (defaults{settings or ''}),"
                 f" each engine step priced at {step_cost} s (fixed, per verified token).  "
                 f"accept len: 1 + accepted / drafts, as vLLM reports it.\n\n{md}")


if __name__ == "__main__":
    main()
