#!/usr/bin/env bash
# Install arctic-inference (the anchor the benchmarks and the side-by-side
# tests compare against) into a virtual environment:
#
#   bench/setup_arctic.sh [VENV]        (default: the active one, else .venv)
#
# It is source-only and builds against torch, so torch 2.13.0 (CPU) goes first
# and the build runs without isolation, with the environment's own python,
# nanobind and cmake first on PATH.  About a minute.
set -euo pipefail
venv="${1:-${VIRTUAL_ENV:-.venv}}"
export PATH="$(cd "$venv" && pwd)/bin:$PATH"
echo "installing arctic-inference 0.3.0 into $venv (builds from source, about a minute)"
python -m pip install -q torch==2.13.0 numpy
python -m pip install -q nanobind==2.9.2 grpcio-tools cmake ninja wheel
python -m pip install --no-build-isolation --no-deps arctic-inference==0.3.0
python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('arctic-inference ok')"
