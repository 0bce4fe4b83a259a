"""What the nodes' resource managers did in a mix pass, read back from their decision
logs: how often they evaluated, the stacks they saw, per kind the moves made (with
their reasons) and refused, and the many-clients rule's notes on each node's queue and
its arrivals. The benchmark itself is :mod:`shuttle.bench.mix`."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shuttle.bench.abacus import Bench
from shuttle.bench.mix_settings import KINDS

#: The many-clients rule's note on a node's queue and its arrivals, in the decision
#: log (runtime/placement_choice.py): the wait per call, stacks on their way, held back.
QUEUE_NOTE = re.compile(
    r"waits ([0-9.]+) s a call beyond the model.*?; (\d+) stacks on their way there, "
    r"\d+ at most, (\d+) held back"
)
#: The node's note when its CPU budget holds arrivals back, and when its clients'
#: saturation raised that budget (placement_choice.choose).
BUDGET_NOTE = re.compile(r"has no CPU for arrivals .*?: (\d+) held back")
SATURATED_NOTE = re.compile(r"clients saturated \(their CPUs ([0-9.]+) busy")
#: The node's note when it holds that raise while it is the bound (its clients read
#: under saturated, waiting on it).
HELD_NOTE = re.compile(r"their CPUs ([0-9.]+|nan) busy now .*? it holds its raise")


def decision_logs(bench: Bench) -> list[Path]:
    return [e.data_dir / ".shuttle" / "runtime" / "placement.jsonl" for e in bench.cluster.nodes]


def log_sizes(bench: Bench) -> list[int]:
    return [p.stat().st_size if p.exists() else 0 for p in decision_logs(bench)]


def kind_of(stack_id: str) -> str:
    """The kind of function a stack runs, from its console's name (``…/console-cheap``)."""
    return stack_id.rsplit("-", 1)[-1]


def decisions(
    bench: Bench, since: Sequence[int], wall_s: float, keep: Path | None
) -> dict[str, Any]:
    """What the nodes' resource managers did in a pass, from their decision logs: how
    often they evaluated, the stacks they saw, and per kind the moves they made and
    the reasons of those they did not. ``keep``: also copy the pass's records there."""
    evaluations = 0
    stacks_max = 0
    made: dict[str, dict[str, int]] = {k: {"to_server": 0, "to_client": 0} for k in KINDS}
    refused: dict[str, dict[str, int]] = {k: {} for k in KINDS}
    #: Per kind and direction, the reasons of the moves made (numbers left out).
    why: dict[str, dict[str, int]] = {k: {} for k in KINDS}
    #: Per evaluation: the node's wait per call charged to arrivals, and the stacks on
    #: their way; and the candidates held back for them, in all.
    waits: list[float] = []
    on_way: list[int] = []
    held_back = 0
    #: Evaluations whose arrivals the CPU budget held back, and the candidates it held;
    #: the clients' median busy share at each evaluation whose budget it raised.
    budget_full = budget_held = 0
    saturated: list[float] = []
    #: The clients' median busy share at each evaluation whose raise was held.
    held: list[float] = []
    held_evaluations = 0
    #: The evaluations' own CPU (the node's thread time in each), in all.
    evaluation_cpu_s = 0.0
    #: The admission edge's climb (``--cpu-climb``): each change, with the pass's
    #: second it came at, and the edge at each evaluation's end.
    climb: list[dict[str, Any]] = []
    shares: list[float] = []
    started = None
    for path, offset in zip(decision_logs(bench), since, strict=True):
        if not path.exists():
            continue
        with open(path, "rb") as f:
            f.seek(offset)
            raw = f.read()
        lines = raw.splitlines()
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.with_name(f"{keep.name}-{path.parents[2].name}.jsonl").write_bytes(raw)
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line
            evaluations += 1
            evaluation_cpu_s += float(record.get("cpu_s", 0.0))
            started = record.get("t") if started is None else started
            step = record.get("climb")
            if isinstance(step, dict):
                shares.append(float(step.get("share", 0.0)))
                if not climb or climb[-1]["last"] != step.get("last"):
                    t = round(float(record.get("t", 0.0)) - float(started or 0.0), 2)
                    climb.append({"t_s": t, "share": step.get("share"), "last": step.get("last")})
            stacks_max = max(stacks_max, len(record.get("stacks", [])))
            for note in record.get("notes", []):
                found = QUEUE_NOTE.search(str(note))
                if found:
                    waits.append(float(found.group(1)))
                    on_way.append(int(found.group(2)))
                    held_back += int(found.group(3))
                full = BUDGET_NOTE.search(str(note))
                if full:
                    budget_full += 1
                    budget_held += int(full.group(1))
                busy = SATURATED_NOTE.search(str(note))
                if busy:
                    saturated.append(float(busy.group(1)))
                kept = HELD_NOTE.search(str(note))
                if kept:
                    held_evaluations += 1
                    if kept.group(1) != "nan":  # no client measured its CPU then
                        held.append(float(kept.group(1)))
            for move in record.get("moves", []):
                kind = kind_of(str(move.get("stack", "")))
                if kind not in made:
                    continue
                # "net benefit 0.123 s ≤ B_thresh ..." → "net benefit ≤ B_thresh".
                reason = " ".join(
                    w
                    for w in str(move.get("reason", "")).split()
                    if not any(c.isdigit() for c in w)
                )
                if move.get("execute"):
                    direction = str(move.get("direction"))
                    made[kind][direction] += 1
                    key = f"{direction}: {reason}"
                    why[kind][key] = why[kind].get(key, 0) + 1
                else:
                    refused[kind][reason] = refused[kind].get(reason, 0) + 1
    return {
        "evaluations": evaluations,
        "evaluations_per_s": round(evaluations / wall_s, 2) if wall_s > 0 else None,
        "stacks_max": stacks_max,
        # The node's CPU its evaluations took, a second (its use, like its objects').
        "evaluation_cpu_s_per_s": round(evaluation_cpu_s / wall_s, 4) if wall_s > 0 else None,
        "moves_made": made,
        "moves_made_reasons": why,
        "moves_refused": refused,
        # The many-clients rule's arrivals (docs/runtime.md, "Many clients").
        "queue_s_per_call": spread(waits),
        "arriving": spread([float(x) for x in on_way]),
        "arrivals_held_back": held_back,
        # The CPU budget (docs/runtime.md, "Saturation", "The clients' saturation"):
        # evaluations where it had no room for arrivals, the candidates it held back
        # in all, and the evaluations whose budget the clients' saturation raised.
        "budget_full": {"evaluations": budget_full, "held_back": budget_held},
        "clients_saturated": {"evaluations": len(saturated), "busy": spread(saturated)},
        # Those whose raise was held while the node was the bound (docs/runtime.md,
        # "The raise held"), with the clients' busy share they read then.
        "raise_held": {"evaluations": held_evaluations, "busy": spread(held)},
        # The admission edge's climb (docs/runtime.md, "The admission edge"; None: off).
        "climb": {"changes": climb, "share": spread(shares), "final_share": shares[-1]}
        if shares
        else None,
    }


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median and maximum (None: no value)."""
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "max": round(max(values), 4)}
