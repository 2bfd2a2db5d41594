"""Which model runner serves ``method: "suffix"``, and who drafts for it.

vLLM has two model runners.  The V1 runner drafts ``suffix`` with its
``SuffixDecodingProposer`` (which the plugin replaces by suffixspec's);
Model Runner V2 (MRV2) picks a speculator in ``init_speculator``.  Which one
runs follows ``VllmConfig.use_v2_model_runner``: ``VLLM_USE_V2_MODEL_RUNNER``
when set, else V1 when Triton is missing or a feature of the config is on
``_get_v2_model_runner_unsupported_features`` (``suffix`` is, up to 0.33),
else MRV2.  vLLM's main branch drafts ``suffix`` itself on MRV2, on the GPU:
there, a plugin that only replaced the V1 class would be bypassed.

So the plugin decides, by ``SUFFIXSPEC_RUNNER``:

* ``v1`` (default, the path tested here): ``suffix`` stays on the V1 runner
  (the plugin lists it as MRV2-unsupported, so vLLM picks V1 and says why),
  where suffixspec drafts; async scheduling is then off (vLLM's V1 runner
  has none for ``suffix``);
* ``mrv2``: suffixspec drafts on MRV2, on the device
  (``device_speculator.DeviceSuffixSpeculator``), with async scheduling.  It
  has run on a GPU only in a synthetic loop (1.00-1.18x the synchronous
  speculator's tokens per ms there, ``docs/device.md``), never under vLLM,
  so it is off by default;
* ``vllm``: vLLM's own drafter serves ``suffix`` (suffixspec stands aside).

Whatever serves, one log line and the ``suffixspec_drafter`` gauge on
``/metrics`` name it (``announce``).
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("vllm.suffixspec")

ENV = "SUFFIXSPEC_RUNNER"
CHOICES = ("v1", "mrv2", "vllm")
DEFAULT = "v1"
#: What the plugin adds to MRV2's unsupported features to keep ``suffix`` on V1.
ON_V1 = ("speculative method 'suffix' (suffixspec serves it on the V1 model runner; "
         "SUFFIXSPEC_RUNNER=mrv2 serves it on Model Runner V2)")

_said: set[str] = set()


def choice(environ=os.environ) -> str:
    value = environ.get(ENV, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: choose from {', '.join(CHOICES)}")
    return value


def unsupported_on_v2(features: list[str], want: str) -> list[str]:
    """MRV2's unsupported features as the plugin wants them: ``suffix`` listed
    (``v1``: vLLM picks the V1 runner and says why) or not (``mrv2``)."""
    rest = [f for f in features if "'suffix'" not in f]
    return rest + [ON_V1] if want == "v1" else rest


def install(want: str) -> None:
    """Make vLLM pick the runner ``want`` asks for ``suffix`` (idempotent)."""
    from vllm.config.vllm import VllmConfig

    original = getattr(VllmConfig._get_v2_model_runner_unsupported_features, "_original",
                       VllmConfig._get_v2_model_runner_unsupported_features)

    def features(self) -> list[str]:
        found = original(self)
        spec = self.speculative_config
        if spec is None or spec.method != "suffix" or want == "vllm":
            return found
        return unsupported_on_v2(found, want)

    features._original = original
    VllmConfig._get_v2_model_runner_unsupported_features = features


def drafter(vllm_config, want: str, mrv2_serving: bool) -> tuple[str, str, bool]:
    """``(who drafts, runner, async scheduling)`` for ``suffix`` under this config.

    Who: ``suffixspec`` or ``vllm``; runner ``v1`` or ``mrv2``.
    ``mrv2_serving``: suffixspec's speculator is installed for MRV2.
    """
    v2 = bool(vllm_config.use_v2_model_runner)
    async_on = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
    runner = "mrv2" if v2 else "v1"
    if want == "vllm":
        return "vllm", runner, async_on
    if v2 and not (want == "mrv2" and mrv2_serving):
        return "vllm", runner, async_on
    return "suffixspec", runner, async_on


def announce(who: str, runner: str, async_on: bool, want: str) -> str:
    """Say once per process who drafts ``suffix``; returns the gauge's label."""
    label = f"{who}-{runner}"
    if label in _said:
        return label
    _said.add(label)
    place = {"v1": "the V1 model runner", "mrv2": "Model Runner V2"}[runner]
    mode = "on" if async_on else "off"
    if who == "suffixspec":
        logger.info("suffixspec: method \"suffix\" is drafted by suffixspec on %s (async "
                    "scheduling %s; %s=%s)", place, mode, ENV, want)
    else:
        level = logging.INFO if want == "vllm" else logging.WARNING
        logger.log(level, "suffixspec: method \"suffix\" is drafted by vLLM's own drafter on %s "
                          "(async scheduling %s), not by suffixspec (%s=%s; v1 or mrv2 serve "
                          "it with suffixspec)", place, mode, ENV, want)
    from suffixspec.integrations.vllm.prometheus import publish_drafter

    publish_drafter(who, runner, async_on)
    return label


def tensor_parallel_size(vllm_config) -> int:
    parallel = getattr(vllm_config, "parallel_config", None)
    return int(getattr(parallel, "tensor_parallel_size", 1) or 1)


def refuse_tensor_parallel(vllm_config, speculator_cls) -> bool:
    """Whether an MRV2 speculator must stand aside for this config: with more
    than one tensor-parallel rank every rank would draft on its own unless the
    speculator ``broadcasts`` rank 0's work, and ranks that draft differently
    feed the model different ``input_ids``.  Says so once; vLLM's own drafter
    then serves ``suffix``."""
    tp = tensor_parallel_size(vllm_config)
    if tp <= 1 or getattr(speculator_cls, "broadcasts", False):
        return False
    if "tp" not in _said:
        _said.add("tp")
        logger.warning("suffixspec: SUFFIXSPEC_RUNNER=mrv2 with tensor parallelism (%d ranks) "
                       "is not supported: its ranks would draft apart; vLLM's own drafter "
                       "serves method \"suffix\" (SUFFIXSPEC_RUNNER=v1 serves it with "
                       "suffixspec on the V1 runner, whose rank 0 drafts for all)", tp)
    return True


def watch_speculators(want: str) -> None:
    """Wrap MRV2's ``init_speculator``: for ``suffix`` it builds suffixspec's
    speculator (``want`` is ``mrv2``) or says that vLLM's own drafts."""
    try:
        import vllm.v1.worker.gpu.spec_decode as spec_decode
    except ImportError:  # a vLLM without Model Runner V2
        return
    original = getattr(spec_decode.init_speculator, "_original", spec_decode.init_speculator)

    def init_speculator(vllm_config, device, req_states):
        if vllm_config.speculative_config.method != "suffix":
            return original(vllm_config, device, req_states)
        if want == "mrv2":
            from suffixspec.integrations.vllm.device_speculator import DeviceSuffixSpeculator

            if not refuse_tensor_parallel(vllm_config, DeviceSuffixSpeculator):
                from suffixspec.integrations.vllm.service import tensor_parallel_group

                speculator = DeviceSuffixSpeculator(vllm_config, device, req_states,
                                                    tp_group=tensor_parallel_group())
                announce("suffixspec", "mrv2", bool(getattr(
                    vllm_config.scheduler_config, "async_scheduling", False)), "mrv2")
                return speculator
        built = original(vllm_config, device, req_states)
        announce(*drafter(vllm_config, want, False), want)
        return built

    init_speculator._original = original
    spec_decode.init_speculator = init_speculator
    module = sys.modules.get("vllm.v1.worker.gpu.model_runner")
    if module is not None:  # a runner imported already bound the name
        module.init_speculator = init_speculator
