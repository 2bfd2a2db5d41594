"""vLLM plugin: serve ``--speculative-config '{"method": "suffix"}'`` with suffixspec.

Registered under the ``vllm.general_plugins`` entry point, so vLLM calls
``register`` in its API process, engine core and every worker.  It serves
``method: "suffix"`` when ``SUFFIXSPEC_ENABLE=1``, or when the switch is unset
and arctic-inference is not installed (see ``settings``), and says in vLLM's
log (logger ``vllm.suffixspec``) whenever it stays off, and why.  vLLM itself is never a dependency: this
package imports it only once the plugin is switched on.
"""

from __future__ import annotations

import logging

from suffixspec.integrations.vllm.settings import Settings, enabled, switch

__all__ = ["Settings", "enabled", "register", "switch"]

logger = logging.getLogger("vllm.suffixspec")  # under vLLM's logger: its format
_installed: bool | None = None


def register() -> None:
    """Entry point for ``vllm.general_plugins``; idempotent."""
    global _installed
    if _installed is not None:
        return
    from suffixspec.integrations.vllm.patch import explain_when_suffix_is_asked, install

    on, why = switch()
    from suffixspec.integrations.vllm.runner import choice

    if on and choice() == "vllm":
        on, why = False, "SUFFIXSPEC_RUNNER=vllm: vLLM's own drafter serves method \"suffix\""
    if not on:
        arctic = "arctic-inference is installed" in why
        explain_when_suffix_is_asked(logging.INFO if arctic else logging.WARNING,
                                     f"suffixspec is off: {why}")
        _installed = False
        return
    _installed = install(why)
    if _installed:
        from suffixspec.integrations.vllm.prometheus import serve_from_this_process

        serve_from_this_process()
