"""The per-block integer fixes (`int_fixes.py`) as LibCST edits: the pieces that hold them, the nodes they
fall on in a piece's tree, and the nodes that take their place.

`int_fixes.py` plans each fix at the `ast` position of the node it edits; the node with that position in the
piece is the one edited, so a fix and the sites' edits in one piece go through the one editor
(`patterns/emit.py`). What a fix writes is built from templates parsed once:

- `regionalize.eager(lambda: <the call or subscript>)`, the parentheses around the node kept around the
  call, so that the node reads as written, spacing and comments included;
- `regionalize.eager(lambda: <target>.__setitem__(<key>, <value>))` for an assignment to a subscript, the
  key and value as `ast` spans them (without parentheses of their own, a tuple key in parentheses);
- `@regionalize.symbolic_ints` above the other decorators of a method, on its own line.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider

from regionalize.codemod.int_fixes import EAGER, SYMBOLIC, Fix, Plan, Position
from regionalize.codemod.nodes import Positioned
from regionalize.codemod.parse_spans import Span, holding, statement

_EAGER = cst.ensure_type(cst.parse_expression(f"{EAGER}(lambda: body)"), cst.Call)
_SETITEM = cst.ensure_type(cst.parse_expression("target.__setitem__(key, value)"), cst.Call)
_DECORATOR = cst.Decorator(cst.parse_expression(SYMBOLIC))
# The node types a fix of each kind edits.
_KINDS: dict[str, tuple[type[cst.CSTNode], ...]] = {
    "eager": (cst.Call, cst.Subscript),
    "setitem": (cst.Assign,),
    "decorate": (cst.FunctionDef,),
}


@dataclass
class FixNodes:
    """The nodes of a piece the fixes edit: calls and subscripts run outside the compiled region,
    assignments made `__setitem__` calls run so, methods decorated (each with its line ending)."""

    eager: set[cst.CSTNode] = field(default_factory=set)
    setitem: set[cst.Assign] = field(default_factory=set)
    decorate: dict[cst.FunctionDef, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.eager or self.setitem or self.decorate)


def fix_spans(fixes: Plan, tree: ast.Module, lines: list[str]) -> list[Span]:
    """The pieces that hold the fixes: the statement of each where it can be cut out on its own (most
    fixes are one call on a line of its own), else its method; none inside another."""
    cut = {fix: statement(lines, *fix.statement) if fix.statement else None for fix in fixes.edits}
    spans = [span for span in cut.values() if span is not None]
    spans += holding(tree, lines, sorted({fix.start[0] for fix, span in cut.items() if span is None}))
    spans.sort(key=lambda span: (span.start, -span.end))
    kept: list[Span] = []
    for span in spans:
        if not kept or span.start > kept[-1].end:
            kept.append(span)
    return kept


def place(fixes: list[Fix], wrapper: Positioned, span: Span, lines: list[str]) -> FixNodes:
    """The nodes of the piece `span` (its tree in `wrapper`) that `fixes` edit; `lines` are the file's."""
    found = FixNodes()
    wanted: dict[tuple[int, int], list[Fix]] = {}
    for fix in fixes:
        wanted.setdefault(_in_piece(fix.start, span, lines), []).append(fix)
    for node, where in wrapper.resolve(PositionProvider).items():
        for fix in wanted.get((where.start.line, where.start.column), ()):
            if not isinstance(node, _KINDS[fix.kind]):
                continue
            if isinstance(node, cst.FunctionDef):
                found.decorate[node] = _newline(lines[fix.end[0] - 1])
            elif (where.end.line, where.end.column) == _in_piece(fix.end, span, lines):
                if isinstance(node, cst.Assign):
                    found.setitem.add(node)
                else:
                    found.eager.add(node)
    return found


def _in_piece(position: Position, span: Span, lines: list[str]) -> tuple[int, int]:
    """A file's `ast` position (a column in UTF-8 bytes) as the piece's LibCST position (in characters)."""
    line, column = position
    text = lines[line - 1]
    if not text.isascii():
        column = len(text.encode("utf-8")[:column].decode("utf-8"))
    return line - span.start + 1, column - len(span.indent)


def _newline(line: str) -> str:
    return "\r\n" if line.endswith("\r\n") else "\n"


def eager(node: cst.BaseExpression) -> cst.Call:
    """`regionalize.eager(lambda: node)`, the parentheses that were the node's around it."""
    lam = cst.ensure_type(_EAGER.args[0].value, cst.Lambda)
    body = node.with_changes(lpar=[], rpar=[])
    arg = _EAGER.args[0].with_changes(value=lam.with_changes(body=body))
    return _EAGER.with_changes(args=[arg], lpar=node.lpar, rpar=node.rpar)


def setitem(assign: cst.Assign) -> cst.Expr:
    """`target[key] = value` as `regionalize.eager(lambda: target.__setitem__(key, value))`."""
    target = cst.ensure_type(assign.targets[0].target, cst.Subscript)
    key_arg, value_arg = _SETITEM.args[:2]
    func = cst.ensure_type(_SETITEM.func, cst.Attribute)
    call = _SETITEM.with_changes(
        func=func.with_changes(value=_bare(target.value)),
        args=[
            key_arg.with_changes(value=_key(target.slice)),
            value_arg.with_changes(value=_bare(assign.value)),
        ],
    )
    return cst.Expr(eager(call), semicolon=assign.semicolon)


def decorated(function: cst.FunctionDef, newline: str) -> cst.FunctionDef:
    """`function` with `@regionalize.symbolic_ints` above its decorators, its line ending `newline`."""
    line_end = cst.TrailingWhitespace(newline=cst.Newline(newline))
    return function.with_changes(
        decorators=[_DECORATOR.with_changes(trailing_whitespace=line_end), *function.decorators]
    )


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    """The node without parentheses of its own, as `ast` spans it."""
    return node.with_changes(lpar=[], rpar=[]) if node.lpar else node


def _key(elements: Sequence[cst.SubscriptElement]) -> cst.BaseExpression:
    """A subscript's key as one expression: the one item, or the items as a tuple, in parentheses unless
    the first item's own open them (`ast` spans a tuple key from its first item to its last comma)."""
    indexes = [cst.ensure_type(e.slice, cst.Index) for e in elements]
    first = indexes[0].value
    if len(indexes) == 1 and isinstance(elements[0].comma, cst.MaybeSentinel):
        # A tuple in parentheses is spanned with its innermost pair, any other node without them.
        if isinstance(first, cst.Tuple):
            return first.with_changes(lpar=first.lpar[-1:], rpar=first.rpar[:1])
        return _bare(first)
    last_comma = elements[-1].comma
    if isinstance(last_comma, cst.Comma):
        last_comma = last_comma.with_changes(whitespace_after=cst.SimpleWhitespace(""))
    commas = [e.comma for e in elements[:-1]] + [last_comma]
    items = [_item(index, comma) for index, comma in zip(indexes, commas, strict=True)]
    opened = first.lpar and not indexes[0].star
    parens = ([], []) if opened else ([cst.LeftParen()], [cst.RightParen()])
    return cst.Tuple(items, lpar=parens[0], rpar=parens[1])


def _item(index: cst.Index, comma: cst.Comma | cst.MaybeSentinel) -> cst.BaseElement:
    """A subscript's item as an item of a tuple, starred where it was."""
    if index.star:
        spacing = index.whitespace_after_star
        assert isinstance(spacing, cst.BaseParenthesizableWhitespace)
        return cst.StarredElement(index.value, comma=comma, whitespace_before_value=spacing)
    return cst.Element(index.value, comma=comma)
