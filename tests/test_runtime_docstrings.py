"""The runtime's docstrings stay short and timeless: none is longer than the code under it
(scripts/docstring_lengths.py), none quotes a measured figure or a year, and every docs page they link to
exists (docs/design.md#runtime-notes)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "regionalize" / "runtime"
sys.path.insert(0, str(ROOT / "scripts"))

import docstring_lengths  # noqa: E402

FIGURE = re.compile(r"\d+(\.\d+)?\s?(s|ms|us|x|%|GB|MB)\b")
YEAR = re.compile(r"\b20\d\d\b")
LINK = re.compile(r"docs/[\w./-]+\.md(?:#[\w-]+)?")


def _docstrings() -> list[tuple[str, str]]:
    """Every docstring of the runtime, with the file and line it is at."""
    found = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, documented) and (text := ast.get_docstring(node, clean=False)):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}"
                found.append((where, text))
    return found


def test_no_runtime_docstring_is_longer_than_its_code() -> None:
    found = docstring_lengths.collect([RUNTIME])
    assert len(found) > 100  # the walk reads the runtime
    offenders = [f"{d.path.relative_to(ROOT)}:{d.line} {d.name}" for d in found if d.too_long]
    assert not offenders


def test_no_runtime_docstring_quotes_a_figure_or_a_year() -> None:
    quoted = [
        (where, m[0]) for where, text in _docstrings() for m in (FIGURE.search(text), YEAR.search(text)) if m
    ]
    assert not quoted


def test_every_docs_page_a_runtime_docstring_or_comment_links_exists() -> None:
    """A link names a page of docs/ and, after `#`, one of its headings as GitHub anchors it."""
    broken = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for link in LINK.findall(path.read_text(encoding="utf-8")):
            page, _, anchor = link.partition("#")
            if not (ROOT / page).is_file() or (anchor and anchor not in _anchors(ROOT / page)):
                broken.append(f"{path.relative_to(ROOT)}: {link}")
    assert not broken


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (as tests/test_docs.py reads them)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    slugs = [
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, re.M)
    ]
    return set(slugs)


def test_each_package_docstring_maps_every_module_of_its_package() -> None:
    """`runtime/__init__.py` and `internals/__init__.py` name each of their modules with what it does."""
    for package in (RUNTIME, RUNTIME / "internals"):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
        modules = [p.name for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
        assert [name for name in modules if f"`{name}`" not in doc] == [], package


def test_the_length_check_finds_a_docstring_longer_than_its_code(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        '"""A module."""\n\n\n'
        'def short(x):\n    """Returns x.\n\n    Two more lines\n    than its code."""\n    return x\n\n\n'
        'def fine(x):\n    """Returns x plus one."""\n    # a comment is not code\n    return x + 1\n\n\n'
        'class Error(Exception):\n    """A one-line docstring passes even with no code under it."""\n',
        encoding="utf-8",
    )
    found = {d.name: d for d in docstring_lengths.collect([module])}
    assert (found["short"].lines, found["short"].code, found["short"].too_long) == (4, 1, True)
    assert (found["fine"].lines, found["fine"].code, found["fine"].too_long) == (1, 1, False)
    assert not found["Error"].too_long and not found["module"].too_long
    assert docstring_lengths.main([str(module)]) == 1
    assert docstring_lengths.main([str(RUNTIME)]) == 0


def test_the_figure_and_year_patterns_match_what_they_must() -> None:
    assert FIGURE.search("0.13 s of 0.70 s") and FIGURE.search("1.05x") and FIGURE.search("3 GB")
    assert YEAR.search("measured on 2026-12-02")
    assert not FIGURE.search("torch 2.11 to 2.15") and not YEAR.search("issue 142183")
