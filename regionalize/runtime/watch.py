"""The guards torch drops from a saved frame, checked on every call as `torch.compile`'s own would be.

torch's saved frame keeps no guard on which function, class or module a name holds (`ID_MATCH` and its
kin), in the process that compiled it as in one that loaded it. `torch.compile` checks those on every
call, in C++; a rebound function (`helper.act = other`, `block.fn = other`) then compiles again. `Watch`
does the same for a saved frame: each dropped guard's path (`guard_paths.py`) is walked from the call's
owner or the frame's globals, and what it finds compared with what was there when the frame was compiled or
loaded.

A call's check runs before every call of the frame, so it is one Python function of straight-line look-ups,
made once from the paths: paths that share their first steps take them once, an attribute is read by its
name (checked to be an identifier: `guard_paths.valid`) and every other key, and every value compared
against, is passed in as data. No text read from a file reaches the function but those identifiers."""

from __future__ import annotations

import builtins
import keyword
import sys
import types
from collections.abc import Callable
from typing import Any

from .guard_paths import Path, Scope, global_value, module_name, step
from .guard_reads import Read, recorded
from .internals.aot import installed


class Watch:
    """The reads of `reads` whose guards torch dropped, as one check of a call (`holds`)."""

    __slots__ = ("check",)

    def __init__(self, reads: list[Read], frame: types.FunctionType) -> None:
        """Raises ValueError where a dropped read has no plain path: it could not be checked."""
        build = _Builder(frame)
        for read in reads:
            if not read.dropped:
                continue
            if read.path is None:
                raise ValueError(f"{read.source} cannot be checked on each call")
            if _vacuous(read.path):
                continue
            build.check(read.path, read.how, read.seen)
        self.check = build.function()

    def holds(self, owner: Any, args: tuple, kwargs: dict) -> bool:
        """Does every dropped read find what it found before, for this call of `owner`? False where a path
        no longer leads anywhere."""
        return self.check((owner, args, kwargs))


def _vacuous(path: Path) -> bool:
    """Is `path` a module Dynamo installed in the frame's globals for its code, and nothing more? Dynamo's
    frame keeps the module object it installed, which no rebinding reaches: its guard never fails."""
    [kind, name], *rest = path
    return not rest and (kind == "module" or (kind == "global" and name.startswith("__import_")))


class _Builder:
    """The lines of a call's check: one local a node of the paths' tree, and the comparisons."""

    def __init__(self, frame: types.FunctionType) -> None:
        self.frame, self.nodes, self.lines, self.tests = frame, {}, [], []
        self.data: list[Any] = []  # keys, values compared against, helpers: `d0`, `d1`... in the check

    def value(self, item: Any) -> str:
        """The name `item` is passed to the check by (a default of its parameters: a local's speed)."""
        self.data.append(item)
        return f"d{len(self.data) - 1}"

    def node(self, path: Path) -> str:
        """The local that holds the value at `path`, its look-up added where new."""
        key = tuple(map(tuple, path))
        if key not in self.nodes:
            *before, (kind, arg) = path
            expression = self.expression(before, kind, arg)  # the nodes before it first
            self.nodes[key] = f"v{len(self.nodes)}"
            self.lines.append(f"{self.nodes[key]} = {expression}")
        return self.nodes[key]

    def expression(self, before: Path, kind: str, arg: Any) -> str:
        if not before:
            return self.head(kind, arg)
        base = self.node(before)
        if kind == "attr" and arg.isidentifier() and not keyword.iskeyword(arg):
            return f"{base}.{arg}"
        if kind == "item":
            return f"{base}[{self.value(arg)}]"
        return f"{self.value(step)}({base}, {self.value(kind)}, {self.value(arg)})"

    def head(self, kind: str, name: str) -> str:
        if kind == "module" or (kind == "global" and name.startswith("__import_")):
            return f"{self.value(sys.modules)}[{self.value(module_name(name))}]"
        if kind == "global" and name.startswith("__builtins_dict"):
            return self.value(builtins.__dict__)
        if kind == "global" and not installed(name):
            return f"{self.value(self.frame.__globals__)}[{self.value(name)}]"
        if kind == "global":  # a global of Dynamo's process-wide names: `global_value` says which it reads
            return f"{self.value(global_value)}({self.value(self.frame.__globals__)}, {self.value(name)})"
        if name == self.frame.__code__.co_varnames[0]:
            return "call[0]"
        return f"{self.value(_argument)}({self.value(self.frame)}, call, {self.value(name)})"

    def check(self, path: Path, how: str, seen: Any) -> None:
        local = self.node(path)
        if how == "is":
            self.tests.append(f"{local} is {self.value(seen)}")
        else:
            self.tests.append(
                f"{self.value(recorded)}({self.value(how)}, {local}) == {self.value(recorded(how, seen))}"
            )

    def function(self) -> Callable[[tuple], bool]:
        parameters = "".join(f", d{i}=None" for i in range(len(self.data)))
        body = "\n".join(f"        {line}" for line in self.lines) or "        pass"
        source = (
            f"def check(call{parameters}):\n"
            "    try:\n"
            f"{body}\n"
            "    except Exception:\n"
            "        return False\n"
            f"    return {' and '.join(self.tests) or 'True'}\n"
        )
        namespace: dict[str, Any] = {}
        exec(compile(source, "<regionalize watch>", "exec"), namespace)
        check = namespace["check"]
        check.__defaults__ = tuple(self.data)
        return check


def _argument(frame: types.FunctionType, call: tuple, name: str) -> Any:
    """An argument of the call other than the owner, by its name in the frame's signature."""
    return Scope(frame, *call).arguments[name]
