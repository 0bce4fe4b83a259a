#!/usr/bin/env bash
# Install a local Ceph for Shuttle's tests and demo (docs/ceph.md): the Debian packages
# of the mon, the OSD and the `ceph` command, and Debian's `rados` Python module linked
# into the project's virtualenv (.venv; there is no usable binding on PyPI).
#
#   scripts/setup-ceph.sh      (scripts/setup.sh --ceph and --dev run it)
#
# Idempotent and quick on a second run. Tested with Debian 12's packages, all at
# 16.2.15+ds-0+deb12u2 (Pacific): ceph-mon ceph-osd ceph-common python3-rados.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(ceph-mon ceph-osd ceph-common python3-rados)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "setup-ceph: installing Debian packages: ${missing[*]} (about 230 MB)"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    # The Ceph packages are in Debian's main archive; update only if apt cannot find them.
    if ! "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
        "${sudo_cmd[@]}" apt-get update -qq
        "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
fi

if [[ ! -x .venv/bin/python ]]; then
    echo "setup-ceph: no virtualenv in .venv; run scripts/setup.sh first" >&2
    exit 1
fi
# Debian builds the module for its own Python (3.11 on Debian 12); it loads in a
# virtualenv of the same minor version only.
so=$(dpkg -L python3-rados | grep -E '/rados\.cpython-[0-9]+-.*\.so$' | head -n1)
venv_tag=$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
if [[ -z $so || $so != *"cpython-$venv_tag-"* ]]; then
    echo "setup-ceph: Debian's rados module is ${so:-missing}, built for another Python than" \
        "the virtualenv's ($(.venv/bin/python --version)); make .venv with python3.11" \
        "(PYTHON=python3.11 scripts/setup.sh after removing .venv)" >&2
    exit 1
fi
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
ln -sfn "$so" "$site/$(basename "$so")"
if ! err=$(.venv/bin/python -c 'import rados' 2>&1); then
    echo "setup-ceph: the rados module does not load in .venv: $err" >&2
    exit 1
fi
echo "setup-ceph: ready: $(dpkg-query -W -f='${Version}' ceph-osd) ceph-mon/ceph-osd, rados in .venv"
