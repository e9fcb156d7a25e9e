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

`changes(root)` lists what the patch holds path by path (git's raw diff of the two trees) and
`contents(oids)` streams the new files' bytes from the same repository: validation builds its
tree from the pristine task and these (`histories.tasks.validation`), byte for byte what the
patch says, never from the workspace or by parsing the patch's text.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from compaction_bench.common.errors import SuiteError
from compaction_bench.common.files import walk

SKIPPED_DIRS = (".git", "__pycache__")
GIT_TIMEOUT_S = 120


class CaptureError(SuiteError):
    """The suite's own git could not read the workspace."""


@dataclass(frozen=True)
class Change:
    """One path the agent changed, from git's raw diff of the pristine tree and the workspace's."""

    path: str  # relative; a name that is not UTF-8 is surrogate-escaped (os.fsdecode)
    status: str  # A added, M modified, D deleted, T type changed (file <-> link)
    old_mode: str  # "000000" where added
    new_mode: str  # "000000" where deleted; 100644, 100755 or 120000 (a link)
    new_oid: str  # the new content's blob (zeros where deleted)


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

    def _env(self, index: Path | None = None) -> dict[str, str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.gitdir), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
               "GIT_DIR": str(self.gitdir), "LC_ALL": "C"}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    @staticmethod
    def _argv(*args: str) -> list[str]:
        return ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c",
                "core.bare=true", *args]

    def _git(self, *args: str, stdin: bytes | None = None, index: Path | None = None) -> bytes:
        done = subprocess.run(self._argv(*args), input=stdin, capture_output=True,
                              timeout=GIT_TIMEOUT_S, cwd=self.gitdir, env=self._env(index),
                              check=False, start_new_session=True)
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

    def changes(self, root: Path) -> list[Change]:
        """What `diff(root)` holds, path by path (no rename detection: a rename is a deletion
        and an addition, so each path is judged as what it is)."""
        assert self.base is not None, "keep_base first"
        raw = self._git("diff-tree", "-r", "-z", "--raw", "--no-renames", "--full-index",
                        self.base, self.tree(root))
        fields = raw.split(b"\0")
        found = []
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if not meta.startswith(b":"):
                continue
            old_mode, new_mode, _old, new_oid, status = meta[1:].decode().split()
            found.append(Change(os.fsdecode(path), status[0], old_mode, new_mode, new_oid))
        return found

    def contents(self, oids: Sequence[str]) -> Iterator[bytes]:
        """Each blob's bytes, in order, from one `git cat-file --batch` (one file in memory at
        a time; each is under the box's file-size limit); all of them within GIT_TIMEOUT_S."""
        if not oids:
            return
        proc = subprocess.Popen(self._argv("cat-file", "--batch"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                cwd=self.gitdir, env=self._env(), start_new_session=True)
        assert proc.stdin is not None and proc.stdout is not None
        timer = threading.Timer(GIT_TIMEOUT_S, proc.kill)
        timer.start()
        try:
            for oid in oids:
                proc.stdin.write(oid.encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.readline().split()
                size = int(header[2]) if len(header) == 3 and header[1] == b"blob" else -1
                data = proc.stdout.read(size) if size >= 0 else b""
                if size < 0 or len(data) != size or proc.stdout.read(1) != b"\n":
                    raise CaptureError(f"patch capture: git cat-file could not read blob {oid} "
                                       f"(timed out after {GIT_TIMEOUT_S} s or died); the "
                                       f"suite's own repository is {self.gitdir}")
                yield data
        except (BrokenPipeError, ValueError) as exc:
            raise CaptureError(f"patch capture: git cat-file stopped ({exc}); the suite's own "
                               f"repository is {self.gitdir}") from None
        finally:
            timer.cancel()
            proc.kill()
            proc.stdin.close()
            proc.stdout.close()
            proc.wait()
