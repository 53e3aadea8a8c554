"""`--vendor`: the runtime package (`regionalize/runtime/`, read as text: no torch here) copied into the
user's tree as a sub-package, `_regionalize/`, that a rewritten file binds with one import.

The copy is the runtime's modules verbatim, each with the runtime's header line first (`runtime/__init__.py`
has it; the others get it), so its relative imports work as they are and the codemod needs nothing of the
runtime but its public API: a rewritten file's calls are the import form's (`regionalize.compile_region(
*self.layers, owner=self)`) and only its import differs (`vendor_import`):

- in a package, one copy at the top folder, `<top>/_regionalize/`, bound by `from .. import _regionalize
  as regionalize` (as many dots as the file's depth): over a whole zoo the runtime is written once;
- a file outside any package gets the copy beside it, bound by `import _regionalize as regionalize`. A
  script's folder is the first entry of `sys.path`, and a module imported from a folder has that folder
  on it, so both find it; a file executed from elsewhere by path (`runpy`, a spec from its location) must
  have its folder on `sys.path`.

The header's version tells a copy regionalize wrote from a folder of the user's (`foreign_module`), never
written over; a second run changes nothing, an older copy is brought up to date, a newer one left alone
(`pending`). Copies written by earlier releases are read by `vendored_legacy.py`.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from regionalize.shared.source_files import SourceFile, write_atomically

RUNTIME = Path(__file__).parents[1] / "runtime"  # regionalize/runtime
MODULE = "_regionalize"  # the copy: `<top package>/_regionalize/`, or beside a lone file
NAME = "regionalize"  # what the import binds in a rewritten file, as the import form's `import regionalize`
# What the first line of every copy's module starts with, whatever its version: a folder of that name whose
# `__init__.py` lacks it is the user's own, never overwritten.
MARK = "# regionalize runtime "
_VERSION = re.compile(r"# regionalize runtime (\d+)")
_INIT = "__init__.py"


def version_of(text: str) -> int | None:
    match = _VERSION.match(text)
    return int(match.group(1)) if match else None


def _name(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


@cache
def modules() -> dict[str, str]:
    """The copy's files by path in it (`internals/cpu.py`): the runtime's modules, each with the runtime's
    header line first."""
    texts = {_name(p, RUNTIME): p.read_text(encoding="utf-8") for p in sorted(RUNTIME.rglob("*.py"))}
    header = texts[_INIT].partition("\n")[0] + "\n"
    return {name: text if text.startswith(MARK) else header + text for name, text in texts.items()}


VERSION = version_of(modules()[_INIT]) or 0


def package_root(path: Path) -> Path | None:
    """The top folder of the package holding `path`, or None for a file outside any package."""
    folder = path.resolve().parent
    if not (folder / _INIT).is_file():
        return None
    while (folder.parent / _INIT).is_file():
        folder = folder.parent
    return folder


def import_dots(path: Path, root: Path) -> str:
    """The dots of a relative import of the top folder `root` from the file at `path`."""
    return "." * len(path.resolve().parent.relative_to(root).parts) + "."


def folder_for(path: str | None) -> Path | None:
    """Where the copy the file at `path` imports lives; None for a text with no file."""
    if path is None:
        return None
    root = package_root(Path(path))
    return (root if root is not None else Path(path).resolve().parent) / MODULE


def vendor_import(path: str | None) -> str:
    """The statement that binds the copy in the file at `path` as the import form binds regionalize."""
    root = package_root(Path(path)) if path else None
    if root is None:
        return f"import {MODULE} as {NAME}"
    return f"from {import_dots(Path(path or ''), root)} import {MODULE} as {NAME}"


def vendor_import_line(code: str) -> re.Match[str] | None:
    """The line `vendor_import` wrote in `code`, with any number of dots."""
    return _IMPORT_LINE.search(code) if MODULE in code else None


_IMPORT_LINE = re.compile(rf"^(?:from \.+ import {MODULE}|import {MODULE}) as {NAME}[ \t]*\r?\n", re.M)


@dataclass
class Placed:
    """A rewrite's text with what it binds to reach the runtime (`collisions.py` checks them free)."""

    code: str
    module: Path | None = None  # the copy the file imports (`folder_for`), with --vendor
    # The names bound: `regionalize`, and the private helpers of an earlier release the file calls.
    binds: frozenset[str] = frozenset()


def is_copy(folder: Path) -> bool:
    """Did regionalize write the folder (its `__init__.py` starts with the runtime's header)?"""
    return written_by_us(folder / _INIT)


def written_by_us(path: Path) -> bool:
    """Opened without blocking, as the runner reads source: a FIFO of the name would hold the run."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            return stat.S_ISREG(os.fstat(descriptor).st_mode) and handle.read(len(MARK)) == MARK.encode()
    except OSError:  # unreadable: it cannot be told from the user's own, so it is not overwritten
        return False


def foreign_module(root: Path) -> tuple[Path, str] | None:
    """What takes the copy's name in the folder `root` without being a copy regionalize wrote, and what it
    is: a folder of the user's (a package, or a namespace package, which a package would hide), a compiled
    module (an extension or a `.pyc`), or a file of the user's (a `_regionalize.py` an earlier regionalize
    wrote is not: `vendored_legacy.py` moves it)."""
    folder = root / MODULE
    if folder.is_dir() and not is_copy(folder):
        return folder, "folder"
    for suffix in (*importlib.machinery.EXTENSION_SUFFIXES, *importlib.machinery.BYTECODE_SUFFIXES):
        if os.path.lexists(root / f"{MODULE}{suffix}"):
            return root / f"{MODULE}{suffix}", "compiled module"
    module = root / f"{MODULE}.py"
    if os.path.lexists(module) and not (written_by_us(module) and _versioned(module)):
        return module, "file"
    return None


def _versioned(module: Path) -> bool:
    try:
        with module.open(encoding="utf-8") as handle:
            return version_of(handle.readline()) is not None
    except (OSError, ValueError):
        return False


# What a run changes in a copy: each file's text before and after ("" for none).
Changes = dict[Path, tuple[str, str]]


def pending(folder: Path) -> Changes:
    """What the copy at `folder` needs to be this runtime's: its files missing or differing, and files of an
    older runtime that this one no longer has. Nothing for a copy up to date, or from a newer regionalize."""
    present = {_name(p, folder): p for p in folder.rglob("*.py")} if folder.is_dir() else {}
    old = {name: _read(path) for name, path in present.items()}
    if (version_of(old.get(_INIT, "")) or 0) > VERSION:
        return {}
    changes = {folder / n: (old.get(n, ""), text) for n, text in modules().items() if old.get(n) != text}
    stale = {folder / n: (t, "") for n, t in old.items() if n not in modules() and t.startswith(MARK)}
    return changes | stale


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""


def write(folder: Path, changes: Changes) -> None:
    """Write `changes` (`pending`'s) atomically: a new copy is made beside its place and renamed into it; an
    older one is rewritten file by file, `__init__.py` (its version) last, so that a run stopped midway
    leaves a copy that the next run finds outdated. OSError when it cannot."""
    if not folder.exists():
        temp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".regionalize-"))
        try:
            for path, (_, text) in changes.items():
                new = temp / path.relative_to(folder)
                new.parent.mkdir(exist_ok=True)
                write_atomically(str(new), _NEW, text)
            os.chmod(temp, 0o777 & ~_umask())
            os.rename(temp, folder)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return
    for path, (_, text) in sorted(changes.items(), key=lambda item: item[0] == folder / _INIT):
        if text:
            path.parent.mkdir(exist_ok=True)
            write_atomically(str(path), _NEW, text)
        else:
            path.unlink()


_NEW = SourceFile("", "utf-8", False)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
