"""Turns the place that a guard reads into a path of plain look-ups, and walks such paths.

Dynamo names a guard's value by a Python expression (`G['helper'].ACT`). A saved owner must find that place
again in a later process without evaluating text from a file, which could run code. So the expression is
parsed into a path when it is compiled (`parse`), written as JSON, and walked with look-ups (`walk`)."""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any, TypeGuard

from .internals.aot import is_installed_global

# A path is a list of steps, each a two-item list, applied left to right. Its head is ["global", name],
# ["arg", name] or ["module", name] (for Dynamo's `__import__('torch')`, looked up in `sys.modules`). The
# steps after it are ["attr", name], ["item", key] with a str, int or bool key, ["key", n] and ["value", n]
# for a dict's n-th key or the value at it, and ["call", "type" | "dict"].
Path = list[list[Any]]

_CALLS: dict[str, Callable[[Any], Any]] = {"type": type, "dict": dict}
_HEADS = ("global", "arg", "module")
_KEYS = (str, int, bool)  # the types of an item's key that JSON keeps
_RENDER: dict[str, Callable[[str, Any], str]] = {
    "attr": lambda text, arg: f"{text}.{arg}",
    "item": lambda text, arg: f"{text}[{arg!r}]",
    "key": lambda text, arg: f"list(dict.keys({text}))[{arg}]",
    "value": lambda text, arg: f"{text}[list(dict.keys({text}))[{arg}]]",
    "call": lambda text, arg: f"{arg}({text})",
}


def parse(source: str) -> Path | None:
    """Returns the path that `source`, a guard's expression, reads, or None for any other expression.

    A path holds only look-ups of names, attributes, constant items, a dict's n-th key or value, and calls
    of `type` or `dict`."""
    try:
        return _path(ast.parse(source, mode="eval").body)
    except (SyntaxError, RecursionError):
        return None


def _path(node: ast.expr) -> Path | None:
    """Returns the path of one node of a guard's expression, its head first."""
    if isinstance(node, ast.Name):
        return None if node.id == "G" else [["arg", node.id]]
    if isinstance(node, ast.Attribute):
        return _then(_path(node.value), "attr", node.attr)
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(node.value, ast.Name) and node.value.id == "G":
            return [["global", key.value]] if _is_constant(key, str) else None
        if _is_constant(key, _KEYS):
            nth = _nth_key(node)  # `list(dict.keys(d))[0]` is the dict's first key
            return _then(nth[0], "key", nth[1]) if nth else _then(_path(node.value), "item", key.value)
        nth = _nth_key(key)  # `d[list(dict.keys(d))[0]]` is the value at the dict's first key
        return _then(_path(node.value), "value", nth[1]) if nth and _is_same(node.value, nth[2]) else None
    if isinstance(node, ast.Call) and not node.keywords:
        name = _called(node.func)
        if name == "__import__" and len(node.args) == 1 and _is_constant(node.args[0], str):
            return [["module", node.args[0].value]]
        if name in _CALLS and len(node.args) == 1:
            return _then(_path(node.args[0]), "call", name)
        if name == "dict.__getitem__" and len(node.args) == 2:  # `dict.__getitem__(d, list(dict.keys(d))[0])`
            nth = _nth_key(node.args[1])
            if nth and _is_same(node.args[0], nth[2]):
                return _then(_path(node.args[0]), "value", nth[1])
    return None


def _then(path: Path | None, kind: str, arg: Any) -> Path | None:
    return None if path is None else [*path, [kind, arg]]


def _is_constant(node: ast.expr, kinds: type | tuple[type, ...]) -> TypeGuard[ast.Constant]:
    return isinstance(node, ast.Constant) and type(node.value) in (
        kinds if isinstance(kinds, tuple) else (kinds,)
    )


def _called(func: ast.expr) -> str | None:
    """Returns the name that a call calls (`type`, `dict.__getitem__`), or None for anything else."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


def _nth_key(node: ast.expr) -> tuple[Path | None, Any, ast.expr] | None:
    """Returns the path of `d`, `n` and the node of `d` for `list(dict.keys(d))[n]`, else None."""
    if not (isinstance(node, ast.Subscript) and _is_constant(node.slice, int)):
        return None
    listed = node.value
    if not (isinstance(listed, ast.Call) and _called(listed.func) == "list" and len(listed.args) == 1):
        return None
    keys = listed.args[0]
    if not (isinstance(keys, ast.Call) and _called(keys.func) == "dict.keys" and len(keys.args) == 1):
        return None
    return _path(keys.args[0]), node.slice.value, keys.args[0]


def _is_same(one: ast.expr, other: ast.expr) -> bool:
    return ast.dump(one) == ast.dump(other)


def is_valid(path: object) -> bool:
    """Returns whether `path`, as read from a file, is a path that `parse` could have made."""
    if not isinstance(path, list) or not path:
        return False
    head, *rest = path
    if not (_is_pair(head) and head[0] in _HEADS and isinstance(head[1], str)):
        return False
    return all(_is_pair(step) and _is_valid_step(*step) for step in rest)


def _is_pair(step: object) -> bool:
    return isinstance(step, list) and len(step) == 2 and isinstance(step[0], str)


def _is_valid_step(kind: str, arg: object) -> bool:
    if kind == "attr":
        return isinstance(arg, str) and arg.isidentifier()
    if kind == "item":
        return type(arg) in _KEYS
    if kind in ("key", "value"):
        return type(arg) is int
    return kind == "call" and arg in _CALLS


def walk(path: Path, scope: Scope) -> Any:
    """Returns the value at `path` in `scope`: its head looked up there, then each step taken."""
    (kind, name), *rest = path
    if kind == "arg":
        value = scope.arguments[name]
    else:
        value = global_value(scope.f_globals, name) if kind == "global" else sys.modules[name]
    for kind, arg in rest:
        value = step(value, kind, arg)
    return value


def step(value: Any, kind: str, arg: Any) -> Any:
    """Returns the value that one step of a path reaches from `value`."""
    if kind == "attr":
        return getattr(value, arg)
    if kind == "item":
        return value[arg]
    if kind == "key":  # read as Dynamo reads a dict's keys, through `dict.keys` past a subclass's own
        return list(dict.keys(value))[arg]
    if kind == "value":
        return dict.__getitem__(value, list(dict.keys(value))[arg])
    if arg == "dict" and isinstance(value, types.MappingProxyType):
        return value  # a class's `__dict__`: the view reads as a copy of it would, without the copy
    return _CALLS[arg](value)


def render(path: Path) -> str:
    """Returns `path` as the model's code names it ("the global helper.ACT", "self._modules['0'].act")."""
    (head, name), *rest = path
    text = module_name(name) if head == "global" else name  # a module's head is named by the module
    for kind, arg in rest:
        text = _RENDER[kind](text, arg)
    return f"the global {text}" if head == "global" else text


def module_name(name: str) -> str:
    """Returns a global's name as the code names it: Dynamo's `__import_torch_dot_nn` becomes `torch.nn`."""
    return name.removeprefix("__import_").replace("_dot_", ".") if name.startswith("__import_") else name


class Scope:
    """Holds what a path's head is looked up in for one call of a frame: its globals and its arguments.

    The arguments are bound to the names of the frame's parameters, with `self` the owner."""

    def __init__(
        self, frame: types.FunctionType, owner: object, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.f_globals = frame.__globals__
        self.arguments = bound_arguments(inspect.signature(frame), owner, args, kwargs)


def bound_arguments(
    signature: inspect.Signature, owner: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Returns a call's arguments by the names of the frame's parameters, defaults included."""
    bound = signature.bind(owner, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def global_value(f_globals: dict[str, Any], name: str) -> Any:
    """Returns a frame's global as a later process has it, and raises KeyError where it cannot have it.

    Dynamo's imported modules come from `sys.modules` and its builtins from Python's. Of the globals that
    Dynamo installed under an id of its process, only modules can be read, since a load puts those back."""
    if name.startswith("__import_"):
        return sys.modules[module_name(name)]
    if name.startswith("__builtins_dict"):
        return builtins.__dict__
    value = f_globals[name]
    if is_installed_global(name) and not isinstance(value, types.ModuleType):
        raise KeyError(name)
    return value
