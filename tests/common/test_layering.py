"""The import layering between the stages, read from the source (every import statement, also
those inside functions): common <- transport <- serve <- kernels <- histories <- loadgen <-
bench <- plan. A stage that imports one above it makes a cycle waiting to happen (histories once
imported loadgen, which imports histories; kernels imported loadgen's GPU sampler while the
policies' scorer imports the entropy kernel, a cycle through three stages until the sampler
moved to serve beside NVML)."""

from __future__ import annotations

import ast

from compaction_bench.common.paths import repo_root

# kernels sits below histories: the policies' proxy scorer runs the fused entropy kernel
ORDER = ("common", "transport", "serve", "kernels", "histories", "loadgen", "bench", "plan")


def imports() -> list[tuple[str, str, str]]:
    """(file, its stage, the stage it imports) for every cross-stage import."""
    found = []
    for stage in ORDER:
        for path in sorted((repo_root() / stage).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and not node.level else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "compaction_bench" and len(parts) > 1 and parts[1] != stage \
                            and parts[1] in ORDER:
                        found.append((str(path.relative_to(repo_root())), stage, parts[1]))
    return found


def test_no_stage_imports_one_above_it() -> None:
    found = imports()
    assert {stage for _, stage, _ in found} == set(ORDER[1:])  # common imports none
    wrong = [f"{path} ({stage}) imports {target}, a stage above it"
             for path, stage, target in found if ORDER.index(target) > ORDER.index(stage)]
    assert not wrong, "\n".join(wrong)
