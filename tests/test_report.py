"""``bench/report.py``: the results page, the benchmarks page and README's
headline are what the JSON files give, and a re-run changes only its figures."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402


def test_the_generated_pages_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_results_file_says_where_it_comes_from():
    for b in report.BENCHES:
        path = ROOT / "bench" / "results" / f"{b.name}.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text())
        assert r.get("commit") or r.get("committed_in"), path.name
        assert r.get("table"), path.name  # a table to show, as the run printed it
    kept = {p.stem for p in (ROOT / "bench" / "results").iterdir()}
    assert kept <= {b.name for b in report.BENCHES}  # one JSON per benchmark, nothing else


def _pages(results: Path) -> tuple[str, str]:
    found = report.load(results)
    return report.results_page(found), report.headline(found)


def test_a_rerun_changes_only_its_own_figures_commit_and_date(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results", results)
    before = _pages(results)
    path = results / "replay.json"
    r = json.loads(path.read_text())
    for run in r["data"]["runs"]:  # the same configurations, other figures
        run["est"] = round(run["est"] * 1.01, 4)
    r["table"] = r["table"].replace("3.119", "3.150")
    r.update(commit="abcdef1", dirty=False, date="2027-01-01 00:00 UTC")
    path.write_text(json.dumps(r))
    after = _pages(results)
    page = [line for line in difflib.unified_diff(before[0].splitlines(), after[0].splitlines(),
                                                  lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert page  # the figures moved
    first = [page_.split("\n## ")[1] for page_ in (before[0], after[0])]  # replay's section
    assert all(line[1:] in first[0] or line[1:] in first[1] for line in page)
    rows = [(a, b) for a, b in zip(before[1].splitlines(), after[1].splitlines()) if a != b]
    assert len(rows) == 1 and "replay" in rows[0][1] and "abcdef1" in rows[0][1]
    assert len(before[1].splitlines()) == len(after[1].splitlines())
