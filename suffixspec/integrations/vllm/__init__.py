"""vLLM plugin: suffixspec as a speculative-decoding method.

Registered under the ``vllm.general_plugins`` entry point, so vLLM calls
``register`` in its API process, engine core and every worker.

* vLLM >= 0.34 (Model Runner V2 only): ``register`` adds ``method:
  "suffixspec"`` to vLLM's speculator registry (``speculator_config``); the
  device drafts (``device_speculator``) and vLLM's own hooks tell it of
  requests.  No vLLM name is rebound.  ``method: "suffix"`` stays vLLM's.
* vLLM 0.32-0.33: suffixspec serves ``method: "suffix"`` on the V1 runner
  (``v1_runner``), when ``SUFFIXSPEC_ENABLE=1``, or when the switch is unset
  and arctic-inference is not installed (see ``settings``).

Either way, what vLLM's code must hold is checked first (``contract``), and
the plugin says in vLLM's log (logger ``vllm.suffixspec``) whenever it stays
off, and why; it never stops vLLM from starting.  vLLM itself is never a
dependency: this package imports it only once the plugin is switched on.
"""

from __future__ import annotations

import logging

from suffixspec.integrations.vllm.settings import FALSE, PREFIX, Settings, enabled, switch

__all__ = ["Settings", "enabled", "register", "switch"]

logger = logging.getLogger("vllm.suffixspec")  # under vLLM's logger: its format
_installed: bool | None = None


def register() -> None:
    """Entry point for ``vllm.general_plugins``; idempotent."""
    global _installed
    if _installed is not None:
        return
    from suffixspec.integrations.vllm import contract

    root = contract.vllm_root()
    try:
        if root is not None and contract.serves_registry(root):
            _installed = _register_method(root)
        else:
            _installed = _serve_suffix_on_v1()
    except Exception as exc:  # installing suffixspec never stops vLLM from starting
        logger.warning("suffixspec is off: %s", exc)
        _installed = False
    if _installed:
        from suffixspec.integrations.vllm.prometheus import serve_from_this_process

        serve_from_this_process()


def _register_method(root) -> bool:
    """vLLM >= 0.34: ``method: "suffixspec"`` in the speculator registry."""
    import os

    from suffixspec.integrations.vllm import contract
    from suffixspec.integrations.vllm.speculator_config import METHOD

    version = contract.vllm_version()
    value = os.environ.get(PREFIX + "ENABLE", "").strip().lower()
    if value in FALSE:
        logger.info("suffixspec is off: %sENABLE=%s (method \"%s\" is not registered)",
                    PREFIX, value, METHOD)
        return False
    found = contract.registry_problems(root)
    if found:
        logger.warning("suffixspec is off: vLLM %s is not what method \"%s\" needs: %s",
                       version, METHOD, "; ".join(found))
        return False
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    register_speculative_method(METHOD, contract.CONFIG_CLASS)
    return True


def _serve_suffix_on_v1() -> bool:
    """vLLM <= 0.33: ``method: "suffix"`` on the V1 runner (``v1_runner``)."""
    from suffixspec.integrations.vllm.v1_runner import choice, explain_when_suffix_is_asked, install

    on, why = switch()
    if on and choice() == "vllm":
        on, why = False, "SUFFIXSPEC_RUNNER=vllm: vLLM's own drafter serves method \"suffix\""
    if not on:
        arctic = "arctic-inference is installed" in why
        explain_when_suffix_is_asked(logging.INFO if arctic else logging.WARNING,
                                     f"suffixspec is off: {why}")
        return False
    return install(why)
