"""A minimal report document (headings, paragraphs, lists, tables, figures) rendered twice:
as Markdown with linked PNG files and as one self-contained HTML page with embedded PNGs.

Both renderings walk the same document, so the Markdown and HTML reports cannot disagree.
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
class Image:
    """A PNG figure; `name` is its file name under the report's plots/ folder."""

    name: str
    png: bytes
    caption: str


Part = Paragraph | Bullets | Table | Image


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
        out += [f"## {section.title}", ""]
        for part in section.parts:
            if isinstance(part, Paragraph):
                out += [part.text, ""]
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
        out.append(f"<h2>{e(section.title)}</h2>")
        for part in section.parts:
            if isinstance(part, Paragraph):
                out.append(f"<p>{e(part.text)}</p>")
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
