"""The facts a first look at a file gathers (`prescan.scan` fills them), and what the codemod asks of them:
which names are containers, what a class of the file or its package builds, which declaration governs a site.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field

from regionalize.codemod.declarations import Declaration
from regionalize.codemod.definitions import Definition
from regionalize.codemod.nodes import dotted_name

CONTAINERS = {"ModuleList", "Sequential", "ModuleDict"}
# Modules whose ModuleList / Sequential / ModuleDict are torch.nn's with an `init_cfg` (OpenMMLab).
CONTAINER_MODULES = ("torch.nn.", "mmengine.model.", "mmcv.runner.", "mmcv.cnn.")
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
