"""The guard bypass: guards on modules' structure filtered, or compiled code called directly."""

import torch

from .internals import _regionalize_global_hooks, _regionalize_guarded_code


def _regionalize_guard_filter(entries):
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


def _regionalize_dispatch(block, **compile_kwargs):
    """regionalize guard bypass: compile `block` in place, then call its compiled code directly."""
    block.compile(**compile_kwargs)
    block._compiled_call_impl = _regionalize_direct(block, block._compiled_call_impl)


def _regionalize_direct(module, guarded, frame=None):
    """regionalize guard bypass: `guarded` (the compiled call of `module`) with its guards skipped.
    `frame` is the function Dynamo compiles for it: the class's `forward` unless given.

    Dynamo's guards run once per dispatch key (tensor shapes, strides, dtypes, devices, requires_grad,
    plain argument values, grad/inference mode, autocast, module.training); later calls with that key
    call the compiled code that served it directly. Other calls, modules with hooks or a patched forward
    take the normal guarded path.
    """
    import inspect
    import types

    forward = frame or type(module).forward
    signature = inspect.signature(forward)
    plain = (int, float, bool, str, type(None))
    direct = {}
    recorded = [None, ()]  # the table's fingerprint (_regionalize_watch), and what it watches

    def key(args, kwargs):
        parts = [
            module.training,
            torch.is_grad_enabled(),
            torch.is_inference_mode_enabled(),
            torch.is_autocast_enabled("cpu"),
            torch.is_autocast_enabled("cuda"),
            tuple(kwargs),
        ]
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                parts.append((value.shape, value.stride(), value.dtype, value.device, value.requires_grad))
            elif isinstance(value, plain):
                parts.append((type(value), value))
            else:
                return None
        return tuple(parts)

    def hooked():
        return (
            module._forward_hooks
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
            or "forward" in module.__dict__
            or _regionalize_global_hooks()
        )

    def dispatch(*args, **kwargs):
        k = None if hooked() else key(args, kwargs)
        if k is None:
            return guarded(*args, **kwargs)
        if _regionalize_watch(*recorded[1]) != recorded[0]:  # a hook or a parameter's dtype changed
            direct.clear()
            recorded[1] = _regionalize_watched(module)
            recorded[0] = _regionalize_watch(*recorded[1])
        compiled = direct.get(k)
        if compiled is not None:
            return compiled(module, *args, **kwargs) if compiled is not guarded else guarded(*args, **kwargs)
        out = guarded(*args, **kwargs)
        # Where no entry of the frame's code passes its guards on the frame as rebuilt here, the key keeps
        # the guarded path rather than searching again on every call: torch 2.11 compiles a function that
        # has no source file through a wrapper of its own, whose entries these are not.
        direct[k] = guarded
        bound = signature.bind(module, *args, **kwargs)
        bound.apply_defaults()
        # The frame's locals as Dynamo saw them: a wrapped forward (RGZ004) also has its closure.
        names = forward.__code__.co_freevars
        frame = dict(bound.arguments) | {
            n: c.cell_contents for n, c in zip(names, forward.__closure__ or (), strict=True)
        }
        code = _regionalize_guarded_code(forward.__code__, frame)
        if code is not None:
            direct[k] = types.FunctionType(
                code, forward.__globals__, forward.__name__, forward.__defaults__, forward.__closure__
            )
        return out

    return dispatch


def _regionalize_watched(module):
    """What the guard bypass watches in `module` on every call, in place of the guards it skips on hooks
    and parameters: the hook dictionaries in use, and where its first parameter is held."""
    hooks = [
        d
        for m in module.modules()
        for d in (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks, m._backward_pre_hooks)
        if d
    ]
    first = next(((m, n) for m in module.modules() for n, p in m._parameters.items() if p is not None), None)
    return hooks, first


def _regionalize_watch(hooks=(), first=None):
    """A fingerprint that changes when a hook is registered anywhere (each registration takes a new handle
    id), one in use is removed, or the first parameter changes dtype, device or object (`.to()`)."""
    parameter = first and first[0]._parameters.get(first[1])
    probe = (id(parameter), parameter.dtype, parameter.device) if parameter is not None else None
    return torch.utils.hooks.RemovableHandle.next_id, tuple(len(d) for d in hooks), probe
