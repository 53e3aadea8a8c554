"""Reaches Inductor's compiler for an owner compiled in pieces (`pieces.py`), and its graphs' values."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any, cast

import torch

from . import probe


@probe("compiling in pieces", "blocks are compiled one by one instead")
def inductor_pieces() -> types.SimpleNamespace:
    """Probe: returns what compiling an owner's graph in pieces needs of torch's compiler (`pieces_backend`).

    That is Inductor's `compile_fx` and how it returns a graph's outputs, fake tensors, a dispatch mode,
    the split, storages and symbols. Fallback None: where torch reuses no region, the owner's blocks are
    compiled one by one."""
    from torch._guards import TracingContext, detect_fake_mode
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx, graph_returns_tuple
    from torch._subclasses import FakeTensor
    from torch.fx.passes.split_module import split_module
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._sympy.symbol import SymT, make_symbol

    size = SymT.SIZE
    return types.SimpleNamespace(
        compile_fx=compile_fx,
        returns_tuple=graph_returns_tuple,
        fake_tensor=FakeTensor,
        dispatch_mode=TorchDispatchMode,
        split_module=split_module,
        storage=StorageWeakRef,
        mode_options=list_mode_options,
        fake_mode=lambda inputs: detect_fake_mode(inputs) or TracingContext.get().fake_mode,
        size_symbol=lambda index: make_symbol(size, index),
    )


def sym_expr(value: torch.SymInt) -> Any:
    """Returns the sympy expression that the `SymInt` `value` stands for."""
    return value.node.expr


def sym_hint(value: torch.SymInt) -> int | None:
    """Returns the value of the `SymInt` `value` in the traced example, or None where it is unknown."""
    return cast("int | None", value.node.hint)  # a SymInt's node is untyped in torch


def op_arguments(func: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Returns the arguments of a call of the ATen op `func` by name, with its defaults filled in."""
    schema = func._schema.arguments
    given = dict(zip((a.name for a in schema), args, strict=False)) | kwargs
    for a in schema:
        if a.name not in given and a.has_default_value():
            given[a.name] = a.default_value
    return given
