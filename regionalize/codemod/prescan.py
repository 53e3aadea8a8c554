"""A fast first look at a file with Python's own parser, before any LibCST work.

LibCST parses several times slower than `ast` and its visitors are slower still, while most of a model
file (configs, attention maths, docstrings) holds no site. So `ast` answers the file-wide questions
(imports, containers, what is compiled already, what the file's classes build); `parse_spans.py` says which
top-level statements can hold a site, and only those are parsed with LibCST and rewritten.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from regionalize.codemod import builds, declarations
from regionalize.codemod.declarations import Declaration
from regionalize.codemod.definitions import Definition
from regionalize.codemod.nodes import Walked, dotted_name, strip_values, walk
from regionalize.shared import helpers

CONTAINERS = {"ModuleList", "Sequential", "ModuleDict"}
# Modules whose ModuleList / Sequential / ModuleDict are torch.nn's with an `init_cfg` (OpenMMLab).
CONTAINER_MODULES = ("torch.nn.", "mmengine.model.", "mmcv.runner.", "mmcv.cnn.")
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
# What the file's package defines under an imported name (`package.py`), or None.
Lookup = Callable[[str], "Definition | None"]


def nothing(name: str) -> None:
    """The lookup of a file read on its own: nothing is known of what it imports."""
    return None


@dataclass
class FileFacts:
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted name
    compiled_iterables: set[str] = field(default_factory=set)  # `self.layers`, `.layers`, `blocks`
    container_attrs: set[str] = field(default_factory=set)  # attributes assigned a container
    torch_bound: bool = False  # `torch` is a module-level name
    top_level_defs: set[str] = field(default_factory=set)
    # Lines (first, last) of the top-level classes with a `forward` of their own: the owners that can be
    # compiled whole around the blocks their methods build.
    owners: list[tuple[int, int]] = field(default_factory=list)
    classes: list[tuple[str, int, int]] = field(default_factory=list)  # every class: name, first, last line
    # Block classes that update a cache of their own (int_fixes' `cache_blocks`), each with the
    # attribute that indexes its cache, or None.
    cache_blocks: dict[str, str | None] = field(default_factory=dict)
    # Classes of this file whose own blocks are compiled: compiling them too would inline those blocks.
    holders: frozenset[str] = frozenset()
    # Those of them whose blocks are nested regions of them, their owner: a stage (RGZ006).
    regional: frozenset[str] = frozenset()
    # Lines of the loops that make a container's blocks nested regions of `self` (a rewrite's, read back).
    regional_loops: list[int] = field(default_factory=list)
    # Classes defined in the file: does the class build submodules (a block) or only tensors (a leaf)?
    holds_submodules: dict[str, bool | None] = field(default_factory=dict)  # None: cannot tell
    # Other container classes, by resolved name: subclasses defined in the file or imported from its
    # package, the `containers` setting.
    containers: dict[str, str] = field(default_factory=dict)
    # Functions returning a container of deep copies of their first argument, defined in the file.
    clone_helpers: set[str] = field(default_factory=set)
    # Classes that define an __init__ of their own.
    own_init: set[str] = field(default_factory=set)
    # Local names of the clone helpers imported from the package, found while scanning.
    imported_clone_helpers: set[str] = field(default_factory=set)
    # Functions of the file whose every return builds a class (`get_down_block`): what they return.
    factories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The repeated blocks the file's classes declare, the classes inside those models, and the
    # `_repeated_blocks` declared anywhere in the package (read by the codemod, for the file rewritten).
    declarations: list[Declaration] = field(default_factory=list)
    inside: set[str] = field(default_factory=set)
    package_declarations: list[Declaration] = field(default_factory=list)
    outside: Lookup = nothing

    def container_kind(self, name: str) -> str | None:
        """ "ModuleList", "Sequential" or "ModuleDict" for a (dotted, local) name of a container class."""
        full = self.resolve(name)
        last = full.rsplit(".", 1)[-1]
        if full in self.containers:
            return self.containers[full]
        if last in CONTAINERS and full.startswith(CONTAINER_MODULES):
            return last
        return None

    def is_container(self, func: ast.expr) -> bool:
        """Is `func`, the callee of a call, a container class (`nn.ModuleList(..)`)?"""
        name = dotted_name(func)
        return name is not None and self.container_kind(name) is not None

    def holds(self, full: str) -> bool | None:
        """Does the class of this resolved name build submodules? None: not defined in the package."""
        if full in self.holds_submodules:
            return self.holds_submodules[full]
        defined = self.outside(full)
        return defined.holds_submodules if defined else None

    def holds_compiled(self, full: str) -> bool:
        """Is this a class of the package whose own repeated blocks are compiled in its module?"""
        defined = self.outside(full)
        return defined is not None and defined.holds_compiled()

    def owns_regions(self, full: str) -> bool:
        """Is this a class of the package whose own repeated blocks are nested regions of it?"""
        defined = self.outside(full)
        return defined is not None and defined.owns_regions()

    def factory(self, full: str) -> tuple[str, ...] | None:
        """The classes a factory function of the file or its package returns (resolved names)."""
        if full in self.factories:
            return self.factories[full]
        defined = self.outside(full)
        return defined.returns if defined else None

    def declaring(self, block: str) -> Declaration | None:
        """The declaration that names this class (by its last name) as a repeated block."""
        return next((d for d in self.declarations + self.package_declarations if block in d.blocks), None)

    def declaration_over(self, scope: str | None) -> Declaration | None:
        """The declaration that says which blocks a site in class `scope` (None: outside any class) may
        compile: the package's `_repeated_blocks`, or a declaration of a model of the file it is inside."""
        if self.package_declarations:  # the file's own first, when it is one of them
            own = [d for d in self.declarations if d in self.package_declarations]
            return (own or self.package_declarations)[0]
        return self.declarations[0] if scope in self.inside else None

    def is_clone_helper(self, full: str) -> bool:
        defined = self.outside(full)
        return defined is not None and defined.clones

    def builds_itself(self, full: str) -> bool:
        """Is this a container subclass of the package whose own __init__ builds what it holds?"""
        defined = self.outside(full)
        return defined is not None and defined.container is not None and defined.builds_itself

    def container_names(self) -> set[str]:
        """Local spellings a container call can have, for scanning before names are resolved."""
        return CONTAINERS | {name.rsplit(".", 1)[-1] for name in self.containers}

    def resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        full = self.imports.get(head, head)
        return f"{full}.{rest}" if rest else full


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
    loops: list[ast.For] = []
    assigns: list[ast.Assign | ast.AnnAssign] = []
    # One walk: three over a 3,000-line modeling file were a sixth of a bulk run.
    walked = walked or Walked(tree)
    everything = walked.nodes
    named: list[ast.Call | ast.ClassDef] = []  # what `_called_or_derived` reads
    classes: list[ast.ClassDef] = []
    for node in everything:
        kind = type(node)  # one look-up per node, not a chain of isinstance: most nodes are none of these
        if kind is ast.Call:
            named.append(node)  # type: ignore[arg-type]
        elif kind not in _SCANNED:
            continue
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    facts.imports[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    facts.imports[head] = head
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    if base in ("torch.nn", "torch.nn.modules"):
                        facts.imports.update({n: f"torch.nn.{n}" for n in CONTAINERS})
                    continue
                sep = "" if base.endswith(".") else "."
                facts.imports[alias.asname or alias.name] = f"{base}{sep}{alias.name}"
        elif isinstance(node, ast.For):
            loops.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            assigns.append(node)
        elif isinstance(node, ast.ClassDef):
            facts.classes.append((node.name, node.lineno, node.end_lineno or node.lineno))
            named.append(node)
            classes.append(node)
    facts.imports = {k: TORCH_MODULES.sub("torch.nn", v) for k, v in facts.imports.items()}
    # A setting may name a class by its bare name; a file imports it under its dotted one.
    for full in facts.imports.values():
        if full.rsplit(".", 1)[-1] in facts.containers and full not in facts.containers:
            facts.containers[full] = facts.containers[full.rsplit(".", 1)[-1]]
    # Before the classes, which may derive from these. Each name can mean reading another module.
    used = {n for node in named for n in _called_or_derived(node, calls)}
    for local, full in facts.imports.items():
        if local not in used:
            continue
        defined = outside(full)
        if defined and defined.container:
            facts.containers[full] = defined.container
        elif defined and defined.clones:
            facts.imported_clone_helpers.add(local)
    for statement in tree.body:
        if isinstance(statement, ast.ClassDef):
            facts.holds_submodules[statement.name] = builds.holds_submodules(statement, facts, walked)
            if any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in statement.body):
                facts.owners.append((statement.lineno, statement.end_lineno or statement.lineno))
            if any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in statement.body):
                facts.own_init.add(statement.name)
        elif isinstance(statement, ast.FunctionDef) and builds.makes_clones(statement, facts, walked):
            facts.clone_helpers.add(statement.name)
    facts.declarations = declarations.read(tree)
    if facts.declarations:
        facts.inside = declarations.inside(tree, {d.model for d in facts.declarations}, walked)
    for cls in classes:  # subclasses of containers, in the order they are defined
        kinds = [facts.container_kind(n) for b in cls.bases if (n := dotted_name(b))]
        if kind := next((k for k in kinds if k), None):
            facts.containers[cls.name] = kind
    for statement in tree.body:  # after the containers: a factory returns a block, not a container
        if (
            isinstance(statement, ast.FunctionDef)
            and statement.name not in facts.clone_helpers
            and (returns := builds.returns_classes(statement, facts, walked))
        ):
            facts.factories[statement.name] = returns
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            facts.torch_bound |= any(
                a.name.split(".")[0] == "torch" and a.asname in (None, "torch") for a in statement.names
            )
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            facts.top_level_defs.add(statement.name)
    for loop in loops:
        if _compiles(loop, facts):
            if _regional(loop):
                facts.regional_loops.append(loop.lineno)
            _compiled(facts, loop.iter)
    for call in named:  # `regionalize.compile_region(*self.layers, owner=self)`: a loop's work in one call
        if type(call) is ast.Call and (starred := _starred(call)) is not None:
            if _owned_by_self(call):
                facts.regional_loops.append(call.lineno)
            _compiled(facts, starred)
    for assign in assigns:
        if isinstance(assign.value, ast.Call) and facts.is_container(assign.value.func):
            targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
            facts.container_attrs |= {t.attr for t in targets if isinstance(t, ast.Attribute)}
    return facts


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
