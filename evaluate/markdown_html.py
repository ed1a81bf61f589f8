"""Markdown -> HTML for the reports' summaries, through markdown-it-py (CommonMark + GFM tables).

The report's summary is written once, as Markdown (report.md, the PR comment), and `to_html` turns
it into the HTML page's summary. Raw HTML never passes through (markdown-it's `html` option is off,
so `<script>` stays text). `_SummaryRenderer` keeps the page's layout as it was before the library
took over: one line per top-level block, a table row per line, tight lists and quotes on one line,
text escaped without touching quotes, code escaped with `html.escape`, soft line breaks as spaces.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

# Tags inside a table that end a line (the header row shares its line with <thead>).
_TABLE_LINE_ENDS = {"table_open", "thead_close", "tbody_open", "tbody_close"}


class _SummaryRenderer(RendererHTML):
    """markdown-it's HTML renderer with the reports' line layout and escaping."""

    def renderToken(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        if token.hidden:  # the <p> of a tight list item
            return ""
        tag = f"</{token.tag}>" if token.nesting == -1 else f"<{token.tag}{self.renderAttrs(token)}>"
        if token.type in _TABLE_LINE_ENDS:
            return tag + "\n"
        if token.type == "tr_close":
            return tag if tokens[idx + 1].type == "thead_close" else tag + "\n"
        if token.type == "table_close" and tokens[idx - 1].type == "thead_close":
            return "<tbody>\n</tbody>\n" + tag + "\n"  # a header alone still gets its (empty) body
        return tag + "\n" if token.block and token.nesting != 1 and token.level == 0 else tag

    def fence(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        return "<pre><code>" + html.escape(tokens[idx].content.removesuffix("\n")) + "</code></pre>\n"

    code_block = fence

    def code_inline(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        return "<code>" + html.escape(tokens[idx].content.strip()) + "</code>"

    def text(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        return html.escape(tokens[idx].content, quote=False)

    def softbreak(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        return " "


_MARKDOWN = MarkdownIt("commonmark", {"html": False}, renderer_cls=_SummaryRenderer).enable("table")


def to_html(markdown: str) -> str:
    """The HTML of a Markdown document: one line per top-level block, ending in a newline."""
    return _MARKDOWN.render(markdown) or "\n"
