"""Helpers the CLI commands share."""

from __future__ import annotations

import re

import click

from suffixspec.fingerprint import TokenizerId
from suffixspec.store import PoolError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``30m``, ``45s`` or a plain number of seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration such as 7d, 12h, 30m or 45s")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def load_tokenizer(path: str):
    """``(TokenizerId, batch encoder)`` of a tokenizer.json, or a one-line CLI error."""
    from suffixspec.fingerprint import tokenizer_id
    from suffixspec.replay.traces import hf_encoder

    try:
        return tokenizer_id(path), hf_encoder(path)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--tokenizer") from None


def open_pool(path: str, tokenizer: TokenizerId | None = None, max_depth: int | None = None,
              **options):
    """A ``PersistentPool``, with pool errors turned into clean CLI errors."""
    from pathlib import Path

    from suffixspec.persistent import PersistentPool

    if tokenizer is None and not Path(path).exists():
        raise click.ClickException(f"no pool at {path}")
    try:
        return PersistentPool(path, tokenizer=tokenizer, max_depth=max_depth, **options)
    except PoolError as e:
        raise click.ClickException(str(e)) from e
