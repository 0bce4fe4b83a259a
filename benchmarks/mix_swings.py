"""The swings in a mix benchmark's adaptive passes, read from the nodes' decision logs
(issue 26, item 5; benchmarks/README.md, "What a send-back frees").

    .venv/bin/python benchmarks/mix_swings.py DIR [DIR ...] [--json FILE]

DIR is a ``shuttle bench abacus mix --logs DIR``. A swing evaluation is one with the
node at 0.95 of its CPU or more (its measured use, the log's "CPU ... s now" over the
1 s window) that sends a stack back; a swing is a run of them with no evaluation
between that is not one. Per pass: evaluations, swing evaluations, swings, stacks
sent back, stacks sent back while the node was at 0.95 or more.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

NOW = re.compile(r"^many clients: \S+ CPU ([0-9.]+) s now, [0-9.]+ s planned, of [0-9.]+ s")
BUSY = 0.95


def pass_swings(path: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        return {"log": str(path), "evaluations": 0}
    node = records[0]["node"]
    window = float(records[0].get("window_s", 1.0))
    swings = swing_evals = backs = backs_busy = 0
    in_swing = False
    for r in records:
        busy = next((float(m.group(1)) / window for n in r["notes"] if (m := NOW.match(n))), None)
        back = sum(1 for a in r["actions"] if a["from"] == node)
        backs += back
        swinging = busy is not None and busy >= BUSY and back > 0
        if busy is not None and busy >= BUSY:
            backs_busy += back
        if swinging:
            swing_evals += 1
            swings += 0 if in_swing else 1
        in_swing = swinging
    return {
        "log": str(path),
        "evaluations": len(records),
        "swing_evaluations": swing_evals,
        "swings": swings,
        "sent_back": backs,
        "sent_back_at_busy": backs_busy,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", type=Path, nargs="+")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for d in args.dirs:
        logs = sorted(d.glob("*adaptive*.jsonl"))
        if not logs:
            raise SystemExit(f"mix_swings: no adaptive decision log (*adaptive*.jsonl) in {d}")
        for log in logs:
            row = pass_swings(log)
            rows.append(row)
            print(
                f"{log}: {row['evaluations']} evaluations, {row.get('swing_evaluations', 0)} "
                f"at >= {BUSY} sending back ({row.get('swings', 0)} swings), "
                f"{row.get('sent_back', 0)} sent back ({row.get('sent_back_at_busy', 0)} "
                "at >= 0.95)"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
