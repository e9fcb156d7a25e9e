"""Patch capture the agent cannot steer, tried with the forgeries an agent can plant in its own
repository from inside the box: a clean filter, `diff.external`, textconv, skip-worktree,
`.git/info/exclude` and `.gitignore`, a `.gitattributes` with `ident`, a nested repository, a
link out of the workspace, a hook that writes into the patch. Real git, real box."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compaction_bench.histories.agent.capture import CaptureError
from compaction_bench.histories.agent.workspace import ConfinedEnvironment, Workspace
from compaction_bench.histories.tasks.task import load_task

pytestmark = pytest.mark.e2e


@pytest.fixture
def ws() -> Iterator[Workspace]:
    with Workspace(load_task("fix-median")) as found:
        yield found


def run(ws: Workspace, command: str) -> str:
    assert isinstance(ws.env, ConfinedEnvironment)
    got = ws.env.execute({"command": command}, timeout=20)
    return str(got["output"])


def test_the_agents_repository_config_cannot_hide_or_replace_a_change(ws: Workspace) -> None:
    run(ws, "printf '\\n# REAL-CHANGE\\n' >> stats_utils.py && echo new > added.txt && "
            "echo secret > hidden.txt && git add -A && "
            "git -c user.name=a -c user.email=a@b commit -qm agent && "
            "git config filter.hide.clean 'echo FORGED' && git config filter.hide.smudge cat && "
            "git config diff.external /bin/true && git config diff.python.textconv 'echo TX' && "
            "printf '*.py filter=hide diff=python\\n' > .gitattributes && "
            "echo hidden.txt >> .git/info/exclude && echo added.txt > .gitignore && "
            "git update-index --skip-worktree stats_utils.py && "
            "printf '#!/bin/sh\\necho HOOK-TEXT\\n' > .git/hooks/post-index-change && "
            "chmod +x .git/hooks/post-index-change && git config core.fsmonitor "
            ".git/hooks/post-index-change")
    patch = ws.patch()
    assert "+# REAL-CHANGE" in patch
    assert "diff --git a/added.txt b/added.txt" in patch
    assert "diff --git a/hidden.txt b/hidden.txt" in patch and "+secret" in patch
    assert "FORGED" not in patch and "TX" not in patch and "HOOK-TEXT" not in patch
    assert ".git/" not in patch  # the agent's repository is not part of the change


def test_ident_attributes_do_not_rewrite_what_was_changed(ws: Workspace) -> None:
    run(ws, "printf '*.py ident\\n' > .gitattributes && "
            "printf '# $Id: REAL-IN-MARKER $\\n' >> stats_utils.py")
    assert "$Id: REAL-IN-MARKER $" in ws.patch()


def test_links_are_recorded_as_links_and_nothing_is_read_through_them(ws: Workspace) -> None:
    run(ws, "ln -s /etc/shadow shadow-link && ln -s / root-link && mkfifo pipe")
    patch = ws.patch()
    assert "+/etc/shadow" in patch and "new file mode 120000" in patch
    assert "root:" not in patch  # the link's target was never read


def test_a_nested_repository_puts_no_git_warning_in_the_patch(ws: Workspace) -> None:
    run(ws, "mkdir vendored && cd vendored && git init -q && echo v > v.txt && git add v.txt")
    patch = ws.patch()
    assert "vendored/v.txt" in patch and "warning" not in patch.lower()
    assert patch.startswith("diff --git")


def test_an_untouched_workspace_gives_an_empty_patch(ws: Workspace) -> None:
    run(ws, "git status >/dev/null; python3 -m unittest -q test_stats_utils 2>/dev/null; true")
    assert ws.patch() == ""


def test_a_path_git_reserves_fails_the_capture_naming_it(ws: Workspace) -> None:
    run(ws, "mkdir .GIT && echo x > .GIT/x")
    with pytest.raises(CaptureError, match=r"git refuses the path '\.GIT/x'"):
        ws.patch()


def test_a_name_that_is_not_utf8_and_a_very_deep_folder_are_captured_and_validated(
        ws: Workspace) -> None:
    # issue 34: `caf\351.txt` made ws.patch() raise UnicodeEncodeError, and a folder 1,100
    # levels deep made patch capture and validation raise RecursionError
    out = run(ws, "printf 'x\\n' > \"$(printf 'caf\\351.txt')\"; "
                  "d=.; for i in $(seq 1100); do d=$d/d; done; mkdir -p $d && echo deep > $d/f; "
                  "echo made")
    assert "made" in out, out
    patch = ws.patch()
    assert "caf" in patch and "deep" in patch
    got = ws.validate()  # the unfixed bug: it fails, and does not raise
    assert not got.passed and "Ran" in got.output


def test_a_process_cannot_open_more_files_than_the_box_allows(ws: Workspace) -> None:
    # issue 34: RLIMIT_NOFILE was never set (5 processes x 19,990 descriptors raised the host's
    # file-nr by 100,140)
    out = run(ws, "python3 -c \"import resource; print('nofile', "
                  "resource.getrlimit(resource.RLIMIT_NOFILE))\"")
    assert "nofile (1024, 1024)" in out, out
