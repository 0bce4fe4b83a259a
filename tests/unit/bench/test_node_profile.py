"""The node profiler of ``bench abacus mix --profile-node``: py-spy on a real process,
its chunks read back, and where the sampled CPU is charged."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from shuttle.bench.mix_settings import MixSettings
from shuttle.bench.node_profile import category, read_raw, start_recording, summarize
from shuttle.errors import ConfigError

HOSTED = (
    "_worker (concurrent/futures/thread.py:83)",
    "call (shuttle/runtime/hosted_calls.py:79)",
    "_enter_hosted (shuttle/runtime/hosted_calls.py:148)",
)
LOOP = ("Runner.run (asyncio/runners.py:118)", "NodeProtocol.data_received (shuttle/net/x.py:9)")
BURN = "burn_cpu (shuttle/net/cpu.py:132)"
EVAL = "ResourceManager.evaluate (shuttle/runtime/planner.py:237)"
#: The evaluation's other real frames: its input and its record in the decision log.
EVAL_FRAMES = (
    "model_input (shuttle/runtime/planner_input.py:130)",
    "ResourceManager._record (shuttle/runtime/planner.py:296)",
    "Digest.parse (shuttle/runtime/digest.py:80)",
)


def _raw(path: Path, stacks: dict[tuple[str, ...], int]) -> Path:
    path.write_text("".join(f"{';'.join(s)} {n}\n" for s, n in stacks.items()))
    return path


def test_samples_are_charged_to_what_ran_and_burns_to_their_section(tmp_path: Path) -> None:
    first = _raw(
        tmp_path / "a.000.txt",
        {(*HOSTED, BURN): 150, HOSTED: 10, (*LOOP, BURN): 40, (*HOSTED, EVAL): 20},
    )
    second = _raw(tmp_path / "a.001.txt", {(*LOOP, "gc_collect_main (libpython3.11.so)"): 5})
    summary = summarize([(100.0, first), (102.0, second)], rate=100, pass_t0=99.0)
    # An evaluation on a worker thread is the evaluation's, not the hosted call's.
    assert summary["cpu_s"]["hosted call"] == 1.6
    assert summary["cpu_s"]["evaluation"] == 0.2
    assert summary["cpu_s"]["event loop"] == 0.4
    assert summary["cpu_s"]["gc"] == 0.05
    assert summary["burn_cpu_s"]["hosted call"] == 1.5
    assert summary["burn_cpu_s"]["event loop"] == 0.4
    assert summary["sampled_cpu_s"] == 2.25
    assert [c["t_s"] for c in summary["per_chunk"]] == [1.0, 3.0]
    assert summary["per_chunk"][1]["gc"] == 0.05
    assert summary["top_self"][0] == [BURN, 1.9]


def test_category_order() -> None:
    assert category(list(HOSTED)) == "hosted call"
    for frame in EVAL_FRAMES:  # the planner's own modules, by their real paths
        assert category([*LOOP, frame]) == "evaluation", frame
    assert category([*LOOP, "ReadOps.read (shuttle/store/reads.py:160)"]) == "serve"
    assert category(["main (x.py:1)"]) == "other"


def test_a_real_process_is_sampled_in_chunks(tmp_path: Path) -> None:
    code = (
        "import time\n"
        "def spin_for_the_profiler():\n"
        "    end = time.monotonic() + 30\n"
        "    while time.monotonic() < end:\n"
        "        pass\n"
        "spin_for_the_profiler()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)  # the interpreter up before py-spy looks for it
        rec = start_recording(child.pid, tmp_path, "spin", rate=50)
        deadline = time.monotonic() + 20
        while len(rec.chunks) < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        said = rec.stop()
    finally:
        child.kill()
        child.wait()
    if said["py_spy_failed"] and any("ermission" in x for x in said["py_spy_said"]):
        pytest.skip(f"py-spy may not attach to a sibling process here: {said['py_spy_said']}")
    assert said["chunks"] >= 1, said
    assert said["py_spy_cpu_s"] > 0
    stacks = read_raw(rec.chunks[0][1])
    assert any(s[-1].startswith("spin_for_the_profiler ") for s in stacks), stacks
    summary = summarize(rec.chunks, 50, None)
    assert summary["sampled_cpu_s"] >= 1.0  # a 2 s chunk of a process spinning


def test_profile_without_py_spy_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="make setup-dev"):
        MixSettings(clients=4, profile_dir=tmp_path / "prof").check()


def test_py_spy_that_cannot_attach_ends_the_recording_and_says_why(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid with no process behind it
    rec = start_recording(gone.pid, tmp_path, "gone", rate=50)
    assert rec._thread is not None
    rec._thread.join(30)  # it ends by itself: no py-spy started again and again
    assert not rec._thread.is_alive()
    said = rec.stop()
    assert said["py_spy_failed"] is True and said["chunks"] == 0
    assert said["py_spy_said"] and said["py_spy_said"][-1].startswith("Error:"), said
    assert not any("StdError" in line or line[:1].isdigit() for line in said["py_spy_said"])
