"""The plugin's switch and settings, without starting an engine."""

from __future__ import annotations

import json

import pytest

from suffixspec.integrations.vllm import settings as s
from suffixspec.integrations.vllm.patch import supported


def test_enabled_only_by_the_switch():
    assert not s.enabled({})
    assert not s.enabled({"SUFFIXSPEC_ENABLE": "0"})
    assert s.enabled({"SUFFIXSPEC_ENABLE": "1"})
    assert s.enabled({"SUFFIXSPEC_ENABLE": " True "})


def test_settings_from_file_and_environment(tmp_path):
    config = tmp_path / "suffixspec.json"
    config.write_text(json.dumps({"pool": "/a.lmdb", "cross_tokens": 1000, "namespace": "sql"}))
    got = s.Settings.from_env({"SUFFIXSPEC_CONFIG": str(config), "SUFFIXSPEC_POOL": "/b.lmdb",
                               "SUFFIXSPEC_LOG_INTERVAL": "2.5"})
    assert got == s.Settings(pool="/b.lmdb", cross_tokens=1000, namespace="sql", log_interval=2.5)
    assert s.Settings.from_env({}) == s.Settings()


@pytest.mark.parametrize("env, message", [
    ({"SUFFIXSPEC_CROSS_TOKENS": "lots"}, "cross_tokens='lots' is not int"),
    ({"SUFFIXSPEC_CONFIG": "/nonexistent/x.json"}, "cannot read it as JSON"),
])
def test_bad_settings_name_the_problem(env, message):
    with pytest.raises(ValueError, match=message):
        s.Settings.from_env(env)


def test_unknown_key_in_file_is_refused(tmp_path):
    config = tmp_path / "c.json"
    config.write_text('{"pol": "/typo.lmdb"}')
    with pytest.raises(ValueError, match="unknown suffixspec setting 'pol'"):
        s.Settings.from_env({"SUFFIXSPEC_CONFIG": str(config)})


def test_version_gate():
    assert supported("0.32.0") and supported("0.32.1")
    assert not supported("0.31.0") and not supported("0.320.0") and not supported(None)


def test_policy_settings_and_which_vllm_length_knobs_are_honoured():
    from types import SimpleNamespace

    assert s.Settings.from_env({"SUFFIXSPEC_POLICY": "counts",
                                "SUFFIXSPEC_DRAFT_COST": "0.05"}) == s.Settings(
        policy="counts", draft_cost=0.05)
    with pytest.raises(ValueError, match="policy='greedy'"):
        s.Settings.from_env({"SUFFIXSPEC_POLICY": "greedy"})
    vllm_defaults = SimpleNamespace(suffix_decoding_max_spec_factor=1.0,
                                    suffix_decoding_min_token_prob=0.1)
    user_set = SimpleNamespace(suffix_decoding_max_spec_factor=2.0,
                               suffix_decoding_min_token_prob=0.2)
    assert s.length_knobs(vllm_defaults, "calibrated") == (None, None)
    assert s.length_knobs(user_set, "calibrated") == (2.0, 0.2)
    assert s.length_knobs(vllm_defaults, "counts") == (1.0, 0.1)
