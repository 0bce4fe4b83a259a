"""``bench lookaside``'s pieces that need no node: the generated project, the subset
of the tree at slow links, the link per bandwidth, the table and the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shuttle.bench.lookaside import LATENCY_S, Config, link_spec, targets
from shuttle.bench.lookaside_plots import table_lines
from shuttle.bench.lookaside_releases import (
    SourceFile,
    choose_subset,
    make_tiny_releases,
    source_files,
)
from shuttle.errors import ConfigError


def test_tiny_releases_differ_more_the_older_they_are(tmp_path: Path) -> None:
    roots = make_tiny_releases(tmp_path, count=3, files=10)
    assert [r.name for r in roots] == ["tiny-3", "tiny-2", "tiny-1"]
    cur = {f.rel: (roots[0] / f.rel).read_text() for f in source_files(roots[0])}
    assert len(cur) == 10
    changed = [sum((root / rel).read_text() != text for rel, text in cur.items()) for root in roots]
    assert changed[0] == 0 and 0 < changed[1] <= changed[2] < 10


def test_source_files_sorted_relative_to_the_root_and_only_python(tmp_path: Path) -> None:
    for rel in ("pkg/b.py", "pkg/a.py", "pkg/data.txt", "other/c.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert [f.rel for f in source_files(tmp_path)] == ["other/c.py", "pkg/a.py", "pkg/b.py"]
    assert [f.rel for f in source_files(tmp_path, "pkg")] == ["pkg/a.py", "pkg/b.py"]


def test_subset_is_a_path_order_prefix_within_the_budget() -> None:
    files = [SourceFile(f"p/{i:02}.py", 100) for i in range(10)]
    assert choose_subset(files, 350) == files[:3]
    assert choose_subset(files, 10_000) == files
    assert choose_subset(files, 1) == files[:1]  # never empty: one file at least


def test_link_has_the_lan_latency_and_rejects_bad_bandwidths() -> None:
    assert link_spec("10Mbit") == f"bw=10Mbit,lat={LATENCY_S * 1e3:g}ms"
    with pytest.raises(ConfigError):
        link_spec("fast")


def _report(rows: dict[str, dict[str, float]]) -> dict[str, Any]:
    cols = ["none", "3", "2"]
    return {
        "columns": cols,
        "trees": {bw: {"files": 4, "bytes": 4000} for bw in rows},
        "rows": {
            bw: {c: {"mean_s": 10.0 - w / 10, "stdev_s": 0.1, "win_pct": w} for c, w in r.items()}
            for bw, r in rows.items()
        },
    }


def test_table_shows_seconds_and_wins_per_store() -> None:
    report = _report({"10Mbit": {"none": 0.0, "3": 27.1, "2": -3.7}})
    lines = table_lines(report)
    assert lines[0].split() == ["bandwidth", "no", "store", "3", "2"]
    assert "[+27.1%]" in lines[1] and "[-3.7%]" in lines[1] and lines[1].startswith("10Mbit")
    assert "4 files" in lines[2]


def test_targets_judge_each_row_that_ran() -> None:
    config = Config("tiny", ["3", "2"], ["1Mbit", "10Mbit", "1Gbit"])
    rows = _report(
        {
            "1Mbit": {"none": 0.0, "3": 70.0, "2": 50.0},
            "10Mbit": {"none": 0.0, "3": 30.0, "2": 19.0},
            "1Gbit": {"none": 0.0, "3": 1.0, "2": -2.5},
        }
    )["rows"]
    got = targets(config, rows)
    assert got["current wins >= paper at 1Mbit"]["met"] is True
    assert got["one back wins >= 20% at 10Mbit"]["met"] is False
    assert got["never loses > 2% at >= 100Mbit"] == {"ours": -2.5, "paper": -26.1, "met": False}
    assert "current wins >= paper at 100kbit" not in got


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (["django/__init__.py", "tests/test_x.py"], "django"),
        (["lib/sqlalchemy/__init__.py", "test/orm/test_a.py"], "lib/sqlalchemy"),
        (["src/my_pkg/__init__.py", "docs/conf.py"], "src/my_pkg"),
        (["src/other/__init__.py", "setup.py"], "src/other"),  # import name differs
        (["a.py", "b/c.py"], ""),  # no package: every .py file
    ],
)
def test_subdir_auto_finds_flat_lib_and_src_layouts(
    tmp_path: Path, layout: list[str], expected: str
) -> None:
    from shuttle.bench.lookaside_releases import find_package

    project = "my-pkg" if "my_pkg" in expected else expected.rpartition("/")[2] or "nothing"
    for rel in layout:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert find_package(tmp_path, project if expected != "src/other" else "Other-Dist") == expected


def test_rsync_finds_what_did_not_change_in_files_of_the_same_name(tmp_path: Path) -> None:
    from shuttle.bench.lookaside_releases import rsync_unchanged

    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        (root / "pkg").mkdir(parents=True)
    body = "".join(f"line {i} of a module that did not change\n" for i in range(2000))
    (old / "pkg" / "a.py").write_text("# 2022\n" + body)
    (new / "pkg" / "a.py").write_text("# 2023\n" + body)
    (new / "pkg" / "new.py").write_text("fresh = True\n" * 100)
    files = source_files(new)
    found = rsync_unchanged(new, old, files, tmp_path)
    assert found is not None
    size = sum(f.size for f in files)
    assert found["matched"] + found["literal"] == size
    assert found["matched"] > 0.9 * len(body) and found["literal"] >= 1300
