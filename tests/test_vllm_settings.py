"""The plugin's switch and settings, without starting an engine."""

from __future__ import annotations

import json

import pytest

from suffixspec.integrations.vllm import settings as s
from suffixspec.integrations.vllm import contract


def test_on_by_default_only_where_arctic_inference_is_missing():
    assert s.switch({}, arctic_installed=False)[0]
    on, why = s.switch({}, arctic_installed=True)
    assert not on and "SUFFIXSPEC_ENABLE=1" in why
    for value in ("0", "off", " False "):
        on, why = s.switch({"SUFFIXSPEC_ENABLE": value}, arctic_installed=False)
        assert not on and "needs arctic-inference" in why
    for value in ("1", " True ", "yes"):
        assert s.switch({"SUFFIXSPEC_ENABLE": value}, arctic_installed=True)[0]


def test_settings_from_file_and_environment(tmp_path):
    config = tmp_path / "suffixspec.json"
    config.write_text(json.dumps({"pool": "/a.lmdb", "cross_tokens": 1000, "namespace": "sql"}))
    got = s.Settings.from_env({"SUFFIXSPEC_CONFIG": str(config), "SUFFIXSPEC_POOL": "/b.lmdb",
                               "SUFFIXSPEC_LOG_INTERVAL": "2.5"})
    assert got == s.Settings(pool="/b.lmdb", cross_tokens=1000, namespace="sql", log_interval=2.5)
    assert s.Settings.from_env({}) == s.Settings()


def test_settings_take_each_field_type_and_proposer_defaults():
    from suffixspec.config import ProposerConfig

    got = s.Settings.from_env({"SUFFIXSPEC_SNAPSHOT_EVERY": "5000", "SUFFIXSPEC_DRAFT_COST": "0.1",
                               "SUFFIXSPEC_SHARED_NAMESPACE": "shared"})
    assert (got.snapshot_every, got.draft_cost, got.shared_namespace) == (5000, 0.1, "shared")
    default = s.Settings()
    assert default.draft_cost is None  # measured from the engine's steps
    # A persistent pool is snapshotted as it grows, and read by others each second.
    assert default.snapshot_every == 1 << 20 and default.refresh_interval == 1.0
    got = s.Settings.from_env({"SUFFIXSPEC_SNAPSHOT_EVERY": "0",
                               "SUFFIXSPEC_REFRESH_INTERVAL": "0.25"})
    assert (got.snapshot_every, got.refresh_interval) == (0, 0.25)
    # Drafting on the device arbitrates unless asked not to.
    assert default.device_arbiter
    assert not s.Settings.from_env({"SUFFIXSPEC_DEVICE_ARBITER": "0"}).device_arbiter
    assert default.device_live
    assert not s.Settings.from_env({"SUFFIXSPEC_DEVICE_LIVE": "0"}).device_live
    assert (default.cross_tokens, default.namespace) == (
        ProposerConfig.cross_pool_tokens, ProposerConfig.namespace)


@pytest.mark.parametrize("env, message", [
    ({"SUFFIXSPEC_CROSS_TOKENS": "lots"}, "cross_tokens='lots' is not int"),
    ({"SUFFIXSPEC_SNAPSHOT_EVERY": "often"}, "snapshot_every='often' is not int"),
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


def test_tested_release_range():
    ok = contract.tested
    assert ok("0.32.0") and ok("0.32.1") and ok("0.33.0") and ok("0.34.0")
    assert not ok("0.31.0") and not ok("0.35.0") and not ok("0.320.0")
    assert not ok(None) and not ok("not a version")


def test_removed_settings_and_which_vllm_length_knobs_are_honoured(tmp_path):
    from types import SimpleNamespace

    assert s.Settings.from_env({"SUFFIXSPEC_DRAFT_COST": "0.05"}) == s.Settings(draft_cost=0.05)
    with pytest.raises(ValueError, match="SUFFIXSPEC_POLICY.* was removed in suffixspec 0.2"):
        s.Settings.from_env({"SUFFIXSPEC_POLICY": "counts"})
    config = tmp_path / "c.json"
    config.write_text('{"recency": true}')
    with pytest.raises(ValueError, match="setting recency .* was removed"):
        s.Settings.from_env({"SUFFIXSPEC_CONFIG": str(config)})
    vllm_defaults = SimpleNamespace(suffix_decoding_max_spec_factor=1.0,
                                    suffix_decoding_min_token_prob=0.1)
    user_set = SimpleNamespace(suffix_decoding_max_spec_factor=2.0,
                               suffix_decoding_min_token_prob=0.2)
    assert s.length_knobs(vllm_defaults) == (None, None)
    assert s.length_knobs(user_set) == (2.0, 0.2)


@pytest.mark.parametrize("name, value", [("CROSS_TOKENS", "-1"), ("SNAPSHOT_EVERY", "-5"),
                                         ("REFRESH_INTERVAL", "-1"), ("REFRESH_INTERVAL", "nan"),
                                         ("REFRESH_INTERVAL", "inf"), ("LOG_INTERVAL", "-2"),
                                         ("DRAFT_COST", "1.5")])
def test_settings_out_of_range_are_refused_in_one_line(tmp_path, name, value):
    """A negative pool budget would prune a shared pool to nothing at its next
    snapshot: out-of-range settings are refused, from the environment or a file."""
    from suffixspec.integrations.vllm.settings import Settings

    with pytest.raises(ValueError, match=f"SUFFIXSPEC_{name} must be a finite number"):
        Settings.from_env({f"SUFFIXSPEC_{name}": value})
    config = tmp_path / "suffixspec.json"
    config.write_text('{"cross_tokens": -5}')
    with pytest.raises(ValueError, match="SUFFIXSPEC_CROSS_TOKENS must be a finite number"):
        Settings.from_env({"SUFFIXSPEC_CONFIG": str(config)})
