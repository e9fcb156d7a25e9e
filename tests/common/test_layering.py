"""The import layering between the stages, read from the source (every import statement, also
those inside functions): common <- transport <- serve <- histories <- loadgen <- bench <- plan;
kernels may import any stage, and only bench and plan import kernels. A stage that imports one
above it makes a cycle waiting to happen (histories once imported loadgen, which imports
histories)."""

from __future__ import annotations

import ast

from compaction_bench.common.paths import repo_root

ORDER = ("common", "transport", "serve", "histories", "loadgen", "bench", "plan")
KERNELS_USERS = ("bench", "plan")
# Known and not yet moved: the entropy scorer runs the fused entropy kernel that kernels/
# benchmarks (kernels/entropy.py); its home should be a stage below histories.
KNOWN = {("histories/policies/scorer.py", "kernels")}


def imports() -> list[tuple[str, str, str]]:
    """(file, its stage, the stage it imports) for every cross-stage import."""
    found = []
    for stage in (*ORDER, "kernels"):
        for path in sorted((repo_root() / stage).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                         and not node.level else
                         [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "compaction_bench" and len(parts) > 1 and parts[1] != stage \
                            and parts[1] in (*ORDER, "kernels"):
                        found.append((str(path.relative_to(repo_root())), stage, parts[1]))
    return found


def test_no_stage_imports_one_above_it_and_only_bench_and_plan_import_kernels() -> None:
    found = imports()
    assert {stage for _, stage, _ in found} == {*ORDER[1:], "kernels"}  # common imports none
    wrong = []
    for path, stage, target in found:
        if (path, target) in KNOWN:
            continue
        if target == "kernels":
            if stage not in KERNELS_USERS:
                wrong.append(f"{path} ({stage}) imports kernels")
        elif stage != "kernels" and ORDER.index(target) > ORDER.index(stage):
            wrong.append(f"{path} ({stage}) imports {target}, a stage above it")
    assert not wrong, "\n".join(wrong)
    seen = {(path, target) for path, _, target in found}
    assert not KNOWN - seen, f"no longer imported, remove from KNOWN: {KNOWN - seen}"
