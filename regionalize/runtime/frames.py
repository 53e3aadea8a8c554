"""The frames the runtime compiles, with the globals of the model code they run.

Dynamo reads a global of an inlined function through the frame it compiles where the two share their
globals; otherwise torch 2.11 to 2.13 import the function's module by its `__name__` (2.14 reads the globals
themselves). A model whose module cannot be imported by that name (loaded by `spec_from_file_location` or
`SourceFileLoader` and not registered, run by `runpy.run_path`, built by `exec`) then failed to compile
with a `ModuleNotFoundError`, where `model.compile()`, whose frame is the model's own `forward`, runs it. So
the frames the runtime compiles take the globals of the model code they call: the owner's `forward`'s for
the owner, the block's for a block compiled on its own where its module cannot be imported. Their bodies
read no global, only their arguments and closure."""

import functools
import sys
import traceback
import types
import warnings

import torch

from .cpu_keys import tag_caches
from .internals.hooks import module_frame
from .internals.tracer import compiling, why_failed
from .state import process

# The runtime's modules, whose frames a warning skips: the package's parts, or a vendored copy's one module.
runtime = __name__[: -len(".frames")] if __name__.endswith(".frames") else __name__


def new_frame(cls, kind):
    """A new frame to compile for modules of `cls` (`module_frame`), named for the class, its module and
    `kind` (two copies of the runtime loaded from one file, each serving its own modules, name theirs
    apart), in the globals of the class's code. Its name is unique in this copy of the runtime: Dynamo
    keys what it learns of a frame (automatic dynamic shapes) by its code's name, file and line, which are
    the runtime's for every frame, so two classes of one name (`Model` in two files) would share it."""
    base = f"{cls.__module__}.{cls.__name__}_{kind}".replace(".", "_")
    name, taken = base, 0
    while name in process.frame_names:
        taken += 1
        name = f"{base}_{taken}"
    process.frame_names.add(name)
    return in_globals(module_frame, globals_of(cls.forward) or globals(), name)


def globals_of(function):
    """The globals of the model code `function` runs: through the runtime's wrappers of a class's `forward`
    (`functools.wraps`, `_regionalize_forward`) to the user's function; None where none is found."""
    for _ in range(16):  # a wrapper chain, never a cycle
        inner = getattr(function, "_regionalize_forward", None) or getattr(function, "__wrapped__", None)
        if inner is None:
            break
        function = inner
    function = getattr(function, "__func__", function)
    return function.__globals__ if isinstance(function, types.FunctionType) else None


def in_globals(function, model_globals, name=None, **defaults):
    """`function` (whose body reads no global) as a function of `model_globals`, its code named `name`, its
    keyword-only defaults `defaults` where given: the frame Dynamo compiles then shares its globals with the
    model code it inlines."""
    code = function.__code__ if name is None else function.__code__.replace(co_name=name)
    made = types.FunctionType(
        code, model_globals, name or function.__name__, function.__defaults__, function.__closure__
    )
    made.__qualname__ = name or function.__qualname__
    made.__kwdefaults__ = defaults or function.__kwdefaults__
    return made


def installed(template, wrapped, **defaults):
    """`template` standing in for `wrapped` on a user class: a copy whose keyword-only defaults carry what it
    calls, not a closure, named and documented as `wrapped`, which its `__wrapped__` leads back to."""
    made = types.FunctionType(template.__code__, template.__globals__, wrapped.__name__)
    made.__kwdefaults__ = defaults
    return functools.update_wrapper(made, wrapped)


def importable(model_globals):
    """Can Dynamo reach the module of `model_globals` by its `__name__`, as it does for a function it inlines
    from a frame of other globals? A module registered under its name, or globals of no name (Dynamo then
    keeps them itself). A name that `sys.modules` holds for other globals (an `exec` named `__main__`) is
    not: Dynamo would read the registered module's values."""
    name = model_globals.get("__name__")
    if not isinstance(name, str) or name.startswith("namedtuple_"):
        return True
    return getattr(sys.modules.get(name), "__dict__", None) is model_globals


def unimportable(owner_globals, classes):
    """Why the owner's frame, of `owner_globals`, cannot inline the `forward` of each of `classes`: the first
    class defined in globals other than the owner's whose module is not importable by name; else None."""
    for cls in classes:
        found = globals_of(cls.forward)
        if found is not None and found is not owner_globals and not importable(found):
            module = found.get("__name__", "?")
            return f"{cls.__name__} is defined in module {module!r}, which is not importable by that name"
    return None


class OrEager:
    """A compiled frame of `code`, or `eager` from the call on where compiling it failed before it ran
    anything (`failed_on_entry`): the original's result, never an error of the compile, with
    one warning a class of module. An error raised once the frame ran (a graph break's later part failing
    to compile, after the first ran) is raised: what ran cannot be run again."""

    __slots__ = ("cls", "code", "compiled", "eager")

    def __init__(self, compiled, eager, code, cls):
        self.compiled, self.eager, self.code, self.cls = compiled, eager, code, cls

    def __call__(self, *args, **kwargs):
        compiled = self.compiled
        if compiled is None:
            return self.eager(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:
            if not failed_on_entry(error, self.code):
                raise
            why = why_failed(error)
        self.compiled = None
        if self.cls not in process.warned:
            process.warned.add(self.cls)
            message = f"{self.cls.__name__} cannot be compiled ({why}); it runs eagerly"
            warnings.warn(f"regionalize: {message}", stacklevel=caller())
        return self.eager(*args, **kwargs)


def failed_on_entry(error, code):
    """Did compiling the frame of `code` raise `error` before the frame ran (Dynamo compiles at its entry)?
    Not where the frame's compiled code ran and a later part of it failed (its code is in the traceback)."""
    frames = traceback.walk_tb(error.__traceback__)
    return compiling(error) and all(frame.f_code.co_name != code.co_name for frame, _ in frames)


def caller():
    """The `stacklevel` of a warning of the function that calls this one that names the line that called
    the model: the first frame of neither this runtime nor torch (whose module call sits between)."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "")
        ours = module == runtime or module.startswith(f"{runtime}.")
        if not ours and module.partition(".")[0] != "torch":
            break
        frame, level = frame.f_back, level + 1
    return level


def torch_compile(fn, kwargs, **more):
    """`torch.compile(fn, **kwargs)`, `more` taking precedence, given options of its own: torch.compile
    pops `guard_filter_fn` from the options it is handed (2.11 to 2.15), which would leave an owner's set-up
    without its guard filter at its next compile, and its saving unaware of it. torch's caches are keyed
    on the machine first (`tag_caches`)."""
    tag_caches()
    return torch.compile(fn, **{**own_options(kwargs), **more})


def own_options(kwargs):
    """`kwargs` with a copy of their options, for a compile that may change them (`block.compile`)."""
    return {**kwargs, "options": dict(kwargs["options"])} if "options" in kwargs else kwargs
