"""The data every part of the finder shares: elements, containers, planned edits, scopes; pure helpers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from functools import cache, cached_property

import libcst as cst

from regionalize.codemod.declarations import Declaration
from regionalize.codemod.int_edits import FixNodes
from regionalize.shared.options import Options


@dataclass
class Edits:
    wrap: set[cst.Call] = field(default_factory=set)  # element calls to wrap in torch.compile(...)
    after: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    split: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    fixes: FixNodes = field(default_factory=FixNodes)  # the per-block integer fixes in the piece
    needs_torch: bool = False
    options: Options = field(default_factory=Options)

    def __bool__(self) -> bool:
        return bool(self.wrap or self.after or self.split or self.fixes)


@dataclass
class Element:
    # "block", "compiled", "leaf", "other", "excluded", "holder", "stage" (a holder that owns its blocks,
    # which its holder's owner takes: RGZ006), "nested", "parts" (a container whose elements are built
    # elsewhere), "undeclared" (a block the model's declaration leaves out) or "factory" (a function
    # returning one of several classes)
    kind: str
    label: str
    call: cst.Call | None = None
    inner: Container | None = None  # the inner container of a "nested" element
    int_vars: frozenset[str] = frozenset()  # integer loop variables in scope where it is built
    rate_vars: frozenset[str] = frozenset()  # its comprehension's variables that take a rate (`for r in dpr`)
    declared: Declaration | None = None  # of an "undeclared" element
    func: cst.BaseExpression | None = (
        None  # the callee its label is the code of: what a mixed container tests
    )
    returns: tuple[str, ...] = ()  # what the factory function that builds the element returns


@dataclass
class Container:
    pattern: str
    dict_like: bool
    repeated: list[Element]  # elements built once per iteration
    single: list[Element]  # elements that stand once, beside the repeated ones
    literal: bool = False  # `nn.ModuleList([Attention(..), FeedForward(..)])` built once per iteration
    count: int | None = None  # how many times the comprehension repeats, when the source says so


class Scope:
    """What the finder knows about one function body (or the module body).

    Its names and bindings are read on first use: most scopes are never asked (the region's module,
    around the one method it holds), and reading one walks the whole body.
    """

    def __init__(self, node: cst.CSTNode, module: cst.Module, containers: set[str]) -> None:
        self.node = node
        self.module = module
        self.containers = containers  # names a container class may be spelled with
        self.params: set[str] = set()
        if isinstance(node, cst.FunctionDef):
            parameters = node.params
            every = [*parameters.posonly_params, *parameters.params, *parameters.kwonly_params]
            self.params = {p.name.value for p in every}

    @cached_property
    def names(self) -> set[str]:
        return {n.value for n in descendants(self.node) if isinstance(n, cst.Name)}

    @cached_property
    def bindings(self) -> dict[str, list[cst.BaseExpression]]:
        """Each target's values, by the target's code. In no particular order: only a target bound once
        is followed, and a value is looked for among them all."""
        found: dict[str, list[cst.BaseExpression]] = {}
        for node in descendants(self.node):
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    found.setdefault(self._code(target.target), []).append(node.value)
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                found.setdefault(self._code(node.target), []).append(node.value)
        return found

    @cached_property
    def container_calls(self) -> list[cst.Call]:
        """Calls spelled like a container, resolved later; in no particular order."""
        found = []
        for node in descendants(self.node):
            if isinstance(node, cst.Call):
                func = node.func
                name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
                if name in self.containers:
                    found.append(node)
        return found

    def fresh(self, base: str, avoid: str = "") -> str:
        """A name the function does not use (nor `avoid`), so the inserted loop shadows nothing."""
        name, n = base, 1
        while name in self.names or name == avoid:
            n += 1
            name = f"{base}{n}"
        return name

    def _code(self, target: cst.BaseExpression) -> str:
        # A plain name is its own code: generating it is most of the cost of reading the bindings.
        if isinstance(target, cst.Name) and not target.lpar:
            return target.value
        return self.module.code_for_node(target)


def dotted_name(expr: cst.BaseExpression) -> str | None:
    """`nn.ModuleList` -> "nn.ModuleList"; None for anything but a chain of names."""
    parts: list[str] = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return None
    parts.append(expr.value)
    return ".".join(reversed(parts))


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from walk(child)


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under `node` (and itself), each once as a visit meets it, in no particular order.

    Read from the nodes' fields: a LibCST visitor builds a copy of every node it passes, several times
    the cost, which made the scopes' walks a tenth of a bulk run.
    """
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        for name in _child_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (tuple, list)):
                stack.extend(item for item in value if isinstance(item, cst.CSTNode))


def holding(node: cst.CSTNode, targets: set[cst.CSTNode]) -> set[cst.CSTNode]:
    """The nodes of `node`'s tree that are one of `targets` or hold one, read from the nodes' fields."""
    found: set[cst.CSTNode] = set()

    def mark(current: cst.CSTNode) -> bool:
        held = current in targets
        for name in _child_fields(type(current)):
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                held = mark(value) or held
            elif isinstance(value, (tuple, list)):
                for item in value:
                    if isinstance(item, cst.CSTNode):
                        held = mark(item) or held
        if held:
            found.add(current)
        return held

    mark(node)
    return found


@cache
def _child_fields(kind: type[cst.CSTNode]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind))


def leaves_of(found: Container) -> list[Element]:
    out: list[Element] = []
    for element in found.repeated:
        out += leaves_of(element.inner) if element.kind == "nested" and element.inner else [element]
    return out


def blocks_of(found: Container) -> list[Element]:
    """Repeated elements worth compiling: blocks or stages, and inner containers whose elements are."""
    return [
        e
        for e in found.repeated
        if e.kind in COMPILED or (e.kind == "nested" and e.inner is not None and blocks_of(e.inner))
    ]


COMPILED = ("block", "stage")  # the kinds of element a site compiles


def rewrite_code(blocks: list[Element]) -> str:
    """The code of a site that compiles `blocks`: RGZ006 where they are stages, RGZ001 where blocks."""
    kinds = {e.kind for e in blocks} | {e.kind for b in blocks if b.inner for e in leaves_of(b.inner)}
    return "RGZ006" if "stage" in kinds else "RGZ001"


def labels(elements: list[Element]) -> str:
    return " | ".join(dict.fromkeys(e.label for e in elements))


def first_label(found: Container) -> str:
    leaves = leaves_of(found)
    return leaves[0].label if leaves else ""
