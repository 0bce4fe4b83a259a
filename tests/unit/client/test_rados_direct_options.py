"""The options and answers of a client that reads RADOS node misses itself
(shuttle.client.rados_direct): bad options are refused saying what to give, and only a
well-formed location is taken for one (anything else: the node's bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.client.rados_direct import CephOptions, Location, location_of
from shuttle.errors import ConfigError


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    path = tmp_path / "ceph.conf"
    path.write_text("[global]\nmon host = 127.0.0.1:6789\n")
    return path


def test_missing_files_are_refused_naming_the_flag(conf: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--ceph-conf .* is not a readable file"):
        CephOptions(tmp_path / "nope.conf")
    with pytest.raises(ConfigError, match=r"--ceph-keyring .* is not a readable file"):
        CephOptions(conf, tmp_path / "nope.keyring")


def test_a_user_must_be_a_cephx_client_name(conf: Path) -> None:
    for bad in ("admin", "client.", "osd.0"):
        with pytest.raises(ConfigError, match=r"client\.NAME"):
            CephOptions(conf, user=bad)
    assert CephOptions(conf, user="client.reader").user == "client.reader"


def test_timeouts_and_memory_must_make_sense(conf: Path) -> None:
    with pytest.raises(ConfigError, match="op timeout must be ≥ 1 s"):
        CephOptions(conf, op_timeout_s=0)
    with pytest.raises(ConfigError, match="remember_s must be ≥ 0"):
        CephOptions(conf, remember_s=-1)
    assert CephOptions(conf, remember_s=0).remember_s == 0


def test_only_a_well_formed_location_is_one() -> None:
    where = {"pool": "p", "namespace": "", "object": "a/b", "version": 7}
    assert location_of({"rados": where}) == Location("p", "", "a/b", 7)
    assert location_of(None) is None  # a read's usual answer: the bytes
    for broken in (
        {"rados": {**where, "version": "7"}},
        {"rados": {k: v for k, v in where.items() if k != "pool"}},
        {"rados": [where]},
        {"other": where},
        [where],
    ):
        assert location_of(broken) is None, broken
