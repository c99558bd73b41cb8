"""Store profiles (dev | production file sizes) and "did you mean" for a mistyped config key (issue 30)."""
from __future__ import annotations

import pytest

from hostmq.config import Config
from hostmq.errors import ConfigError


def test_a_mistyped_key_or_section_gets_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"did you mean store\.commitlog_file_bytes\?"):
        Config.from_dict({"store": {"comitlog_file_bytes": 1 << 20}})
    with pytest.raises(ConfigError, match=r"did you mean 'store'\?"):
        Config.from_dict({"stor": {}})


def test_a_store_profile_fills_only_the_sizes_the_config_does_not_set():
    from hostmq.config import PROFILES
    dev = Config.from_dict({"store": {"profile": "dev", "index_slots": 1234}}).store
    assert dev.commitlog_file_bytes == PROFILES["dev"]["commitlog_file_bytes"] == 32 << 20
    assert dev.index_slots == 1234
    assert Config().store.profile == "production"
    assert Config().store.commitlog_file_bytes == PROFILES["production"]["commitlog_file_bytes"] == 1 << 30
    # Switching profile by override re-fills what the old profile gave, keeps what was set.
    back = Config.from_dict({"store": {"profile": "dev", "index_slots": 1234}}).with_overrides(
        {"store": {"profile": "production"}}).store
    assert back.commitlog_file_bytes == 1 << 30 and back.index_slots == 1234
    with pytest.raises(ConfigError, match="store.profile must be one of"):
        Config.from_dict({"store": {"profile": "tiny"}})
