"""The statements `--guard-bypass` writes for a block compiled on its own (the per-block form); the helpers
they call are the runtime's (`runtime/`), which needs torch alone. In the hierarchical form the codemod
passes `guard_bypass="<mode>"` to `_regionalize_blocks`, which applies it to the owner's frame.

- `filter`: `Module.compile(options={"guard_filter_fn": ...})` with a filter that drops Dynamo's guards
  on the *structure* of modules (types, submodule and hook dicts, global functions), which a model does
  not change after it is built, and keeps every guard on values: inputs, global state (grad mode, ...),
  parameters, and attribute values such as `training` or a per-block constant.
- `depyf`: depyf's custom-dispatcher idea. After a guarded call, the helper asks Dynamo which compiled
  code served it and, for later calls with the same *dispatch key* (the shapes, strides, dtypes, devices
  and requires_grad of tensor arguments, the values of plain arguments, grad and inference mode,
  autocast, and the block's `training` flag), calls that code directly, with no guard evaluation and no
  eval-frame hook. Any other call, or a block with hooks, takes the normal guarded path.

What neither mode re-checks, and so must not change after the first call: docs/compile-forms.md#guard-bypass.
"""

from __future__ import annotations

from regionalize.shared import helpers

HELPER_NAMES = {"filter": helpers.GUARD_FILTER, "depyf": helpers.DISPATCH}


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
