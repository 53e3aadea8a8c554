"""A fast first look at a file with Python's own parser, before any LibCST work.

LibCST parses several times slower than `ast` and its visitors are slower still, while most of a model
file (configs, attention maths, docstrings) holds no site. So `ast` answers the file-wide questions
(imports, containers, what is compiled already, what the file's classes build); `parse_spans.py` says which
top-level statements can hold a site, and only those are parsed with LibCST and rewritten. The answers are
a `file_facts.FileFacts`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from regionalize.codemod import builds, declarations
from regionalize.codemod.file_facts import CONTAINERS, FileFacts, Lookup, nothing
from regionalize.codemod.nodes import Walked, dotted_name, strip_values, walk
from regionalize.shared import helpers

# Names that make a top-level statement worth a LibCST parse.
# The calls that compile their first argument: the API's, and an earlier release's helpers, as a module of
# the package read for what it holds (`transform._holders_of`) is read as it is on disk.
COMPILING_HELPERS = {
    helpers.COMPILE_DIRECT,
    helpers.COMPILE_REGION,
    helpers.DISPATCH,
    helpers.BLOCKS,
    helpers.CUDA_GRAPHS,
}
TORCH_MODULES = re.compile(r"^torch\.nn\.modules(\.\w+)?(?=\.)")


def scan(
    tree: ast.Module,
    containers: frozenset[str] = frozenset(),
    outside: Lookup = nothing,
    calls: bool = True,
    walked: Walked | None = None,
) -> FileFacts:
    """The file-wide facts; `outside` says what the file's package defines under the names it imports.

    Imported names the file derives classes from are looked up at once, and with `calls` the names it
    calls too (containers and clone helpers of the package, for the file being rewritten); the rest
    only when the patterns ask.
    """
    facts = FileFacts(outside=outside)
    facts.containers = {name: kind_by_name(name) for name in containers}
    # One walk: three over a 3,000-line modeling file were a sixth of a bulk run.
    walked = walked or Walked(tree)
    nodes = _sort_nodes(walked.nodes, facts)
    _normalize_imports(facts)
    # Before the classes, which may derive from these. Each name can mean reading another module.
    _look_up_imported(facts, {n for node in nodes.named for n in _called_or_derived(node, calls)})
    _read_top_level_builds(tree, facts, walked)
    facts.declarations = declarations.read(tree)
    if facts.declarations:
        facts.inside = declarations.inside(tree, {d.model for d in facts.declarations}, walked)
    _add_container_subclasses(facts, nodes.classes)
    _read_factories(tree, facts, walked)
    _read_top_level_names(tree, facts)
    _read_compiled_blocks(facts, nodes)
    _read_container_attrs(facts, nodes.assigns)
    return facts


@dataclass
class _Nodes:
    """The nodes of a file that `scan` reads further, each kind in the order of the walk."""

    loops: list[ast.For] = field(default_factory=list)
    assigns: list[ast.Assign | ast.AnnAssign] = field(default_factory=list)
    named: list[ast.Call | ast.ClassDef] = field(default_factory=list)  # what `_called_or_derived` reads
    classes: list[ast.ClassDef] = field(default_factory=list)


def _sort_nodes(everything: list[ast.AST], facts: FileFacts) -> _Nodes:
    """Sorts the walked nodes by kind, recording the imports and classes in `facts` on the way."""
    nodes = _Nodes()
    for node in everything:
        kind = type(node)  # one look-up per node, not a chain of isinstance: most nodes are none of these
        if kind is ast.Call:
            nodes.named.append(node)  # type: ignore[arg-type]
        elif kind not in _SCANNED:
            continue
        elif isinstance(node, ast.Import):
            _add_import(facts, node)
        elif isinstance(node, ast.ImportFrom):
            _add_import_from(facts, node)
        elif isinstance(node, ast.For):
            nodes.loops.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            nodes.assigns.append(node)
        elif isinstance(node, ast.ClassDef):
            facts.classes.append((node.name, node.lineno, node.end_lineno or node.lineno))
            nodes.named.append(node)
            nodes.classes.append(node)
    return nodes


def _add_import(facts: FileFacts, node: ast.Import) -> None:
    """Records the local names an `import` statement binds."""
    for alias in node.names:
        if alias.asname:
            facts.imports[alias.asname] = alias.name
        else:
            head = alias.name.split(".")[0]
            facts.imports[head] = head


def _add_import_from(facts: FileFacts, node: ast.ImportFrom) -> None:
    """Records the local names a `from ... import` statement binds (torch.nn's containers for a `*`)."""
    base = "." * node.level + (node.module or "")
    for alias in node.names:
        if alias.name == "*":
            if base in ("torch.nn", "torch.nn.modules"):
                facts.imports.update({n: f"torch.nn.{n}" for n in CONTAINERS})
            continue
        sep = "" if base.endswith(".") else "."
        facts.imports[alias.asname or alias.name] = f"{base}{sep}{alias.name}"


def _normalize_imports(facts: FileFacts) -> None:
    """Spells torch.nn's modules as torch.nn, and gives a container of the setting its imported name."""
    facts.imports = {k: TORCH_MODULES.sub("torch.nn", v) for k, v in facts.imports.items()}
    # A setting may name a class by its bare name; a file imports it under its dotted one.
    for full in facts.imports.values():
        if full.rsplit(".", 1)[-1] in facts.containers and full not in facts.containers:
            facts.containers[full] = facts.containers[full.rsplit(".", 1)[-1]]


def _look_up_imported(facts: FileFacts, used: set[str]) -> None:
    """Records which of the `used` imported names are the package's containers or clone helpers."""
    for local, full in facts.imports.items():
        if local not in used:
            continue
        defined = facts.outside(full)
        if defined and defined.container:
            facts.containers[full] = defined.container
        elif defined and defined.clones:
            facts.imported_clone_helpers.add(local)


def _read_top_level_builds(tree: ast.Module, facts: FileFacts, walked: Walked) -> None:
    """Records what each top-level class builds, the owners, the own `__init__`s and the clone helpers."""
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef):
            facts.holds_submodules[statement.name] = builds.holds_submodules(statement, facts, walked)
            if _has_method(statement, "forward"):
                facts.owners.append((statement.lineno, statement.end_lineno or statement.lineno))
            if _has_method(statement, "__init__"):
                facts.own_init.add(statement.name)
        elif isinstance(statement, ast.FunctionDef) and builds.makes_clones(statement, facts, walked):
            facts.clone_helpers.add(statement.name)


def _has_method(cls: ast.ClassDef, name: str) -> bool:
    """Does the class define a (plain) method of this name in its own body?"""
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in cls.body)


def _add_container_subclasses(facts: FileFacts, classes: list[ast.ClassDef]) -> None:
    """Records the file's subclasses of containers, in the order they are defined."""
    for cls in classes:
        kinds = [facts.container_kind(n) for b in cls.bases if (n := dotted_name(b))]
        if kind := next((k for k in kinds if k), None):
            facts.containers[cls.name] = kind


def _read_factories(tree: ast.Module, facts: FileFacts, walked: Walked) -> None:
    """Records the top-level functions that build a class; after the containers: a factory returns a
    block, not a container."""
    for statement in tree.body:
        if (
            isinstance(statement, ast.FunctionDef)
            and statement.name not in facts.clone_helpers
            and (returns := builds.returns_classes(statement, facts, walked))
        ):
            facts.factories[statement.name] = returns


def _read_top_level_names(tree: ast.Module, facts: FileFacts) -> None:
    """Records whether `torch` is a module-level name, and the top-level definitions."""
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            facts.torch_bound |= any(
                a.name.split(".")[0] == "torch" and a.asname in (None, "torch") for a in statement.names
            )
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            facts.top_level_defs.add(statement.name)


def _read_compiled_blocks(facts: FileFacts, nodes: _Nodes) -> None:
    """Records the iterables whose blocks loops or starred calls compile, and which make them regions of
    `self`."""
    for loop in nodes.loops:
        if _compiles(loop, facts):
            if _regional(loop):
                facts.regional_loops.append(loop.lineno)
            _compiled(facts, loop.iter)
    # `regionalize.compile_region(*self.layers, owner=self)`: a loop's work in one call
    for call in nodes.named:
        if type(call) is ast.Call and (starred := _starred(call)) is not None:
            if _owned_by_self(call):
                facts.regional_loops.append(call.lineno)
            _compiled(facts, starred)


def _read_container_attrs(facts: FileFacts, assigns: list[ast.Assign | ast.AnnAssign]) -> None:
    """Records the attributes assigned a container (`self.layers = nn.ModuleList(..)`)."""
    for assign in assigns:
        if isinstance(assign.value, ast.Call) and facts.is_container(assign.value.func):
            targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
            facts.container_attrs |= {t.attr for t in targets if isinstance(t, ast.Attribute)}


_SCANNED = {ast.Import, ast.ImportFrom, ast.For, ast.Assign, ast.AnnAssign, ast.ClassDef}


def _called_or_derived(node: ast.AST, calls: bool) -> Iterator[str]:
    """The first part of a base class's name, or with `calls` of a called one (`layers.Block(..)`)."""
    if isinstance(node, ast.Call) and calls:
        exprs = [node.func]
    elif isinstance(node, ast.ClassDef):
        exprs = node.bases
    else:
        return
    for expr in exprs:
        name = dotted_name(expr)
        if name:
            yield name.split(".")[0]


def kind_by_name(name: str) -> str:
    """The kind of a container class named in the `containers` setting, read from its name."""
    last = name.rsplit(".", 1)[-1]
    return "ModuleDict" if "Dict" in last else "Sequential" if "Sequential" in last else "ModuleList"


def _compiled(facts: FileFacts, iterable: ast.expr) -> None:
    """The blocks of `iterable` are compiled: a container of it is already (RGZ002)."""
    name = dotted_name(strip_values(iterable))
    if name:
        facts.compiled_iterables.add(name)
        if "." in name:
            facts.compiled_iterables.add("." + name.rsplit(".", 1)[1])


def _starred(call: ast.Call) -> ast.expr | None:
    """`ITER` of `regionalize.compile_region(*ITER, owner=...)` (or another compiling call so written)."""
    if len(call.args) == 1 and isinstance(call.args[0], ast.Starred):
        return call.args[0].value if dotted_name(call.func) in COMPILING_HELPERS else None
    return None


def _owned_by_self(call: ast.Call) -> bool:
    """Does the call make blocks nested regions of `self`, as the hierarchical form does (an earlier
    release's helper took the owner second)?"""
    name = dotted_name(call.func)
    if name == helpers.BLOCKS:
        return len(call.args) >= 2 and dotted_name(call.args[1]) == "self"
    return name == helpers.COMPILE_REGION and any(
        k.arg == helpers.OWNER and dotted_name(k.value) == "self" for k in call.keywords
    )


def _regional(loop: ast.For) -> bool:
    """Does `for x in it:` make blocks nested regions of `self`, as the hierarchical form's loop does?"""
    return any(
        isinstance(node, ast.Call) and _owned_by_self(node)
        for statement in loop.body
        for node in walk(statement)
    )


def _compiles(loop: ast.For, facts: FileFacts) -> bool:
    """Does `for x in it:` compile each `x` (in place, or with torch.compile), maybe one loop deeper?"""
    if not isinstance(loop.target, ast.Name):
        return False
    var = loop.target.id
    for node in (n for statement in loop.body for n in walk(statement)):
        if isinstance(node, ast.Call):
            name = dotted_name(node.func)
            if name == f"{var}.compile" or (name and facts.resolve(name) == "torch.compile"):
                return True
            if name in COMPILING_HELPERS and node.args and dotted_name(node.args[0]) == var:
                return True
            if (starred := _starred(node)) is not None and dotted_name(strip_values(starred)) == var:
                return True  # each item of `var` (a stage's blocks), as a loop deeper would
        if (
            isinstance(node, ast.For)
            and dotted_name(strip_values(node.iter)) == var
            and _compiles(node, facts)
        ):
            return True
    return False
