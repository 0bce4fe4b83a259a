"""``shuttle bench abacus ...``: the group of ABACUS's experiments as commands (and
``mix``: placement for aggregate throughput under many clients, after Bhardwaj et al.,
ATC 2020).

Each prints a table, writes JSON with ``--json-out FILE`` and a PNG with ``--plot FILE``
(default: beside the JSON), and records its settings in the JSON. The commands are
declared by family: the synthetic filter (``abacus_filter_cli``: ``filter``,
``competition``, ``swing``), the object-based file system (``objectfs_cli``: ``cache``,
``phases``, ``raid``, ``directory``) and many clients (``mix_cli``: ``mix``), with the
options and output they share in ``abacus_options``. This module makes the group and
registers them, in the order ``--help`` lists them.
"""

from __future__ import annotations

import typer

from shuttle.bench import abacus_filter_cli, mix_cli, objectfs_cli

app = typer.Typer(
    help="ABACUS's experiments on the live system (6.2 RAID, 6.3 filter, 6.4 cache, "
    "6.5 directory, 6.6 phases, 6.7 competition, swinging conditions, and a mix of cheap "
    "and CPU-heavy functions from many clients), each statically at the client, adaptive, "
    "and at the server.",
    no_args_is_help=True,
)

app.command("filter")(abacus_filter_cli.filter_)
app.command("competition")(abacus_filter_cli.competition)
app.command("swing")(abacus_filter_cli.swing)
app.command("cache")(objectfs_cli.cache)
app.command("phases")(objectfs_cli.phases)
app.command("raid")(objectfs_cli.raid)
app.command("directory")(objectfs_cli.directory)
app.command("mix")(mix_cli.mix)
