"""Makes the frames that the runtime compiles, each in the globals of the model code it calls.

Some torch versions import an inlined function's module by name unless the compiled frame shares its
globals, which fails for a model whose module is not importable by name
(docs/form-hierarchical.md#models-whose-module-is-not-importable-by-name). The frames' bodies read no
global, only their arguments and closure."""

from __future__ import annotations

import functools
import sys
import traceback
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .cpu_keys import tag_caches
from .internals.hooks import module_frame
from .internals.tracer import is_compile_error, why_failed
from .state import process

# The name of the runtime's package, whose frames a warning skips (a vendored copy has a name of its own).
runtime = __name__[: -len(".frames")] if __name__.endswith(".frames") else __name__


def new_frame(cls: type[nn.Module], kind: str) -> types.FunctionType:
    """Returns a new frame to compile for modules of `cls`, in the globals of the class's code.

    The frame is named for the class, its module and `kind`, uniquely in this copy of the runtime: Dynamo
    keys what it learns of a frame by its code's name, file and line, so two classes of one name
    (`Model` in two files) would otherwise share it."""
    base = f"{cls.__module__}.{cls.__name__}_{kind}".replace(".", "_")
    name, taken = base, 0
    while name in process.frame_names:
        taken += 1
        name = f"{base}_{taken}"
    process.frame_names.add(name)
    return in_globals(module_frame, globals_of(cls.forward) or globals(), name)


def globals_of(function: Callable[..., Any]) -> dict[str, Any] | None:
    """Returns the globals of the model code that `function` runs, or None where none are found.

    It follows the runtime's wrappers of a class's `forward` down to the user's function."""
    for _ in range(16):  # bounded, so that a cycle of wrappers cannot loop forever
        inner = getattr(function, "_regionalize_forward", None) or getattr(function, "__wrapped__", None)
        if inner is None:
            break
        function = inner
    function = getattr(function, "__func__", function)
    return function.__globals__ if isinstance(function, types.FunctionType) else None


def in_globals(
    function: Callable[..., Any], model_globals: dict[str, Any], name: str | None = None, **defaults: Any
) -> types.FunctionType:
    """Returns a copy of `function` that runs in `model_globals`, its code named `name`.

    Dynamo then compiles a frame that shares its globals with the model code it inlines. `defaults`, where
    given, replace the copy's keyword-only defaults."""
    code = function.__code__ if name is None else function.__code__.replace(co_name=name)
    made = types.FunctionType(
        code, model_globals, name or function.__name__, function.__defaults__, function.__closure__
    )
    made.__qualname__ = name or function.__qualname__
    made.__kwdefaults__ = defaults or function.__kwdefaults__
    return made


def copy_for_class(
    template: Callable[..., Any], wrapped: Callable[..., Any], **defaults: Any
) -> Callable[..., Any]:
    """Returns a copy of `template`, named and documented as `wrapped`, to install in its place on a class.

    The copy carries what it calls in keyword-only defaults rather than in a closure."""
    made = types.FunctionType(template.__code__, template.__globals__, wrapped.__name__)
    made.__kwdefaults__ = defaults
    return functools.update_wrapper(made, wrapped)


def is_importable(model_globals: dict[str, Any]) -> bool:
    """Returns whether Dynamo can reach the module of `model_globals` by its `__name__`.

    Globals without a name count as reachable; a name that `sys.modules` holds for other globals does not."""
    name = model_globals.get("__name__")
    if not isinstance(name, str) or name.startswith("namedtuple_"):
        return True
    return getattr(sys.modules.get(name), "__dict__", None) is model_globals


def why_unimportable(owner_globals: dict[str, Any] | None, classes: Iterable[type[nn.Module]]) -> str | None:
    """Returns why the owner's frame cannot inline the `forward` of one of `classes`, or None where it can.

    The reason names the first class from other globals whose module is not importable by name."""
    for cls in classes:
        found = globals_of(cls.forward)
        if found is not None and found is not owner_globals and not is_importable(found):
            module = found.get("__name__", "?")
            return f"{cls.__name__} is defined in module {module!r}, which is not importable by that name"
    return None


class OrEager:
    """Calls a compiled frame of `code`, and runs `eager` instead once the frame fails to compile.

    Only a failure before the frame ran anything switches to `eager`, with one warning per module class, so
    that the call returns the original's result. An error raised after part of the frame ran is raised,
    because what ran cannot be run again."""

    __slots__ = ("cls", "code", "compiled", "eager")

    def __init__(
        self, compiled: Callable[..., Any] | None, eager: Callable[..., Any], code: types.CodeType, cls: type
    ) -> None:
        self.compiled, self.eager, self.code, self.cls = compiled, eager, code, cls

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        compiled = self.compiled
        if compiled is None:
            return self.eager(*args, **kwargs)
        try:
            return compiled(*args, **kwargs)
        except Exception as error:
            if not is_entry_failure(error, self.code):
                raise
            why = why_failed(error)
        self.compiled = None
        if self.cls not in process.warned:
            process.warned.add(self.cls)
            message = f"{self.cls.__name__} cannot be compiled ({why}); it runs eagerly"
            warnings.warn(f"regionalize: {message}", stacklevel=caller_level())
        return self.eager(*args, **kwargs)


def is_entry_failure(error: BaseException, code: types.CodeType) -> bool:
    """Returns whether compiling the frame of `code` raised `error` before the frame ran anything."""
    frames = traceback.walk_tb(error.__traceback__)
    return is_compile_error(error) and all(frame.f_code.co_name != code.co_name for frame, _ in frames)


def caller_level() -> int:
    """Returns the `stacklevel` that points a warning at the line that called the model.

    That line is in the first frame that belongs neither to this runtime nor to torch."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None:
        module = frame.f_globals.get("__name__", "")
        ours = module == runtime or module.startswith(f"{runtime}.")
        if not ours and module.partition(".")[0] != "torch":
            break
        frame, level = frame.f_back, level + 1
    return level


def torch_compile(fn: Callable[..., Any], kwargs: dict[str, Any], **more: Any) -> Callable[..., Any]:
    """Returns `torch.compile(fn, **kwargs)` with `more` taking precedence, after keying caches on the CPU."""
    tag_caches()
    # torch.compile pops `guard_filter_fn` from the options it is handed, so it gets a copy of them.
    return torch.compile(fn, **{**copy_options(kwargs), **more})


def copy_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Returns `kwargs` with a copy of their options, for a compile that may change them."""
    return {**kwargs, "options": dict(kwargs["options"])} if "options" in kwargs else kwargs
