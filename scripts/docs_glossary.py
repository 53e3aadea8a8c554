"""Each page links a glossary term (docs/glossary.md) where it first uses it.

"First use" is the term's first occurrence in the page's prose: code (fenced or inline), headings, HTML
comments, the text and target of other links and blocks written by a renderer between `<!-- ...: begin`
and `<!-- ...: end -->` markers are not prose. `first_unlinked(text)` lists the terms a page uses
before linking them; `link_first_uses(text, href)` links each at its first use, which
`python scripts/render_docs.py` runs over the pages and tests/test_glossary.py checks.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"
# The pages a reader follows from the README; the results pages are written by the scripts that
# measured them, and the code pages are printed in a terminal by `regionalize rule`.
PAGES = (ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "glossary.md"))

_WORD = r"(?<![\w\-/.`]){}(?![\w\-])"
# term anchor -> what a use of it looks like (case-insensitive), longest terms first where they overlap.
TERMS: dict[str, str] = {
    "import-form": r"import forms?",
    "vendored-copy": r"vendored cop(?:y|ies)",
    "site-code": r"site codes?",
    "in-pieces": r"in pieces",
    "full-compile": r"full compiles?",
    "graph-deduplication": r"graph deduplication",
    "stand-in": r"stand-ins?",
    "runtime-n": r"runtime \d+",
    "block": r"blocks?",
    "owner": r"owners?",
    "site": r"sites?",
    "form": r"forms?",
    "cold": r"cold",
    "warm": r"warm",
    "hot": r"hot",
    "restart": r"restart(?:s|ed)?",
    "sitting": r"sittings?",
}
_PATTERNS = {anchor: re.compile(_WORD.format(words), re.IGNORECASE) for anchor, words in TERMS.items()}

# Spans that are not prose: fenced code, HTML comments and rendered blocks, headings, links (text and
# target), inline code. Matched in that order, each a whole span.
_NOT_PROSE = re.compile(
    r"^```.*?^```[ \t]*$"
    r"|<!-- (?P<name>[\w-]+): begin.*?<!-- (?P=name): end -->"
    r"|<!--.*?-->"
    r"|^#{1,6} [^\n]*$"
    r"|!?\[[^\]\n]*\]\([^)\n]*\)"
    r"|`[^`\n]*`",
    re.MULTILINE | re.DOTALL,
)


def _prose(text: str) -> list[tuple[int, int]]:
    """The spans of `text` that are prose."""
    spans, at = [], 0
    for match in _NOT_PROSE.finditer(text):
        spans.append((at, match.start()))
        at = match.end()
    spans.append((at, len(text)))
    return spans


def _linked(text: str, anchor: str) -> int | None:
    """Where the page's first link to the term is, if any."""
    match = re.search(rf"\]\([^)\s]*glossary\.md#{re.escape(anchor)}\)", text)
    return match.start() if match else None


def first_use(text: str, anchor: str) -> re.Match[str] | None:
    """The term's first occurrence in the page's prose, outside other terms' links."""
    pattern = _PATTERNS[anchor]
    for start, end in _prose(text):
        for match in pattern.finditer(text, start, end):
            if not _inside_longer_term(text, match, anchor):
                return match
    return None


# Terms that hold another: a use of `import form` is not a first use of `form`.
_HELD_IN = {"form": ("import-form",), "site": ("site-code",)}


def _inside_longer_term(text: str, match: re.Match[str], anchor: str) -> bool:
    for other in _HELD_IN.get(anchor, ()):
        around = _PATTERNS[other].finditer(text, max(0, match.start() - 40), match.end() + 40)
        if any(m.start() <= match.start() and match.end() <= m.end() for m in around):
            return True
    return False


def first_unlinked(text: str) -> list[str]:
    """The terms the page uses in prose before (or without) its first link to the glossary's entry."""
    missing = []
    for anchor in TERMS:
        use = first_use(text, anchor)
        link = _linked(text, anchor)
        if use is not None and (link is None or link > use.start()):
            missing.append(anchor)
    return missing


def link_first_uses(text: str, href: str) -> str:
    """The page with each term linked at its first use; `href` is the glossary's path from the page."""
    for anchor in first_unlinked(text):
        use = first_use(text, anchor)
        assert use is not None
        link = f"[{use.group()}]({href}#{anchor})"
        text = text[: use.start()] + link + text[use.end() :]
    return text


def href(page: Path) -> str:
    return "docs/glossary.md" if page.parent == ROOT else "glossary.md"
