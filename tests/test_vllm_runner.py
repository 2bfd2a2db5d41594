"""Which path serves and who says so: the V1 wing's switch, the log line and the gauge."""

from __future__ import annotations

import logging

import pytest

from suffixspec.integrations.vllm import prometheus


def test_the_v1_wing_serves_suffix_or_stands_aside_and_mrv2_names_its_replacement():
    from suffixspec.integrations.vllm.v1_runner import choice

    assert choice({}) == "v1" and choice({"SUFFIXSPEC_RUNNER": "VLLM"}) == "vllm"
    with pytest.raises(ValueError, match="SUFFIXSPEC_RUNNER='v3'"):
        choice({"SUFFIXSPEC_RUNNER": "v3"})
    with pytest.raises(ValueError, match='removed: on vLLM >= 0.34 use method "suffixspec"'):
        choice({"SUFFIXSPEC_RUNNER": "mrv2"})


def test_the_log_line_and_the_gauge_say_which_path_serves(tmp_path, monkeypatch, caplog):
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    monkeypatch.setenv("SUFFIXSPEC_METRICS_DIR", str(tmp_path))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(prometheus, "_announced", set())
    with caplog.at_level(logging.INFO, logger="vllm.suffixspec"):
        prometheus.announce("suffixspec", "mrv2", True)
        prometheus.announce("suffix", "v1", False)
        prometheus.announce("suffix", "v1", False)  # once per process
    text = caplog.text
    assert ('method "suffixspec" is drafted by suffixspec on Model Runner V2, on the device '
            '(async scheduling on)') in text
    assert ('method "suffix" is drafted by suffixspec on vLLM\'s V1 model runner, on the host '
            '(async scheduling off)') in text
    assert text.count('method "suffix" is drafted') == 1
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    samples = {(s.labels["method"], s.labels["runner"], s.labels["async_scheduling"]): s.value
               for m in registry.collect() if m.name == "suffixspec_drafter"
               for s in m.samples}
    assert samples == {("suffixspec", "mrv2", "on"): 1.0, ("suffix", "v1", "off"): 1.0}
