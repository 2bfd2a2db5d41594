"""suffixspec on vLLM's V1 model runner, serving ``method: "suffix"`` (vLLM <= 0.33).

Everything that exists only for the V1 runner lives in this package; vLLM
0.34 removed that runner, and there suffixspec serves ``method:
"suffixspec"`` through vLLM's speculator registry instead
(``speculator_config``, ``device_speculator``).

vLLM <= 0.33 picks proposers from a fixed list of method names, and its
generic ``custom_class`` hook passes no request ids, which a stateful
proposer needs.  So the plugin serves ``"suffix"``: it puts
``SuffixSpecDrafter`` (a subclass of vLLM's ``SuffixDecodingProposer``, so
the runner's ``isinstance`` checks hold) where the model runner looks the
class up, and lets config validation pass without arctic-inference.  vLLM
<= 0.33 keeps ``suffix`` on the V1 runner by itself (Model Runner V2 lists
it as unsupported).  The names rebound here, each checked first
(``contract.v1_problems``): ``SuffixDecodingProposer`` (in its module and
the runner's), ``vllm.config.speculative.has_arctic_inference``, and
``GPUModelRunner._update_states``, ``_on_request_state_removed`` and
``shutdown`` (``hooks``).  Every step here is idempotent.

``SUFFIXSPEC_RUNNER=vllm`` leaves ``suffix`` to vLLM's own drafter.
"""

from __future__ import annotations

import logging
import os
import sys

from suffixspec.integrations.vllm import contract

logger = logging.getLogger("vllm.suffixspec")

_RUNNER = "vllm.v1.worker.gpu_model_runner"


ENV = "SUFFIXSPEC_RUNNER"
CHOICES = ("v1", "vllm")


def choice(environ=os.environ) -> str:
    """``SUFFIXSPEC_RUNNER``: ``v1`` (default, suffixspec drafts ``suffix``) or
    ``vllm`` (vLLM's own drafter does)."""
    value = environ.get(ENV, "").strip().lower() or "v1"
    if value == "mrv2":
        raise ValueError(f"{ENV}=mrv2 was removed: on vLLM >= 0.34 use method "
                         f"\"suffixspec\", which drafts on Model Runner V2")
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: choose from {', '.join(CHOICES)}")
    return value


def install(why: str = "", root=None) -> bool:
    """Patch vLLM in this process; False, saying why, when vLLM's code is not
    what the plugin hooks (``contract``).  ``root``: the vLLM sources checked
    (default: the installed package)."""
    version = contract.vllm_version()
    root = root or contract.vllm_root()
    found = contract.v1_problems(root) if root is not None else ["vLLM is not installed"]
    if found:
        if root is not None and contract.proposer_uses_arctic_api(root):
            return _serve_through_vllms_proposer(why, version, found)
        explain_when_suffix_is_asked(logging.WARNING, f"suffixspec is off: vLLM {version} is "
                                                      f"not what it hooks: {'; '.join(found)}")
        return False
    message = f"suffixspec serves method \"suffix\": {why or 'enabled'}"
    if not contract.tested(version):
        message += (f"; vLLM {version} is outside the tested releases ({contract.TESTED}), "
                    f"but its code has everything the plugin hooks")
    _guard_llvmlite_scan()
    import vllm.v1.spec_decode.suffix_decoding as suffix_decoding

    from suffixspec.integrations.vllm.v1_runner.drafter import SuffixSpecDrafter

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true"):
        logger.warning("suffixspec: VLLM_USE_V2_MODEL_RUNNER=1 sends method \"suffix\" to "
                       "Model Runner V2, where vLLM %s drafts it itself: suffixspec serves it "
                       "on the V1 runner only", version)
    # Config validation then needs no arctic-inference.
    explain_when_suffix_is_asked(logging.INFO, message, answer=True)
    suffix_decoding.SuffixDecodingProposer = SuffixSpecDrafter
    module = sys.modules.get(_RUNNER)  # a runner imported later binds the patched name
    if module is not None:
        module.SuffixDecodingProposer = SuffixSpecDrafter
    return True


def _serve_through_vllms_proposer(why: str, version: str | None, found: list[str]) -> bool:
    """The runner differs from what the drafter hooks, but vLLM's own suffix
    proposer still builds arctic-inference's cache: give it suffixspec's
    arctic-compatible cache (``suffixspec.compat.arctic``, suffixspec policy)
    in place of arctic's module."""
    _guard_llvmlite_scan()
    from suffixspec.compat import arctic

    arctic.install()
    explain_when_suffix_is_asked(
        logging.WARNING,
        f"suffixspec serves method \"suffix\" through vLLM's own SuffixDecodingProposer, "
        f"with suffixspec's arctic-compatible cache ({why or 'enabled'}); its own drafter is "
        f"off (no pool, metrics or multi-turn reuse) because vLLM {version} is not what it "
        f"hooks: {'; '.join(found)}", answer=True)
    return True


def explain_when_suffix_is_asked(level: int, message: str, answer: bool | None = None) -> None:
    """Log ``message`` once, when a config asks for method "suffix".

    Plugins load before vLLM sets up its logging, so a line logged now would
    not show in vLLM's format.  vLLM asks ``has_arctic_inference`` only while
    validating a suffix config, right before it fails without
    arctic-inference: the line shows next to that error.  ``answer``: what
    the question then answers (None: vLLM's own answer).
    """
    try:
        import vllm.config.speculative as speculative

        original = getattr(speculative.has_arctic_inference, "_original",
                           speculative.has_arctic_inference)
    except (ImportError, AttributeError):
        logger.log(level, message)
        return
    said = []

    def has_arctic_inference() -> bool:
        if not said:
            said.append(True)
            logger.log(level, message)
        return original() if answer is None else answer

    has_arctic_inference._original = original
    speculative.has_arctic_inference = has_arctic_inference


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
