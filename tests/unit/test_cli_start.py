"""``shuttle --help``, ``--version`` and every command's ``--help`` import what builds the
command tree, not what the commands run (issue 25, item 6).

A command used to start in about a second because ``import shuttle.cli`` imported the
FUSE face, the object file system, the grep application and the run-time to print
``ls --help``. Each command module now imports its machinery inside the function that
runs it. This checks it by which modules are loaded, not by a timing bound (the
machine is shared: a time limit would flake); ``benchmarks/cli_start.py`` measures the
time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import shuttle

#: Modules that building the command tree and printing help must not load: the faces,
#: the object file system and built-in objects, the applications, the run-time, the
#: client and node machinery, the store, the simulator's kernel, and the heavy
#: third-party packages they bring (numbers, data frames, crypto, TLS, event loops,
#: serialisation, hashing, progress bars).
HEAVY: tuple[str, ...] = (
    "shuttle.faces.fuse",
    "shuttle.faces.mount",
    "pyfuse3",
    "trio",
    "shuttle.objects",
    "shuttle.apps.grep",
    "shuttle.apps.dashboard",
    "shuttle.runtime.client",
    "shuttle.runtime.binding",
    "shuttle.runtime.config",
    "shuttle.client.client",
    "shuttle.client.connect",
    "shuttle.node.config",
    "shuttle.node.main",
    "shuttle.store",
    "shuttle.net.auth",
    "shuttle.net.blocking",
    "shuttle.wire",
    "shuttle.cluster.local",
    "shuttle.cluster.clusterfile",
    "shuttle.sim.kernel",
    "shuttle.sim.config",
    "numpy",
    "pandas",
    "matplotlib",
    "cryptography",
    "ssl",
    "asyncio",
    "uvloop",
    "msgpack",
    "blake3",
    "fsspec",
    "dask",
    "re2",
    "rich.progress",
    "rich.live",
)

#: Walks the whole command tree in a fresh interpreter, printing each command's help,
#: then reports the loaded modules (and any help that failed) as JSON on stdout.
WALK = """
import contextlib, io, json, sys
from shuttle.cli import build_command

root = build_command()
failed = []
walked = []

def run(args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = root.main(args=args, prog_name="shuttle", standalone_mode=False)
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue()

def walk(cmd, path):
    walked.append(" ".join(path))
    code, text = run([*path, "--help"])
    if code not in (0, None) or "Usage" not in text:
        failed.append([path, code, text[-300:]])
    for name in getattr(cmd, "list_commands", lambda ctx: [])(None):
        walk(cmd.get_command(None, name), [*path, name])

walk(root, [])
code, version = run(["--version"])
sys.__stdout__.write(json.dumps({"modules": sorted(sys.modules), "failed": failed,
                                 "version": version, "walked": walked}))
"""


def _heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_help_of_every_command_imports_nothing_heavy() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WALK], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {
        "ls",
        "cluster up",
        "bench abacus filter",
        "trace calibrate-background",  # added from above their group (shuttle.cli.ADDED)
        "trace record-object",
        "sim calibrate",
        "sim predict",
        "bench sim-predict",
    } <= set(report["walked"])
    assert report["failed"] == []
    assert report["version"].strip() == shuttle.__version__
    assert _heavy(report["modules"]) == [], "imported just to print help; import it where it runs"


@pytest.mark.parametrize("args", [["--version"], ["ls", "--help"]])
def test_the_shuttle_process_imports_nothing_heavy(args: list[str]) -> None:
    """The real entry point (``shuttle.cli:main``, as the ``shuttle`` script runs it)."""
    code = (
        "import json, sys\n"
        f"sys.argv = ['shuttle', *{args!r}]\n"
        "from shuttle.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('MODULES' + json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    modules = json.loads(done.stderr.rpartition("MODULES")[2])
    assert done.stdout.strip() != ""
    assert _heavy(modules) == []


def test_the_names_and_defaults_the_help_shows_are_their_modules() -> None:
    """The command modules write down the few names and defaults their options show
    (importing the modules that define them would import what help must not); each
    must be what its module says."""
    from shuttle.apps import cli as apps_cli
    from shuttle.apps.grep import PLACEMENTS
    from shuttle.client import cli as client_cli
    from shuttle.client.lookaside import cli as lookaside_cli
    from shuttle.client.lookaside import stores
    from shuttle.client.validation import VALIDATION_DEFAULT, VALIDATION_ENV
    from shuttle.cluster import cli as cluster_cli
    from shuttle.cluster import clusterfile, user_cli
    from shuttle.faces import cli as faces_cli
    from shuttle.faces import fuse
    from shuttle.net import auth, tls
    from shuttle.node import cli as node_cli
    from shuttle.node import config as node_config
    from shuttle.objects import grep as grep_object
    from shuttle.objects import lines

    assert client_cli.CLUSTER_ENV == cluster_cli.CLUSTER_ENV == clusterfile.CLUSTER_ENV
    assert client_cli.KEY_FILE_ENV == user_cli.KEY_FILE_ENV == auth.KEY_FILE_ENV
    assert (client_cli.TLS_ENV, client_cli.CA_FILE_ENV) == (tls.TLS_ENV, tls.CA_FILE_ENV)
    assert cluster_cli.CLUSTER_FILE_NAME == clusterfile.CLUSTER_FILE_NAME
    assert cluster_cli.DEFAULT_ROOT == clusterfile.DEFAULT_ROOT
    assert apps_cli.PLACEMENTS == PLACEMENTS
    assert apps_cli.BLOCK_BYTES_DEFAULT == lines.BLOCK_BYTES_DEFAULT
    assert apps_cli.BATCH_BYTES_DEFAULT == grep_object.BATCH_BYTES_DEFAULT
    assert (faces_cli.VALIDATION_DEFAULT, faces_cli.VALIDATION_ENV) == (
        VALIDATION_DEFAULT,
        VALIDATION_ENV,
    )
    assert faces_cli.ATTR_TIMEOUT_S_DEFAULT == fuse.ATTR_TIMEOUT_S_DEFAULT
    assert faces_cli.DIR_TIMEOUT_S_DEFAULT == fuse.DIR_TIMEOUT_S_DEFAULT
    assert node_cli.CACHE_BYTES_DEFAULT == node_config.CACHE_BYTES_DEFAULT
    assert node_cli.CACHE_BLOCK_BYTES_DEFAULT == node_config.CACHE_BLOCK_BYTES_DEFAULT
    assert lookaside_cli.HOME_ENV == stores.HOME_ENV
    assert lookaside_cli.LOOKASIDE_ENV == stores.LOOKASIDE_ENV


def test_the_lazy_packages_still_give_their_names() -> None:
    """``shuttle.client``, ``shuttle.sim``, ``shuttle.traces``, ``shuttle.cluster`` and
    ``shuttle.client.lookaside`` import their names on first use; ``connect`` stays
    the function even once its module is imported."""
    code = (
        "import shuttle.client.connect\n"
        "import shuttle, shuttle.client as c\n"
        "from shuttle.client import connect, Client, ObjectInfo\n"
        "from shuttle.sim import Kernel\n"
        "from shuttle.traces import TraceRecord\n"
        "from shuttle.cluster import ClusterFile\n"
        "from shuttle.client.lookaside import StoreSet, LookasideReader\n"
        "assert callable(connect) and not isinstance(connect, type(shuttle))\n"
        "assert c.connect is connect is shuttle.connect\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
