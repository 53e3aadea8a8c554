"""The code `--guard-bypass` writes into a model file: it must run with torch alone, not regionalize.

Each mode is a module-level helper, inserted once after the imports, and one call per block.

- `filter`: `Module.compile(options={"guard_filter_fn": ...})` with a filter that drops Dynamo's guards
  on the *structure* of modules (types, submodule and hook dicts, global functions), which a model does
  not change after it is built, and keeps every guard on values: inputs, global state (grad mode, ...),
  parameters, and attribute values such as `training` or a per-block constant.
- `depyf`: depyf's custom-dispatcher idea. After a guarded call, the helper asks Dynamo which compiled
  code served it and, for later calls with the same *dispatch key* (the shapes, strides, dtypes, devices
  and requires_grad of tensor arguments, the values of plain arguments, grad and inference mode,
  autocast, and the block's `training` flag), calls that code directly, with no guard evaluation and no
  eval-frame hook. Any other call, or a block with hooks, takes the normal guarded path.

What neither mode re-checks, and so must not change after the first call: see docs/guard-bypass.md.
"""

from __future__ import annotations

HELPER_NAMES = {"filter": "_regionalize_guard_filter", "depyf": "_regionalize_dispatch"}

_FILTER = '''\
def _regionalize_guard_filter(entries):
    """regionalize guard bypass: skip guards on the structure of modules, keep guards on values.

    Dropped: type, identity-of-dict, hook and global-function guards of nn.Module sources. Kept: inputs,
    grad mode and other global state, parameters, attribute values (training, per-block constants).
    """
    structural = {
        "TYPE_MATCH", "NOT_PRESENT_IN_GENERIC_DICT", "EMPTY_NN_MODULE_HOOKS_DICT", "MODULE_MATCH",
        "BUILTIN_MATCH", "CLOSURE_MATCH", "FUNCTION_MATCH", "DICT_KEYS_MATCH", "DICT_VERSION",
    }
    return [
        not (
            entry.guard_type in structural
            and (entry.is_global or entry.orig_guard.source.is_unspecialized_nn_module())
        )
        for entry in entries
    ]
'''

_DISPATCH = '''\
def _regionalize_dispatch(block, **compile_kwargs):
    """regionalize guard bypass: compile `block` in place, then call its compiled code directly.

    Dynamo's guards run once per dispatch key (tensor shapes, strides, dtypes, devices, requires_grad,
    plain argument values, grad/inference mode, autocast, block.training); later calls with that key
    skip them. Other calls, blocks with hooks or a patched forward take the normal guarded path.
    """
    import inspect
    import types

    import torch
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch.nn.modules import module as nn_module

    block.compile(**compile_kwargs)
    guarded = block._compiled_call_impl
    forward = type(block).forward
    signature = inspect.signature(forward)
    plain = (int, float, bool, str, type(None))
    direct = {}

    def key(args, kwargs):
        parts = [
            block.training,
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
            block._forward_hooks or block._forward_pre_hooks or block._backward_hooks
            or block._backward_pre_hooks or "forward" in block.__dict__
            or nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
            or nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks
        )

    def dispatch(*args, **kwargs):
        k = None if hooked() else key(args, kwargs)
        if k is None:
            return guarded(*args, **kwargs)
        compiled = direct.get(k)
        if compiled is not None:
            return compiled(block, *args, **kwargs)
        out = guarded(*args, **kwargs)
        bound = signature.bind(block, *args, **kwargs)
        bound.apply_defaults()
        # The frame's locals as Dynamo saw them: a wrapped forward (RGZ004) also has its closure.
        names = forward.__code__.co_freevars
        frame = dict(bound.arguments) | {n: c.cell_contents for n, c in zip(names, forward.__closure__ or ())}
        for entry in _debug_get_cache_entry_list(forward.__code__):  # the order Dynamo tries them in
            if entry.guard_manager.check(frame):
                direct[k] = types.FunctionType(
                    entry.code, forward.__globals__, forward.__name__,
                    forward.__defaults__, forward.__closure__,
                )
                break
        return out

    block._compiled_call_impl = dispatch
'''


def helper_source(mode: str) -> str | None:
    return {"filter": _FILTER, "depyf": _DISPATCH}.get(mode)


def inplace_statement(mode: str, var: str, kwargs_src: str) -> str:
    """One statement that compiles module `var` in place with the bypass."""
    if mode == "filter":
        return f"{var}.compile({_join(kwargs_src, 'options={' + _FILTER_OPTION + '}')})"
    return f"{HELPER_NAMES['depyf']}({_join(var, kwargs_src)})"


def wrap_expression(mode: str, expr_src: str, kwargs_src: str) -> str:
    """`torch.compile(Block(..))` with the bypass, for --style wrap (filter mode only)."""
    if mode != "filter":
        raise ValueError(f"--guard-bypass {mode} compiles in place: it needs --style inplace")
    return f"torch.compile({_join(expr_src, kwargs_src, 'options={' + _FILTER_OPTION + '}')})"


_FILTER_OPTION = f'"guard_filter_fn": {HELPER_NAMES["filter"]}'


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)
