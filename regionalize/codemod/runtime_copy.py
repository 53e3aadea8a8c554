"""Where a rewritten file gets the runtime helpers it calls (`runtime/`, read as text: no torch here).

The runtime is written in parts, one job each (`runtime/stack.py`, `frames.py`, `state.py`, `plan.py`,
`owner.py`, `outer.py`, `graphs.py`, `per_block.py`, `pieces.py`, `regions.py`, `nested.py`, `kv.py`,
`static.py`, `fixes.py`, `bypass.py`), and a rewrite gets them joined into one module (`runtime_text`):
the header and docstring of `runtime/__init__.py`, the parts' imports once, then each part's code, its
imports of the other parts left out since they are one module then.

A file inside a package imports them, in one line, from `_regionalize.py`, a copy of the runtime that the
runner keeps once per package, at its top folder: over a whole zoo, the helpers are written once and
fixed in one place. A file outside any package holds the helpers it calls inline, between two marker
comments. Either way the helpers placed are found from the names the file calls, so a second pass
places the same ones, and brings an outdated copy up to date, and otherwise changes nothing. Every copy
starts with the runtime's header: a file of the name without it is the package's own (`foreign_module`),
and the names a placement binds are checked free by `collisions.py`.
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import re
import stat
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from regionalize.codemod.nodes import split_lines
from regionalize.shared.sites import label

RUNTIME = Path(__file__).parents[1] / "runtime"  # regionalize/runtime
# In the order the joined module holds them: a part before any that calls it as it is defined (a decorator).
PARTS = (
    "stack",
    "internals",
    "threads",
    "frames",
    "state",
    "plan",
    "owner",
    "outer",
    "constants",
    "around",
    "graphs",
    "per_block",
    "pieces",
    "regions",
    "nested",
    "kv",
    "static",
    "fixes",
    "bypass",
)
MODULE = "_regionalize"  # the package's copy: `<top package>/_regionalize.py`
BEGIN = "# regionalize runtime {version}: begin (written by regionalize, which updates it; do not edit)"
END = "# regionalize runtime: end"
_NAME = re.compile(r"\b_regionalize_\w+\b")
# The inline copy, with the blank lines written before it.
_CHUNK = re.compile(
    r"(?P<blank>(?:^\r?\n){0,2})^# regionalize runtime \d+: begin.*?^# regionalize runtime: end[^\n]*\n",
    re.M | re.S,
)
# What the first line of every copy, inline or the package's, starts with, whatever its version: a file of
# that name without it is the package's own, never overwritten.
_MARK = "# regionalize runtime "
_VERSION = re.compile(r"# regionalize runtime (\d+)")


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
        lines = split_lines(text)
        statements = ast.parse(text).body
        for statement in statements:
            if isinstance(statement, ast.Import):
                imports.update(dict.fromkeys(f"import {alias.name}\n" for alias in statement.names))
        code = [s for s in statements if not isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr))]
        bodies.append("".join(lines[_start(code[0], lines) - 1 :]).strip("\n") + "\n")
    standard = sorted(line for line in imports if line.split()[1] in sys.stdlib_module_names)
    others = sorted(line for line in imports if line not in standard)
    init = (RUNTIME / "__init__.py").read_text(encoding="utf-8")
    head = "".join(split_lines(init)[: ast.parse(init).body[0].end_lineno])  # the header and docstring
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
    lines = split_lines(text)
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
    # The names the placed helpers bind in the file: those imported, or each definition and import of the
    # inline copy (`import torch` as `torch`).
    binds: frozenset[str] = frozenset()


def place(code: str, path: str | None, at: int) -> Placed:
    """`code` with the helpers it calls placed, at line index `at` (after the imports) unless already
    there: one import in a package, else inline. Whether the names it binds are free is for the caller
    to judge (`collisions.py`)."""
    chunk = _chunk(code)
    outside = code if chunk is None else code[: chunk.start()] + code[chunk.end() :]
    root = package_root(Path(path)) if path else None
    dots = import_dots(Path(path), root) if path and root else ""
    importing = _import_line(outside, dots) if dots else None
    called = set(_NAME.findall(outside if importing is None else outside.replace(importing.group(0), "")))
    called &= set(_sections())
    if not called:  # nothing calls the helpers any more: an import or inline copy left is dead code
        return Placed(outside if importing is None else outside.replace(importing.group(0), "", 1))
    newline = "\r\n" if "\r\n" in code else "\n"
    if root is not None:
        line = f"from {dots}{MODULE} import {', '.join(sorted(called))}{newline}"
        module, binds = root / f"{MODULE}.py", frozenset(called)
        if importing is not None:
            return Placed(code.replace(importing.group(0), line, 1), module, binds)
        return Placed(_insert(code, at, line), module, binds)
    chosen = [_sections()[name] for name in _closure(called)]
    binds = frozenset(c.name.removeprefix("import ") for c in chosen)
    imports = "".join(c.text for c in chosen if c.name.startswith("import "))
    defs = "\n\n\n".join(c.text.rstrip("\n") for c in chosen if not c.name.startswith("import "))
    body = imports + "\n\n" + defs
    text = f"{BEGIN.format(version=VERSION)}\n{body}\n{END}\n".replace("\n", newline)
    if chunk is not None:
        return Placed(code[: chunk.start()] + chunk.group("blank") + text + code[chunk.end() :], binds=binds)
    return Placed(_insert(code, at, newline * 2 + text), binds=binds)


@dataclass(frozen=True)
class Removed:
    """A vendored copy taken out of a file that moves to the import form."""

    line: int  # 1-based, in the text it was taken from
    text: str  # what it was, for the site line
    copy: bool = False  # a package's copy, left on disk


def remove(code: str, path: str | None) -> tuple[str, Removed | None]:
    """`code` without the vendored copy it uses: the import of its package's copy, or its inline copy."""
    chunk = _chunk(code)
    if chunk is not None:
        start = chunk.start() + len(chunk.group("blank"))
        version = version_of(code[start:]) or 0
        size = code.count("\n", start, chunk.end())
        removed = Removed(
            code.count("\n", 0, start) + 1, f"the inline copy of runtime {version} ({size} lines)"
        )
        return code[: chunk.start()] + code[chunk.end() :], removed
    root = package_root(Path(path)) if path else None
    importing = _import_line(code, import_dots(Path(path), root)) if path and root else None
    if importing is None or root is None:
        return code, None
    copy = root / f"{MODULE}.py"
    try:
        with copy.open(encoding="utf-8") as handle:
            version = version_of(handle.readline())
    except (OSError, ValueError):
        version = None
    shown_copy = f"`{label(copy)}`" + (f" (runtime {version})" if version else "")
    removed = Removed(code.count("\n", 0, importing.start()) + 1, f"the import of {shown_copy}", copy=True)
    return code[: importing.start()] + code[importing.end() :], removed


def _chunk(code: str) -> re.Match[str] | None:
    # The search tries its pattern at every position of the file; most files hold no copy at all.
    return _CHUNK.search(code) if _MARK in code else None


def inline_lines(code: str) -> range:
    """The lines (1-based) of the file's inline copy, written by regionalize; empty when it has none."""
    chunk = _chunk(code)
    if chunk is None:
        return range(0)
    first = code.count("\n", 0, chunk.start() + len(chunk.group("blank"))) + 1
    return range(first, code.count("\n", 0, chunk.end()) + 1)


def foreign_module(root: Path) -> tuple[Path, str] | None:
    """What takes the runtime module's name in the top folder `root` without being a copy regionalize
    wrote, and what it is: a file of the package's own (its first line is not a copy's), a folder (a
    package, which Python imports before a module, or a namespace package, which a module would hide), or
    a compiled module (an extension, which Python imports before a `.py`; a `.pyc`, which a `.py` hides)."""
    if (root / MODULE).is_dir():
        return root / MODULE, "folder"
    for suffix in (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.BYTECODE_SUFFIXES):
        if os.path.lexists(root / f"{MODULE}{suffix}"):
            return root / f"{MODULE}{suffix}", "compiled module"
    copy = root / f"{MODULE}.py"
    if os.path.lexists(copy) and not _written_by_us(copy):
        return copy, "file"
    return None


def _written_by_us(path: Path) -> bool:
    """Opened without blocking, as the runner reads source: a FIFO of the name would hold the run."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            return stat.S_ISREG(os.fstat(descriptor).st_mode) and handle.read(len(_MARK)) == _MARK.encode()
    except OSError:  # unreadable: it cannot be told from the package's own, so it is not overwritten
        return False


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


def _import_line(code: str, dots: str) -> re.Match[str] | None:
    """The import regionalize writes: from the top folder's copy, of its helpers alone. A module of the
    user's of that name deeper in the package, or other names, are the user's own import."""
    return re.search(
        rf"^from {re.escape(dots)}{MODULE} import _regionalize_\w+(?:, _regionalize_\w+)*\r?\n", code, re.M
    )


def import_dots(path: Path, root: Path) -> str:
    """The dots of a relative import of the top folder `root` from the file at `path`."""
    return "." * len(path.resolve().parent.relative_to(root).parts) + "."


def _insert(code: str, at: int, text: str) -> str:
    lines = split_lines(code)
    lines[at:at] = [text]
    return "".join(lines)
