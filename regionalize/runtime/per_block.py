"""The fallback, and the form where torch reuses no traced region and the backend is not Inductor: each
block compiled on its own."""

import functools
import sys

import torch

from .bypass import _regionalize_direct
from .frames import (
    _regionalize_frame,
    _regionalize_importable,
    _regionalize_model_globals,
    _RegionalizeOrEager,
)
from .internals import _regionalize_compiled_call, _regionalize_module_call, _regionalize_set_compiled_call
from .kv import _regionalize_kv_empty
from .regions import _regionalize_block_compiled
from .state import _regionalize_process, _RegionalizeForm
from .static import _regionalize_static_handed
from .threads import _regionalize_locked

_regionalize_graph_modes = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs


def _regionalize_per_block(owner):
    """The fallback: each block compiled on its own (without CUDA graphs), the owner run eagerly."""
    state = owner.__dict__["_regionalize_owner"]
    if state.compiled < len(state.blocks):  # once per block, not on every training call
        _regionalize_locked(_regionalize_per_block_compile, owner, state)
    return _regionalize_module_call(owner)


def _regionalize_per_block_compile(owner, state):
    """Compile each of the owner's blocks not compiled yet (under the set-up lock: once, whichever thread's
    call comes first)."""
    if state.compiled < len(state.blocks):
        graphs = _regionalize_graph_modes
        kwargs = {k: v for k, v in state.kwargs.items() if not (k == "mode" and v in graphs)}
        model = _regionalize_model(owner)
        for block in state.blocks:
            if block in _regionalize_process.block_frames:
                continue
            if type(block.__dict__.get("_regionalize_layer")) is int:  # its cache stood in for
                _regionalize_block_compiled(block, _regionalize_static(block, kwargs, model))
            elif _regionalize_compiled_call(block) is None:
                _regionalize_block_compile(block, _regionalize_static(block, kwargs, model), state.direct)
        state.compiled = len(state.blocks)


def _regionalize_block_compile(block, kwargs, direct):
    """Compile `block` on its own: `block.compile(**kwargs)`, whose frame is the class's `forward` (a region
    of the runtime's). Where Dynamo cannot import the module of the block's code by name, in a frame of
    its class in the globals of that code (`frames.py`), which runs it eagerly where it cannot be compiled.
    Not for every block: torch 2.11 compiles a function of no source file (a copy of the runtime executed
    from text) through a wrapper of its own, which would share one recompile limit among all blocks."""
    cls = type(block)
    model_globals = _regionalize_model_globals(cls.forward)
    if model_globals is None or _regionalize_importable(model_globals):
        block.compile(**kwargs)
        if direct:
            compiled = _regionalize_compiled_call(block)
            _regionalize_set_compiled_call(block, _regionalize_direct(block, compiled))
        return
    frame = _regionalize_process.class_frames.get(cls)
    if frame is None:
        frame = _regionalize_process.class_frames[cls] = _regionalize_frame(cls, "call")
    compiled = functools.partial(torch.compile(frame, **kwargs), block)
    call = _RegionalizeOrEager(compiled, _regionalize_module_call(block), frame.__code__, cls)
    _regionalize_set_compiled_call(block, _regionalize_direct(block, call, frame) if direct else call)


def _regionalize_model(module):
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


def _regionalize_static(module, kwargs, model):
    """The compile options for `module`, a block compiled on its own, with `dynamic=False` when another
    module of its class in `model` holds a parameter of the same name at another shape (stages of
    growing width). `block.compile()` compiles torch's `_call_impl`, one code object for every module, and
    those blocks share no graph, parameters being static: automatic dynamic shapes would only add a
    symbolic compile for each, which on Swin's stages kept Inductor's CPU code generation busy past 5
    minutes, against half a minute for a full compile. Compared by name, since the stages differ in what
    they hold too (Swin's third has six blocks, its last no downsampling). Not where the parameters they
    share agree (T5's encoder and decoder stacks, one class, the decoder's layers holding a
    cross-attention too), nor across models (`_regionalize_model`): a decoder's cache grows every token,
    and static shapes would compile it again for each, up to the recompile limit."""
    if "dynamic" in kwargs:
        return kwargs
    own = {name: p.shape for name, p in module.named_parameters()}
    others = [m for m in model.modules() if type(m) is type(module) and m is not module]
    if any(own.get(name, p.shape) != p.shape for m in others for name, p in m.named_parameters()):
        return {**kwargs, "dynamic": False}
    return kwargs


def _regionalize_per_call(state, args, kwargs):
    """Where torch reuses no region (an owner in pieces, without CUDA graphs), why this call is served per
    block: "static" where it hands a `StaticCache`, "prompt" where it hands a `DynamicCache` that holds
    nothing yet; else None. Only where the stand-in serves every block (one that it cannot, compiled on its
    own, would compile a frame for each layer) and every layer. A StaticCache both started and decoded
    later in pieces, and `generate` traced such an owner in pieces as a full compile; a prompt is one call
    a generation, and per block its first call compiles one block where in pieces Dynamo traced every one
    (the figures: docs/form-torch-versions.md)."""
    indexed = state.indexed
    if state.plan.form is not _RegionalizeForm.PIECES or not indexed:
        return None
    if _regionalize_static_handed(args, kwargs):
        why = "static"
    elif _regionalize_kv_empty(args, kwargs):
        why = "prompt"
    else:
        return None  # a token's call, most calls: the blocks go unread
    served = all(type(block.__dict__["_regionalize_layer"]) is int for block, _ in indexed)
    return why if served else None
