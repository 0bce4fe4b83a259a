"""Where the jail's root is built: never over the interpreter's own files (a checkout
under /tmp had its virtualenv hidden by the root's tmpfs, and every shipped object was
refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.runtime import jail_enter
from shuttle.runtime.jail_enter import JailError, staging_for


@pytest.fixture
def candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made = [str(tmp_path / name) for name in ("tmp", "mnt", "media")]
    for path in made:
        Path(path).mkdir()
    monkeypatch.setattr(jail_enter, "STAGING_CANDIDATES", tuple(made))
    return made


def test_the_first_candidate_when_nothing_to_bind_is_under_it(candidates: list[str]) -> None:
    assert staging_for(["/usr", "/opt/python"]) == candidates[0]


def test_a_candidate_holding_a_bind_is_passed_over(candidates: list[str]) -> None:
    venv = candidates[0] + "/x/.venv"
    assert staging_for(["/usr", venv]) == candidates[1]


def test_a_candidate_inside_a_bind_is_passed_over(candidates: list[str]) -> None:
    assert staging_for([candidates[0], candidates[1] + "/lib"]) == candidates[2]


def test_a_candidate_that_only_shares_a_name_prefix_is_kept(candidates: list[str]) -> None:
    assert staging_for([candidates[0] + "x/.venv"]) == candidates[0]


def test_a_missing_candidate_is_passed_over(candidates: list[str]) -> None:
    Path(candidates[0]).rmdir()
    assert staging_for(["/usr"]) == candidates[1]


def test_no_candidate_left_is_a_clear_error(candidates: list[str]) -> None:
    with pytest.raises(JailError, match=r"no directory to build the jail's root in: .*create /mnt"):
        staging_for([str(Path(candidates[0]).parent)])
