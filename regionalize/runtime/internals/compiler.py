"""Inductor's compiler as the owner compiled in pieces uses it (`pieces.py`), and the ATen and sympy
values its graphs carry."""

import types

from . import probe


@probe("compiling in pieces", "blocks are compiled one by one instead")
def inductor_pieces():
    """Probe: what compiling an owner's graph in pieces needs of torch's compiler (`pieces_backend`):
    Inductor's `compile_fx`, fake tensors, a dispatch mode, the split, storages compared and symbols named.
    Fallback None: where torch reuses no region, the owner's blocks are compiled one by one, as with a
    backend other than Inductor."""
    from torch._guards import TracingContext, detect_fake_mode
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses import FakeTensor
    from torch.fx.passes.split_module import split_module
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._sympy.symbol import SymT, make_symbol

    size = SymT.SIZE
    return types.SimpleNamespace(
        compile_fx=compile_fx,
        fake_tensor=FakeTensor,
        dispatch_mode=TorchDispatchMode,
        split_module=split_module,
        storage=StorageWeakRef,
        mode_options=list_mode_options,
        fake_mode=lambda inputs: detect_fake_mode(inputs) or TracingContext.get().fake_mode,
        size_symbol=lambda index: make_symbol(size, index),
    )


def sym_expr(value):
    """The sympy expression of the `ShapeEnv` that the `SymInt` `value` stands for."""
    return value.node.expr


def sym_hint(value):
    """The value of the `SymInt` `value` in the example traced, None where unknown."""
    return value.node.hint


def op_arguments(func, args, kwargs):
    """The arguments of a call of the ATen op `func` by name, its defaults filled in."""
    schema = func._schema.arguments
    given = dict(zip((a.name for a in schema), args, strict=False)) | kwargs
    for a in schema:
        if a.name not in given and a.has_default_value():
            given[a.name] = a.default_value
    return given
