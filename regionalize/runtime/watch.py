"""Checks on every call the guards that torch drops from a saved frame, as `torch.compile` would.

Those guards check which function, class or module a name holds
(docs/saved-owners.md#never-stale-never-corrupt). The check is one function of straight-line look-ups,
made once from the guards' paths. No text from a file reaches it except attribute names checked to be
identifiers; every key and value is passed in as data."""

from __future__ import annotations

import builtins
import inspect
import keyword
import sys
import types
from collections.abc import Callable
from typing import Any, cast

from .guard_paths import Path, bound_arguments, global_value, module_name, step
from .guard_reads import Read, record_of
from .internals.aot import is_installed_global


class Watch:
    """Checks, on each call, the reads whose guards torch dropped (`is_unchanged`)."""

    __slots__ = ("check",)

    def __init__(self, reads: list[Read], frame: types.FunctionType) -> None:
        """Builds the check, and raises ValueError where a dropped read has no plain path to check."""
        build = _Builder(frame)
        for read in reads:
            if not read.dropped:
                continue
            if read.path is None:
                raise ValueError(f"{read.source} cannot be checked on each call")
            if _is_vacuous(read.path):
                continue
            build.check(read.path, read.how, read.seen)
        self.check = build.function()

    def is_unchanged(self, owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Returns whether every dropped read finds what it found before, for this call of `owner`."""
        return self.check((owner, args, kwargs))


def _is_vacuous(path: Path) -> bool:
    """Returns whether `path` is only a module that Dynamo installed, whose guard can never fail."""
    [kind, name], *rest = path
    return not rest and (kind == "module" or (kind == "global" and name.startswith("__import_")))


class _Builder:
    """Builds the lines of a call's check: one local per node of the paths' tree, and the comparisons."""

    def __init__(self, frame: types.FunctionType) -> None:
        self.frame, self.lines, self.tests = frame, list[str](), list[str]()
        self.nodes: dict[tuple[Any, ...], str] = {}
        self.data: list[Any] = []  # keys, values and helpers, named `d0`, `d1`, ... in the check

    def value(self, item: Any) -> str:
        """Returns the name under which `item` is passed to the check, as a default for a local's speed."""
        self.data.append(item)
        return f"d{len(self.data) - 1}"

    def node(self, path: Path) -> str:
        """Returns the local that holds the value at `path`, adding its look-up where it is new."""
        key = tuple(map(tuple, path))
        if key not in self.nodes:
            *before, (kind, arg) = path
            expression = self.expression(before, kind, arg)  # adds the nodes before it first
            self.nodes[key] = f"v{len(self.nodes)}"
            self.lines.append(f"{self.nodes[key]} = {expression}")
        return self.nodes[key]

    def expression(self, before: Path, kind: str, arg: Any) -> str:
        if not before and kind == "arguments":  # the call's arguments, bound once a call
            return f"{self.value(bound_arguments)}({self.value(inspect.signature(self.frame))}, *call)"
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
        if kind == "global" and not is_installed_global(name):
            return f"{self.value(self.frame.__globals__)}[{self.value(name)}]"
        if kind == "global":  # a global that Dynamo named by an id: `global_value` decides what it reads
            return f"{self.value(global_value)}({self.value(self.frame.__globals__)}, {self.value(name)})"
        if name == self.frame.__code__.co_varnames[0]:
            return "call[0]"
        return f"{self.node([['arguments', None]])}[{self.value(name)}]"

    def check(self, path: Path, how: str, seen: Any) -> None:
        local = self.node(path)
        if how == "is":
            self.tests.append(f"{local} is {self.value(seen)}")
            return
        test = f"{self.value(record_of)}({self.value(how)}, {local}) == {self.value(record_of(how, seen))}"
        if how == "value" and isinstance(seen, types.CodeType):  # immutable: the same object reads the same
            test = f"({local} is {self.value(seen)} or {test})"
        self.tests.append(test)

    def function(self) -> Callable[[tuple[Any, ...]], bool]:
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
        return cast("Callable[[tuple[Any, ...]], bool]", check)
