"""The site codes' pages, `regionalize/codes/RGZnnn.md`: the one place each code's meaning is written.

A page's title line, `# RGZ108: <meaning>`, is the meaning that site lines, JSON and SARIF print; the rest
of the page says why the codemod decides so and what to do about it, for `regionalize rule`.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

# Shipped inside the package (package-data in pyproject.toml), so that `regionalize rule` works from an
# installed wheel, without a checkout or a network.
_PAGES = resources.files("regionalize").joinpath("codes")
CODE = re.compile(r"RGZ\d{3}")
_TITLE = re.compile(r"# (RGZ\d{3}): (\S.*)")

# Where the pages are published, for SARIF's `helpUri`, which the SARIF 2.1.0 schema requires to be an
# absolute URI. The project has no public address yet, so reports carry the page itself (SARIF `help`)
# and its path in the package; setting this adds `helpUri` to every rule.
DOCS_URL: str | None = None


class UnknownCode(LookupError):
    """A code that has no page."""


@cache
def pages() -> dict[str, str]:
    """Every page's Markdown, by code, in code order."""
    found = {}
    for entry in _PAGES.iterdir():
        code = entry.name.removesuffix(".md")
        if entry.name.endswith(".md") and CODE.fullmatch(code):
            found[code] = entry.read_text(encoding="utf-8")
    return dict(sorted(found.items()))


def page(code: str) -> str:
    """The page of `code` (any case: `rgz108` is RGZ108)."""
    try:
        return pages()[code.upper()]
    except KeyError:
        raise UnknownCode(code) from None


@cache
def meanings() -> dict[str, str]:
    """Each code's one-line meaning: its page's title."""
    return {code: title(code, text) for code, text in pages().items()}


def title(code: str, text: str) -> str:
    """The meaning in the title line; a page without one is a bug in the package, said plainly."""
    first = text.split("\n", 1)[0]
    match = _TITLE.fullmatch(first)
    if match is None or match[1] != code:
        raise ValueError(f"regionalize/codes/{code}.md must start with '# {code}: <meaning>', not {first!r}")
    return match[2]


def path(code: str) -> str:
    """The page's path in the package, which is also its path in the source repository."""
    return f"regionalize/codes/{code}.md"


def help_uri(code: str) -> str | None:
    return f"{DOCS_URL.rstrip('/')}/{code}.md" if DOCS_URL else None
