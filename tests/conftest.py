"""Shared fixtures: paths to the shared traces and tokenizer, when present."""

from __future__ import annotations

from pathlib import Path

import pytest

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
