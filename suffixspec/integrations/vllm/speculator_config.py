"""``method: "suffixspec"``: suffixspec in vLLM's speculator registry (vLLM >= 0.34).

vLLM 0.34 builds every speculator from a ``SpeculatorConfig`` named by its
method; a plugin adds its own with ``register_speculative_method`` (called
from ``suffixspec.integrations.vllm.register`` in every vLLM process, by
qualified name, so this module loads only where a config names the method).
suffixspec's config is vLLM's suffix config with another speculator: it keeps
everything vLLM knows of suffix decoding (no draft model, dense token history
on the device, confidences learned online for adaptive verification, the
``suffix_decoding_*`` keys and their checks) and names
``DeviceSuffixSpeculator``.  ``method: "suffix"`` stays vLLM's own.

suffixspec's own settings come from ``speculator_options`` (keys as
``Settings``'s fields, ``{"pool": "/var/lib/pools/sql.lmdb"}``), over the
environment (``SUFFIXSPEC_*``); both are checked here, while vLLM validates
the config in the API server, so a bad one stops the server before it loads
a model, with one line.

Like every config module vLLM loads, this one imports neither torch nor the
speculator.
"""

from __future__ import annotations

import logging

from vllm.v1.worker.gpu.spec_decode.suffix.config import SuffixSpeculatorConfig

from suffixspec.integrations.vllm.settings import Settings

logger = logging.getLogger("vllm.suffixspec")

METHOD = "suffixspec"
#: ``num_speculative_tokens`` when the config leaves it out (docs/vllm.md,
#: "How many tokens a draft may hold").
DEFAULT_SPECULATIVE_TOKENS = 8


class SuffixSpecSpeculatorConfig(SuffixSpeculatorConfig):
    speculator_class = "suffixspec.integrations.vllm.device_speculator.DeviceSuffixSpeculator"
    supported_options = frozenset({"speculator_options"})

    @classmethod
    def configure(cls, spec) -> None:
        if spec.num_speculative_tokens is None:
            spec.num_speculative_tokens = DEFAULT_SPECULATIVE_TOKENS
            logger.info("suffixspec: num_speculative_tokens defaults to %d",
                        DEFAULT_SPECULATIVE_TOKENS)
        super().configure(spec)

    @classmethod
    def apply_options(cls, spec) -> None:
        settings(spec)  # refused now, with one line, rather than in a worker


def settings(spec) -> Settings:
    """suffixspec's settings for ``spec`` (vLLM's ``SpeculativeConfig``):
    its ``speculator_options`` over the environment."""
    try:
        return Settings.from_env(options=getattr(spec, "speculator_options", None))
    except ValueError as e:
        raise ValueError(f"method \"{METHOD}\": {e}") from None
