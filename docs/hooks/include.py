"""mkdocs hook: pages that show a file living beside the code, read at build time.

The schemas and data notes (`bench/analysis/summary_schema.md`, `plan/SCHEMA.md`, ...) keep one
home next to the code that writes or reads them; a docs page shows one with a single line

    <!-- include: plan/SCHEMA.md -->

(the path relative to the folder of mkdocs.yml). The file's text replaces the line, followed by
a note naming the file, so an edit there is an edit of the docs and no copy can drift. A path
that does not exist, or lies outside the checkout, stops the build with one line naming the
page, the path and the fix. `mkdocs serve` also rebuilds when an included file changes.

The line `<!-- settings-table -->` becomes the table of every bench setting, generated from the
typed config (`compaction-bench bench --settings` prints the same rows), so no setting is
written down twice.
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
SETTINGS = re.compile(r"^<!-- settings-table -->[ \t]*$", re.MULTILINE)

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


def _settings_table() -> str:
    from compaction_bench.bench.run.config import BenchConfig
    from compaction_bench.common.markdown import table
    from compaction_bench.common.settings import settings_table

    rows = [(f"`{name}`", f"`{variable}`", f"`{default}`" if default else "-", text)
            for name, variable, default, text in settings_table(BenchConfig)]
    return "\n".join(table(("setting (file, `name=value`)", "make variable", "default",
                           "what it does"), rows))


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    root = _root(config)
    markdown = MARKER.sub(lambda found: _read(root, page.file.src_uri, found["path"]), markdown)
    if SETTINGS.search(markdown):
        markdown = SETTINGS.sub(lambda _: _settings_table(), markdown)
    return markdown


def on_serve(server: Any, config: MkDocsConfig, builder: Any) -> Any:
    for path in sorted(_included):
        server.watch(str(path))
    return server
