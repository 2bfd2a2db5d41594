#!/usr/bin/env bash
# Wheels of suffixspec's own dependencies for a lent GPU machine, which has
# torch, Triton and Numba but no registry (and no lmdb): put them under the
# ignored bench/cache/device-wheels and carry that folder with the device check.
#
#   bench/device_wheels.sh              (Python 3.12, manylinux x86_64)
#
# On the GPU machine:
#   pip install --no-index --no-deps bench/cache/device-wheels/*.whl
#   PYTHONPATH=. python bench/device_check.py --out "$OUT"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/cache/device-wheels"
mkdir -p "$dest"
python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --implementation cp -d "$dest" \
    lmdb msgpack xxhash click tqdm packaging tokenizers
ls -la "$dest"
