"""What switches the vLLM plugin on, and its suffixspec-only settings.

vLLM's own ``--speculative-config`` carries the drafting knobs
(``num_speculative_tokens`` and the ``suffix_decoding_*`` keys).  Everything
vLLM has no key for comes from environment variables, or from a JSON file
named by ``SUFFIXSPEC_CONFIG`` whose keys are the lower-case names below
without the prefix (``{"pool": "/var/lib/pools/sql.lmdb"}``); a variable wins
over the file.

==============================  ==============================================
``SUFFIXSPEC_ENABLE=1``         serve ``method: "suffix"`` with suffixspec
``SUFFIXSPEC_CONFIG``           JSON file with any of the settings below
``SUFFIXSPEC_POOL``             persistent cross-request pool (LMDB file)
``SUFFIXSPEC_TOKENIZER``        tokenizer.json (or its folder) that the pool
                                is checked against; default: the model's
``SUFFIXSPEC_NAMESPACE``        namespace finished outputs join
``SUFFIXSPEC_SHARED_NAMESPACE`` a namespace every request also drafts from
``SUFFIXSPEC_CROSS_TOKENS``     token budget of the cross-request pool
``SUFFIXSPEC_SNAPSHOT_EVERY``   re-snapshot the pool after this many tokens
``SUFFIXSPEC_LOG_INTERVAL``     seconds between metric log lines (0: never)
==============================  ==============================================
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

PREFIX = "SUFFIXSPEC_"
TRUE = {"1", "true", "yes", "on"}


def enabled(environ=os.environ) -> bool:
    return environ.get(PREFIX + "ENABLE", "").strip().lower() in TRUE


@dataclass(frozen=True)
class Settings:
    pool: str | None = None
    tokenizer: str | None = None
    namespace: str = "default"
    shared_namespace: str | None = None
    cross_tokens: int = 4_000_000
    snapshot_every: int | None = None
    log_interval: float = 10.0

    @classmethod
    def from_env(cls, environ=os.environ) -> Settings:
        values: dict = {}
        config = environ.get(PREFIX + "CONFIG")
        if config:
            values.update(_read_file(Path(config)))
        for f in fields(cls):
            raw = environ.get(PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = raw
        return cls(**{name: _convert(cls, name, value) for name, value in values.items()})


def _read_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{PREFIX}CONFIG={path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{PREFIX}CONFIG={path}: expected a JSON object")
    return data


def _convert(cls, name: str, value):
    known = {f.name: f for f in fields(cls)}
    if name not in known:
        raise ValueError(f"unknown suffixspec setting {name!r}; known: {', '.join(known)}")
    kind = known[name].type.split(" |")[0]
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"suffixspec setting {name}={value!r} is not {kind}") from None
