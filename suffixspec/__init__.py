"""suffixspec: speculative-decoding drafts from suffix tries over past tokens.

>>> from suffixspec import SuffixProposer
>>> prop = SuffixProposer(max_spec_tokens=8)
>>> prop.start_request("r1", [5, 6, 7, 8, 5, 6])
>>> prop.propose(["r1"])[0].token_ids.tolist()
[7, 8]

Names are imported on first use, so importing a light submodule (the vLLM
plugin's entry point, for one) does not load Numba.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "CrossPool": "suffixspec.pools.memory",
    "ProposerConfig": "suffixspec.config",
    "Draft": "suffixspec.draft",
    "Proposer": "suffixspec.draft",
    "SuffixIndex": "suffixspec.index",
    "SuffixProposer": "suffixspec.proposer",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'suffixspec' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
