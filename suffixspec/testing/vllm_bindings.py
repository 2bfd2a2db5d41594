"""Every function and class vLLM's loaded modules bind, for the tests that
show installing suffixspec rebinds none of them (``tests/test_vllm034.py``,
``tests/test_vllm_runner.py``, each in a fresh interpreter)."""

from __future__ import annotations

import sys


def vllm_bindings() -> dict[str, int]:
    """``module.name`` (and ``module.Class.attr``) -> the id of what it binds,
    over every loaded ``vllm`` module."""
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if callable(value):
                out[f"{name}.{attr}"] = id(value)
                if isinstance(value, type) and value.__module__ == name:
                    for k, v in list(vars(value).items()):
                        if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                            out[f"{name}.{attr}.{k}"] = id(v)
    return out
