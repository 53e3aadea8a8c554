"""Words before their meaning: every page links a glossary term (docs/glossary.md) where it first uses it,
every term has its entry, and the README links the glossary on its first screen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_docs import anchors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import docs_glossary

ROOT = docs_glossary.ROOT


def test_every_term_has_an_entry() -> None:
    assert set(docs_glossary.TERMS) <= anchors(docs_glossary.GLOSSARY)


@pytest.mark.parametrize("page", docs_glossary.PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_links_each_term_at_its_first_use(page: Path) -> None:
    missing = docs_glossary.first_unlinked(page.read_text(encoding="utf-8"))
    assert not missing, (
        f"{page.relative_to(ROOT)} uses {missing} before linking docs/glossary.md "
        "(python scripts/render_docs.py links each at its first use)"
    )


def test_the_readme_links_the_glossary_on_its_first_screen() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:15])
    assert "](docs/glossary.md)" in first_screen
    for term in ("owner", "form"):
        assert f"](docs/glossary.md#{term})" in first_screen


def test_the_check_can_fail() -> None:
    text = "# Blocks\n\nA block is `block` here; its [owner](glossary.md#owner), then the owner.\n"
    assert docs_glossary.first_unlinked(text) == ["block"]
    linked = docs_glossary.link_first_uses(text, "glossary.md")
    assert linked == text.replace("A block", "A [block](glossary.md#block)")
    assert docs_glossary.first_unlinked("the owner, then [owner](glossary.md#owner)\n") == ["owner"]
    assert docs_glossary.first_unlinked(linked) == []
    # Code, headings, other links and rendered blocks are not prose; `import form` is not `form`.
    skipped = "```\nblock\n```\n[a block](x.md) <!-- t: begin -->site<!-- t: end --> the import form\n"
    assert docs_glossary.first_unlinked(skipped) == ["import-form"]
    assert docs_glossary.first_unlinked("a per-block call, a warm-up\n") == []
