"""Where a guard reads, as plain data: Dynamo names a guard's value by a Python expression over the frame's
globals and arguments (`G['helper'].ACT`, `self._modules['blocks']._modules['0'].act`). A saved owner
records what such a guard read (`guard_reads.py`), and a later process must find the same place again
without evaluating text read from a file: whoever can write the file would run code. So the expression is
parsed once, in the process that compiled it, into a path of steps (`parse`), which is written as JSON and
walked with `getattr` and item look-ups (`walk`); nothing read from a file is evaluated."""

from __future__ import annotations

import ast
import builtins
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

from .internals.aot import installed

# A path is a list of steps, each a two-item list: its head ["global", name], ["arg", name] or ["module",
# name] (Dynamo's `__import__('torch')`, an imported module looked up in `sys.modules`), then
# ["attr", name], ["item", key] (a str, an int or a bool), ["key", n] and ["value", n] (a dict's n-th
# key, or the value at it) and ["call", "type" | "dict"], applied left to right.
Path = list[list[Any]]

_CALLS: dict[str, Callable[[Any], Any]] = {"type": type, "dict": dict}
_HEADS = ("global", "arg", "module")
_KEYS = (str, int, bool)  # an item's key, as JSON keeps it
_RENDER: dict[str, Callable[[str, Any], str]] = {
    "attr": lambda text, arg: f"{text}.{arg}",
    "item": lambda text, arg: f"{text}[{arg!r}]",
    "key": lambda text, arg: f"list(dict.keys({text}))[{arg}]",
    "value": lambda text, arg: f"{text}[list(dict.keys({text}))[{arg}]]",
    "call": lambda text, arg: f"{arg}({text})",
}


def parse(source: str) -> Path | None:
    """The path `source` (a guard's expression, as Dynamo writes it) reads, or None where it is anything
    but look-ups of names, attributes, constant items, a dict's n-th key or value, and calls of `type` or
    `dict` (then what it reads cannot be found again in a later process, and the frame is not saved)."""
    try:
        return _path(ast.parse(source, mode="eval").body)
    except (SyntaxError, RecursionError):
        return None


def _path(node: ast.expr) -> Path | None:
    """The path of one node of a guard's expression (`parse`), its head first."""
    if isinstance(node, ast.Name):
        return None if node.id == "G" else [["arg", node.id]]
    if isinstance(node, ast.Attribute):
        return _then(_path(node.value), "attr", node.attr)
    if isinstance(node, ast.Subscript):
        key = node.slice
        if isinstance(node.value, ast.Name) and node.value.id == "G":
            return [["global", key.value]] if _constant(key, str) else None
        if _constant(key, _KEYS):
            nth = _nth_key(node)  # `list(dict.keys(d))[0]`: the dict's first key
            return _then(nth[0], "key", nth[1]) if nth else _then(_path(node.value), "item", key.value)
        nth = _nth_key(key)  # `d[list(dict.keys(d))[0]]`: the value at the dict's first key
        return _then(_path(node.value), "value", nth[1]) if nth and _same(node.value, nth[2]) else None
    if isinstance(node, ast.Call) and not node.keywords:
        name = _called(node.func)
        if name == "__import__" and len(node.args) == 1 and _constant(node.args[0], str):
            return [["module", node.args[0].value]]
        if name in _CALLS and len(node.args) == 1:
            return _then(_path(node.args[0]), "call", name)
        if name == "dict.__getitem__" and len(node.args) == 2:  # `dict.__getitem__(d, list(dict.keys(d))[0])`
            nth = _nth_key(node.args[1])
            if nth and _same(node.args[0], nth[2]):
                return _then(_path(node.args[0]), "value", nth[1])
    return None


def _then(path: Path | None, kind: str, arg: Any) -> Path | None:
    return None if path is None else [*path, [kind, arg]]


def _constant(node: ast.expr, kinds: type | tuple[type, ...]) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (
        kinds if isinstance(kinds, tuple) else (kinds,)
    )


def _called(func: ast.expr) -> str | None:
    """`type`, `dict.__getitem__`: the name a call calls, where it is a name or an attribute of one."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


def _nth_key(node: ast.expr) -> tuple[Path | None, int, ast.expr] | None:
    """For `list(dict.keys(d))[n]`: the path of `d`, `n`, and `d`'s node; else None."""
    if not (isinstance(node, ast.Subscript) and _constant(node.slice, int)):
        return None
    listed = node.value
    if not (isinstance(listed, ast.Call) and _called(listed.func) == "list" and len(listed.args) == 1):
        return None
    keys = listed.args[0]
    if not (isinstance(keys, ast.Call) and _called(keys.func) == "dict.keys" and len(keys.args) == 1):
        return None
    return _path(keys.args[0]), node.slice.value, keys.args[0]


def _same(one: ast.expr, other: ast.expr) -> bool:
    return ast.dump(one) == ast.dump(other)


def valid(path: object) -> bool:
    """Is `path` (as read from a file) a path `parse` could have made? A file's other content is refused."""
    if not isinstance(path, list) or not path:
        return False
    head, *rest = path
    if not (_pair(head) and head[0] in _HEADS and isinstance(head[1], str)):
        return False
    return all(_pair(step) and _step_valid(*step) for step in rest)


def _pair(step: object) -> bool:
    return isinstance(step, list) and len(step) == 2 and isinstance(step[0], str)


def _step_valid(kind: str, arg: object) -> bool:
    if kind == "attr":
        return isinstance(arg, str) and arg.isidentifier()
    if kind == "item":
        return type(arg) in _KEYS
    if kind in ("key", "value"):
        return type(arg) is int
    return kind == "call" and arg in _CALLS


def walk(path: Path, scope: Scope) -> Any:
    """The value at `path` in `scope`: its head looked up there, then each step taken."""
    (kind, name), *rest = path
    if kind == "arg":
        value = scope.arguments[name]
    else:
        value = global_value(scope.f_globals, name) if kind == "global" else sys.modules[name]
    for kind, arg in rest:
        value = step(value, kind, arg)
    return value


def step(value: Any, kind: str, arg: Any) -> Any:
    """One step of a path from `value`."""
    if kind == "attr":
        return getattr(value, arg)
    if kind == "item":
        return value[arg]
    if kind == "key":  # as Dynamo reads a dict's keys: `dict.keys`, past a subclass's own
        return list(dict.keys(value))[arg]
    if kind == "value":
        return dict.__getitem__(value, list(dict.keys(value))[arg])
    if arg == "dict" and isinstance(value, types.MappingProxyType):
        return value  # a class's `__dict__`, read by item: the view reads as its copy would, uncopied
    return _CALLS[arg](value)


def render(path: Path) -> str:
    """`path` as the model's code names it: "the global helper.ACT", "self._modules['0'].act"."""
    (head, name), *rest = path
    text = module_name(name) if head == "global" else name  # a module's head is its name
    for kind, arg in rest:
        text = _RENDER[kind](text, arg)
    return f"the global {text}" if head == "global" else text


def module_name(name: str) -> str:
    """A global's name as the code names it: Dynamo's `__import_torch_dot_nn` is the module `torch.nn`."""
    return name.removeprefix("__import_").replace("_dot_", ".") if name.startswith("__import_") else name


class Scope:
    """What a path's head is looked up in, for one call of a frame (the owner's compiled function): its
    globals, and the call's arguments by the names of the frame's parameters (`self` the owner)."""

    def __init__(self, frame: types.FunctionType, owner: object, args: tuple, kwargs: dict) -> None:
        bound = inspect.signature(frame).bind(owner, *args, **kwargs)
        bound.apply_defaults()
        self.f_globals, self.arguments = frame.__globals__, bound.arguments


def global_value(f_globals: dict, name: str) -> Any:
    """A global of a frame's as a later process has it: the modules Dynamo imported by a name of its own
    (`__import_torch_dot_nn`) from `sys.modules`, Python's builtins (`__builtins_dict___0`), else the
    frame's own globals. Of those Dynamo installed under an id of its process's, the modules only, which
    a load puts back (`install_modules`): a path through any other cannot be read there."""
    if name.startswith("__import_"):
        return sys.modules[module_name(name)]
    if name.startswith("__builtins_dict"):
        return builtins.__dict__
    value = f_globals[name]
    if installed(name) and not isinstance(value, types.ModuleType):
        raise KeyError(name)
    return value
