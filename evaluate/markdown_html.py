"""Markdown -> HTML for the subset the reports use: headings, pipe tables (with alignment), lists,
block quotes, fenced code, paragraphs; inline code, **strong** and *emphasis*.

Small on purpose (no dependency): the report's summary is written once, as Markdown (report.md, the
PR comment), and this turns it into the HTML page's summary. Everything is HTML-escaped; no raw HTML
passes through.
"""

from __future__ import annotations

import html
import re

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*[-*+]\s+(.*)$")
_ALIGN_CELL = re.compile(r"^\s*(:?)-{3,}(:?)\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])")


def inline(text: str) -> str:
    """One line of inline Markdown as HTML (code spans are taken literally)."""
    out: list[str] = []
    pos = 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_emphasis(text[pos:m.start()]))
        out.append(f"<code>{html.escape(m.group(2).strip())}</code>")
        pos = m.end()
    out.append(_emphasis(text[pos:]))
    return "".join(out)


def _emphasis(text: str) -> str:
    text = html.escape(text.replace("\\|", "|"), quote=False)
    text = _STRONG.sub(r"<strong>\1</strong>", text)
    return _EMPHASIS.sub(r"<em>\1</em>", text)


def _cells(line: str) -> list[str]:
    """The cells of one table row: split on unescaped pipes, outer pipes dropped."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip() for c in re.split(r"(?<!\\)\|", body)]


def _table(rows: list[str]) -> str:
    header = _cells(rows[0])
    aligns: list[str | None] = [None] * len(header)
    body = rows[1:]
    if body and all(_ALIGN_CELL.match(c) for c in _cells(body[0])):
        for i, cell in enumerate(_cells(body[0])[: len(header)]):
            m = _ALIGN_CELL.match(cell)
            assert m is not None
            left, right = bool(m.group(1)), bool(m.group(2))
            aligns[i] = "center" if left and right else "right" if right else "left" if left else None
        body = body[1:]

    def row(cells: list[str], tag: str) -> str:
        tds = []
        for i, cell in enumerate(cells):
            align = aligns[i] if i < len(aligns) else None
            style = f' style="text-align:{align}"' if align else ""
            tds.append(f"<{tag}{style}>{inline(cell)}</{tag}>")
        return "<tr>" + "".join(tds) + "</tr>"

    lines = ["<table>", "<thead>" + row(header, "th") + "</thead>", "<tbody>"]
    lines += [row(_cells(r), "td") for r in body]
    lines += ["</tbody>", "</table>"]
    return "\n".join(lines)


def to_html(markdown: str) -> str:
    """The HTML of a Markdown document (block by block)."""
    lines = markdown.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[i + 1 : j])) + "</code></pre>")
            i = j + 1
            continue
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
            i += 1
            continue
        j = i
        if line.lstrip().startswith("|"):
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
        elif line.startswith(">"):
            while j < len(lines) and lines[j].startswith(">"):
                j += 1
            quoted = " ".join(ln[1:].strip() for ln in lines[i:j])
            out.append(f"<blockquote><p>{inline(quoted)}</p></blockquote>")
        elif _LIST_ITEM.match(line):
            while j < len(lines) and _LIST_ITEM.match(lines[j]):
                j += 1
            items = "".join(f"<li>{inline(_list_text(ln))}</li>" for ln in lines[i:j])
            out.append(f"<ul>{items}</ul>")
        else:
            while j < len(lines) and lines[j].strip() and not _starts_block(lines[j]):
                j += 1
            out.append(f"<p>{inline(' '.join(ln.strip() for ln in lines[i:j]))}</p>")
        i = j
    return "\n".join(out) + "\n"


def _list_text(line: str) -> str:
    m = _LIST_ITEM.match(line)
    return m.group(1) if m else line


def _starts_block(line: str) -> bool:
    return bool(line.startswith(("```", ">")) or line.lstrip().startswith("|") or _HEADING.match(line)
                or _LIST_ITEM.match(line))
