"""What switches the vLLM plugin on, and its suffixspec-only settings.

vLLM's own ``--speculative-config`` carries the drafting knobs
(``num_speculative_tokens`` and the ``suffix_decoding_*`` keys).  Everything
vLLM has no key for comes from environment variables, or from a JSON file
named by ``SUFFIXSPEC_CONFIG`` whose keys are the lower-case names below
without the prefix (``{"pool": "/var/lib/pools/sql.lmdb"}``); a variable wins
over the file.

==================================  ==============================================
``SUFFIXSPEC_ENABLE``               1: serve ``method: "suffix"`` with suffixspec;
                                    0: never; unset: when arctic-inference (the
                                    library vLLM's own suffix method needs) is
                                    not installed
``SUFFIXSPEC_CONFIG``               JSON file with any of the settings below
``SUFFIXSPEC_POOL``                 persistent cross-request pool (LMDB file)
``SUFFIXSPEC_TOKENIZER``            tokenizer.json (or its folder) that the pool
                                    is checked against; default: the model's
``SUFFIXSPEC_NAMESPACE``            namespace finished outputs join
``SUFFIXSPEC_SHARED_NAMESPACE``     a namespace every request also drafts from
``SUFFIXSPEC_REQUEST_NAMESPACES``   namespaces a request may name for itself,
                                    comma-separated (``sql,agent``): its output
                                    joins and it drafts from the one its
                                    ``vllm_xargs`` key ``suffixspec_namespace``
                                    names; any other name, or none, gets
                                    ``SUFFIXSPEC_NAMESPACE``
``SUFFIXSPEC_CROSS_TOKENS``         token budget of the cross-request pool
``SUFFIXSPEC_SNAPSHOT_EVERY``       re-snapshot the pool after this many tokens
``SUFFIXSPEC_LOG_INTERVAL``         seconds between metric log lines (0: never)
``SUFFIXSPEC_DRAFT_COST``           verification cost of one drafted token, as a
                                    share of a step; unset: measured from the
                                    engine's step times
``SUFFIXSPEC_CUDA_GRAPHS``          0: the device's drafting step (vLLM >= 0.34) runs
                                    kernel by kernel instead of as CUDA graphs
``SUFFIXSPEC_DEVICE_ARBITER``       0: drafting on the device (vLLM >= 0.34) does not
                                    arbitrate between its pick and its
                                    own-history scan as the host does
                                    (``arbitrate``; docs/device.md)
``SUFFIXSPEC_DEVICE_LIVE``          0: drafting on the device (vLLM >= 0.34) does not
                                    draft from the other requests' open outputs
                                    (``device.corpus.LiveCorpus``)
==================================  ==============================================
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, fields
from typing import get_type_hints
from pathlib import Path

from suffixspec.config import (ARCTIC_MIN_TOKEN_PROB, ARCTIC_SPEC_FACTOR, REFRESH_INTERVAL,
                               REMOVED, ProposerConfig, check_namespace, check_range)

PREFIX = "SUFFIXSPEC_"
TRUE = {"1", "true", "yes", "on"}


FALSE = {"0", "false", "no", "off"}


def switch(environ=os.environ, arctic_installed: bool | None = None) -> tuple[bool, str]:
    """Whether the plugin serves ``method: "suffix"``, and why, in words."""
    value = environ.get(PREFIX + "ENABLE", "").strip().lower()
    if value in TRUE:
        return True, f"{PREFIX}ENABLE={value}"
    if value in FALSE:
        return False, (f"{PREFIX}ENABLE={value}; method \"suffix\" then needs "
                       f"arctic-inference")
    if arctic_installed is None:
        arctic_installed = _importable("arctic_inference")
    if arctic_installed:
        return False, (f"arctic-inference is installed and serves method \"suffix\"; "
                       f"{PREFIX}ENABLE=1 serves it with suffixspec instead")
    return True, f"arctic-inference is not installed; {PREFIX}ENABLE=0 turns suffixspec off"


def enabled(environ=os.environ) -> bool:
    return switch(environ)[0]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


#: A persistent pool is snapshotted after this many committed tokens, by a
#: child process: what a restart indexes in memory at open stays about this
#: size (about 2 s of indexing here), and memory stays within the budget.
SNAPSHOT_EVERY = 1 << 20


@dataclass(frozen=True)
class Settings:
    pool: str | None = None
    tokenizer: str | None = None
    namespace: str = ProposerConfig.namespace
    shared_namespace: str | None = None
    request_namespaces: str = ""  # comma-separated: the namespaces a request may name
    cross_tokens: int = ProposerConfig.cross_pool_tokens
    snapshot_every: int = SNAPSHOT_EVERY  # 0: never (the in-memory part only grows)
    refresh_interval: float = REFRESH_INTERVAL
    log_interval: float = 10.0
    draft_cost: float | None = None  # None: measured online (``suffixspec.stepcost``)
    cuda_graphs: bool = True  # the device's drafting step replayed as graphs (``device.graphs``)
    device_arbiter: bool = True  # the device arbitrates as the host (``native.arbiter``)
    device_live: bool = True  # the device drafts from open outputs too (``LiveCorpus``)
    # The feeder in a process of its own (``device.feeder_process``); off until it has run
    # on a GPU.
    device_feeder_process: bool = False

    def __post_init__(self):
        for name in ("cross_tokens", "snapshot_every"):
            check_range(PREFIX + name.upper(), getattr(self, name))
        for name in ("refresh_interval", "log_interval"):
            check_range(PREFIX + name.upper(), getattr(self, name), high=1e9)
        check_range(PREFIX + "DRAFT_COST", self.draft_cost, high=0.999, allow_none=True)
        for name in self.allowed_namespaces():
            try:
                check_namespace(name)
            except ValueError as e:
                raise ValueError(f"{PREFIX}REQUEST_NAMESPACES: {e}") from None

    def allowed_namespaces(self) -> frozenset[str]:
        """The namespaces a request may name (``request_namespaces``)."""
        return frozenset(n.strip() for n in self.request_namespaces.split(",") if n.strip())

    @classmethod
    def from_env(cls, environ=os.environ, options: dict | None = None) -> Settings:
        """The settings from ``SUFFIXSPEC_CONFIG``'s file, then the environment,
        then ``options`` (vLLM's ``speculator_options`` for ``method:
        "suffixspec"``, keys as in the file), each winning over the one before."""
        values: dict = {}
        config = environ.get(PREFIX + "CONFIG")
        if config:
            values.update(_read_file(Path(config)))
        for name in [f.name for f in fields(cls)] + list(REMOVED):
            raw = environ.get(PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        if options is not None:
            if not isinstance(options, dict):
                raise ValueError(f"speculator_options must be a JSON object, got {options!r}")
            values.update(options)
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
    """``value`` (text from the environment, or JSON) as field ``name``'s type."""
    from pydantic import TypeAdapter, ValidationError

    known = {f.name: f for f in fields(cls)}
    if name in REMOVED:
        raise ValueError(f"suffixspec setting {name} ({PREFIX}{name.upper()}) was removed in "
                         f"suffixspec 0.2: {REMOVED[name]}")
    if name not in known:
        raise ValueError(f"unknown suffixspec setting {name!r}; known: {', '.join(known)}")
    kind = get_type_hints(cls)[name]
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError:
        kind = getattr(kind, "__name__", str(kind))  # int, or "int | None"
        raise ValueError(f"suffixspec setting {name}={value!r} is not {kind}") from None


# vLLM's defaults for the length knobs: it passes them whether or not a user set them.
VLLM_DEFAULT_SPEC_FACTOR = ARCTIC_SPEC_FACTOR
VLLM_DEFAULT_MIN_TOKEN_PROB = ARCTIC_MIN_TOKEN_PROB


def length_knobs(spec_config) -> tuple[float | None, float | None]:
    """``(max_spec_factor, min_token_prob)`` to honour; None: suffixspec's own rule.

    Each is taken only when it differs from vLLM's default, i.e. when a user
    set it.
    """
    factor = spec_config.suffix_decoding_max_spec_factor
    min_prob = spec_config.suffix_decoding_min_token_prob
    return (None if factor == VLLM_DEFAULT_SPEC_FACTOR else factor,
            None if min_prob == VLLM_DEFAULT_MIN_TOKEN_PROB else min_prob)
