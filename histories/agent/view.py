"""What a bwrap box sees of the system: an allowlist, not the host's `/` minus a list.

The box's root is an empty tmpfs (bwrap's own), made read-only once everything is mounted. Into
it go, read-only, exactly what the task's interpreter and tools need: `/usr` (the system
`python3` and `git` the tasks run, their libraries, `/usr/local`), the merged-/usr links (`/bin`,
`/lib*`, `/sbin`: symlinks where the host has symlinks, read-only binds otherwise), and from
`/etc` only the loader's cache and `/etc/alternatives` (symlinks into /usr), plus a `passwd` and
a `group` written for the box (root, the command's uid, nobody). Writable: the workspace (a
bind), `/tmp` and `/dev/shm` (sized tmpfs mounts). A fresh `/dev` (null, zero, random, tty...)
made read-only, and a `/proc` of the box's own PID namespace.

Nothing else exists inside: no /run, /var, /opt, /srv, /home, /root, no checkout, no caches,
so no host unix socket under those paths can be connected to and no file planted there can be
read.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_TREES = ("/usr",)  # read-only binds: the interpreter, git, coreutils and their libraries
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/alternatives")


def _identity(uid: int, gid: int) -> tuple[bytes, bytes]:
    """The box's /etc/passwd and /etc/group: git and `id` name the command's user."""
    passwd = (f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
              f"agent:x:{uid}:{gid}:agent:/nonexistent:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    group = f"root:x:0:\nagent:x:{gid}:\nnogroup:x:65534:\n"
    return passwd.encode(), group.encode()


def data_fd(content: bytes) -> int:
    """A memory file holding `content`, read from the start (bwrap's --ro-bind-data)."""
    fd = os.memfd_create("compbench-view", 0)
    os.write(fd, content)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def system_view(*, uid: int, gid: int, tmp_bytes: int, shm_bytes: int
                ) -> tuple[list[str], list[int]]:
    """bwrap arguments that build the read-only allowlist view (before the workspace bind), and
    the file descriptors they read (the caller passes them to bwrap, then closes them)."""
    args: list[str] = []
    for tree in SYSTEM_TREES:
        if Path(tree).is_dir():
            args += ["--ro-bind", tree, tree]
    for top in TOP_LINKS:
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        if Path(name).exists():
            args += ["--ro-bind", name, name]
    fds = [data_fd(content) for content in _identity(uid, gid)]
    args += ["--perms", "0644", "--ro-bind-data", str(fds[0]), "/etc/passwd",
             "--perms", "0644", "--ro-bind-data", str(fds[1]), "/etc/group",
             "--dev", "/dev", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
             "--proc", "/proc", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    return args, fds


def seal() -> list[str]:
    """After the workspace bind: the box's root and /dev become read-only (the writable places
    are the workspace, /tmp and /dev/shm, each a mount of its own)."""
    return ["--remount-ro", "/dev", "--remount-ro", "/"]
