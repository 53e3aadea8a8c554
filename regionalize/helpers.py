"""Where a rewritten file gets the runtime helpers it calls (`runtime/`, read as text: no torch here).

The runtime is written in parts, one job each (`runtime/owner.py`, `regions.py`, `kv.py`, `fixes.py`,
`bypass.py`), and a rewrite gets them joined into one module (`runtime_text`): the header and docstring of
`runtime/__init__.py`, the parts' imports once, then each part's code, its imports of the other parts
left out since they are one module then.

A file inside a package imports them, in one line, from `_regionalize.py`, a copy of the runtime that the
runner keeps once per package, at its top folder: over a whole zoo, the helpers are written once and
fixed in one place. A file outside any package holds the helpers it calls inline, between two marker
comments. Either way the helpers placed are found from the names the file calls, so a second pass
places the same ones, and brings an outdated copy up to date, and otherwise changes nothing.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

RUNTIME = Path(__file__).with_name("runtime")
PARTS = ("owner", "regions", "kv", "fixes", "bypass")  # in the order the joined module holds them
MODULE = "_regionalize"  # the package's copy: `<top package>/_regionalize.py`
BEGIN = "# regionalize runtime {version}: begin (written by regionalize, which updates it; do not edit)"
END = "# regionalize runtime: end"
_NAME = re.compile(r"\b_regionalize_\w+\b")
# The inline copy, with the blank lines written before it.
_CHUNK = re.compile(
    r"(?P<blank>(?:^\r?\n){0,2})^# regionalize runtime \d+: begin.*?^# regionalize runtime: end[^\n]*\n",
    re.M | re.S,
)
_MARK = "# regionalize runtime "  # what every inline copy's first line starts with
_VERSION = re.compile(r"# regionalize runtime (\d+)")
_DEFINED = re.compile(r"^def (_regionalize_\w+)|^(_regionalize_\w+) *=(?!=)", re.M)


@dataclass(frozen=True)
class _Section:
    name: str
    text: str
    needs: frozenset[str]  # other sections it calls


@cache
def runtime_text() -> str:
    """The runtime as the one module a rewrite imports or holds in part (see the module's docstring)."""
    imports: dict[str, None] = {}
    bodies = []
    for part in PARTS:
        text = (RUNTIME / f"{part}.py").read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        statements = ast.parse(text).body
        for statement in statements:
            if isinstance(statement, ast.Import):
                imports.update(dict.fromkeys(f"import {alias.name}\n" for alias in statement.names))
        code = [s for s in statements if not isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr))]
        bodies.append("".join(lines[_start(code[0], lines) - 1 :]).strip("\n") + "\n")
    standard = sorted(line for line in imports if line.split()[1] in sys.stdlib_module_names)
    others = sorted(line for line in imports if line not in standard)
    head = (RUNTIME / "__init__.py").read_text(encoding="utf-8")
    return f"{head}\n{''.join(standard)}\n{''.join(others)}\n" + "\n\n".join(bodies)


def _start(statement: ast.stmt, lines: list[str]) -> int:
    """The first line of `statement`, with its decorators and the comment lines right above it."""
    first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", []))])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return first


def version_of(text: str) -> int | None:
    match = _VERSION.match(text)
    return int(match.group(1)) if match else None


VERSION = version_of(runtime_text()) or 0


@cache
def _sections() -> dict[str, _Section]:
    """The runtime's top-level statements by name, an import by `import NAME`, each with what it needs."""
    text = runtime_text()
    lines = text.splitlines(keepends=True)
    found: dict[str, _Section] = {}
    for statement in ast.parse(text).body:
        body = "".join(lines[_start(statement, lines) - 1 : statement.end_lineno])
        if isinstance(statement, ast.Import):
            name = "import " + statement.names[0].name
        elif isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
            name = statement.name
        elif isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
        else:
            continue  # the docstring
        found[name] = _Section(name, body, frozenset())
    for name, section in found.items():
        words = set(re.findall(r"\w+", section.text))
        needs = {other for other in found if other.removeprefix("import ") in words} - {name}
        found[name] = _Section(name, section.text, frozenset(needs))
    return found


def _closure(names: set[str]) -> list[str]:
    """The sections `names` call, with those they call in turn, in the runtime's order."""
    sections, todo, seen = _sections(), list(names), set()
    while todo:
        name = todo.pop()
        if name in sections and name not in seen:
            seen.add(name)
            todo += sections[name].needs
    return [name for name in sections if name in seen]


def package_root(path: Path) -> Path | None:
    """The top folder of the package holding `path`, or None for a file outside any package."""
    folder = path.resolve().parent
    if not (folder / "__init__.py").is_file():
        return None
    while (folder.parent / "__init__.py").is_file():
        folder = folder.parent
    return folder


@dataclass
class Placed:
    code: str
    module: Path | None = None  # the package's runtime copy this file imports from


def place(code: str, path: str | None, at: int) -> Placed:
    """`code` with the helpers it calls placed, at line index `at` (after the imports) unless already
    there: one import in a package, else inline. A helper the file defines itself (an older rewrite's)
    stays as it is."""
    # The search tries its pattern at every position of the file; most files hold no copy at all.
    chunk = _CHUNK.search(code) if _MARK in code else None
    outside = code if chunk is None else code[: chunk.start()] + code[chunk.end() :]
    importing = _import_line(outside)
    called = set(_NAME.findall(outside if importing is None else outside.replace(importing.group(0), "")))
    called = (called & set(_sections())) - {a or b for a, b in _DEFINED.findall(outside)}
    if not called:  # nothing calls the helpers any more: an import or inline copy left is dead code
        return Placed(outside if importing is None else outside.replace(importing.group(0), "", 1))
    root = package_root(Path(path)) if path else None
    newline = "\r\n" if "\r\n" in code else "\n"
    if root is not None:
        line = f"from {_dots(Path(path), root)}{MODULE} import {', '.join(sorted(called))}{newline}"
        if importing is not None:
            return Placed(code.replace(importing.group(0), line, 1), root / f"{MODULE}.py")
        return Placed(_insert(code, at, line), root / f"{MODULE}.py")
    chosen = [_sections()[name] for name in _closure(called)]
    imports = "".join(c.text for c in chosen if c.name.startswith("import "))
    defs = "\n\n\n".join(c.text.rstrip("\n") for c in chosen if not c.name.startswith("import "))
    body = imports + "\n\n" + defs
    text = f"{BEGIN.format(version=VERSION)}\n{body}\n{END}\n".replace("\n", newline)
    if chunk is not None:
        return Placed(code[: chunk.start()] + chunk.group("blank") + text + code[chunk.end() :])
    return Placed(_insert(code, at, newline * 2 + text))


def pending_module(file: Path) -> str | None:
    """The text `file` (a package's runtime copy) should get, or None when it is up to date: missing or
    older than this runtime. A copy from a newer regionalize is left alone."""
    try:
        current = file.read_text(encoding="utf-8")
    except OSError:
        return runtime_text()
    if current == runtime_text() or (version_of(current) or 0) > VERSION:
        return None
    return runtime_text()


def _import_line(code: str) -> re.Match[str] | None:
    return re.search(rf"^from \.+{MODULE} import [\w, ]+\r?\n", code, re.M)


def _dots(path: Path, root: Path) -> str:
    return "." * len(path.resolve().parent.relative_to(root).parts) + "."


def _insert(code: str, at: int, text: str) -> str:
    lines = code.splitlines(keepends=True)
    lines[at:at] = [text]
    return "".join(lines)
