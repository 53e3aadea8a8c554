"""The guard bypass: guards on modules' structure filtered, or compiled code called directly."""

import inspect
import types

import torch

from .internals.hooks import compiled_call, global_hooks, module_hooks, set_compiled_call
from .internals.tracer import guarded_code


def guard_filter(entries):
    """regionalize guard bypass: skip guards on the structure of modules, keep guards on values.

    Dropped: type, identity-of-dict, hook and global-function guards of nn.Module sources. Kept: inputs,
    grad mode and other global state, parameters, attribute values (training, per-block constants).
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


def dispatch(block, **compile_kwargs):
    """regionalize guard bypass: compile `block` in place, then call its compiled code directly."""
    block.compile(**compile_kwargs)
    set_compiled_call(block, Direct(block, compiled_call(block)))


class Direct:
    """regionalize guard bypass: `guarded` (the compiled call of `module`) with its guards skipped. `frame`
    is the function Dynamo compiles for it: the class's `forward` unless given.

    Dynamo's guards run once per dispatch key (tensor shapes, strides, dtypes, devices, requires_grad,
    plain argument values, grad/inference mode, autocast, module.training); later calls with that key
    call the compiled code that served it directly. Other calls, modules with hooks or a patched forward
    take the normal guarded path.
    """

    _plain = (int, float, bool, str, type(None))

    def __init__(self, module, guarded, frame=None):
        self.module, self.guarded = module, guarded
        self.forward = frame or type(module).forward
        self.signature = inspect.signature(self.forward)
        self.direct = {}  # dispatch key -> the compiled code that served it, or `guarded`
        self.watched, self.fingerprint = (), None  # what `watch` watches, and what it gave

    def __call__(self, *args, **kwargs):
        key = None if self.hooked() else self.key(args, kwargs)
        if key is None:
            return self.guarded(*args, **kwargs)
        if watch(*self.watched) != self.fingerprint:  # a hook or a parameter's dtype changed
            self.direct.clear()
            self.watched = watched(self.module)
            self.fingerprint = watch(*self.watched)
        compiled = self.direct.get(key)
        if compiled is not None and compiled is not self.guarded:
            return compiled(self.module, *args, **kwargs)
        out = self.guarded(*args, **kwargs)
        if compiled is None:
            self.direct[key] = self.learned(args, kwargs)
        return out

    def key(self, args, kwargs):
        parts = [
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

    def hooked(self):
        module = self.module
        return any(module_hooks(module)) or "forward" in module.__dict__ or global_hooks()

    def learned(self, args, kwargs):
        """The compiled code that served this call: the first entry of the frame's code whose guards pass on
        the frame rebuilt here; else `guarded`, the key then keeping the guarded path rather than
        searching again on every call (torch 2.11 compiles a function that has no source file through a
        wrapper of its own, whose entries these are not)."""
        forward = self.forward
        bound = self.signature.bind(self.module, *args, **kwargs)
        bound.apply_defaults()
        # The frame's locals as Dynamo saw them: a wrapped forward (RGZ004) also has its closure.
        cells = zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True)
        frame = dict(bound.arguments) | {n: c.cell_contents for n, c in cells}
        code = guarded_code(forward.__code__, frame)
        if code is None:
            return self.guarded
        return types.FunctionType(
            code, forward.__globals__, forward.__name__, forward.__defaults__, forward.__closure__
        )


def watched(module):
    """What the guard bypass watches in `module` on every call, in place of the guards it skips on hooks
    and parameters: the hook dictionaries in use, and where its first parameter is held."""
    hooks = [d for m in module.modules() for d in module_hooks(m) if d]
    first = next(((m, n) for m in module.modules() for n, _ in m.named_parameters(recurse=False)), None)
    return hooks, first


def watch(hooks=(), first=None):
    """A fingerprint that changes when a hook is registered anywhere (each registration takes a new handle
    id), one in use is removed, or the first parameter changes dtype, device or object (`.to()`)."""
    parameter = first and getattr(first[0], first[1], None)
    probe = (id(parameter), parameter.dtype, parameter.device) if parameter is not None else None
    return torch.utils.hooks.RemovableHandle.next_id, tuple(len(d) for d in hooks), probe
