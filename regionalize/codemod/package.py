"""What the rest of a file's package defines, for the names the file imports from it: container subclasses,
classes that build submodules (blocks) or only tensors (leaves), and clone helpers.

So an imported class is judged by its definition, as one defined in the file is, not by its name. Each
module is read with `ast` once per process (again if the file changes), only when a name leads to it.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from regionalize.codemod import declarations, prescan
from regionalize.codemod.definitions import Definition

_MAX_BYTES = 10 * 1024 * 1024
_MAX_HOPS = 8  # re-exports followed, as an `__init__.py` importing from a submodule
# The classes of a module whose own repeated blocks the codemod compiles (the codemod's own passes over
# that module), each with whether they are nested regions of it (a stage its holder's owner takes):
# handed in from above, since the codemod itself reads packages through this module.
FindHolders = Callable[[Path], Mapping[str, bool]]


def _no_holders(file: Path) -> Mapping[str, bool]:
    return {}


def module_name_for(path: Path) -> tuple[Path, str]:
    """(import root, dotted name): climb while folders are packages, as Python's import system would.

    A file inside an installed library gets its real name (`transformers.models.llama.modeling_llama`),
    which is what makes `from ...modeling_utils import X` work; a stand-alone script gets its stem.
    """
    folder = path.parent
    # A script's stem need not be an identifier (`model.in.py`): it is executed, not imported, by name.
    parts = [path.stem if (folder / "__init__.py").is_file() else re.sub(r"\W", "_", path.stem)]
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return folder, ".".join(reversed(parts))


class Packages:
    """The packages met in a run, their modules read on demand and kept while their files stay the same."""

    def __init__(self, containers: frozenset[str] = frozenset(), holders: FindHolders = _no_holders) -> None:
        self.containers = containers  # the `containers` setting, for the modules read too
        self._find_holders = holders
        self._holders: dict[Path, tuple[tuple[int, int], Mapping[str, bool]]] = {}
        self._finding: set[Path] = set()
        self._read: dict[Path, tuple[tuple[int, int], prescan.FileFacts | None]] = {}
        self._reading: list[Path] = []
        self._partial: set[Path] = set()
        self._read_again: set[Path] = set()
        self._declared: dict[Path, list[tuple[Path, declarations.Declaration]]] = {}

    def lookup(self, path: str | Path) -> prescan.Lookup:
        """Resolve the names a file imports (as `prescan.FileFacts.resolve` spells them) in its package."""
        where = _package_of(path)
        if where is None:
            return prescan.nothing  # a stand-alone script: no package to read
        root, here = where
        found: dict[str, Definition | None] = {}

        def find(name: str) -> Definition | None:
            if name not in found:
                found[name] = self._define(root, here, name, _MAX_HOPS)
            return found[name]

        return find

    def declared(
        self, path: str | Path, own: list[declarations.Declaration]
    ) -> list[declarations.Declaration]:
        """The `_repeated_blocks` declared anywhere in the file's top package (read once per process),
        the file's from `own`, the declarations of the text being rewritten, in place of those on disk:
        the two differ for standard input (an editor's unsaved buffer) and for a caller's own text."""
        file = Path(os.path.abspath(path))
        if not (file.parent / "__init__.py").is_file():
            return []
        root, module = module_name_for(file)
        top = root / module.split(".")[0]
        if top not in self._declared:
            self._declared[top] = _repeated_blocks(top)
        own = [d for d in own if d.attribute == "_repeated_blocks"]
        result: list[declarations.Declaration] = []
        for where, declaration in self._declared[top]:
            if where != file:
                result.append(declaration)
            elif own:  # in the place the file's came, so that messages cite the same first one
                result += own
                own = []
        return result + own

    def _define(self, root: Path, here: list[str], name: str, hops: int) -> Definition | None:
        absolute = _absolute(here, name)
        if absolute is None or len(absolute) < 2 or absolute[0] != here[0]:
            return None  # outside the package: torch, another library
        module, attr = absolute[:-1], absolute[-1]
        file = _module_file(root, module)
        facts = self._facts(file) if file is not None else None
        if facts is None:
            return None
        if attr in facts.holds_submodules:
            return Definition(
                facts.containers.get(attr),
                facts.holds_submodules[attr],
                builds_itself=attr in facts.own_init,
                holds_compiled=partial(self._held, file, attr, False),
                owns_regions=partial(self._held, file, attr, True),
            )
        if attr in facts.clone_helpers:
            return Definition(clones=True)
        if attr in facts.factories:
            return Definition(returns=_absolute_names(module, file, facts.factories[attr], facts))
        if attr in facts.imports and hops > 0:  # re-exported: follow it where it comes from
            package = module if file.name == "__init__.py" else module[:-1]
            return self._define(root, package, facts.imports[attr], hops - 1)
        return None

    def _held(self, file: Path, name: str, regions: bool) -> bool:
        """Does class `name` of `file` hold compiled blocks (with `regions`: as nested regions of it)? Found
        once per module and version of its file. A module met again while its own holders are being found
        (an import cycle) holds none as far as that search knows."""
        try:
            stat = file.stat()
        except OSError:
            return False
        stamp = (stat.st_mtime_ns, stat.st_size)
        if file not in self._holders or self._holders[file][0] != stamp:
            if file in self._finding:
                return False
            self._finding.add(file)
            try:
                self._holders[file] = (stamp, self._find_holders(file))
            finally:
                self._finding.discard(file)
        held = self._holders[file][1]
        return held.get(name, False) if regions else name in held

    def _facts(self, file: Path) -> prescan.FileFacts | None:
        try:
            stat = file.stat()
        except OSError:
            return None
        if file in self._reading:
            # An import cycle: this module is known once it is read. The ones read meanwhile saw it
            # unknown, so they are not kept, and are read again (once) when next asked for.
            self._partial.update(self._reading[self._reading.index(file) + 1 :])
            return None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if file in self._read and self._read[file][0] == stamp:
            return self._read[file][1]
        facts = None
        self._reading.append(file)
        try:
            if stat.st_size <= _MAX_BYTES:
                tree = ast.parse(file.read_bytes())
                facts = prescan.scan(tree, self.containers, self.lookup(file), calls=False)
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            facts = None
        finally:
            self._reading.pop()
        if file in self._partial and file not in self._read_again:
            self._partial.discard(file)
            self._read_again.add(file)  # once more at most: cycles are common, each read is a parse
        else:
            self._read[file] = (stamp, facts)
        return facts


def _package_of(path: str | Path) -> tuple[Path, list[str]] | None:
    """The import root and the dotted name of the package of the file at `path`; None outside any."""
    file = Path(os.path.abspath(path))
    if not (file.parent / "__init__.py").is_file():
        return None
    root, module = module_name_for(file)
    # The package from the folders: a stem need not be a name (`model.in.py`, a fixture's input).
    return root, module.removesuffix("." + file.stem).split(".")


def module_file(path: str | Path, name: str) -> Path | None:
    """The file of the module that the file at `path` imports as `name` (`.layers`, `lib.layers`), when it
    is a module of the file's top package; None for any other."""
    where = _package_of(path)
    if where is None:
        return None
    root, here = where
    absolute = _absolute(here, name)
    if not absolute or absolute[0] != here[0]:
        return None
    return _module_file(root, absolute)


def _absolute(here: list[str], name: str) -> list[str] | None:
    """`..layers.Block` imported in package a.b.c -> [a, b, layers, Block]; None above the top package."""
    level = len(name) - len(name.lstrip("."))
    rest = [part for part in name[level:].split(".") if part]
    if level == 0:
        return rest
    if level - 1 >= len(here):
        return None
    return here[: len(here) - (level - 1)] + rest


def _absolute_names(
    module: list[str], file: Path, names: tuple[str, ...], facts: prescan.FileFacts
) -> tuple[str, ...]:
    """Names resolved in a module, made absolute: a class of the module itself is named there bare."""
    package = module if file.name == "__init__.py" else module[:-1]
    found = []
    for name in names:
        if name.startswith("."):
            parts = _absolute(package, name)
        elif "." not in name and name in facts.holds_submodules:
            parts = [*module, name]
        else:
            parts = name.split(".")
        if parts:
            found.append(".".join(parts))
    return tuple(found)


def _repeated_blocks(top: Path) -> list[tuple[Path, declarations.Declaration]]:
    found = []
    for folder, _, names in os.walk(top):
        for name in sorted(n for n in names if n.endswith(".py")):
            if not (Path(folder) / name).is_file():  # a FIFO would wait for a writer
                continue
            try:
                source = (Path(folder) / name).read_bytes()
                if len(source) > _MAX_BYTES or b"_repeated_blocks" not in source:
                    continue
                tree = ast.parse(source)
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                continue
            file = Path(folder) / name
            found += [(file, d) for d in declarations.read(tree) if d.attribute == "_repeated_blocks"]
    return found


def _module_file(root: Path, module: list[str]) -> Path | None:
    base = root.joinpath(*module)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None
