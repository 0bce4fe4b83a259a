"""What ``shuttle bench abacus mix`` takes: its settings (every flag), the placements
a run makes and the kinds of function its clients call, and the checks that refuse a
run that cannot mean anything, saying which setting and why. The benchmark itself is
:mod:`shuttle.bench.mix`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shuttle.bench.node_profile import RATE_DEFAULT, py_spy_path
from shuttle.errors import ConfigError
from shuttle.net.profiles import parse_link_profile

#: The placements, in the order each run makes them. ``split`` is an oracle, not a
#: policy: it knows the kinds and puts every cheap filter at the node and every heavy
#: one at its client, the placement the adaptive run-time should find when the node
#: has the CPU for every cheap filter. ``split-K`` (``--partial K``, between ``split``
#: and ``adaptive``) puts only the first K clients' cheap filters at the node: when
#: the node saturates, all of them is not the best placement, and the best of the
#: splits a run makes is the ceiling adaptive is read against.
PLACEMENTS = ("client", "server", "split", "adaptive")
#: Prefix of the partial splits' placement names (``split-4``: four cheap filters at
#: the node).
PARTIAL_PREFIX = "split-"
#: Between K and J in a partial split with heavy filters at the node too
#: (``split-32+h4``: the first 32 clients' cheap filters and the first 4 clients'
#: heavy ones; ``--partial-heavy 32:4``): whether any placement but the cheap-at-node
#: splits does better when the clients' core is the bound and the node's is not full.
HEAVY_MARK = "+h"
#: The two kinds of function every client calls.
KINDS = ("cheap", "heavy")
#: More client processes than this measure the machine's process table, not placement.
CLIENTS_MAX = 256
#: Nodes the benchmark can spread the objects over (the issue asks for 1-3).
NODES_MAX = 3
#: The LAN profile's 10 Mbit/s and 0.5 ms with a 64 KiB token bucket: the default bucket
#: (1 ms of traffic, 1.25 KB) wakes a client's shaper 210 times per 256 KiB block, and
#: 16 to 64 clients sharing one core spent it on that (at 16 clients the client-side
#: CPU, not the links, bounded every placement). The rate is the same.
LINK_DEFAULT = "bw=10Mbit,lat=0.5ms,burst=64KiB"


@dataclass
class MixSettings:
    """Everything ``shuttle bench abacus mix`` takes as a flag."""

    clients: int = 16
    cheap_share: float = 0.5
    nodes: int = 1
    link: str = LINK_DEFAULT
    runs: int = 3
    duration_s: float = 20.0
    warmup_s: float = 8.0
    window_s: float = 1.0
    threshold: float = 0.3
    #: The nodes scale each stack's B_thresh by its share of its client's time
    #: (``shuttle serve --threshold-share``; docs/runtime.md, "Many clients").
    threshold_share: bool = False
    block_bytes: int = 256 << 10
    object_bytes: int = 8 << 20
    cheap_pass: float = 0.05
    cheap_cpu_s_per_mb: float = 0.0002
    heavy_pass: float = 1.0
    heavy_cpu_s_per_mb: float = 0.008
    node_cpu_factor: float = 0.05
    seed: int = 1
    client_cpu: int | None = None
    node_cpu: int | None = None
    #: The node on one CPU and the clients on another (``--client-cpu``,
    #: ``--node-cpu``; by default the lowest and highest this process may use): the
    #: emulation of separate machines. False (``--no-pin``): the scheduler puts both
    #: anywhere, and the clients can take the node's CPU.
    pin: bool = True
    #: Where to copy the nodes' decision logs of every adaptive pass (None: nowhere).
    logs_dir: Path | None = None
    #: Also run the oracle ``split`` placement (:data:`PLACEMENTS`) in every run.
    split: bool = True
    #: Partial splits to run too: for each K, the first K clients' cheap filters at
    #: the node and every other filter at its client (``split-K``).
    partial: tuple[int, ...] = ()
    #: Partial splits with heavy filters at the node too: for each (K, J), the first K
    #: clients' cheap filters and the first J clients' heavy ones (``split-K+hJ``).
    partial_heavy: tuple[tuple[int, int], ...] = ()
    #: The nodes' limit on stacks on their way to them and not yet observed
    #: (``shuttle serve --arrivals-max``; None: the node's default).
    arrivals_max: int | None = None
    #: The same while the clients are saturated (``shuttle serve
    #: --arrivals-max-saturated``; None: the node's default).
    arrivals_max_saturated: int | None = None
    #: The node's CPU budget for arrivals (``shuttle serve --cpu-budget``; None: its
    #: default).
    cpu_budget: float | None = None
    #: The share arrivals may fill while the clients are saturated (``shuttle serve
    #: --cpu-budget-saturated``; None: its default; the budget: no raise).
    cpu_budget_saturated: float | None = None
    #: The node climbs its admission edge from the budget on the clients' measured
    #: calls a second (``shuttle serve --cpu-climb``).
    cpu_climb: bool = False
    #: The node holds its raised share while it is the bound (``shuttle serve
    #: --raise-hold``; False: ``--no-raise-hold``, the rule as it was).
    raise_hold: bool = True
    #: The node ranks arrivals by what they save per node CPU second (``shuttle serve
    #: --rank-by-node-cpu``; False: the paper's order, as it was).
    rank_by_node_cpu: bool = True
    #: The node sends back for its CPU only stacks whose leaving frees it (``shuttle
    #: serve --shed-by-freed-cpu``; False: any hosted stack, as it was).
    shed_by_freed_cpu: bool = True

    #: The nodes keep their decision logs in memory as JSON lines (``shuttle serve
    #: --log-as-text``; False: as dicts, as before).
    log_as_text: bool = True
    #: The nodes' full collections on a thread every this many seconds (``shuttle
    #: serve --scheduled-gc``; 0: the interpreter's own; None: the node's default).
    scheduled_gc_s: float | None = None
    #: Where to write a py-spy trace of each node in each adaptive pass and its summary
    #: (``--profile-node``; None: no profile), and py-spy's samples a second.
    profile_dir: Path | None = None
    profile_rate: int = RATE_DEFAULT
    #: py-spy with the C frames too (``--profile-native``: it stops the node per sample).
    profile_native: bool = False
    #: Only the thread holding the GIL (``--profile-gil``).
    profile_gil: bool = False

    def placements(self) -> tuple[str, ...]:
        """The placements each run makes, in order: the uniform ones, the splits
        (every cheap filter at the node, then the partial ones), adaptive."""
        fixed = tuple(p for p in PLACEMENTS[:-1] if self.split or p != "split")
        partial = tuple(f"{PARTIAL_PREFIX}{k}" for k in self.partial)
        heavy = tuple(f"{PARTIAL_PREFIX}{k}{HEAVY_MARK}{j}" for k, j in self.partial_heavy)
        return (*fixed, *partial, *heavy, PLACEMENTS[-1])

    def check(self) -> None:
        """Refuse settings that cannot make a meaningful run, saying which and why."""
        if not 1 <= self.clients <= CLIENTS_MAX:
            raise ConfigError(f"--clients must be 1..{CLIENTS_MAX}, got {self.clients}")
        if not 0.0 <= self.cheap_share <= 1.0:
            raise ConfigError(
                f"--cheap-share is the fraction of calls that are cheap, 0..1; "
                f"got {self.cheap_share!r}"
            )
        if not 1 <= self.nodes <= NODES_MAX:
            raise ConfigError(f"--nodes must be 1..{NODES_MAX}, got {self.nodes}")
        if self.profile_dir is not None:
            py_spy_path()  # before any pass: says how to install it if it is missing
        if not 0.0 <= self.warmup_s < self.duration_s:
            raise ConfigError(
                f"--warmup ({self.warmup_s:g} s) must be ≥ 0 and shorter than --duration "
                f"({self.duration_s:g} s): the steady state is measured after it"
            )
        for name, value in (("--cheap-pass", self.cheap_pass), ("--heavy-pass", self.heavy_pass)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} is a fraction of each block, 0..1; got {value!r}")
        if self.block_bytes > self.object_bytes:
            raise ConfigError(
                f"--block-bytes ({self.block_bytes}) is larger than --object-bytes "
                f"({self.object_bytes}); make the object at least one block"
            )
        parse_link_profile(self.link)
        for k in self.partial:
            if not 1 <= k < self.clients:
                raise ConfigError(
                    f"--partial {k}: a partial split puts K of the {self.clients} clients' "
                    f"cheap filters at the node, so K must be 1..{self.clients - 1} "
                    "(0 is the all-at-client placement, every one the split)"
                )
        for k, j in self.partial_heavy:
            if not (0 <= k <= self.clients and 1 <= j < self.clients):
                raise ConfigError(
                    f"--partial-heavy {k}:{j}: K cheap and J heavy filters of the "
                    f"{self.clients} clients at the node, so K must be 0..{self.clients} "
                    f"and J 1..{self.clients - 1} (J = 0 is --partial K)"
                )
        if len(set(self.partial_heavy)) != len(self.partial_heavy):
            raise ConfigError(f"--partial-heavy lists a K:J twice: {list(self.partial_heavy)}")
        if self.cpu_budget is not None and not 0 < self.cpu_budget <= 1:
            raise ConfigError(f"--cpu-budget must be in (0, 1], got {self.cpu_budget}")
        if self.cpu_budget_saturated is not None and not 0 < self.cpu_budget_saturated <= 1:
            raise ConfigError(
                f"--cpu-budget-saturated must be in (0, 1], got {self.cpu_budget_saturated}"
            )
        if self.arrivals_max is not None and self.arrivals_max < 0:
            raise ConfigError(f"--arrivals-max must be ≥ 0 (0: no limit), got {self.arrivals_max}")
        if self.arrivals_max_saturated is not None and self.arrivals_max_saturated < 0:
            raise ConfigError(
                f"--arrivals-max-saturated must be ≥ 0, got {self.arrivals_max_saturated}"
            )
        self._check_cpus()
        if len(set(self.partial)) != len(self.partial):
            raise ConfigError(f"--partial lists a K twice: {list(self.partial)}")

    def _check_cpus(self) -> None:
        chosen = [
            (n, c)
            for n, c in (("--client-cpu", self.client_cpu), ("--node-cpu", self.node_cpu))
            if c is not None
        ]
        if not self.pin:
            if chosen:
                raise ConfigError(
                    f"{chosen[0][0]} {chosen[0][1]} with --no-pin: --no-pin leaves the node "
                    "and the clients to the scheduler; drop one of the two"
                )
            return
        usable = sorted(os.sched_getaffinity(0))
        for name, cpu in chosen:
            if cpu not in usable:
                raise ConfigError(
                    f"{name} {cpu}: this process may use CPUs {usable}; pick one of them"
                )
        # As bench_node chooses them: the lowest usable for the clients, the highest
        # for the node, where not given (one usable CPU: nothing to separate).
        client = usable[0] if self.client_cpu is None else self.client_cpu
        node = usable[-1] if self.node_cpu is None else self.node_cpu
        if len(usable) > 1 and client == node:
            raise ConfigError(
                f"the clients and the node would both run on CPU {client} (--client-cpu "
                f"{self.client_cpu}, --node-cpu {self.node_cpu}; by default the lowest and "
                "the highest usable): that is not separate machines; give them different "
                "CPUs, or --no-pin to leave both to the scheduler"
            )


def parse_partial(text: str) -> tuple[int, ...]:
    """``--partial``'s value, ``"4,8,12"``, as (4, 8, 12); :class:`ConfigError` says
    what is wrong with anything else."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise ConfigError(
                f"--partial takes the numbers of cheap filters to put at the node, "
                f"comma-separated (e.g. 4,8,12); {part!r} is not a whole number"
            ) from None
    return tuple(out)


def parse_partial_heavy(text: str) -> tuple[tuple[int, int], ...]:
    """``--partial-heavy``'s value, ``"32:2,32:4"``, as ((32, 2), (32, 4));
    :class:`ConfigError` says what is wrong with anything else."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        k, sep, j = part.partition(":")
        if not (sep and k.strip().isdigit() and j.strip().isdigit()):
            raise ConfigError(
                f"--partial-heavy takes K:J pairs, comma-separated (e.g. 32:2,32:4: the "
                f"first K clients' cheap filters and the first J clients' heavy ones at "
                f"the node); {part!r} is not one"
            )
        out.append((int(k), int(j)))
    return tuple(out)
