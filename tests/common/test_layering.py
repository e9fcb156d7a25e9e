"""The import layering between the stages, read from the source (every import statement, also
those inside functions): common <- transport <- serve <- kernels <- histories <- loadgen <-
bench <- plan. A stage that imports one above it makes a cycle waiting to happen (histories once
imported loadgen, which imports histories; kernels imported loadgen's GPU sampler while the
policies' scorer imports the entropy kernel, a cycle through three stages until the sampler
moved to serve beside NVML).

Within and across stages, no module imports itself through others either: a cycle held apart
only by an import inside a function (session.py <-> routing.py, a five-file loop in plan/ until
2026-12-07) breaks as soon as someone moves that import to the top, and means two modules that
cannot be understood, or tested, one without the other."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from compaction_bench.common.paths import repo_root
from compaction_bench.stages import DATA, STAGES

# kernels sits below histories: the policies' proxy scorer runs the fused entropy kernel
ORDER = STAGES


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


def module_imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package laid out under `root` (the stage folders and compaction_bench/)
    and the package's modules it imports, by any import statement, also inside functions."""
    files: dict[str, Path] = {}
    for folder in (*ORDER, "compaction_bench"):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            parts = parts[1:] if parts[0] == "compaction_bench" else parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            files[".".join(("compaction_bench", *parts))] = path

    def module(name: str) -> str | None:  # `a.b.name` is module a.b where name is not one
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {module(f"{node.module}.{a.name}") for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {module(a.name) for a in node.names}
        graph[name] = {m for m in found if m is not None and m != name}
    return graph


def module_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated at the end), or
    None."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as cycle:
        return list(cycle.args[1])
    return None


def test_no_module_imports_itself_through_others() -> None:
    graph = module_imports(repo_root())
    assert len(graph) > 150 and "compaction_bench.bench.run.session" in graph
    cycle = module_cycle(graph)
    assert cycle is None, ("an import cycle (counting imports inside functions): "
                           + " -> ".join(cycle or ()) + "; move what both need below both")


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    """The check on a package with one cycle held apart by an import inside a function, as
    session.py and routing.py were: it is found; without the function's import, none is."""
    (tmp_path / "compaction_bench").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    (tmp_path / "bench" / "session.py").write_text(
        "def router():\n    from compaction_bench.bench.routing import measured\n")
    (tmp_path / "bench" / "routing.py").write_text(
        "from compaction_bench.bench.session import router\nmeasured = 1\n")
    cycle = module_cycle(module_imports(tmp_path))
    assert cycle is not None and set(cycle) == {"compaction_bench.bench.session",
                                                "compaction_bench.bench.routing"}
    (tmp_path / "bench" / "session.py").write_text("def router():\n    return 1\n")
    assert module_cycle(module_imports(tmp_path)) is None


def test_the_stage_list_is_every_subpackage_folder() -> None:
    """setup.py maps the folders of compaction_bench/stages.py, and the mypy view links every
    folder with an `__init__.py`: the two agree, so a new stage is one line in stages.py."""
    folders = {p.parent.name for p in repo_root().glob("*/__init__.py")}
    assert folders == {*STAGES, DATA, "compaction_bench"}
