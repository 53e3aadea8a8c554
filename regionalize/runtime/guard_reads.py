"""Records what a saved owner's guards read that torch does not check, and compares it before a load.

torch drops some kinds of guard from a saved frame (which function, class or module a name holds) and
rebuilds the guards on globals at a load from the globals as they are then. Each such guard's place and
what it read are recorded (`record_of`) and compared before a load (`find_changed`); `watch.py` checks the
dropped ones on every call (docs/saved-owners.md#never-stale-never-corrupt)."""

from __future__ import annotations

import hashlib
import types
from typing import Any

import torch

from .guard_paths import Path, Scope, is_valid, parse, render, walk
from .internals.aot import GuardRead

_PLAIN = (type(None), bool, int, float, str)
_HOWS = ("len", "type", "keys", "is", "value")  # what a guard can read of its value (`record_of`)
_DEPTH = 2  # how deep `_function` follows a function's closures and globals


class Read:
    """Holds one guard's read: what it reads (`how`), where (`path`), what it saw, and whether torch drops it.

    `how` is "len", "type", "keys", "is" or "value"; `path` is None where Dynamo's source is no plain path.
    The runtime checks a dropped guard's read on every call."""

    __slots__ = ("dropped", "how", "path", "seen", "source")

    def __init__(self, how: str, path: Path | None, seen: Any, dropped: bool, source: str = "") -> None:
        self.how, self.path, self.seen, self.dropped = how, path, seen, dropped
        self.source = source or (render(path) if path else "")


def reads_of(guards: list[GuardRead]) -> list[Read]:
    """Returns `guards`, as `aot.savable` collected them, as `Read`s."""
    return [Read(how, parse(source), value, dropped, source) for how, source, value, dropped in guards]


def record_of(how: str, value: Any) -> Any:
    """Returns what a guard reads of `value` as JSON that another process can compare, or None.

    A read that cannot be recorded returns None, and the frame is then not saved."""
    if how == "len":
        return [len(value)]
    if how == "type":
        return _value(type(value))
    if how == "keys":
        keys = [_value(key) for key in value]
        return None if None in keys else keys
    return _value(value)


def _value(value: Any, depth: int = 0) -> Any:
    """Returns `value` as JSON that another process can compare, or None where it cannot be recorded.

    Constants are kept as they are, modules and classes by name, functions by what they compute, dicts by
    their keys, code objects by content, and other objects by their `repr` or else their type. A tensor gives
    None, since its values may be constants of the compiled code."""
    if isinstance(value, _PLAIN):
        return [value]  # boxed, because None is a value too
    if isinstance(value, (tuple, list)) and all(isinstance(item, _PLAIN) for item in value):
        return [list(value)]
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, types.CodeType):
        return {"code": _code(value)}
    if isinstance(value, dict):
        keys = record_of("keys", value)
        return keys and {"keys": keys}
    if isinstance(value, types.FunctionType):
        return _function(value, depth)
    if isinstance(value, (type, types.BuiltinFunctionType)):
        name = getattr(value, "__qualname__", None)
        return name and {"is": f"{getattr(value, '__module__', None)}.{name}"}
    if isinstance(value, torch.Tensor):
        return None  # its values may be the compiled code's constants
    text = repr(value)
    if " at 0x" not in text and "object at" not in text and "..." not in text:  # "..." marks a cut repr
        return {"repr": text}
    kind = _value(type(value))
    return kind and {"type": kind}


def _function(function: types.FunctionType, depth: int) -> dict[str, Any]:
    """Returns a record of `function` that tells it apart from any function that computes otherwise.

    It holds the function's name and code and, down to `_DEPTH`, its defaults, its closure's cells and the
    globals its code names, so two closures over different values differ."""
    name = {"is": f"{function.__module__}.{function.__qualname__}", "code": _code(function.__code__)}
    if depth >= _DEPTH:
        return name
    f_globals = function.__globals__
    state = {
        "defaults": [_state(v, depth) for v in function.__defaults__ or ()],
        "kwdefaults": [[k, _state(v, depth)] for k, v in sorted((function.__kwdefaults__ or {}).items())],
        "cells": [_state(_cell(cell), depth) for cell in function.__closure__ or ()],
        "globals": [
            [n, _state(f_globals[n], depth)] for n in sorted(_names(function.__code__)) if n in f_globals
        ],
    }
    return {**name, **state}


def _state(value: Any, depth: int) -> Any:
    """Returns what of a value that a function holds can change what the function computes.

    Constants, functions, classes, modules and code count in full; anything else counts by its type alone,
    since what a trace reads of it has guards of its own."""
    if isinstance(value, types.FunctionType):
        return _function(value, depth + 1)
    plain = isinstance(value, (*_PLAIN, type, types.BuiltinFunctionType, types.ModuleType, types.CodeType))
    if plain or (isinstance(value, tuple) and all(isinstance(item, _PLAIN) for item in value)):
        return _value(value, depth + 1)
    return {"type": _value(type(value))}


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return "<empty cell>"


def _names(code: types.CodeType) -> set[str]:
    """Returns the names that `code` and the code nested in it look up, globals among them."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _code(code: types.CodeType) -> list[Any]:
    """Returns a code object's name, first line, and a hash of its bytecode, constants and names."""
    return [
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_firstlineno,
        _hash(code),
    ]


def _hash(code: types.CodeType) -> str:
    digest = hashlib.sha256(code.co_code)
    for const in code.co_consts:
        digest.update(
            (_hash(const) if isinstance(const, types.CodeType) else repr((type(const), const))).encode()
        )
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)).encode())
    return digest.hexdigest()[:16]


def find_unreadable(reads: list[Read], scope: Scope) -> str | None:
    """Returns the first of `reads` that a later process could not check, or None where it can check all.

    A read fails the test where its path is not plain, does not lead back to the same object here, or reads
    something that cannot be recorded."""
    for read in reads:
        kept = record_of(read.how, read.seen)
        try:
            now = walk(read.path, scope) if read.path else None
            same = (
                read.path is not None
                and kept is not None
                and (now is read.seen or record_of(read.how, now) == kept)
            )
        except Exception:
            same = False
        if not same:
            return render(read.path) if read.path else read.source
    return None


def records(reads: list[Read]) -> list[dict[str, Any]]:
    """Returns `reads` as the saved file keeps them, as plain data."""
    return [
        {"how": r.how, "path": r.path, "saw": record_of(r.how, r.seen), "dropped": r.dropped} for r in reads
    ]


def find_changed(kept: object, scope: Scope) -> tuple[str | None, list[Read]]:
    """Returns the first of the saved records (`kept`) that reads otherwise now, and the reads as they are.

    The changed read is named as the model's code names it ("the global helper.ACT"), or is None. A value
    that changed in itself is named before a function that changed only through its globals. A record that
    `records` could not have written raises ValueError, and the file is then not loaded."""
    if not isinstance(kept, list):
        raise ValueError("records are not a list")
    now_reads, differ = [], []
    for record in kept:
        if not (isinstance(record, dict) and is_valid(record.get("path")) and record.get("how") in _HOWS):
            raise ValueError("a record is not a guard's read")
        path, saw = record["path"], record.get("saw")
        try:
            value = walk(path, scope)
            now = record_of(record["how"], value)
        except Exception:
            now = value = None
        if now != saw:
            differ.append((_is_change_in_globals(saw, now), render(path)))
        now_reads.append(Read(record["how"], path, value, bool(record.get("dropped"))))
    if differ:
        return min(differ, key=lambda pair: pair[0])[1], []
    return None, now_reads


def _is_change_in_globals(saw: Any, now: Any) -> bool:
    """Returns whether two records of a function differ only in the globals it reads."""
    if not (isinstance(saw, dict) and isinstance(now, dict) and "globals" in saw and "globals" in now):
        return False
    return {**saw, "globals": None} == {**now, "globals": None}
