"""The data every part of the finder shares: elements, containers, planned edits, scopes; pure helpers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from regionalize.declarations import Declaration
from regionalize.options import Options


@dataclass
class Edits:
    wrap: set[cst.Call] = field(default_factory=set)  # element calls to wrap in torch.compile(...)
    after: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    split: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    needs_torch: bool = False
    kwargs: str = ""
    options: Options = field(default_factory=Options)

    def __bool__(self) -> bool:
        return bool(self.wrap or self.after or self.split)


@dataclass
class Element:
    # "block", "compiled", "leaf", "other", "excluded", "holder", "nested", "parts" (a container whose
    # elements are built elsewhere), "undeclared" (a block the model's declaration leaves out) or
    # "factory" (a function returning one of several classes)
    kind: str
    label: str
    call: cst.Call | None = None
    inner: Container | None = None  # the inner container of a "nested" element
    int_vars: frozenset[str] = frozenset()  # integer loop variables in scope where it is built
    declared: Declaration | None = None  # of an "undeclared" element
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
    """What the finder knows about one function body (or the module body)."""

    def __init__(self, node: cst.CSTNode, module: cst.Module, containers: set[str]) -> None:
        self.bindings: dict[str, list[cst.BaseExpression]] = {}
        self.names: set[str] = set()
        self.container_calls: list[cst.Call] = []  # calls spelled like a container, resolved later
        self.params: set[str] = set()
        if isinstance(node, cst.FunctionDef):
            parameters = node.params
            every = [*parameters.posonly_params, *parameters.params, *parameters.kwonly_params]
            self.params = {p.name.value for p in every}
        node.visit(_ScopeCollector(self, module, containers))

    def fresh(self, base: str, avoid: str = "") -> str:
        """A name the function does not use (nor `avoid`), so the inserted loop shadows nothing."""
        name, n = base, 1
        while name in self.names or name == avoid:
            n += 1
            name = f"{base}{n}"
        return name


class _ScopeCollector(cst.CSTVisitor):
    def __init__(self, scope: Scope, module: cst.Module, containers: set[str]) -> None:
        self.scope = scope
        self.module = module
        self.containers = containers  # names a container class may be spelled with

    def visit_Name(self, node: cst.Name) -> None:
        self.scope.names.add(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        if name in self.containers:
            self.scope.container_calls.append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        self.scope.bindings.setdefault(self.module.code_for_node(target), []).append(value)


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


def leaves_of(found: Container) -> list[Element]:
    out: list[Element] = []
    for element in found.repeated:
        out += leaves_of(element.inner) if element.kind == "nested" and element.inner else [element]
    return out


def blocks_of(found: Container) -> list[Element]:
    """Repeated elements worth compiling: blocks, and inner containers whose elements are blocks."""
    return [
        e
        for e in found.repeated
        if e.kind == "block" or (e.kind == "nested" and e.inner is not None and blocks_of(e.inner))
    ]


def labels(elements: list[Element]) -> str:
    return " | ".join(dict.fromkeys(e.label for e in elements))


def first_label(found: Container) -> str:
    leaves = leaves_of(found)
    return leaves[0].label if leaves else ""
