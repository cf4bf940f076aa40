"""Cluster profiles are read from the user's config folder (or $NBSCALE_PROFILES)."""

from __future__ import annotations

import pytest

from nbscale.errors import PoolError
from nbscale.pool.profiles import resolve_cluster

PROFILE = '[profiles.lab]\nbackend = "ray"\naddress = "ray://head:10001"\nenv = { NCCL_SOCKET_IFNAME = "eth0" }\n'


def test_a_profile_is_read_from_the_xdg_config_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("NBSCALE_PROFILES", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "nbscale").mkdir()
    (tmp_path / "nbscale" / "profiles.toml").write_text(PROFILE)
    profile = resolve_cluster("lab")
    assert (profile.address, profile.env) == ("ray://head:10001", {"NCCL_SOCKET_IFNAME": "eth0"})


def test_nbscale_profiles_names_another_file_and_a_missing_profile_names_that_file(tmp_path, monkeypatch):
    elsewhere = tmp_path / "team.toml"
    elsewhere.write_text(PROFILE)
    monkeypatch.setenv("NBSCALE_PROFILES", str(elsewhere))
    assert resolve_cluster("lab").address == "ray://head:10001"
    with pytest.raises(PoolError, match=r"neither an address .* nor a profile in .*team.toml \(profiles there: lab\)"):
        resolve_cluster("gpu-farm")


def test_a_profiles_connect_timeout_is_read_and_a_bad_one_names_the_profile_and_file(tmp_path, monkeypatch):
    profiles = tmp_path / "profiles.toml"
    monkeypatch.setenv("NBSCALE_PROFILES", str(profiles))
    profiles.write_text(PROFILE + "connect_timeout = 300\n")
    assert resolve_cluster("lab").connect_timeout == 300.0
    profiles.write_text(PROFILE + 'connect_timeout = "slow"\n')
    with pytest.raises(PoolError, match=r"connect_timeout in profile 'lab' of .*profiles.toml must be a number of "
                                        r"seconds from 1 to 3600, such as 120, not 'slow'"):
        resolve_cluster("lab")
