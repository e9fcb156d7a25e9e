"""The box's seccomp filter (bwrap `--seccomp FD`): a short denylist of system calls a task's
commands never need and an attacker inside wants.

Denied with EPERM: ptrace and cross-process memory access (the agent could otherwise stop the
box's pid 1, bwrap's init, and hang the command until its timeout), new namespaces of any kind
through `unshare`, `setns` or `clone` flags (bwrap's `--disable-userns` closes user namespaces
too), mounts and the new mount API, kernel keyrings, BPF, perf events, userfaultfd, io_uring,
module and kexec loading, `open_by_handle_at`, swap, reboot, `syslog`, `acct`, and the TIOCSTI
ioctl (faking terminal input; the box's new session already makes it useless), `modify_ldt`,
fanotify, `memfd_secret`, Landlock, `statmount`/`listmount`/`open_tree_attr`, and `socket` of
the AF_VSOCK family. `clone3` gets
ENOSYS: its flags live behind a pointer a filter cannot read, so libc falls back to `clone`,
whose flags are checked. Foreign architectures (i386 and x32 entry points) are refused
outright, so the numbers below cannot be dodged.

Written for x86_64 only (`filter_program` returns None elsewhere and the manifest says so).
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06

DENIED = {  # x86_64 numbers
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "syslog": 103,
    "pivot_root": 155, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
    "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442,
    # issue 34's gaps: the LDT (old segment tricks), fanotify (watching the host's files),
    # secret memory, Landlock (a sandbox the box did not make), the newer mount calls
    "modify_ldt": 154, "fanotify_init": 300, "landlock_create_ruleset": 444,
    "landlock_add_rule": 445, "landlock_restrict_self": 446, "memfd_secret": 447,
    "statmount": 457, "listmount": 458, "open_tree_attr": 467,
}
CLONE, CLONE3, IOCTL, SOCKET = 56, 435, 16, 41
AF_VSOCK = 40  # sockets to the hypervisor or other VMs: a way out the network namespace misses
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
TIOCSTI = 0x5412
NR, ARCH, ARG0_LOW, ARG1_LOW = 0, 4, 16, 24  # offsets in struct seccomp_data


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def filter_program() -> bytes | None:
    """The classic-BPF program bwrap loads, or None on an architecture it is not written for."""
    if platform.machine() != "x86_64":
        return None
    deny, allow = RET_ERRNO | errno.EPERM, RET_ALLOW
    checks = sorted(DENIED.values())
    # Layout (jumps count the instructions skipped): arch check, nr load, x32 check, one JEQ per
    # denied number and three for the argument checks, ALLOW, then the return blocks.
    body: list[tuple[int, int, str | None, str | None]] = []  # code, k, true label, false label
    body.append((LD_ABS_W, ARCH, None, None))
    body.append((JEQ, AUDIT_ARCH_X86_64, None, "deny"))
    body.append((LD_ABS_W, NR, None, None))
    body.append((JGE, X32_BIT, "deny", None))
    body += [(JEQ, nr, "deny", None) for nr in checks]
    body.append((JEQ, CLONE3, "nosys", None))
    body.append((JEQ, CLONE, "clone", None))
    body.append((JEQ, IOCTL, "ioctl", None))
    body.append((JEQ, SOCKET, "socket", None))
    body.append((RET, allow, None, None))
    labels: dict[str, int] = {}
    tail: list[tuple[int, int, str | None, str | None]] = []
    for name, block in (  # BPF jumps go forward only: "deny" comes last
            ("clone", [(LD_ABS_W, ARG0_LOW, None, None), (JSET, CLONE_NAMESPACES, "deny", None),
                       (RET, allow, None, None)]),
            ("ioctl", [(LD_ABS_W, ARG1_LOW, None, None), (JEQ, TIOCSTI, "deny", None),
                       (RET, allow, None, None)]),
            ("socket", [(LD_ABS_W, ARG0_LOW, None, None), (JEQ, AF_VSOCK, "deny", None),
                        (RET, allow, None, None)]),
            ("nosys", [(RET, RET_ERRNO | errno.ENOSYS, None, None)]),
            ("deny", [(RET, deny, None, None)])):
        labels[name] = len(body) + len(tail)
        tail += block
    program = b""
    for index, (code, k, true, false) in enumerate([*body, *tail]):
        jt = labels[true] - index - 1 if true else 0
        jf = labels[false] - index - 1 if false else 0
        assert 0 <= jt < 256 and 0 <= jf < 256, "seccomp jump out of range"
        program += _insn(code, k, jt, jf)
    return program


def describe() -> dict[str, object]:
    """What the manifest records of the filter."""
    if platform.machine() != "x86_64":
        return {"seccomp": None, "why": f"the filter is written for x86_64, not "
                                       f"{platform.machine()}"}
    return {"seccomp": "denylist", "denied": sorted([*DENIED, "clone3 (ENOSYS)",
                                                     "clone with namespace flags",
                                                     "ioctl TIOCSTI", "socket AF_VSOCK"])}
