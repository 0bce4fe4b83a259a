#!/usr/bin/env bash
# Set up Shuttle on a fresh Debian 12 machine: system packages, a virtualenv in
# .venv, and the pinned Python dependencies from the lock files.
#
#   scripts/setup.sh          runtime only (requirements.lock)
#   scripts/setup.sh --dev    runtime + test and lint tools (requirements-dev.lock),
#                             and a local Ceph (scripts/setup-ceph.sh: the tests need it)
#   scripts/setup.sh --ceph   runtime + a local Ceph (`shuttle cluster up --ceph`)
#
# Idempotent and quick on a second run: it skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=runtime
ceph=no
for arg in "$@"; do
    case $arg in
        --dev) profile=dev ceph=yes ;;
        --ceph) ceph=yes ;;
        *) echo "setup: unknown option $arg (use --dev or --ceph)" >&2; exit 2 ;;
    esac
done

# System packages the project uses: redis-server (the netrand benchmark's anchor),
# tre-agrep and strace (the simulator's recorded mobile application), iproute2
# (tc/ip for kernel-shaped links), python3-venv (Debian splits venv out); fuse3
# (fusermount3, for `shuttle mount`) and what pip needs to build pyfuse3 from its
# sdist: libfuse3-dev, pkg-config, gcc and python3-dev (Python's headers), which
# also compile Shuttle's hot modules (scripts/build_compiled.py, below).
apt_packages=(redis-server tre-agrep strace iproute2 python3-venv fuse3 libfuse3-dev pkg-config gcc python3-dev)
# The tests also need rsync (the mount keeps the mtimes rsync -t sets; `shuttle bench
# lookaside` compares its matching with rsync's) and Debian's chromium (the dashboard's
# page is tested in it, headless, through Playwright: no browser is ever downloaded).
[[ $profile == dev ]] && apt_packages+=(rsync chromium)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: Shuttle needs Python 3.11 or newer; $python is $("$python" --version 2>&1)." >&2
    echo "setup: install python3.11 or set PYTHON=/path/to/python3.11 and run again." >&2
    exit 1
fi

if [[ ! -x .venv/bin/python ]]; then
    echo "setup: creating .venv with $("$python" --version)"
    "$python" -m venv .venv
fi

lock=requirements.lock
[[ $profile == dev ]] && lock=requirements-dev.lock
stamp=.venv/.shuttle-$profile-$(sha256sum "$lock" pyproject.toml | sha256sum | cut -c1-16)
if [[ ! -f $stamp ]]; then
    echo "setup: installing pinned dependencies from $lock"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q --require-hashes -r "$lock"
    .venv/bin/python -m pip install -q --no-deps -e .
    rm -f .venv/.shuttle-"$profile"-*
    touch "$stamp"
fi
# Compile the hot modules with mypyc (gcc and python3-dev above): a hash check when
# nothing changed, a rebuild when a compiled module's source did (src/shuttle/compiled.py).
# SHUTTLE_PURE=1 skips it: Shuttle then runs its pure Python modules, as it does
# (slower, and the tests' build check fails) when the build fails.
if [[ ${SHUTTLE_PURE:-0} == 0 ]] && ! .venv/bin/python scripts/build_compiled.py; then
    echo "setup: compiling the hot modules failed (above); Shuttle will run its pure" >&2
    echo "setup: Python modules. Fix the error and run setup again." >&2
fi
[[ $ceph == yes ]] && scripts/setup-ceph.sh
echo "setup: ready ($profile); the shuttle command is .venv/bin/shuttle"
