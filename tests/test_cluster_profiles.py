"""Cluster profiles are read from the user's config folder (or $NBSCALE_PROFILES)."""

from __future__ import annotations

import os

import pytest

from nbscale.cluster_profiles import resolve_cluster
from nbscale.errors import PoolError

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
    with pytest.raises(
        PoolError,
        match=r"connect_timeout in profile 'lab' of .*profiles.toml must be a number of "
        r"seconds from 1 to 3600, such as 120, not 'slow'",
    ):
        resolve_cluster("lab")


def test_a_profiles_file_another_user_could_write_is_not_used(tmp_path, monkeypatch):
    # job_python and env decide what runs as the user: a profile others can change is code others can run
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(PROFILE + 'job_python = "/their/python"\n')
    monkeypatch.setenv("NBSCALE_PROFILES", str(profiles))
    profiles.chmod(0o666)
    with pytest.raises(
        PoolError,
        match=r"The cluster profiles file .*profiles.toml is not used: other users can write "
        r"to it \(mode -rw-rw-rw-\).*chmod go-w",
    ):
        resolve_cluster("lab")
    profiles.chmod(0o644)
    tmp_path.chmod(0o777)  # they could swap the file for theirs
    with pytest.raises(PoolError, match=rf"is not used: the folder {tmp_path} above it can be written by other users"):
        resolve_cluster("lab")
    tmp_path.chmod(0o700)
    assert resolve_cluster("lab").job_python == "/their/python"
    if os.geteuid() == 0:  # giving the file away takes root
        os.chown(profiles, 65534, 65534)
        with pytest.raises(PoolError, match=r"is not used: it belongs to another user \(uid 65534\)"):
            resolve_cluster("lab")
