"""What a saved owner's guards read that torch's load would not check, recorded with the file and checked
before it is loaded (`saved.py`).

torch saves a frame's guards on its inputs with the values they expect. It cannot save some kinds (which
function, class or module an attribute holds: `ID_MATCH`, `CLOSURE_MATCH`, ...), which `aot_compile` then
drops, and those on globals it builds again at the load from the globals as they are then: a frame saved
with one activation function, or one value of a module's flag, would run with it in a process that set
another. Each such guard's source (a Python expression over the frame's globals, `G[...]`, and its
arguments) is recorded with what it read (`recorded`), and evaluated again before a load."""

import builtins
import hashlib
import inspect
import re
import sys
import types

import torch

from .internals.aot import installed

_PLAIN = (type(None), bool, int, float, str)


def recorded(how, value):
    """What a guard reads of `value` (`how`: its "len", its "type", its dict's "keys", which object it "is",
    or its "value"), as JSON keeps it, comparable across processes (`_value`); None where it cannot be
    recorded: the frame is not saved."""
    if how == "len":
        return [len(value)]
    if how == "type":
        return _value(type(value))
    if how == "keys":
        keys = [_value(key) for key in value]
        return None if None in keys else keys
    return _value(value)


def _value(value):
    """`value` as JSON keeps it, comparable across processes: a constant (a tuple as a list), a function,
    class or module by its name (a function's code by its line and a hash: two lambdas of one module
    differ), a dict by its keys (its values have guards of their own), a code object; `repr` where it names
    no address (`torch.uint8`, an enum's member), else the object's type (what is read of it is guarded on
    its own). None for a tensor (its values may be the compiled code's constants) and where even the type
    cannot be named: the frame is not saved."""
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
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        name = getattr(value, "__qualname__", None)
        code = getattr(value, "__code__", None)
        return name and {"is": f"{getattr(value, '__module__', None)}.{name}", "code": code and _code(code)}
    if isinstance(value, torch.Tensor):
        return None  # its values may be the compiled code's constants
    text = repr(value)
    if " at 0x" not in text and "object at" not in text and "..." not in text:  # "...": cut short
        return {"repr": text}
    kind = _value(type(value))
    return kind and {"type": kind}


def _code(code):
    return [
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_firstlineno,
        hashlib.sha256(code.co_code).hexdigest()[:16],
    ]


class _Globals(dict):
    """The globals a guard's source names (`G['SCALE']`), as a later process has them: the frame's, the
    modules Dynamo imported by a name of its own (`__import_torch_dot_nn`), and Python's builtins
    (`__builtins_dict___0`). Of the globals Dynamo installed under an id of its process's, the modules only,
    which a load puts back (`install_modules`): a source through any other cannot be read there."""

    def __init__(self, f_globals):
        super().__init__()
        self.f_globals = f_globals

    def __missing__(self, name):
        if name.startswith("__import_"):
            return sys.modules[_module_name(name)]
        if name.startswith("__builtins_dict"):
            return builtins.__dict__
        value = self.f_globals[name]
        if installed(name) and not isinstance(value, types.ModuleType):
            raise KeyError(name)
        return value


def scope(frame, owner, args, kwargs):
    """What a source is evaluated in, for a call of `frame` (the owner's compiled function): `G`, and the
    call's arguments by the names of the frame's parameters (`self` the owner)."""
    bound = inspect.signature(frame).bind(owner, *args, **kwargs)
    bound.apply_defaults()
    return {"G": _Globals(frame.__globals__), "__builtins__": builtins, **bound.arguments}


def read(source, names):
    """The value of a guard's `source` in `names` (`scope`)."""
    return eval(source, dict(names))  # a guard's source, as Dynamo's own guards evaluate it every call


def unreadable(reads, names):
    """The first source of `reads` ((how, source, value), as the guards saw them) that a later process could
    not check: it does not evaluate to the same object here, or what is read of it cannot be recorded.
    None where every one can."""
    for how, source, value in reads:
        kept = recorded(how, value)
        try:
            now = read(source, names)
            same = kept is not None and (now is value or recorded(how, now) == kept)
        except Exception:
            same = False
        if not same:
            return source
    return None


def changed(records, names):
    """The first source of `records` ((how, source, what `recorded` kept)) that reads otherwise now, as the
    model's code names it ("the global helper.ACT", "self.act"), or None."""
    for how, source, saved in records:
        try:
            now = recorded(how, read(source, names))
        except Exception:
            now = None
        if now != saved:
            return named(source)
    return None


_HEAD = re.compile(r"G\['([^']+)'\]")  # a global of the frame's, or a module Dynamo imported


def named(source):
    """A source as the code names it: `G['__import_helper'].ACT` is "the global helper.ACT"."""
    text = _HEAD.sub(lambda head: _module_name(head.group(1)), source)
    return f"the global {text}" if _HEAD.match(source) else text


def _module_name(name):
    """A global's name as the code names it: Dynamo's `__import_torch_dot_nn` is the module `torch.nn`."""
    return name.removeprefix("__import_").replace("_dot_", ".") if name.startswith("__import_") else name
