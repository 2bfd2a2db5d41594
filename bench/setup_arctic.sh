#!/usr/bin/env bash
# Install arctic-inference (the anchor the benchmarks compare against) into the
# active virtual environment.  It is source-only and builds against torch, so
# torch 2.13.0 (CPU) goes first and the build runs without isolation.
set -euo pipefail
pip install torch==2.13.0
pip install nanobind==2.9.2 grpcio-tools cmake ninja wheel
pip install --no-build-isolation --no-deps arctic-inference==0.3.0
python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; print('arctic-inference ok')"
