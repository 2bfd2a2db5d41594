"""vLLM plugin: serve ``--speculative-config '{"method": "suffix"}'`` with suffixspec.

Registered under the ``vllm.general_plugins`` entry point, so vLLM calls
``register`` in its API process, engine core and every worker.  It does
nothing unless ``SUFFIXSPEC_ENABLE=1`` (see ``settings`` for the rest of the
switches), and nothing twice.  vLLM itself is never a dependency: this
package imports it only once the plugin is switched on.
"""

from __future__ import annotations

from suffixspec.integrations.vllm.settings import Settings, enabled

__all__ = ["Settings", "enabled", "register"]

_installed: bool | None = None


def register() -> None:
    """Entry point for ``vllm.general_plugins``; idempotent."""
    global _installed
    if _installed is not None or not enabled():
        return
    from suffixspec.integrations.vllm.patch import install

    _installed = install()
