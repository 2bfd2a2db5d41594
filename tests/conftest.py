"""Shared fixtures: paths to the shared traces and tokenizer, when present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from suffixspec.integrations.vllm.contract import vllm_version


def _at_least(version: str | None, floor: str) -> bool:
    from packaging.version import Version

    return version is not None and Version(version) >= Version(floor)


#: vLLM 0.34 has Model Runner V2 only and no CPU build: its Python objects run
#: here on CPU tensors (``scripts/install_vllm034.sh`` makes their venv), its
#: Triton kernels under Triton's interpreter, which vLLM takes where no GPU is
#: visible.  Set before anything imports vLLM.
VLLM_034 = _at_least(vllm_version(), "0.34")
if VLLM_034:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def pytest_collection_modifyitems(config, items):
    """Tests of vLLM 0.34's path run in the venv that has it; elsewhere they say where."""
    if VLLM_034:
        return
    skip = pytest.mark.skip(reason="needs vLLM >= 0.34: the README's test command runs it in "
                                   ".venv-vllm034 (scripts/install_vllm034.sh)")
    for item in items:
        if "vllm034" in item.keywords:
            item.add_marker(skip)


SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "data" / "traces"
TOKENIZER = SHARED / "tokenizers" / "qwen" / "tokenizer.json"


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    if not TOKENIZER.is_file():
        pytest.skip(f"shared tokenizer not found at {TOKENIZER}")
    return TOKENIZER


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES}")
    return TRACES


def _replay(cache: Path) -> dict:
    """``suffixspec replay --json`` on its embedded default with Numba's cache
    at ``cache``: the row's drafts, not its timings."""
    cli = str(Path(sys.executable).with_name("suffixspec"))
    out = subprocess.run([cli, "replay", "--json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "NUMBA_CACHE_DIR": str(cache)}).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return {k: v for k, v in row.items() if "_us_" not in k}


@pytest.fixture(scope="session")
def first_run_kernel_cache(tmp_path_factory):
    """A kernel cache a first run filled (``suffixspec replay`` on an empty
    cache: the drafting kernel compiles in a child process), that run's row,
    and ``replay(cache)`` to run it again.  Tests copy the cache to change it."""
    cache = tmp_path_factory.mktemp("first-run") / "cache"
    return SimpleNamespace(path=cache, row=_replay(cache), replay=_replay)


@pytest.fixture
def arctic_api_restored():
    """Undo ``suffixspec.compat.arctic.install()`` after the test: the modules
    under arctic-inference's names, and the real package's attribute."""
    import sys

    names = ("arctic_inference", "arctic_inference.suffix_decoding")
    saved = {k: sys.modules.get(k) for k in names}
    yield
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
    if saved[names[0]] is not None and saved[names[1]] is not None:
        saved[names[0]].suffix_decoding = saved[names[1]]
