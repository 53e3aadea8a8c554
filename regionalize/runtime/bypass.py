"""Implements the guard bypass: drops guards on modules' structure, or calls compiled code directly.

The bypass and what it no longer checks are described in docs/form-guard-bypass.md."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .internals.hooks import Hooks, compiled_call, has_global_hooks, module_hooks, set_compiled_call
from .internals.tracer import guarded_code

if TYPE_CHECKING:
    from .internals.aot import GuardFilterEntry

Watched = tuple[list[Hooks], "tuple[nn.Module, str] | None"]  # hook dicts, and where the first parameter is
Fingerprint = tuple[int, tuple[int, ...], "tuple[Any, ...] | None"]  # what `fingerprint` returns


def guard_filter(entries: list[GuardFilterEntry]) -> list[bool]:
    """regionalize guard bypass: skips the guards on the structure of modules and keeps those on values.

    It drops the type, dict identity, hook and global function guards of modules, and keeps the guards on
    inputs, global state such as grad mode, parameters and attribute values.
    """
    structural = {
        "TYPE_MATCH",
        "NOT_PRESENT_IN_GENERIC_DICT",
        "EMPTY_NN_MODULE_HOOKS_DICT",
        "MODULE_MATCH",
        "BUILTIN_MATCH",
        "CLOSURE_MATCH",
        "FUNCTION_MATCH",
        "DICT_KEYS_MATCH",
        "DICT_VERSION",
    }
    return [
        not (
            entry.guard_type in structural
            and (entry.is_global or entry.orig_guard.source.is_unspecialized_nn_module())
        )
        for entry in entries
    ]


def dispatch(block: nn.Module, **compile_kwargs: Any) -> None:
    """regionalize guard bypass: compiles `block` in place, then calls its compiled code directly."""
    block.compile(**compile_kwargs)
    set_compiled_call(block, Direct(block, compiled_call(block)))  # type: ignore[arg-type]  # set by `compile`


class Direct:
    """regionalize guard bypass: calls `guarded`, the compiled call of `module`, with its guards skipped.

    Dynamo's guards run once per dispatch key (the inputs' shapes, strides, dtypes and devices, plain
    argument values, grad and autocast modes, `module.training`), and later calls with that key call the
    compiled code that served the first one. Calls with other arguments, and modules with hooks or a patched
    `forward`, take the guarded path. `frame` is the function that Dynamo compiles, by default the class's
    `forward`.
    """

    _plain = (int, float, bool, str, type(None))
    direct: dict[tuple[Any, ...], Callable[..., Any]]
    watched: Watched | tuple[()]
    fingerprint: Fingerprint | None

    def __init__(
        self, module: nn.Module, guarded: Callable[..., Any], frame: Callable[..., Any] | None = None
    ) -> None:
        self.module, self.guarded = module, guarded
        self.forward = frame or type(module).forward
        self.signature = inspect.signature(self.forward)
        self.direct = {}  # dispatch key -> the compiled code that served it, or `guarded`
        self.watched, self.fingerprint = (), None  # what `fingerprint` reads, and what it gave

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = None if self.is_hooked() else self.key(args, kwargs)
        if key is None:
            return self.guarded(*args, **kwargs)
        if fingerprint(*self.watched) != self.fingerprint:  # a hook or a parameter's dtype changed
            self.direct.clear()
            self.watched = find_watched(self.module)
            self.fingerprint = fingerprint(*self.watched)
        compiled = self.direct.get(key)
        if compiled is not None and compiled is not self.guarded:
            return compiled(self.module, *args, **kwargs)
        out = self.guarded(*args, **kwargs)
        if compiled is None:
            self.direct[key] = self.learn(args, kwargs)
        return out

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        parts: list[Any] = [
            self.module.training,
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"),
            torch.is_autocast_enabled("cuda"),
            tuple(kwargs),
        ]
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                parts.append((value.shape, value.stride(), value.dtype, value.device, value.requires_grad))
            elif isinstance(value, self._plain):
                parts.append((type(value), value))
            else:
                return None
        return tuple(parts)

    def is_hooked(self) -> bool:
        module = self.module
        return any(module_hooks(module)) or "forward" in module.__dict__ or has_global_hooks()

    def learn(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        """Returns the compiled code that served this call, or `guarded` where none is found.

        It rebuilds the frame's locals and takes the first compiled entry whose guards pass on them. A key
        with no entry keeps the guarded path (docs/design.md#blocks-compiled-on-their-own)."""
        forward = self.forward
        bound = self.signature.bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        # The frame's locals as Dynamo saw them; a wrapped forward (RGZ004) has its closure's cells too.
        cells = zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True)
        frame = dict(bound.arguments) | {n: c.cell_contents for n, c in cells}
        code = guarded_code(forward.__code__, frame)
        if code is None:
            return self.guarded
        return types.FunctionType(
            code, forward.__globals__, forward.__name__, forward.__defaults__, forward.__closure__
        )


def find_watched(module: nn.Module) -> Watched:
    """Returns what the bypass watches on every call in place of the guards it skips.

    These are the hook dicts in use and the place of the module's first parameter."""
    hooks = [d for m in module.modules() for d in module_hooks(m) if d]
    first = next(((m, n) for m in module.modules() for n, _ in m.named_parameters(recurse=False)), None)
    return hooks, first


def fingerprint(hooks: Sequence[Hooks] = (), first: tuple[nn.Module, str] | None = None) -> Fingerprint:
    """Returns a fingerprint that changes when a hook is added or removed or the first parameter changes.

    Each hook's registration takes a new handle id, and `.to()` changes the parameter's dtype or device."""
    parameter = first and getattr(first[0], first[1], None)
    probe = (id(parameter), parameter.dtype, parameter.device) if parameter is not None else None
    return torch.utils.hooks.RemovableHandle.next_id, tuple(len(d) for d in hooks), probe
