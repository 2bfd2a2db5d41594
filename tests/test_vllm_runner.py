"""Who drafts method "suffix": the runner vLLM picks, the plugin's choice, its log line and gauge."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from suffixspec.integrations.vllm import runner

pytest.importorskip("vllm")


def _config(v2_env, monkeypatch, method="suffix"):
    """A config whose runner choice runs vLLM's own ``use_v2_model_runner``."""
    from vllm.config.vllm import VllmConfig

    if v2_env is None:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", v2_env)
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(method=method),
        attention_config=SimpleNamespace(hisparse_config=None),
        parallel_config=SimpleNamespace(distributed_executor_backend=None,
                                        pipeline_parallel_size=1, use_ubatching=False),
        scheduler_config=SimpleNamespace(async_scheduling=v2_env == "1"))
    cfg._get_v2_model_runner_unsupported_features = (
        lambda: VllmConfig._get_v2_model_runner_unsupported_features(cfg))
    cfg.use_v2_model_runner = VllmConfig.use_v2_model_runner.fget(cfg)
    return cfg


def test_the_plugin_keeps_suffix_on_v1_or_lets_it_reach_mrv2():
    features = ["pipeline parallelism with external_launcher"]
    assert runner.unsupported_on_v2(features, "v1") == features + [runner.ON_V1]
    assert runner.unsupported_on_v2(features + ["speculative method 'suffix'"], "mrv2") == \
        features
    assert runner.choice({}) == "v1" and runner.choice({"SUFFIXSPEC_RUNNER": "MRV2"}) == "mrv2"
    with pytest.raises(ValueError, match="SUFFIXSPEC_RUNNER='v3'"):
        runner.choice({"SUFFIXSPEC_RUNNER": "v3"})


@pytest.mark.parametrize("v2_env, want, drafts", [
    ("0", "v1", ("suffixspec", "v1")),          # the V1 runner: suffixspec's drafter
    ("1", "mrv2", ("suffixspec", "mrv2")),      # MRV2 with suffixspec's speculator
    ("1", "v1", ("vllm", "mrv2")),              # MRV2 forced, suffixspec not on it
    ("1", "vllm", ("vllm", "mrv2")),            # suffixspec stands aside
])
def test_who_drafts_follows_vllms_runner_choice(monkeypatch, v2_env, want, drafts):
    cfg = _config(v2_env, monkeypatch)
    who, where, async_on = runner.drafter(cfg, want, mrv2_serving=want == "mrv2")
    assert (who, where) == drafts
    assert async_on == (v2_env == "1")


def test_the_log_line_and_the_gauge_name_who_drafts(tmp_path, monkeypatch, caplog):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    monkeypatch.setenv("SUFFIXSPEC_METRICS_DIR", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(runner, "_said", set())
    with caplog.at_level(logging.INFO, logger="vllm.suffixspec"):
        runner.announce("suffixspec", "mrv2", True, "mrv2")
        runner.announce("suffixspec", "v1", False, "v1")
        runner.announce("vllm", "mrv2", True, "v1")
    text = caplog.text
    assert 'drafted by suffixspec on Model Runner V2 (async scheduling on' in text
    assert 'drafted by suffixspec on the V1 model runner (async scheduling off' in text
    assert "drafted by vLLM's own drafter on Model Runner V2" in text
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = {(s.labels["drafter"], s.labels["runner"], s.labels["async_scheduling"]): s.value
               for m in registry.collect() if m.name == "suffixspec_drafter"
               for s in m.samples}
    assert samples == {("suffixspec", "mrv2", "on"): 1.0, ("suffixspec", "v1", "off"): 1.0,
                       ("vllm", "mrv2", "on"): 1.0}


def test_mrv2_contract_holds_on_the_installed_vllm():
    from suffixspec.integrations.vllm import contract

    assert contract.mrv2_problems(contract.vllm_root()) == []


def test_mrv2_with_tensor_parallelism_needs_a_speculator_that_broadcasts(monkeypatch, caplog):
    """Every MRV2 rank would draft on its own and ranks can draft apart: with
    more than one tensor-parallel rank a speculator that does not broadcast
    rank 0's work stands aside, says so in one line, and vLLM's own drafter
    serves.  suffixspec's device speculator broadcasts its payload."""
    import vllm.v1.worker.gpu.spec_decode as spec_decode

    import suffixspec.integrations.vllm.device_speculator as device

    class Lone:  # a speculator without a broadcast
        def __init__(self, *args, **kwargs):
            raise AssertionError("built with tensor parallelism")

    monkeypatch.setattr(device, "DeviceSuffixSpeculator", Lone)

    built = []

    def vllms_own(vllm_config, device, req_states):
        built.append("vllm")
        return "vllm's speculator"

    monkeypatch.setattr(spec_decode, "init_speculator", vllms_own)
    monkeypatch.setattr(runner, "_said", set())
    monkeypatch.setattr(runner, "announce", lambda *a: None)
    runner.watch_speculators("mrv2")
    cfg = SimpleNamespace(speculative_config=SimpleNamespace(method="suffix"),
                          parallel_config=SimpleNamespace(tensor_parallel_size=2),
                          scheduler_config=SimpleNamespace(async_scheduling=True),
                          use_v2_model_runner=True)
    with caplog.at_level(logging.WARNING, logger="vllm.suffixspec"):
        assert spec_decode.init_speculator(cfg, "cpu", None) == "vllm's speculator"
        assert spec_decode.init_speculator(cfg, "cpu", None) == "vllm's speculator"
    assert built == ["vllm", "vllm"]
    lines = [r for r in caplog.records if "tensor parallelism" in r.getMessage()]
    assert len(lines) == 1 and "2 ranks" in lines[0].getMessage()
    one = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1))
    assert not runner.refuse_tensor_parallel(one, Lone)
    monkeypatch.undo()
    assert device.DeviceSuffixSpeculator.broadcasts
    assert not runner.refuse_tensor_parallel(cfg, device.DeviceSuffixSpeculator)
