#!/usr/bin/env bash
# Proposer p50 of two checkouts, interleaved: for each round and each slice,
# one process per checkout (bench/checkout_p50.py, one replay), A then B in
# odd rounds and B then A in even ones, so a drift of the machine's speed
# falls on both.  Prints one line per replay, "A|B {json}", then per slice
# the smallest and the median p50 of each and B/A of both.
#
#   bench/checkout_p50_ab.sh A_CHECKOUT B_CHECKOUT "sql code gorilla bfcl agent" ROUNDS \
#       [TRACES] [TOKENIZER]  > lines.txt
#
# Each checkout gets its own Numba cache (/tmp/numba_p50_<name>); PYTHON
# (default: this checkout's .venv) runs both.  Compare the smallest p50 of
# each checkout per slice; on these noisy machines one round is not enough.
set -euo pipefail
a="$(cd "$1" && pwd)"; b="$(cd "$2" && pwd)"; slices="$3"; rounds="$4"
here="$(cd "$(dirname "$0")" && pwd)"
traces="${5:-$here/../../shared/data/traces}"
tokenizer="${6:-$here/../../shared/tokenizers/qwen}"
python="${PYTHON:-$here/../.venv/bin/python}"
one() {  # checkout label slice
    (cd "$1" && NUMBA_CACHE_DIR="/tmp/numba_p50_$(basename "$1")" PYTHONPATH="$1" \
        "$python" "$here/checkout_p50.py" "$3" "$traces" "$tokenizer" 1 | sed "s/^/$2 /")
}
lines="$(mktemp)"; trap 'rm -f "$lines"' EXIT
for r in $(seq "$rounds"); do
    for s in $slices; do
        if (( r % 2 )); then one "$a" A "$s"; one "$b" B "$s"; else one "$b" B "$s"; one "$a" A "$s"; fi
    done
done | tee "$lines"
"$python" - "$lines" <<'PY'
import json, statistics, sys
p50 = {}
for line in open(sys.argv[1]):
    who, row = line.split(" ", 1)
    row = json.loads(row)
    p50.setdefault(row["trace"], {"A": [], "B": []})[who].append(row["p50"])
for trace, by in p50.items():
    a, b = by["A"], by["B"]
    print(f"# {trace}: A min {min(a):.2f} median {statistics.median(a):.2f}, "
          f"B min {min(b):.2f} median {statistics.median(b):.2f}; "
          f"B/A min {min(b) / min(a):.3f} median {statistics.median(b) / statistics.median(a):.3f} "
          f"({len(a)} replays each)")
PY
