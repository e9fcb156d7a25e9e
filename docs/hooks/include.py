"""mkdocs hook: pages that show a file living beside the code, read at build time.

The schemas and data notes (`bench/analysis/summary_schema.md`, `plan/SCHEMA.md`, ...) keep one
home next to the code that writes or reads them; a docs page shows one with a single line

    <!-- include: plan/SCHEMA.md -->

(the path relative to the folder of mkdocs.yml). The file's text replaces the line, followed by
a note naming the file, so an edit there is an edit of the docs and no copy can drift. A path
that does not exist, or lies outside the checkout, stops the build with one line naming the
page, the path and the fix. `mkdocs serve` also rebuilds when an included file changes.

The line `<!-- settings-table: <command> -->` (every command with settings, listed in
`_settings_table`)
becomes the
table of every setting of that command, generated from its typed config (`compaction-bench
<command> --settings` prints the same rows), so no setting is written down twice. The line
`<!-- command-reference -->` becomes the table of every command and subcommand with its
arguments and first paragraph of help, generated from the built app (`compaction_bench.cli
reference`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

# A whole line of its own, so a mention of the syntax inside a sentence is left alone.
MARKER = re.compile(r"^<!-- include: (?P<path>\S+) -->[ \t]*$", re.MULTILINE)
SETTINGS = re.compile(r"^<!-- settings-table: (?P<command>[a-z-]+) -->[ \t]*$", re.MULTILINE)

# Every file included by the last build, for `mkdocs serve` to watch.
_included: set[Path] = set()


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _read(root: Path, page: str, relative: str) -> str:
    path = (root / relative).resolve()
    if root not in path.parents:
        raise PluginError(f"docs/{page}: `include: {relative}` points outside the checkout; "
                          "give a path relative to the folder of mkdocs.yml")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PluginError(f"docs/{page}: `include: {relative}` names no file; fix the path "
                          "(relative to the folder of mkdocs.yml) or remove the line") from None
    except UnicodeDecodeError as exc:
        raise PluginError(f"{relative}: not UTF-8 text (byte {exc.start}), included by "
                          f"docs/{page}; save it as UTF-8") from None
    _included.add(path)
    note = f"*This page is `{relative}` of the checkout, included at build time.*"
    return f"{text.rstrip()}\n\n{note}\n"


def _settings_table(page: str, command: str) -> str:
    from pydantic import BaseModel

    from compaction_bench.bench.faults.cli import FaultsConfig
    from compaction_bench.bench.gpucheck import GpuCheckConfig
    from compaction_bench.bench.report.settings import (
        CompareConfig,
        ReportConfig,
        StudyReportConfig,
    )
    from compaction_bench.bench.run.config import BenchConfig
    from compaction_bench.common.markdown import table
    from compaction_bench.common.settings import settings_table
    from compaction_bench.histories.settings import (
        AcquireConfig,
        ArmsConfig,
        AuditConfig,
        ContinueConfig,
        ImportConfig,
        ImportStudyConfig,
    )
    from compaction_bench.kernels.calibration import CalibrationConfig
    from compaction_bench.kernels.cli import ResultsCheckConfig
    from compaction_bench.loadgen.cli import MergeConfig, RunConfig, WorkerConfig
    from compaction_bench.plan.settings import PlanCheckConfig, PlanConfig
    from compaction_bench.plan.truth import TruthConfig
    from compaction_bench.serve.settings import (
        CheckConfig,
        PrepareConfig,
        ServeConfig,
        StopConfig,
    )

    models: dict[str, type[BaseModel]] = {"bench": BenchConfig, "serve": ServeConfig,
                                          "plan": PlanConfig, "fleet-truth": TruthConfig,
                                          "kernels": CalibrationConfig,
                                          "histories-acquire": AcquireConfig,
                                          "histories-arms": ArmsConfig, "serve-check": CheckConfig,
                                          "stop": StopConfig, "prepare-model": PrepareConfig,
                                          "plan-check": PlanCheckConfig,
                                          "histories-audit": AuditConfig,
                                          "histories-continue": ContinueConfig,
                                          "histories-import": ImportConfig,
                                          "study-import": ImportStudyConfig,
                                          "report": ReportConfig, "compare": CompareConfig,
                                          "study-report": StudyReportConfig,
                                          "kernels-check": ResultsCheckConfig,
                                          "faults": FaultsConfig, "load-worker": WorkerConfig,
                                          "load-run": RunConfig, "load-merge": MergeConfig,
                                          "gpu-check": GpuCheckConfig}
    if command not in models:
        raise PluginError(f"docs/{page}: `settings-table: {command}` names no command with "
                          f"settings; use one of {', '.join(models)}")
    rows = [(f"`{name}`", f"`{variable}`", f"`{default}`" if default else "-", text)
            for name, variable, default, text in settings_table(models[command])]
    return "\n".join(table(("setting (file, `name=value`)", "make variable", "default",
                           "what it does"), rows))


COMMANDS = re.compile(r"^<!-- command-reference -->[ \t]*$", re.MULTILINE)


def _command_reference() -> str:
    from compaction_bench.cli import reference
    from compaction_bench.common.markdown import table

    rows = [(f"`{command}`", f"`{usage}`" if usage else "(a group)",
             text.replace("|", "\\|")) for command, usage, text in reference()]
    return "\n".join(table(("command", "arguments", "what it does"), rows))


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    root = _root(config)
    markdown = MARKER.sub(lambda found: _read(root, page.file.src_uri, found["path"]), markdown)
    if SETTINGS.search(markdown):
        markdown = SETTINGS.sub(
            lambda found: _settings_table(page.file.src_uri, found["command"]), markdown)
    if COMMANDS.search(markdown):
        markdown = COMMANDS.sub(lambda _: _command_reference(), markdown)
    return markdown


def on_serve(server: Any, config: MkDocsConfig, builder: Any) -> Any:
    for path in sorted(_included):
        server.watch(str(path))
    return server
