"""The names a rewrite adds must be free (RGZ113): it never shadows the user's code, nor is shadowed by it.

A rewrite binds names in the file: `regionalize`, by `import regionalize` or, with `--vendor`, by the
import of the runtime copy (`runtime_copy.vendor_import`); and the private helper names of an earlier
release (`_regionalize_*`, `shared/helpers.py`) that the file calls, which the codemod converts. With
`--vendor`, the copy takes `_regionalize` in the top folder (or beside a lone file). Each must mean nothing
else already:

- a name bound that the file binds anywhere (a definition, an assignment, an import, a parameter): the
  calls are made inside methods, where a local of that name would be called instead; or that a star
  import of a module of the package may bring. A name with a leading underscore comes through a star
  import only when `__all__` lists it, so that is what is read; an `__all__` built any other way than
  from literal lists may list any name the module binds;
- the copy's name: a file or folder regionalize did not write, or a compiled module
  (`runtime_copy.foreign_module`; the runner reports an error for it too), or a binding of `_regionalize`
  at module level in the top `__init__.py`, which importing the copy would overwrite.

What regionalize wrote itself is not a collision: its imports of the copy, and an earlier release's
import of its joined module or inline copy between markers. A star import of a module outside the
package is not read, as nothing outside the package is.
"""

from __future__ import annotations

import ast
import functools
import stat
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from regionalize.codemod import import_form, package, runtime_copy, vendored_legacy
from regionalize.shared.sites import label, shown

_MAX_BYTES = 10 * 1024 * 1024
_MAX_HOPS = 8  # star imports followed through modules whose `__all__` is built
_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)
# Is this binding of the name regionalize's own (or the very module it imports)?
Ours = Callable[[ast.AST, str], bool]
# A node of a module that binds names, or may (an import), whether it is at module level, and its names.
Binder = tuple[ast.AST, bool, list[str]]


@dataclass(frozen=True)
class Clash:
    hint: str  # for the site lines: which name, and where it is taken
    # The package's runtime module, when a file or folder of the package's own takes its name: the runner
    # reports it as an error of the run.
    blocked: Path | None = None


def clash(tree: ast.Module, source: str, placed: runtime_copy.Placed, path: str | None) -> Clash | None:
    """The first reason the helpers placed in `source` (parsed as `tree`, the file at `path`) cannot go
    in, or None when every name they bind is free."""
    if not placed.binds:
        return None
    module = placed.module
    if module is not None:
        if foreign := runtime_copy.foreign_module(module.parent):
            taken, what = foreign
            return Clash(
                f"`{shown(label(taken))}` is the package's own {what}, not its runtime module", module
            )
        if found := _init_binding(module.parent, tree if path and _is_init(path, module.parent) else None):
            return Clash(found)
    inline = vendored_legacy.inline_lines(source)
    # The import of the package's copy is ours, also where the import form takes its place.
    root = runtime_copy.package_root(Path(path)) if path else None
    dots = runtime_copy.import_dots(Path(path), root) if path and root else None

    # Helpers are called inside methods, where a local of their name would be called instead: the
    # vendored helpers and the import form's module name are checked in every scope.
    private = {name for name in placed.binds if name.startswith("_") or name == import_form.NAME}

    def ours(node: ast.AST, name: str) -> bool:
        if getattr(node, "lineno", 0) in inline:
            return True
        if _imports_copy(node, dots):
            return True
        if isinstance(node, ast.ImportFrom):  # an earlier release's import of the package's joined copy
            return node.module == runtime_copy.MODULE and dots is not None and node.level == len(dots)
        # `import regionalize`, or a module the inline copy imports
        return (name not in private or name == import_form.NAME) and _imports_itself(node, name)

    file = Path(path) if path and module else None  # star imports are read in a package only
    if not _may_bind(source, placed.binds) and not (file and _top_star(tree)):
        return None  # the walk below would find nothing: most files hold none of the names
    for node, name in _bindings(tree, placed.binds, private, ours, file):
        if isinstance(node, ast.ImportFrom) and _star(node):
            return Clash(f"`{_star(node)}` (line {node.lineno}) may bring `{name}`")
        return Clash(f"`{name}` is already bound at line {getattr(node, 'lineno', '?')}")
    return None


def _is_init(path: str, root: Path) -> bool:
    return Path(path).resolve() == (root / "__init__.py").resolve()


def _init_binding(root: Path, tree: ast.Module | None) -> str | None:
    """Does the top `__init__.py` (`tree`, when it is the file rewritten) bind the runtime module's name?"""
    init = root / "__init__.py"
    read = _parse(init) if tree is None else None
    if tree is None and read is None:
        return None
    walked = read.binders if read else None
    for node, _ in _bindings(tree or read.tree, {runtime_copy.MODULE}, set(), _imports_itself, init, walked):
        return (
            f"`{shown(label(init))}` binds `{runtime_copy.MODULE}` (line {node.lineno}), "
            "the runtime module's name"
        )
    return None


def _imports_copy(node: ast.AST, dots: str | None) -> bool:
    """The statement `runtime_copy.vendor_import` writes, with the dots of the file's depth (`dots`)."""
    if isinstance(node, ast.ImportFrom):
        names, ok = node.names, dots is not None and node.module is None and node.level == len(dots)
    else:
        names, ok = getattr(node, "names", []), isinstance(node, ast.Import) and dots is None
    return ok and [(a.name, a.asname) for a in names] == [(runtime_copy.MODULE, runtime_copy.NAME)]


def _imports_itself(node: ast.AST, name: str) -> bool:
    """`import torch` binding `torch`; `from . import _regionalize` binding the runtime module."""
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == name and a.asname in (None, name) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 1 and node.module is None and name == runtime_copy.MODULE
    return False


def _bindings(
    tree: ast.Module,
    names: set[str] | frozenset[str],
    everywhere: set[str],
    ours: Ours,
    file: Path | None = None,
    walked: Iterable[Binder] | None = None,
    hops: int = _MAX_HOPS,
) -> Iterator[tuple[ast.AST, str]]:
    """The nodes that bind one of `names` and are not `ours`: at module level, or for the `everywhere`
    names in any scope; and the module-level star imports (of the package of `file`) that may bring one.
    `walked`: the tree's `_binders`, when they were found before."""
    for child, top, bound in _binders(tree) if walked is None else walked:
        for name in bound:
            if name in names and (top or name in everywhere) and not ours(child, name):
                yield child, name
        if top and file is not None and isinstance(child, ast.ImportFrom) and _star(child):
            yield from ((child, name) for name in sorted(_star_brings(file, child, names, hops)))


def _binders(tree: ast.Module) -> Iterator[Binder]:
    """The nodes of `tree` that bind a name or import, in the order `_bindings` reports them: a walk that
    is lazy, since the first binding found is the one reported."""
    stack: list[tuple[ast.AST, bool]] = [(tree, True)]  # a list, not recursion: an `ast` may be deep
    while stack:
        node, top = stack.pop()
        for child in ast.iter_child_nodes(node):
            stack.append((child, top and not isinstance(child, _SCOPES)))
            bound = _bound(child)
            if bound or isinstance(child, ast.ImportFrom):
                yield child, top, bound


def _bound(node: ast.AST) -> list[str]:
    """The names a node binds in its scope."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Name):
        return [node.id] if isinstance(node.ctx, ast.Store) else []
    if isinstance(node, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [a.asname or a.name for a in node.names if a.name != "*"]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return [node.name] if node.name else []
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    return []


def _star(node: ast.ImportFrom) -> str:
    """`from .utils import *` for a star import, else ''."""
    if not any(a.name == "*" for a in node.names):
        return ""
    return f"from {'.' * node.level}{node.module or ''} import *"


def _star_brings(file: Path, node: ast.ImportFrom, names: set[str] | frozenset[str], hops: int) -> set[str]:
    """Those of `names` (private, as ours are) that a star import of a module of the package may bring:
    those its `__all__` lists; with an `__all__` built another way, those the module binds or brings in
    turn by a star import of its own."""
    source = package.module_file(file, "." * node.level + (node.module or ""))
    read = _parse(source) if source is not None and hops > 0 else None
    if source is None or read is None:  # outside the package, not there, or a cycle: not read
        return set()
    if read.listed is not None:
        return set(names) & read.listed
    found = _bindings(read.tree, names, set(), _nothing_ours, source, read.binders, hops - 1)
    return {name for _, name in found}


def _nothing_ours(node: ast.AST, name: str) -> bool:
    return False


def _all(tree: ast.Module) -> set[str] | None:
    """The names `__all__` lists, from its literal lists (empty without one); None when it is built
    another way, so that any name may be in it."""
    listed: set[str] = set()
    for statement in tree.body:
        values: list[ast.expr] = []
        if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(_is_all(t) for t in targets) and statement.value is not None:
                values = [statement.value]
        elif (
            isinstance(statement, ast.Expr)
            and isinstance(call := statement.value, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and _is_all(call.func.value)
        ):
            values = [ast.List(elts=list(call.args))] if call.func.attr == "append" else list(call.args)
        for value in values:
            if not isinstance(value, (ast.List, ast.Tuple)) or not all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
            ):
                return None
            listed.update(e.value for e in value.elts if isinstance(e, ast.Constant))
    return listed


def _is_all(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "__all__"


class _Read:
    """A module of the package read from disk, with what the checks ask of it found once: every rewritten
    file of a package checks its top `__init__.py` (transformers': 806 lines, and a walk of it took 3 ms)."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree

    @functools.cached_property
    def binders(self) -> list[Binder]:
        return list(_binders(self.tree))

    @functools.cached_property
    def listed(self) -> set[str] | None:
        return _all(self.tree)


def _parse(file: Path) -> _Read | None:
    """The module at `file`, read once per version of it in a process: every rewritten file of a package
    asks for its top `__init__.py` (transformers': 7 ms a parse, over 650 files)."""
    try:
        found = file.stat()
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode) or found.st_size > _MAX_BYTES:  # a FIFO would wait for a writer
        return None
    return _read(file, found.st_mtime_ns, found.st_size)


@functools.lru_cache(maxsize=32)
def _read(file: Path, mtime_ns: int, size: int) -> _Read | None:
    try:
        return _Read(ast.parse(file.read_bytes()))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _may_bind(source: str, names: frozenset[str]) -> bool:
    """Might an identifier of `source` be one of `names`? Python reads an identifier as its NFKC form
    (a fullwidth `t` in `torch` binds `torch`), and an ASCII name is the NFKC form only of a spelling
    whose characters outside ASCII each decompose (NFKD) into ASCII letters of the name: without such a
    character in the file, the name must stand in it as it is."""
    if any(name in source for name in names):
        return True
    if source.isascii():
        return False
    if not all(name.isascii() for name in names):
        return True
    letters = set("".join(names))
    return any(_spells(char, letters) for char in set(source) if not char.isascii())


def _spells(char: str, letters: set[str]) -> bool:
    decomposed = _nfkd(char)
    return decomposed.isascii() and letters.issuperset(decomposed)


@functools.lru_cache(maxsize=4096)
def _nfkd(char: str) -> str:
    return unicodedata.normalize("NFKD", char)


def _top_star(tree: ast.Module) -> bool:
    """Is there a star import at module level (in no function or class), where `_bindings` reads them?
    Only statements are walked: an import is one, and no expression holds a statement."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ImportFrom) and _star(node):
            return True
        if not isinstance(node, _SCOPES):
            stack += (c for c in ast.iter_child_nodes(node) if isinstance(c, _STATEMENTS))
    return False


_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)
