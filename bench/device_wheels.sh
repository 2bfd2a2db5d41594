#!/usr/bin/env bash
# Wheels of suffixspec's dependencies that a lent GPU machine lacks (it has
# torch, Triton, Numba, msgpack, xxhash, click, tqdm and tokenizers, and no
# registry): lmdb, and pydantic for the plugin's settings (with the typing-extensions it
# needs, newer than torch's may be).  They go under the
# ignored bench/cache/device-wheels; carry that folder with the device check.
#
#   bench/device_wheels.sh              (Python 3.12, manylinux x86_64)
#
# On the GPU machine:
#   pip install --no-index --no-deps --target /tmp/site bench/cache/device-wheels/*.whl
#   PYTHONPATH=/tmp/site:. python bench/device_check.py --out "$OUT"
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="$here/cache/device-wheels"
mkdir -p "$dest"
python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --implementation cp -d "$dest" \
    lmdb pydantic pydantic_core annotated-types typing-inspection typing-extensions
ls -la "$dest"
