"""Every relative link in the README and the docs resolves: the file exists and, for a Markdown
target, so does the heading an anchor names (GitHub's heading ids)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

REPO = Path(__file__).resolve().parent.parent
DOCUMENTS = [REPO / "README.md", REPO / "tests/data/README.md", *sorted((REPO / "docs").rglob("*.md"))]
_MARKDOWN = MarkdownIt("commonmark").enable("table")


def _tokens(text: str) -> list[Token]:
    """Block tokens and, after each inline one, its children (where links live)."""
    flat: list[Token] = []
    for token in _MARKDOWN.parse(text):
        flat.append(token)
        flat.extend(token.children or [])
    return flat


def _links(text: str) -> list[str]:
    return [str(t.attrGet("href")) for t in _tokens(text) if t.type == "link_open"]


def heading_ids(text: str) -> set[str]:
    """GitHub's ids: the heading's text lower-cased, punctuation but `-` and `_` dropped, spaces as `-`."""
    tokens = _MARKDOWN.parse(text)
    ids: set[str] = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            plain = "".join(
                c.content for c in tokens[i + 1].children or [] if c.type in ("text", "code_inline")
            )
            ids.add(re.sub(r"[^\w\- ]", "", plain.strip().lower()).replace(" ", "-"))
    return ids


def broken_links(document: Path) -> list[str]:
    broken = []
    for href in _links(document.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", href):  # http:, https:, mailto:
            continue
        path_part, _, anchor = href.partition("#")
        target = (document.parent / unquote(path_part)).resolve() if path_part else document
        if not target.exists():
            broken.append(f"{href}: no such file")
        elif (
            anchor
            and target.suffix == ".md"
            and unquote(anchor) not in heading_ids(target.read_text(encoding="utf-8"))
        ):
            broken.append(f"{href}: no heading #{anchor} in {target.relative_to(REPO)}")
    return broken


def test_heading_ids_follow_github() -> None:
    assert heading_ids("## What is spoken: the text front end\n### `serve --workers 2` (not kept)\n") == {
        "what-is-spoken-the-text-front-end",
        "serve---workers-2-not-kept",
    }


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(document: Path) -> None:
    assert broken_links(document) == []
