"""What a saved owner's guards read that torch does not check for it, recorded with the file, checked before
it is loaded, and checked again on every call (`saved.py`).

torch saves a frame's guards on its inputs with the values they expect. It cannot save some kinds (which
function, class or module a name holds: `ID_MATCH`, `CLOSURE_MATCH`, ...), which `aot_compile` then drops
from the frame it serves, in the process that compiled it as in one that loads it; and it builds the guards
on globals again at a load from the globals as they are then. So a function rebound after the first call,
or a module's flag that a later process sets otherwise, would go unchecked. Each such guard's place (a
path, `guard_paths.py`) is recorded with what it read (`recorded`) and compared before a load (`changed`);
the dropped ones are checked on every call (`watch.py`), as `torch.compile`'s guards would, and a call
where one fails runs the frame `torch.compile` compiles, which compiles again."""

from __future__ import annotations

import hashlib
import types
from typing import Any

import torch

from .guard_paths import Path, Scope, parse, render, valid, walk

_PLAIN = (type(None), bool, int, float, str)
_HOWS = ("len", "type", "keys", "is", "value")  # what a guard reads of its value (`recorded`)
_DEPTH = 2  # how deep a function's state is followed through its closures and globals


class Read:
    """One guard's read: what it reads of its value (`how`: its "len", its "type", its dict's "keys", which
    object it "is", or its "value"), where (`path`; None where Dynamo's `source` is not a plain path of
    look-ups, which a later process could not find again), what it saw there (`seen`, the object itself),
    and whether torch drops the guard (`dropped`: then the runtime checks it on every call)."""

    __slots__ = ("dropped", "how", "path", "seen", "source")

    def __init__(self, how: str, path: Path | None, seen: Any, dropped: bool, source: str = "") -> None:
        self.how, self.path, self.seen, self.dropped = how, path, seen, dropped
        self.source = source or (render(path) if path else "")


def reads_of(guards: list[tuple[str, str, Any, bool]]) -> list[Read]:
    """`guards` ((how, source, value, dropped), as `aot.savable` collected them) as `Read`s."""
    return [Read(how, parse(source), value, dropped, source) for how, source, value, dropped in guards]


def recorded(how: str, value: Any) -> Any:
    """What a guard reads of `value` as JSON keeps it, comparable across processes (`_value`); None where
    it cannot be recorded: the frame is not saved."""
    if how == "len":
        return [len(value)]
    if how == "type":
        return _value(type(value))
    if how == "keys":
        keys = [_value(key) for key in value]
        return None if None in keys else keys
    return _value(value)


def _value(value: Any, depth: int = 0) -> Any:
    """`value` as JSON keeps it, comparable across processes: a constant (a tuple as a list), a module by
    its name, a function by its name and all that changes what it computes (`_function`), a class by its
    name, a dict by its keys (its values have guards of their own), a code object by its content; `repr`
    where it names no address (`torch.uint8`, an enum's member), else the object's type (what is read of
    it is guarded on its own). None for a tensor (its values may be the compiled code's constants) and
    where even the type cannot be named: the frame is not saved."""
    if isinstance(value, _PLAIN):
        return [value]  # boxed: None is a value too
    if isinstance(value, (tuple, list)) and all(isinstance(item, _PLAIN) for item in value):
        return [list(value)]
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, types.CodeType):
        return {"code": _code(value)}
    if isinstance(value, dict):
        keys = recorded("keys", value)
        return keys and {"keys": keys}
    if isinstance(value, types.FunctionType):
        return _function(value, depth)
    if isinstance(value, (type, types.BuiltinFunctionType)):
        name = getattr(value, "__qualname__", None)
        return name and {"is": f"{getattr(value, '__module__', None)}.{name}"}
    if isinstance(value, torch.Tensor):
        return None  # its values may be the compiled code's constants
    text = repr(value)
    if " at 0x" not in text and "object at" not in text and "..." not in text:  # "...": cut short
        return {"repr": text}
    kind = _value(type(value))
    return kind and {"type": kind}


def _function(function: types.FunctionType, depth: int) -> dict:
    """A function as a later process can tell it apart: its name, its code (bytecode, constants, names),
    and, `_DEPTH` deep, its defaults, its closure's cells and the globals its code names (`_state`). Two
    functions built by `exec` from one text with another constant, or one closure over another value,
    differ."""
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
    """What of a value a function holds (a default, a cell, a global) changes what it computes: a
    constant's value, a function (`_function`, a level deeper), which class, module or code it is; of
    anything else (a tensor, a registry, a logger) its type alone: what a trace reads of it is guarded on
    its own, and its contents may differ from process to process without changing the code."""
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
    """The names `code` and the code nested in it look up (globals among them)."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _code(code: types.CodeType) -> list:
    """A code object by its name, its first line and a hash of what it runs: its bytecode, its constants
    (nested code by the same hash) and the names it looks up."""
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


def unreadable(reads: list[Read], scope: Scope) -> str | None:
    """The first of `reads` that a later process could not check, as the code names it: its path is not
    plain, it does not lead to the same object here, or what is read of it cannot be recorded. None where
    every one can."""
    for read in reads:
        kept = recorded(read.how, read.seen)
        try:
            now = walk(read.path, scope) if read.path else None
            same = (
                read.path is not None
                and kept is not None
                and (now is read.seen or recorded(read.how, now) == kept)
            )
        except Exception:
            same = False
        if not same:
            return render(read.path) if read.path else read.source
    return None


def records(reads: list[Read]) -> list[dict]:
    """`reads` as the saved file keeps them: data only (`guard_paths.valid`)."""
    return [
        {"how": r.how, "path": r.path, "saw": recorded(r.how, r.seen), "dropped": r.dropped} for r in reads
    ]


def changed(kept: object, scope: Scope) -> tuple[str | None, list[Read]]:
    """What of the saved file's records (`kept`) reads otherwise now, as the model's code names it ("the
    global helper.ACT", "self.act"), or None; and the reads as they are now, for the `Watch`. Where several
    differ, one that changed in itself is named before a function that changed only through the globals it
    reads (a changed flag changes both). A record that is not what `records` writes raises ValueError: the
    file is not loaded."""
    if not isinstance(kept, list):
        raise ValueError("records are not a list")
    now_reads, differ = [], []
    for record in kept:
        if not (isinstance(record, dict) and valid(record.get("path")) and record.get("how") in _HOWS):
            raise ValueError("a record is not a guard's read")
        path, saw = record["path"], record.get("saw")
        try:
            value = walk(path, scope)
            now = recorded(record["how"], value)
        except Exception:
            now = value = None
        if now != saw:
            differ.append((_through_globals(saw, now), render(path)))
        now_reads.append(Read(record["how"], path, value, bool(record.get("dropped"))))
    if differ:
        return min(differ, key=lambda pair: pair[0])[1], []
    return None, now_reads


def _through_globals(saw: Any, now: Any) -> bool:
    """Do two records of a function differ only in the globals it reads?"""
    if not (isinstance(saw, dict) and isinstance(now, dict) and "globals" in saw and "globals" in now):
        return False
    return {**saw, "globals": None} == {**now, "globals": None}
