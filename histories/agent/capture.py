"""Patch capture the agent cannot steer: the workspace read from the host side, compared with
the pristine copy taken before the agent acted, by a git repository of the suite's own.

The agent's `.git` (its config, hooks, fsmonitor, filters, `diff.external`, index flags such as
skip-worktree, `info/exclude`) is never read: the suite keeps a bare repository in a private
folder the box cannot see, with an empty configuration (GIT_CONFIG_NOSYSTEM=1,
GIT_CONFIG_GLOBAL=/dev/null, no hooks, no fsmonitor). Every file is hashed as it is, with
`hash-object --no-filters` (no clean filter, no `ident`, no end-of-line conversion, whatever a
`.gitattributes` says), `.gitignore` files have no say (the tree is walked in Python), symbolic
links are recorded as links and never followed, and the diff of two trees runs in the bare
repository with `--no-ext-diff --no-textconv --binary`, so the agent's `.gitattributes` cannot
hide a change (at most it shows as a binary patch, content included). git's stderr is kept
apart from the patch. Nothing of the agent's runs here: its processes died with their command
(PID namespace), and no git hook or filter is configured.

Left out of both trees: `.git` folders (any depth) and `__pycache__` folders.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import walk

SKIPPED_DIRS = (".git", "__pycache__")
GIT_TIMEOUT_S = 120


class CaptureError(SuiteError):
    """The suite's own git could not read the workspace."""


class Snapshots:
    """A private bare repository holding the pristine tree; `diff(path)` is the patch."""

    def __init__(self, max_bytes: int = 128 * 2**20) -> None:
        # the apparent size of all files a capture may read: a sparse file costs nothing on
        # disk but git reads (and tmpfs faults in) every byte of it, and random data makes a
        # patch of 1.35 characters a byte in the suite's memory
        self.max_bytes = max_bytes
        self.gitdir = Path(tempfile.mkdtemp(prefix="compbench-capture-"))  # mode 700
        self._git("init", "-q", "--bare", str(self.gitdir))
        self.base: str | None = None

    def _git(self, *args: str, stdin: bytes | None = None, index: Path | None = None) -> bytes:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.gitdir), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
               "GIT_DIR": str(self.gitdir), "LC_ALL": "C"}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        done = subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c",
                               "core.fsmonitor=false", "-c", "core.bare=true", *args],
                              input=stdin, capture_output=True, timeout=GIT_TIMEOUT_S,
                              cwd=self.gitdir, env=env, check=False, start_new_session=True)
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CaptureError(f"patch capture: git {args[0]} failed ({done.returncode}): "
                               f"{why[-1] if why else 'no message'}; the suite's own repository "
                               f"is {self.gitdir}")
        return done.stdout

    def tree(self, root: Path) -> str:
        """The tree id of `root` as it is on disk (modes, links, bytes)."""
        entries: list[tuple[str, str, bytes]] = []  # mode, path, content (links: target)
        files: list[tuple[str, str]] = []
        total = 0
        for folder, dirs, names in walk(root):  # never follows links; any depth
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
            for name in names:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root)
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    entries.append(("120000", relative, os.fsencode(os.readlink(path))))
                elif stat.S_ISREG(info.st_mode):  # fifos, sockets and devices are left out
                    files.append(("100755" if info.st_mode & 0o111 else "100644", relative))
                    total += info.st_size
                    if total > self.max_bytes:
                        raise CaptureError(
                            f"patch capture: the workspace's files add up to more than "
                            f"{self.max_bytes // 2**20} MiB (apparent size, sparse files "
                            f"counted whole; {relative!r} passed it): the patch is not taken")
        lines = b""
        plain = [(mode, p) for mode, p in files if "\n" not in p]
        if plain:
            # names as the file system holds them: a name that is not UTF-8 (caf\xe9.txt) is
            # a surrogate-escaped str here, and only os.fsencode gives its bytes back
            paths = b"".join(os.fsencode(os.path.join(root, p)) + b"\n" for _, p in plain)
            ids = self._git("hash-object", "-w", "--no-filters", "--stdin-paths",
                            stdin=paths).decode().split()
            lines += b"".join(f"{mode} {oid}\t".encode() + os.fsencode(p) + b"\0"
                              for (mode, p), oid in zip(plain, ids, strict=True))
        for mode, p in files:  # a name with a newline cannot go through --stdin-paths
            if "\n" in p:
                entries.append((mode, p, Path(root, p).read_bytes()))
        for mode, relative, target in entries:
            oid = self._git("hash-object", "-w", "--no-filters", "--stdin",
                            stdin=target).decode().strip()
            lines += f"{mode} {oid}\t".encode() + os.fsencode(relative) + b"\0"
        with tempfile.TemporaryDirectory(dir=self.gitdir) as scratch:
            index = Path(scratch) / "index"
            self._git("update-index", "-z", "--add", "--index-info", stdin=lines, index=index)
            tree = self._git("write-tree", index=index).decode().strip()
        # git drops a path it reserves (`.GIT/x`, `a/.Git`) with no error: that change would be
        # missing from the patch, so the capture fails naming it instead
        kept = set(self._git("ls-tree", "-r", "-z", "--name-only", tree).split(b"\0"))
        wanted = [entry.split(b"\t", 1)[1] for entry in lines.split(b"\0") if entry]
        refused = [p.decode("utf-8", "replace") for p in wanted if p not in kept]
        if refused:
            raise CaptureError(f"patch capture: git refuses the path {refused[0]!r}"
                               f"{f' and {len(refused) - 1} more' if len(refused) > 1 else ''}"
                               " (a name git reserves for its repository); the run's patch "
                               "cannot hold it")
        return tree

    def keep_base(self, root: Path) -> None:
        """Take the pristine tree (before the agent acts)."""
        self.base = self.tree(root)

    def diff(self, root: Path) -> str:
        """The agent's changes to `root` since `keep_base`, as a git patch."""
        assert self.base is not None, "keep_base first"
        now = self.tree(root)
        patch = self._git("diff-tree", "-p", "--binary", "--no-ext-diff", "--no-textconv",
                          "--no-color", "--full-index", self.base, now)
        return patch.decode("utf-8", "replace")
