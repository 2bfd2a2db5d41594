#!/usr/bin/env bash
# A second virtual environment with vLLM 0.34.0's Python objects on the CPU,
# for the tests of suffixspec's Model Runner V2 speculator (vLLM 0.34 has no
# other runner) and its registration through vLLM's speculator registry.
#
#   scripts/install_vllm034.sh [VENV]        (default: .venv-vllm034)
#
# vLLM 0.34.0 has no CPU build and its CUDA dependencies (flashinfer,
# cutlass...) are not all on the registry, so it is installed without its
# dependencies, beside the CPU build of torch 2.13.0 (vLLM pins 2.14.0; the
# config, request-state and speculator code it needs run on either), the
# numba it pins (0.65.0), Triton (its kernels run on CPU tensors under
# TRITON_INTERPRET=1) and the modules its config and speculator code import.
# No engine starts in it: the tests drive vLLM's own objects on CPU tensors.
# The contract's sources (vLLM 0.33.0 and 0.34.0) are fetched once as well,
# so no test downloads anything (scripts/fetch_vllm_sources.py).
set -euo pipefail
venv="${1:-.venv-vllm034}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --progress-bar off)
echo "[1/4] torch 2.13.0 (CPU build), numba 0.65.0 (vLLM 0.34's pin), Triton"
"${pip[@]}" -c "$here/constraints-cpu.txt" "torch==2.13.0+cpu" "numba==0.65.0" "triton==3.9.0"
echo "[2/4] vLLM 0.34.0 without its dependencies"
"${pip[@]}" --no-deps "vllm==0.34.0"
echo "[3/4] what vLLM's config, request-state and speculator modules import"
"${pip[@]}" -c "$here/constraints-cpu.txt" packaging regex numpy "pydantic>=2.12" psutil pyzmq \
    urllib3 "transformers>=5.16.1,<5.23" aiohttp requests pillow pybase64 cachetools cbor2 \
    msgspec cloudpickle uvloop py-cpuinfo prometheus_client "llguidance>=1.7,<1.8" \
    "xgrammar==0.2.8" einops blake3 openai fastapi
echo "[4/4] suffixspec and the test tools"
"${pip[@]}" -c "$here/constraints-cpu.txt" -e "$root" "pytest>=8" "hypothesis>=6.100"
"$venv/bin/python" "$here/fetch_vllm_sources.py"
"$venv/bin/python" -c "import importlib.metadata as m; print('vllm', m.version('vllm'), 'torch', m.version('torch'), 'numba', m.version('numba'))"
