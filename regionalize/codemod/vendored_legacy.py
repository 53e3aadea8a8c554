"""Vendored copies as files hold them, for a rewrite that moves them: the import of the sub-package that
`--vendor` writes now (`runtime_copy.py`), and the copies of earlier releases, which kept the runtime's
private names (`shared/helpers.py` lists those they wrote):

- in a package, `<top>/_regionalize.py`, the runtime joined into one module, and each rewritten file
  importing its helpers by name (`from .._regionalize import _regionalize_blocks`);
- in a file outside any package, the helpers it called inline, between two marker comments.

`remove` takes a file's copy out: a run with `--vendor` then binds the sub-package, one without it
`import regionalize` (RGZ005). A package directory shadows a module of its name, so the joined module is
deleted when the sub-package is written, and the runner refuses while a file the run does not rewrite
still imports it (`importers`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from regionalize.codemod.runtime_copy import MARK, MODULE, folder_for, import_dots, package_root, version_of
from regionalize.codemod.runtime_copy import vendor_import_line as _vendor_import_line
from regionalize.shared.sites import label

BEGIN = "# regionalize runtime {version}: begin (written by regionalize, which updates it; do not edit)"
END = "# regionalize runtime: end"
# The inline copy, with the blank lines written before it.
_CHUNK = re.compile(
    r"(?P<blank>(?:^\r?\n){0,2})^# regionalize runtime \d+: begin.*?^# regionalize runtime: end[^\n]*\n",
    re.M | re.S,
)
_MAX_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class Removed:
    """A vendored copy taken out of a file that moves to another form."""

    line: int  # 1-based, in the text it was taken from
    text: str  # what it was, for the site line
    copy: bool = False  # a copy of the package's, left on disk


def remove(code: str, path: str | None) -> tuple[str, Removed | None]:
    """`code` without the vendored copy it uses: its inline copy, the import of its package's joined module,
    or the import of the sub-package (the file's own statements, whatever its path)."""
    chunk = _chunk(code)
    if chunk is not None:
        start = chunk.start() + len(chunk.group("blank"))
        version = version_of(code[start:]) or 0
        size = code.count("\n", start, chunk.end())
        removed = Removed(
            code.count("\n", 0, start) + 1, f"the inline copy of runtime {version} ({size} lines)"
        )
        return code[: chunk.start()] + code[chunk.end() :], removed
    importing, copy, first = _copy_import(code, path)
    if importing is None:
        return code, None
    shown = "the runtime copy" if copy is None else f"`{label(copy)}`"
    version = _version(first)
    shown += f" (runtime {version})" if version else ""
    removed = Removed(code.count("\n", 0, importing.start()) + 1, f"the import of {shown}", copy=True)
    return code[: importing.start()] + code[importing.end() :], removed


def _copy_import(code: str, path: str | None) -> tuple[re.Match[str] | None, Path | None, Path | None]:
    """The import of a copy that `code` holds, the copy, and the file whose first line gives its version:
    an earlier release's joined module, or the sub-package."""
    root = package_root(Path(path)) if path else None
    if path and root and (found := _import_line(code, import_dots(Path(path), root))):
        return found, root / f"{MODULE}.py", root / f"{MODULE}.py"
    folder = folder_for(path)
    return _vendor_import_line(code), folder, folder / "__init__.py" if folder else None


def _version(file: Path | None) -> int | None:
    if file is None:
        return None
    try:
        with file.open(encoding="utf-8") as handle:
            return version_of(handle.readline())
    except (OSError, ValueError):
        return None


def _chunk(code: str) -> re.Match[str] | None:
    # The search tries its pattern at every position of the file; most files hold no copy at all.
    return _CHUNK.search(code) if MARK in code else None


def inline_lines(code: str) -> range:
    """The lines (1-based) of the file's inline copy, written by regionalize; empty when it has none."""
    chunk = _chunk(code)
    if chunk is None:
        return range(0)
    first = code.count("\n", 0, chunk.start() + len(chunk.group("blank"))) + 1
    return range(first, code.count("\n", 0, chunk.end()) + 1)


def _import_line(code: str, dots: str) -> re.Match[str] | None:
    """The import an earlier regionalize wrote: from the top folder's joined module, of its helpers alone.
    A module of the user's of that name deeper in the package, or other names, are the user's own."""
    if f"{MODULE} import" not in code:
        return None
    return re.search(
        rf"^from {re.escape(dots)}{MODULE} import _regionalize_\w+(?:, _regionalize_\w+)*\r?\n", code, re.M
    )


def joined_module(root: Path) -> Path | None:
    """The joined module an earlier regionalize wrote at the top folder `root`, if it is there."""
    module = root / f"{MODULE}.py"
    return module if module.is_file() and _version(module) is not None else None


def importers(root: Path) -> list[Path]:
    """The files of the package at `root` that import its joined module, as an earlier regionalize wrote."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            file = Path(folder) / name
            try:
                if file.stat().st_size > _MAX_BYTES or not file.is_file():  # a FIFO would wait for a writer
                    continue
                text = file.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if _import_line(text, import_dots(file, root)) is not None:
                found.append(file)
    return found
