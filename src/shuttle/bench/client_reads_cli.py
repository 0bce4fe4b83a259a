"""``shuttle bench speculate|lookaside``: the client's read paths, as their papers
measured them.

Concepts: speculative remote read (Yi, section 4: normal reads against thread and
fork speculation and ``auto`` over a LAN slowed down, with remote writes) and
lookaside caching (Tolia et al., Figure 6: a cold build over the mount with stores
of older releases, at each bandwidth). The commands only parse their options and
print; the measuring is in :mod:`shuttle.bench.speculate` and
:mod:`shuttle.bench.lookaside`. ``shuttle.bench.cli`` registers them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from shuttle.bench.session import benchmark, scratch_dir
from shuttle.bench.session import lines as progress_lines
from shuttle.errors import UsageError


@benchmark("bench speculate")
def speculate(
    iterations: Annotated[int, typer.Option(min=1, help="Reads per run (the paper: 100).")] = 100,
    slowdowns: Annotated[
        str, typer.Option(help="How many times slower than --link, comma-separated.")
    ] = "1,2,4,8,16,32",
    cases: Annotated[
        str,
        typer.Option(
            help="LOCAL_MS:P pairs: local processing between reads and the probability of "
            "a remote write before each read (the paper's test cases 1 and 2)."
        ),
    ] = "30:0,60:0,60:0.1,60:0.25",
    methods: Annotated[
        str, typer.Option(help="Any of normal, thread, fork, auto, comma-separated.")
    ] = "normal,thread,fork,auto",
    object_bytes: Annotated[int, typer.Option(min=16, help="Object size (the paper: 10 KB).")] = (
        10 * 1024
    ),
    link: Annotated[str, typer.Option(help="The link profile slowed down (default: lan).")] = "lan",
    work: Annotated[str, typer.Option(help="Local processing: busy (CPU loop) or sleep.")] = "busy",
    seed: Annotated[int, typer.Option(help="Seed of the remote-write pattern.")] = 1,
    node: Annotated[
        str | None, typer.Option(help="Use this node (HOST:PORT) instead of starting one.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write the report here.")
    ] = None,
    plot_path: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG of the paper's graphs here.")
    ] = None,
) -> None:
    """Speculative remote read (Yi, section 4): normal read against thread and fork
    speculation and auto, over a LAN slowed 1x to 32x, with remote writes at rate p."""
    from shuttle.bench.speculate import SpeculateConfig, parse_cases, print_report
    from shuttle.bench.speculate import run as run_speculate

    try:
        factors = tuple(int(k) for k in slowdowns.split(","))
    except ValueError:
        raise UsageError(f"--slowdowns: integers separated by commas, not {slowdowns!r}") from None
    config = SpeculateConfig(
        iterations=iterations,
        slowdowns=factors,
        cases=parse_cases(cases),
        methods=tuple(m.strip() for m in methods.split(",")),
        object_bytes=object_bytes,
        link=link,
        work=work,
        seed=seed,
        node=node,
    )
    console = Console()
    # Progress as plain lines: a spinner's refresh thread would compete for the
    # interpreter with the thread branches being measured.
    report = run_speculate(config, progress=progress_lines("speculate", console))
    print_report(report)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
    if plot_path is not None:
        from shuttle.bench.speculate_plots import plot

        plot_path.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"plot written to {plot(report, plot_path)}")


@benchmark("bench lookaside")
def lookaside(
    project: Annotated[
        str, typer.Argument(help="PyPI project whose sdists are built (default: django).")
    ] = "django",
    releases: Annotated[
        str,
        typer.Option(
            "--releases",
            help="CURRENT,ONE_BACK,TWO_BACK,...: the release in Shuttle, then the stores' "
            "releases (default: 5.0.4,5.0.3,5.0,4.2,4.1 for django).",
        ),
    ] = "",
    bandwidths: Annotated[
        str,
        typer.Option(
            "--bandwidths", help="Link bandwidths, comma-separated (LAN latency on each)."
        ),
    ] = "100kbit,1Mbit,10Mbit,100Mbit,1Gbit",
    runs: Annotated[int, typer.Option(min=1, help="Cold builds per cell (mean, stdev).")] = 1,
    target_s: Annotated[
        float,
        typer.Option(
            "--target-s",
            min=1.0,
            help="Shrink the tree at slow links to this many seconds of transfer.",
        ),
    ] = 90.0,
    jobs: Annotated[int, typer.Option(min=0, help="compileall -j (0: every core).")] = 0,
    subdir: Annotated[
        str,
        typer.Option(
            "--subdir",
            help="Build this directory of the release (auto: the project's package "
            "directory if the sdist has one; empty: every .py file).",
        ),
    ] = "auto",
    validation: Annotated[
        str, typer.Option("--validation", help="The mount's validation mode.")
    ] = "callback",
    attr_timeout: Annotated[
        float,
        typer.Option("--attr-timeout", min=0.0, help="The mount's --attr-timeout (seconds)."),
    ] = 60.0,
    smoke: Annotated[
        bool,
        typer.Option("--smoke", help="A generated tiny project in 3 releases, no download (CI)."),
    ] = False,
    out: Annotated[
        Path,
        typer.Option("--out", help="Directory for lookaside.json and lookaside.png."),
    ] = Path("benchmarks/results/lookaside"),
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Scratch directory (default: a temporary one)."),
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option(
            "--cache-dir",
            help="Keep downloaded sdists and their trees here (default: $SHUTTLE_BENCH_CACHE, "
            "else ~/.cache/shuttle/bench-lookaside; a few releases take hundreds of MB); "
            "'' keeps them in the scratch directory, removed at the end.",
        ),
    ] = None,
) -> None:
    """Lookaside caching (the paper's Figure 6): a cold `compileall` of a project's
    current release over `shuttle mount`, with no store and with stores holding the
    current and older releases, at each bandwidth."""
    import shutil

    from shuttle.bench.lookaside import Config
    from shuttle.bench.lookaside import run as run_lookaside
    from shuttle.bench.lookaside_plots import plot, table_lines
    from shuttle.bench.lookaside_releases import RELEASES_DEFAULT

    if releases:
        chosen = [r.strip() for r in releases.split(",") if r.strip()]
    elif smoke:
        chosen = ["3", "2", "1"]
    elif project.lower() == "django":
        chosen = list(RELEASES_DEFAULT)
    else:
        raise UsageError("--releases CURRENT,ONE_BACK,... is needed for a project but django")
    config = Config(
        project=project,
        releases=chosen,
        bandwidths=[b.strip() for b in bandwidths.split(",") if b.strip()],
        runs=runs,
        target_s=target_s,
        jobs=jobs,
        tiny=smoke,
        subdir=subdir,
        validation=validation,
        attr_timeout_s=attr_timeout,
    )
    if cache_dir is not None:
        config.cache_dir = Path(cache_dir) if cache_dir else None
    console = Console()
    scratch = workdir or scratch_dir("shuttle-bench-lookaside-")
    try:
        report = run_lookaside(config, scratch, progress_lines("lookaside", console))
    finally:
        if workdir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    for line in table_lines(report):
        console.print(line, highlight=False, soft_wrap=True)
    for name, target in report["targets"].items():
        verdict = "met" if target["met"] else "NOT met"
        paper = "" if target["paper"] is None else f", paper {target['paper']}%"
        console.print(f"target {name}: ours {target['ours']}%{paper}: {verdict}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "lookaside.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "lookaside.png")
    console.print(f"report written to {out / 'lookaside.json'} and {out / 'lookaside.png'}")
