"""A minimal report document (headings, paragraphs, lists, tables, figures) rendered twice:
as Markdown with linked PNG files and as one self-contained HTML page with embedded PNGs.

Both renderings walk the same document, so the Markdown and HTML reports cannot disagree.
`from_markdown` reads back the Markdown this suite writes (the plan's plan.md: headings, quotes,
paragraphs, bullets, `common.markdown.table` tables and plot links), so the plan's HTML comes
from the same renderer as the report's.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

from compaction_bench.common import markdown


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Subheading:
    """A heading inside a section (### in Markdown)."""

    text: str


@dataclass(frozen=True)
class Image:
    """A PNG figure; `name` is its file name under the report's plots/ folder."""

    name: str
    png: bytes
    caption: str


Part = Paragraph | Bullets | Table | Image | Subheading


@dataclass
class Section:
    title: str
    parts: list[Part] = field(default_factory=list)

    def add(self, *parts: Part) -> Section:
        self.parts.extend(parts)
        return self


@dataclass(frozen=True)
class Document:
    title: str
    sections: tuple[Section, ...]

    def images(self) -> list[Image]:
        return [p for s in self.sections for p in s.parts if isinstance(p, Image)]


def to_markdown(document: Document, plots_dir: str = "plots") -> str:
    out = [f"# {document.title}", ""]
    for section in document.sections:
        out += [f"## {section.title}", ""] if section.title else []
        for part in section.parts:
            if isinstance(part, Paragraph):
                out += [part.text, ""]
            elif isinstance(part, Subheading):
                out += [f"### {part.text}", ""]
            elif isinstance(part, Bullets):
                out += [f"- {item}" for item in part.items] + [""]
            elif isinstance(part, Table):
                if part.caption:
                    out += [part.caption, ""]
                out += [*markdown.table(part.header, part.rows), ""]
            else:
                out += [f"![{part.caption}]({plots_dir}/{part.name})", "", f"*{part.caption}*", ""]
    return "\n".join(out)


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
figure { margin: 1em 0 2em; } figcaption { font-style: italic; color: #555; }
img { max-width: 100%; } .caption { color: #444; }
"""


def to_html(document: Document) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
        f"<title>{e(document.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(document.title)}</h1>",
    ]
    for section in document.sections:
        if section.title:
            out.append(f"<h2>{e(section.title)}</h2>")
        for part in section.parts:
            if isinstance(part, Paragraph):
                out.append(f"<p>{e(part.text)}</p>")
            elif isinstance(part, Subheading):
                out.append(f"<h3>{e(part.text)}</h3>")
            elif isinstance(part, Bullets):
                out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in part.items) + "</ul>")
            elif isinstance(part, Table):
                if part.caption:
                    out.append(f"<p class='caption'>{e(part.caption)}</p>")
                head = "".join(f"<th>{e(h)}</th>" for h in part.header)
                body = "".join(
                    "<tr>" + "".join(f"<td>{e(c).replace(chr(10), '<br>')}</td>" for c in row)
                    + "</tr>"
                    for row in part.rows
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            else:
                data = base64.b64encode(part.png).decode("ascii")
                out.append(
                    f"<figure><img alt='{e(part.caption)}' src='data:image/png;base64,{data}'>"
                    f"<figcaption>{e(part.caption)}</figcaption></figure>"
                )
    out.append("</body></html>")
    return "\n".join(out)


def _cells(line: str) -> tuple[str, ...]:
    """A `common.markdown.table` row's cells, unescaped (`\\|` and `<br>`)."""
    inner = line.strip()[1:-1]
    cells, cell, i = [], "", 0
    while i < len(inner):
        if inner.startswith("\\|", i):
            cell, i = cell + "|", i + 2
        elif inner[i] == "|":
            cells.append(cell)
            cell, i = "", i + 1
        else:
            cell, i = cell + inner[i], i + 1
    cells.append(cell)
    return tuple(c.strip().replace("<br>", "\n") for c in cells)


def from_markdown(text: str, images: dict[str, bytes] | None = None) -> Document:
    """The document of Markdown this suite writes (module docstring): `# ` the title, `## ` a
    section, `### ` a subheading, `> ` and other lines paragraphs (consecutive lines joined),
    `- ` bullets, `|` rows a table, `![caption](plots/<name>)` a figure whose PNG is
    `images[name]` (a link to a PNG not given stays a paragraph)."""
    title, sections = "", [Section("")]
    lines = text.splitlines()
    i = 0

    def add(part: Part) -> None:
        sections[-1].add(part)

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("# ") and not title:
            title, i = line[2:].strip(), i + 1
        elif line.startswith("## "):
            sections.append(Section(line[3:].strip()))
            i += 1
        elif line.startswith("### "):
            add(Subheading(line[4:].strip()))
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            body = [r for r in rows[1:] if not set(r.replace("|", "").strip()) <= {"-", ":"}]
            add(Table(_cells(rows[0]), tuple(_cells(r) for r in body)))
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith(("- ", "  ")) and lines[i].strip():
                if lines[i].startswith("- "):
                    items.append(lines[i][2:].strip())
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            add(Bullets(tuple(items)))
        elif (found := _image(line)) is not None and found[1] in (images or {}):
            caption, name = found
            add(Image(name, (images or {})[name], caption))
            i += 1
        else:
            paragraph = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(
                    ("#", "|", "- ", "![")):
                paragraph.append(lines[i].removeprefix("> ").strip())
                i += 1
            if not paragraph:  # an image line whose PNG was not given
                paragraph, i = [line.strip()], i + 1
            add(Paragraph(" ".join(paragraph)))
    kept = tuple(s for s in sections if s.title or s.parts)
    return Document(title, kept)


def _image(line: str) -> tuple[str, str] | None:
    """(caption, file name) of a `![caption](plots/<name>)` line."""
    text = line.strip()
    if not (text.startswith("![") and text.endswith(")") and "](" in text):
        return None
    caption, link = text[2:-1].split("](", 1)
    return caption, link.rsplit("/", 1)[-1]
