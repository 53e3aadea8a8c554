"""Walking Python's `ast` trees, which the codemod does many times over each file before any LibCST work,
and LibCST's trees, which it visits once per piece."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

if TYPE_CHECKING:
    from libcst.metadata.base_provider import ProviderT


def walk(node: ast.AST) -> list[ast.AST]:
    """The nodes `ast.walk` yields, in its order (breadth first), as a list.

    Without `ast.walk`'s three layers of generators the walk takes a third less; the walks of `ast`
    trees were a sixth of a bulk run over the transformers models.
    """
    return [node for level in _levels(node) for node in level]


def dotted_name(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def strip_values(node: ast.expr) -> ast.expr:
    """`x.values()` -> `x`: a ModuleDict is compiled through its values."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("values", "children", "modules")
    ):
        return node.func.value
    return node


class Walked:
    """One walk of a module for all that is asked of it and of its top-level statements.

    `nodes` are what `ast.walk(tree)` yields and `under(statement)` what `ast.walk(statement)` yields,
    each in its order: a breadth-first walk lists the nodes level by level, and a level of the module
    lists its statements' nodes of that level, statement after statement. Walking again for each class
    and function, and for the pieces, was most of what the walks cost.
    """

    def __init__(self, tree: ast.Module) -> None:
        levels = {statement: _levels(statement) for statement in _below([tree])}
        self.nodes: list[ast.AST] = [tree]
        for depth in range(max(map(len, levels.values()), default=0)):
            for below in levels.values():
                if depth < len(below):
                    self.nodes += below[depth]
        self._under = {
            statement: [n for level in below for n in level] for statement, below in levels.items()
        }

    def under(self, statement: ast.stmt) -> list[ast.AST]:
        """A statement of the module's body, and the nodes under it."""
        return self._under[statement]


def _levels(node: ast.AST) -> list[list[ast.AST]]:
    """`node`'s subtree in breadth-first order, one list per depth."""
    levels = [[node]]
    while below := _below(levels[-1]):
        levels.append(below)
    return levels


def _below(level: list[ast.AST]) -> list[ast.AST]:
    """The children of a level's nodes, in order."""
    below: list[ast.AST] = []
    fields = _CHILD_FIELDS
    for parent in level:
        kind = type(parent)
        names = fields.get(kind)
        if names is None:
            names = fields[kind] = tuple(f for f in kind._fields if f not in _SCALARS.get(kind, _NAMES))
        for name in names:
            value = getattr(parent, name, None)  # a field left unset is skipped, as ast.iter_fields does
            if type(value) is list:
                if value:  # a list comprehension: a generator here cost an eighth of the walk
                    below += [item for item in value if isinstance(item, ast.AST)]
            elif isinstance(value, ast.AST):
                below.append(value)
    return below


# The fields of each node type that may hold nodes: the grammar gives the others a name, a number or a
# constant, never a node, and reading them was a third of the walk (`_below`).
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_NAMES = frozenset(
    {
        "id",
        "name",
        "arg",
        "attr",
        "module",
        "asname",
        "level",
        "is_async",
        "conversion",
        "kind",
        "type_comment",
    }
)
_SCALARS: dict[type, frozenset[str]] = {ast.Constant: _NAMES | {"value"}}
if hasattr(ast, "TypeAlias"):  # Python 3.12: `type X = ...` names its alias with a node
    _SCALARS[ast.TypeAlias] = _NAMES - {"name"}


def any_within(lines: list[int], first: int, last: int) -> bool:
    """Does the sorted list `lines` hold a line within `first`..`last`?"""
    index = bisect.bisect_left(lines, first)
    return index < len(lines) and lines[index] <= last


def split_lines(source: str) -> list[str]:
    """The lines as Python numbers them: split at \\r\\n, \\r or \\n only, ends kept. `str.splitlines`
    also splits at form feeds and other separators, which some files hold in comments or on lines of their
    own (page breaks): the lines after one would not be the lines `ast` and LibCST name."""
    # Each `in` is a memchr; a regex's character class scanned the text several times slower.
    if not any(c in source for c in "\v\f\x1c\x1d\x1e") and (
        source.isascii() or not any(c in source for c in "\x85\u2028\u2029")
    ):
        return source.splitlines(keepends=True)
    return _LINE.findall(source)


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def segment(lines: list[str], node: ast.expr) -> str:
    """`ast.get_source_segment(source, node)`, from the source's `split_lines`: it splits the whole
    file again for each segment, which was most of what planning the per-block integers took."""
    assert node.end_lineno is not None and node.end_col_offset is not None  # set on every parsed node
    first, last = node.lineno - 1, node.end_lineno - 1
    start, end = node.col_offset, node.end_col_offset
    if first == last:
        return lines[first].encode()[start:end].decode()
    inner = "".join(lines[first + 1 : last])
    return lines[first].encode()[start:].decode() + inner + lines[last].encode()[:end].decode()


class FastDispatch:
    """A LibCST visitor's dispatch, found once per node type instead of by name at every node.

    LibCST looks up `visit_<Type>`, `leave_<Type>` and, for each child attribute, `visit_<Type>_<attr>` and
    `leave_<Type>_<attr>` by building the name and calling `getattr` at every node: in a bulk run over the
    transformers models that was a fifth of the finder's walks. The codemod's visitors define no attribute
    visits, so those are skipped; a class that does define one must not take this mixin
    (`tests/test_nodes.py` checks the codemod's).
    """

    _found: ClassVar[dict[tuple[type, str, type], Callable[..., Any] | None]] = {}

    def _method(self, prefix: str, node_type: type) -> Callable[..., Any] | None:
        key = (type(self), prefix, node_type)
        try:
            method = FastDispatch._found[key]
        except KeyError:
            method = FastDispatch._found[key] = getattr(type(self), f"{prefix}{node_type.__name__}", None)
        return method

    def on_visit(self, node: cst.CSTNode) -> bool:
        method = self._method("visit_", type(node))
        return method is None or method(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode, *updated: Any) -> Any:
        method = self._method("leave_", type(original_node))
        if not updated:  # a visitor's
            if method is not None:
                method(self, original_node)
            return None
        return updated[0] if method is None else method(self, original_node, updated[0])

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        pass

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        pass


class Positioned(MetadataWrapper):
    """A piece's tree with its positions, the one metadata the finder asks for, resolved on their own.

    LibCST resolves a provider, then runs the batchable ones in a walk of the whole tree, even when there
    are none to run: that empty walk rebuilt every node of each piece, a twentieth of a bulk run. Any
    other provider is resolved as LibCST resolves it.
    """

    def __init__(self, module: cst.Module) -> None:
        super().__init__(module, unsafe_skip_copy=True)  # parsed for this wrapper: no node is shared

    def resolve_many(
        self, providers: Collection[ProviderT]
    ) -> Mapping[ProviderT, Mapping[cst.CSTNode, object]]:
        if not set(providers) <= {PositionProvider}:
            return super().resolve_many(providers)
        if providers and PositionProvider not in self._metadata:
            self._metadata[PositionProvider] = PositionProvider()._gen(self)
        return {provider: self._metadata[provider] for provider in providers}

    def read(self, visitor: cst.CSTVisitor) -> None:
        """`self.visit(visitor)` for a visitor that only reads (`read`)."""
        with visitor.resolve(self):
            read(self.module, visitor)


def read(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`node.visit(visitor)` for a visitor that only reads: the same calls in the same order, without
    the copy of every node LibCST's walk builds as it goes (that copy was two thirds of the finder's walk,
    the visitor's own calls aside)."""
    if visitor.on_visit(node):
        for name in _visited_fields(node):
            value = getattr(node, name)
            if type(value) is tuple or type(value) is list:
                for item in value:
                    read(item, visitor)
            elif value is not None and type(value) is not cst.MaybeSentinel:
                read(value, visitor)
    visitor.on_leave(node)


_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}


def _visited_fields(node: cst.CSTNode) -> tuple[str, ...]:
    """The fields LibCST visits a node's children by, in its order: the same for every node of a type
    (each type's `_visit_and_replace_children` names them one by one), read once from that method."""
    try:
        return _FIELDS[type(node)]
    except KeyError:
        probe = _FieldOrder()
        node._visit_and_replace_children(probe)
        _FIELDS[type(node)] = order = tuple(dict.fromkeys(probe.fields))
        return order


class _FieldOrder(cst.CSTVisitor):
    """Records the fields a node's children are visited by, and visits no further."""

    def __init__(self) -> None:
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self.fields.append(attribute)
