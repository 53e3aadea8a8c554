"""The fallback, and the form where torch reuses no traced region and the backend is not Inductor: each
block compiled on its own."""

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
    """The fallback: each block compiled on its own (without CUDA graphs), the owner run eagerly; an owner
    of owners that gave its stages back and has no blocks of its own runs as a plain module."""
    state = owner.__dict__.get("_regionalize_owner")
    if state is not None and state.compiled < len(state.blocks):  # once per block, not every training call
        locked(per_block_compile, owner, state)
    return module_call(owner)


def per_block_compile(owner, state):
    """Compile each of the owner's blocks not compiled yet (under the set-up lock: once, whichever thread's
    call comes first)."""
    if state.compiled < len(state.blocks):
        kwargs = {k: v for k, v in state.kwargs.items() if not (k == "mode" and v in graph_modes)}
        model = model_of(owner)
        for block in state.blocks:
            if block in process.block_frames:
                continue
            if type(block.__dict__.get("_regionalize_layer")) is int:  # its cache stood in for
                block_compiled(block, static_options(block, kwargs, model))
            elif compiled_call(block) is None:
                block_compile(block, static_options(block, kwargs, model), state.direct)
        state.compiled = len(state.blocks)


def block_compile(block, kwargs, direct):
    """Compile `block` on its own: `block.compile(**kwargs)`, whose frame is the class's `forward` (a region
    of the runtime's). Where Dynamo cannot import the module of the block's code by name, in a frame of
    its class in the globals of that code (`frames.py`), which runs it eagerly where it cannot be compiled.
    Not for every block: torch 2.11 compiles a function of no source file (a copy of the runtime executed
    from text) through a wrapper of its own, which would share one recompile limit among all blocks."""
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
    """The model `module` runs in: the outermost module of the calls under way (the `self` of their
    frames) that holds it, or `module` itself. Not every module of the process: a draft model and its
    target of one family at two widths, or a model built twice at two sizes, are separate."""
    model, frame, seen = module, sys._getframe(1), set()
    while frame is not None:
        caller = frame.f_locals.get("self")
        # A module under construction (an `__init__` building the model) may not have its submodules yet.
        if isinstance(caller, torch.nn.Module) and "_modules" in caller.__dict__ and id(caller) not in seen:
            seen.add(id(caller))
            if any(m is module for m in caller.modules()):
                model = caller
        frame = frame.f_back
    return model


def static_options(module, kwargs, model):
    """The compile options for `module`, a block compiled on its own, with `dynamic=False` when another
    module of its class in `model` holds a parameter of the same name at another shape (stages of
    growing width). `block.compile()` compiles torch's `_call_impl`, one code object for every module, and
    those blocks share no graph, parameters being static: automatic dynamic shapes would only add a
    symbolic compile for each, which on Swin's stages kept Inductor's CPU code generation busy past 5
    minutes, against half a minute for a full compile. Compared by name, since the stages differ in what
    they hold too (Swin's third has six blocks, its last no downsampling). Not where the parameters they
    share agree (T5's encoder and decoder stacks, one class, the decoder's layers holding a
    cross-attention too), nor across models (`model_of`): a decoder's cache grows every token,
    and static shapes would compile it again for each, up to the recompile limit."""
    if "dynamic" in kwargs:
        return kwargs
    own = {name: p.shape for name, p in module.named_parameters()}
    others = [m for m in model.modules() if type(m) is type(module) and m is not module]
    if any(own.get(name, p.shape) != p.shape for m in others for name, p in m.named_parameters()):
        return {**kwargs, "dynamic": False}
    return kwargs


def per_call_reason(state, args, kwargs):
    """Where torch reuses no region (an owner in pieces, without CUDA graphs), why this call is served per
    block: "static" where it hands a `StaticCache`, "prompt" where it hands a `DynamicCache` that holds
    nothing yet; else None. Only where the stand-in serves every block (one that it cannot, compiled on its
    own, would compile a frame for each layer) and every layer. A StaticCache both started and decoded
    later in pieces, and `generate` traced such an owner in pieces as a full compile; a prompt is one call
    a generation, and per block its first call compiles one block where in pieces Dynamo traced every one
    (the figures: docs/form-torch-versions.md)."""
    if state.plan.form is not Form.PIECES or not state.indexed:
        return None
    # None for a token's call, most calls: the blocks go unread.
    why = "static" if static_handed(args, kwargs) else "prompt" if kv_empty(args, kwargs) else None
    served = why and all(type(block.__dict__["_regionalize_layer"]) is int for block, _ in state.indexed)
    return why if served else None
