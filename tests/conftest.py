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
