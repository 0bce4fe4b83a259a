"""The files a single-host Ceph starts from: its conf, cephx keys and keyrings, and a
free port for its mon."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import socket
import struct
import time
from pathlib import Path

from shuttle.cluster.cephclient import CLIENT_OP_TIMEOUT_S
from shuttle.errors import ExternalToolError

#: The mon's port is picked at random below the kernel's ephemeral range, so it does
#: not collide with clients' source ports; OSDs pick theirs in 6800-7300 themselves.
MON_PORTS = (10000, 30000)
#: PGs of a pool: few, so the probe writes that check it are few; enough to spread
#: objects over three OSDs.
PG_NUM = 16
ADMIN_KEYRING = "client.admin.keyring"


def new_key() -> str:
    """A fresh cephx secret, as ``ceph-authtool --gen-print-key`` prints it: a
    CryptoKey (type AES, creation time, 16 random bytes), base64."""
    now = time.time()
    blob = struct.pack("<HIIH", 1, int(now), int((now % 1) * 1e9), 16) + os.urandom(16)
    return base64.b64encode(blob).decode()


def keyring_text(entries: dict[str, tuple[str, dict[str, str]]]) -> str:
    out = []
    for name, (key, caps) in entries.items():
        out.append(f"[{name}]\n\tkey = {key}\n")
        out += [f'\tcaps {svc} = "{cap}"\n' for svc, cap in caps.items()]
    return "".join(out)


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on, outside the ephemeral range."""
    for _ in range(200):
        port = random.randrange(*MON_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ExternalToolError(f"no free port in {MON_PORTS} on 127.0.0.1 for the Ceph mon")


#: Admin sockets are Unix sockets, whose paths must fit in sun_path (108 bytes): a
#: root longer than this keeps its sockets in a short folder of its own under /tmp.
ROOT_MAX_CHARS = 60


def run_dir(root: Path) -> Path:
    """Where the daemons' admin sockets go: ROOT/run, or for a long root (pytest's
    folders, say) /tmp/shuttle-ceph-HASH, named by the root so it is the same each start."""
    if len(str(root)) <= ROOT_MAX_CHARS:
        return root / "run"
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:12]
    return Path("/tmp") / f"shuttle-ceph-{digest}"


def conf_text(
    root: Path, *, fsid: str, mon_port: int, size: int, min_size: int, osd_size_bytes: int
) -> str:
    """The ceph.conf of a single-host Ceph under ``root`` (docs/ceph.md explains each
    setting that differs from Ceph's defaults)."""
    r = root
    run = run_dir(root)
    return f"""\
# Written by shuttle.cluster.ceph for a single-host Ceph under {r}.
[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{mon_port}
mon initial members = a
public network = 127.0.0.0/8
ms bind msgr2 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = {run}
mon data = {r}/mon/$name
osd data = {r}/osd/$name
# Three OSDs on one host: each OSD is its own failure domain.
osd crush chooseleaf type = 0
osd pool default size = {size}
osd pool default min size = {min_size}
osd pool default pg num = {PG_NUM}
osd pool default pgp num = {PG_NUM}
osd pool default pg autoscale mode = off
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
# The default warns on a disk only 70% full.
mon data avail warn = 2
mon data avail crit = 1
# A killed OSD is marked down by one peer on the same host, within seconds.
mon osd reporter subtree level = osd
mon osd min down reporters = 1
osd heartbeat interval = 1
osd heartbeat grace = 6

[mon]
# Map changes (pool create, osd down) commit in a tenth of a second, not one.
paxos propose interval = 0.1
admin socket = {run}/$name.asok
log file = {r}/log/$name.log
mon cluster log file = {r}/log/cluster.log

[osd]
admin socket = {run}/$name.asok
log file = {r}/log/$name.log
keyring = {r}/osd/$name/keyring
osd objectstore = bluestore
bluestore block create = true
bluestore block size = {osd_size_bytes}
bluestore fsck on mount = false
bluestore cache autotune = false
bluestore cache size = 67108864
osd op num shards = 2
osd op num threads per shard = 1
# cls_lua (code run in the OSD) needs these, and they are read at start only.
osd class load list = *
osd class default list = *

[client]
keyring = {r}/{ADMIN_KEYRING}
# One admin socket per client process, so several clients can run at once.
admin socket = {run}/$name.$pid.$cctid.asok
rados osd op timeout = {CLIENT_OP_TIMEOUT_S}
rados mon op timeout = {CLIENT_OP_TIMEOUT_S}
client mount timeout = {CLIENT_OP_TIMEOUT_S}
"""
