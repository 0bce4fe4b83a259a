"""The decision log in memory as JSON lines (``RuntimeConfig.log_as_text``): nothing a
garbage collection traverses, and the same records read back as with dicts."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

from shuttle.runtime.config import RuntimeConfig
from tests.unit.runtime.test_planner import client_digest, resource_manager


def _tracked_objects_of_the_log(records: object) -> int:
    """Objects a full collection would look into to get through the in-memory log."""
    gc.collect()  # tuples of untracked items are untracked by a collection
    seen = 0
    todo = [records]
    while todo:
        obj = todo.pop()
        for child in gc.get_referents(obj):
            if gc.is_tracked(child):
                seen += 1
                todo.append(child)
    return seen


def _timeless(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without what each evaluation measured of its own CPU."""
    return [{k: v for k, v in r.items() if k != "cpu_s"} for r in records]


def test_the_log_in_memory_is_nothing_a_collection_traverses(tmp_path: Path) -> None:
    text = resource_manager(RuntimeConfig(decision_log=tmp_path / "a.jsonl"))
    dicts = resource_manager(RuntimeConfig(decision_log=tmp_path / "b.jsonl", log_as_text=False))
    for rm in (text, dicts):
        for _ in range(5):
            rm.receive(client_digest())
    assert len(text.records) == len(dicts.records) >= 1
    assert _tracked_objects_of_the_log(text.records) == 0
    # As before: every record's dicts and lists (its nodes, stacks, objects, edges,
    # candidates...), for every full collection.
    assert _tracked_objects_of_the_log(dicts.records) >= 10 * len(dicts.records)


def test_the_records_read_back_and_written_are_the_same_either_way(tmp_path: Path) -> None:
    text = resource_manager(RuntimeConfig(decision_log=tmp_path / "a.jsonl"))
    dicts = resource_manager(RuntimeConfig(decision_log=tmp_path / "b.jsonl", log_as_text=False))
    for rm in (text, dicts):
        for _ in range(3):
            rm.receive(client_digest())
        rm._write_log()
    assert _timeless(json.loads(json.dumps(dicts.log_since(0)))) == _timeless(text.log_since(0))
    assert [r["seq"] for r in text.log_since(1)] == [2, 3]
    assert [r["seq"] for r in text.log_since(0, limit=1)] == [3]
    lines_a = (tmp_path / "a.jsonl").read_text().splitlines()
    lines_b = (tmp_path / "b.jsonl").read_text().splitlines()
    assert _timeless([json.loads(x) for x in lines_a]) == _timeless(
        [json.loads(x) for x in lines_b]
    )
    assert len(lines_a) == 3
