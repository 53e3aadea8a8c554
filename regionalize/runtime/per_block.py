"""Compiles each block on its own, the fallback form.

It is also the form where torch reuses no traced region and the backend is not Inductor
(docs/form-torch-versions.md)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from .bypass import Direct
from .frames import OrEager, globals_of, is_importable, new_frame, torch_compile
from .graphs import graph_modes
from .internals.hooks import compiled_call, module_call, set_compiled_call
from .regions import compile_stood_in
from .saved_blocks import saved_frames
from .state import process
from .threads import run_locked

if TYPE_CHECKING:
    from types import FrameType, FunctionType

    from .state import OwnerState


def per_block(owner: torch.nn.Module) -> Callable[..., Any]:
    """Returns the owner's eager call, after compiling each of its blocks on its own, without CUDA graphs.

    An owner of owners that gave its stages back and has no blocks of its own runs as a plain module."""
    state = owner.__dict__.get("_regionalize_owner")
    if state is not None and state.compiled < len(state.blocks):  # once per block, not on every call
        run_locked(compile_blocks, owner, state)
    return module_call(owner)


def compile_blocks(owner: torch.nn.Module, state: OwnerState) -> None:
    """Compiles each of the owner's blocks that is not compiled yet, under the set-up lock."""
    if state.compiled < len(state.blocks):
        given = state.config.kwargs
        kwargs = {k: v for k, v in given.items() if not (k == "mode" and v in graph_modes)}
        model = model_of(owner)
        save = is_saving_blocks(state)
        for block in state.blocks:
            if block in process.block_frames:
                continue
            if type(block.__dict__.get("_regionalize_layer")) is int:  # a stand-in serves its cache
                compile_stood_in(block, static_options(block, kwargs, model), save)
            elif compiled_call(block) is None:
                compile_block(block, static_options(block, kwargs, model), state.config.direct, save)
        state.compiled = len(state.blocks)


def is_saving_blocks(state: OwnerState) -> bool:
    """Returns whether a call with autograd compiles the blocks of an owner that saves its frame: their
    frames are then saved too (`saved_blocks.py`)."""
    config = state.config
    return config.save and not config.direct and state.report.plan.form.runs_whole and torch.is_grad_enabled()


def compile_block(block: torch.nn.Module, kwargs: dict[str, Any], direct: bool, save: bool = False) -> None:
    """Compiles `block` on its own, as `block.compile(**kwargs)` does where Dynamo can import its code's
    module, with its frames saved where `save` asks and they can be (`saved_blocks.py`).

    Otherwise it compiles a frame of the block's class in the globals of that code (`frames.py`), which runs
    the block eagerly where it cannot be compiled (docs/design.md#blocks-compiled-on-their-own)."""
    cls = type(block)
    model_globals = globals_of(cls.forward)
    frame = None
    if model_globals is None or is_importable(model_globals):
        call = torch_compile(module_call(block), kwargs)  # as `block.compile()` sets it
    else:
        frame = class_frame(cls)
        call = OrEager(
            functools.partial(torch_compile(frame, kwargs), block), module_call(block), frame.__code__, cls
        )
    if save and (saved := saved_frames(block, class_frame(cls), kwargs, call)) is not None:
        call = OrEager(functools.partial(saved, block), module_call(block), saved.frame.__code__, cls)
    elif direct:
        call = Direct(block, call, frame) if frame else Direct(block, call)
    set_compiled_call(block, call)


def class_frame(cls: type[torch.nn.Module]) -> FunctionType:
    """Returns the frame that compiles blocks of `cls` on their own, made once for the process."""
    frame = process.class_frames.get(cls)
    if frame is None:
        frame = process.class_frames[cls] = new_frame(cls, "call")
    return frame


def model_of(module: torch.nn.Module) -> torch.nn.Module:
    """Returns the model that `module` runs in: the outermost module of the calls under way that holds it.

    It is `module` itself where no such call holds it."""
    model, frame, seen = module, cast("FrameType | None", sys._getframe(1)), set()
    while frame is not None:
        caller = frame.f_locals.get("self")
        # A module under construction (in its `__init__`) may not have its submodules yet.
        if isinstance(caller, torch.nn.Module) and "_modules" in caller.__dict__ and id(caller) not in seen:
            seen.add(id(caller))
            if any(m is module for m in caller.modules()):
                model = caller
        frame = frame.f_back
    return model


def static_options(module: torch.nn.Module, kwargs: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
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
