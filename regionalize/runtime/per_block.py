"""Compiles each block on its own, the fallback form.

It is also the form where torch reuses no traced region and the backend is not Inductor
(docs/form-torch-versions.md)."""

import functools
import sys

import torch

from .bypass import Direct
from .frames import OrEager, globals_of, importable, new_frame, own_options, torch_compile
from .internals.hooks import compiled_call, module_call, set_compiled_call
from .kv import kv_empty
from .regions import block_compiled
from .state import Form, process
from .static import static_handed
from .threads import locked

graph_modes = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs


def per_block(owner):
    """Returns the owner's eager call, after compiling each of its blocks on its own, without CUDA graphs.

    An owner of owners that gave its stages back and has no blocks of its own runs as a plain module."""
    state = owner.__dict__.get("_regionalize_owner")
    if state is not None and state.compiled < len(state.blocks):  # once per block, not on every call
        locked(per_block_compile, owner, state)
    return module_call(owner)


def per_block_compile(owner, state):
    """Compiles each of the owner's blocks that is not compiled yet, under the set-up lock."""
    if state.compiled < len(state.blocks):
        kwargs = {k: v for k, v in state.kwargs.items() if not (k == "mode" and v in graph_modes)}
        model = model_of(owner)
        for block in state.blocks:
            if block in process.block_frames:
                continue
            if type(block.__dict__.get("_regionalize_layer")) is int:  # a stand-in serves its cache
                block_compiled(block, static_options(block, kwargs, model))
            elif compiled_call(block) is None:
                block_compile(block, static_options(block, kwargs, model), state.direct)
        state.compiled = len(state.blocks)


def block_compile(block, kwargs, direct):
    """Compiles `block` on its own, with `block.compile(**kwargs)` where Dynamo can import its code's module.

    Otherwise it compiles a frame of the block's class in the globals of that code (`frames.py`), which runs
    the block eagerly where it cannot be compiled (docs/design.md#blocks-compiled-on-their-own)."""
    cls = type(block)
    model_globals = globals_of(cls.forward)
    if model_globals is None or importable(model_globals):
        block.compile(**own_options(kwargs))
        if direct:
            set_compiled_call(block, Direct(block, compiled_call(block)))
        return
    frame = process.class_frames.get(cls)
    if frame is None:
        frame = process.class_frames[cls] = new_frame(cls, "call")
    frame_call = functools.partial(torch_compile(frame, kwargs), block)
    call = OrEager(frame_call, module_call(block), frame.__code__, cls)
    set_compiled_call(block, Direct(block, call, frame) if direct else call)


def model_of(module):
    """Returns the model that `module` runs in: the outermost module of the calls under way that holds it.

    It is `module` itself where no such call holds it."""
    model, frame, seen = module, sys._getframe(1), set()
    while frame is not None:
        caller = frame.f_locals.get("self")
        # A module under construction (in its `__init__`) may not have its submodules yet.
        if isinstance(caller, torch.nn.Module) and "_modules" in caller.__dict__ and id(caller) not in seen:
            seen.add(id(caller))
            if any(m is module for m in caller.modules()):
                model = caller
        frame = frame.f_back
    return model


def static_options(module, kwargs, model):
    """Returns the compile options for `module`, with `dynamic=False` where its class has other widths.

    That is where another module of its class in `model` holds a parameter of the same name at another
    shape. Such blocks share no graph, and automatic dynamic shapes would only add a slow symbolic compile
    for each (docs/form-hierarchical.md#owners-of-one-class-at-several-widths)."""
    if "dynamic" in kwargs:
        return kwargs
    own = {name: p.shape for name, p in module.named_parameters()}
    others = [m for m in model.modules() if type(m) is type(module) and m is not module]
    if any(own.get(name, p.shape) != p.shape for m in others for name, p in m.named_parameters()):
        return {**kwargs, "dynamic": False}
    return kwargs


def per_call_reason(state, args, kwargs):
    """Returns why an owner in pieces serves this call per block, or None where it serves it whole.

    The reason is "static" for a call that hands over a `StaticCache` and "prompt" for an empty
    `DynamicCache`, and only where the stand-in serves every block (docs/form-torch-versions.md)."""
    if state.plan.form is not Form.PIECES or not state.indexed:
        return None
    # A token's call, the most common one, gives None without reading the blocks.
    why = "static" if static_handed(args, kwargs) else "prompt" if kv_empty(args, kwargs) else None
    served = why and all(type(block.__dict__["_regionalize_layer"]) is int for block, _ in state.indexed)
    return why if served else None
