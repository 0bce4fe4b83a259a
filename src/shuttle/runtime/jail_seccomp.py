"""The jail's seccomp filter: the system calls a shipped object may not make.

Loaded by the jailed worker itself (:mod:`shuttle.runtime.jail_enter`) after it has
dropped to its unprivileged uid and set ``no_new_privs``, before it loads any shipped
code; the filter then holds for every process the object starts (a filter is
inherited across fork and exec and cannot be removed).

It is a deny list over an allowed default, not an allow list: shipped code is
arbitrary Python with arbitrary C extensions, and an allow list that misses one
call an extension needs breaks objects at random. What it refuses are the calls
that reach *outside* the jail or change what the jail is:

* other processes' memory and execution: ``ptrace``, ``process_vm_readv/writev``,
  ``kcmp``, ``pidfd_getfd``, ``process_madvise``;
* the mount table and namespaces (a way back out): ``mount``, ``umount2``,
  ``pivot_root``, ``chroot``, the new mount API, ``unshare``, ``setns``, and
  ``clone`` with any ``CLONE_NEW*`` flag (``clone3``, whose flags sit in memory a
  filter cannot read, answers ``ENOSYS`` so the C library falls back to ``clone``);
* the kernel's own surfaces: ``bpf``, ``perf_event_open``, ``keyctl`` and the key
  calls, ``userfaultfd``, ``io_uring_*`` (its requests bypass this filter), modules,
  ``kexec``, ``reboot``, swap, clocks, ``syslog``, ``acct``, ``quotactl``, file
  handles (``open_by_handle_at`` reads files by inode, past the mount table);
* networks other than Unix sockets: ``socket`` and ``socketpair`` of any family but
  ``AF_UNIX`` (the jail's network namespace has only loopback anyway; this makes
  "connect out" fail at once, with ``EPERM``).

Signals need no rule: the jail's pid namespace holds no process of the node's to
name, and the worker starts a session of its own, so ``kill(0, ...)`` and
``kill(-1, ...)`` reach only the jail's processes. A refused call fails with
``EPERM`` (``ENOSYS`` for ``clone3``); an x32 or i386 system call kills the caller
(libseccomp's default for a foreign architecture).
"""

from __future__ import annotations

import errno
import socket
from typing import Any

#: Calls refused with EPERM, whatever their arguments.
REFUSED = (
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    # mounts and namespaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    # the kernel
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "fanotify_init",
    "vhangup",
    "sethostname",
    "setdomainname",
)

#: ``CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
#: CLONE_NEWPID | CLONE_NEWNET`` and ``CLONE_NEWTIME``: a clone with any of them makes
#: a namespace, which the jail must not.
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_FLAGS |= 0x20000000 | 0x40000000 | 0x00000080


def load_filter() -> None:
    """Load the filter into this process (inherited by every process it starts).

    Needs ``no_new_privs`` (or ``CAP_SYS_ADMIN``). ``OSError`` if libseccomp is
    missing or the kernel refuses the filter; the caller reports what is missing."""
    build_filter().load()


def build_filter() -> Any:
    """The filter as libseccomp holds it before loading (a ``pyseccomp.SyscallFilter``:
    its ``export_pfc`` prints the rules, which is how the tests read the policy);
    ``OSError`` if libseccomp is missing."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # pyseccomp loads libseccomp.so.2 with ctypes
        raise OSError(
            errno.ENOSYS, f"libseccomp could not be loaded ({exc}); install libseccomp2"
        ) from None
    refuse = seccomp.ERRNO(errno.EPERM)
    arg_masked = seccomp.MASKED_EQ
    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in REFUSED:
        try:
            flt.add_rule(refuse, name)
        except (OSError, ValueError):
            # A call this kernel's headers (as libseccomp knows them) do not have:
            # nothing to refuse.
            continue
    flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    # clone(flags, ...): refused when any namespace flag is set.
    for bit in _bits(CLONE_NEW_FLAGS):
        flt.add_rule(refuse, "clone", seccomp.Arg(0, arg_masked, bit, bit))
    # socket(domain, ...) and socketpair(domain, ...): Unix sockets only.
    for call in ("socket", "socketpair"):
        flt.add_rule(refuse, call, seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    return flt


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
