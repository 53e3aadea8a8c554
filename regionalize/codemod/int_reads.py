"""Where a per-block integer is read in a block's method, and what carries the read out of the method.

`int_fixes.py` plans a fix for each carrier: the call or subscript that hands the integer to another
object, or the assignment that stores it into one."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from regionalize.codemod import class_graph
from regionalize.codemod.nodes import walk


def parents_of(root: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in walk(root) for child in ast.iter_child_nodes(node)}


def ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Iterator[ast.AST]:
    while node in parents:
        node = parents[node]
        yield node


def statements_above(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Iterator[ast.stmt]:
    return (a for a in ancestors(node, parents) if isinstance(a, ast.stmt))


def carrier_of(read: ast.AST, parents: dict[ast.AST, ast.AST], names: set[str]) -> ast.expr | None:
    """The innermost call or subscript that hands `read` to an object other than self or a module.

    `past_key_values.update(k, v, self.layer_idx)` -> that call; `cache.layers[self.layer_idx]` -> that
    subscript; `torch.roll(x, self.shift)`, `self.proj(..)` or a plain `if self.layer_idx == 0` -> None.
    """
    child = read
    for node in ancestors(read, parents):
        if isinstance(node, (ast.stmt, ast.Lambda, ast.comprehension)):
            return None
        if (isinstance(node, ast.Call) and child is not node.func) or (
            isinstance(node, ast.Subscript) and child is node.slice
        ):
            root = class_graph.root_name(node.func if isinstance(node, ast.Call) else node.value)
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                return None
            if root is not None and root != "self" and root not in names and _movable(node):
                return node
        child = node
    return None


def _movable(node: ast.expr) -> bool:
    """Can `node` become the body of a lambda with the same meaning?"""
    for inner in walk(node):
        if isinstance(inner, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)):
            return False
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "super":
            return False  # zero-argument super() needs the method's frame
    return True


def setitem_of(read: ast.AST, parents: dict[ast.AST, ast.AST], names: set[str]) -> ast.Assign | None:
    """`cache.is_updated[self.layer_idx] = True`: an assignment that can become a `__setitem__` call.

    Only with a constant or a name as the value: Python evaluates the value before the target, the call
    after it, so anything that could have a side effect keeps its place (and its RGZ201).
    """
    target = parents.get(read)
    while target is not None and not isinstance(target, ast.Subscript):
        if isinstance(target, ast.stmt):
            return None
        target = parents.get(target)
    statement = parents.get(target) if target is not None else None
    if (
        not isinstance(statement, ast.Assign)
        or statement.targets != [target]
        or not isinstance(target.ctx, ast.Store)
        or not _plain_key(target.slice)
        or not isinstance(statement.value, (ast.Constant, ast.Name))
    ):
        return None
    root = class_graph.root_name(target.value)
    return statement if root is not None and root != "self" and root not in names else None


def _plain_key(key: ast.expr) -> bool:
    """A key that can be the argument of `__setitem__`: no slice, and a starred item beside others."""
    items = key.elts if isinstance(key, ast.Tuple) else [key]
    starred = any(isinstance(item, ast.Starred) for item in items)
    return not any(isinstance(item, ast.Slice) for item in items) and not (starred and len(items) == 1)


def stored_into(read: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    for node in ancestors(read, parents):
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
            return node
        if isinstance(node, ast.stmt):
            return None
    return None


def outermost(nodes: list[ast.expr], parents: dict[ast.AST, ast.AST]) -> list[ast.expr]:
    """Drop carriers inside other carriers: the outer lambda already takes them out."""
    chosen = set(nodes)
    return [n for n in nodes if not any(a in chosen for a in ancestors(n, parents))]
