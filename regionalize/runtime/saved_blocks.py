"""Saves the frames that run a block class's calls with autograd, and loads them in a later process.

Calls with autograd run an owner's blocks one by one (`per_block.py`), so a restarted training job's first
step would trace and compile each block class again. With the frames saved, it loads each class's frame,
forward and backward, from a file and traces nothing (docs/saved-owners.md#training-steps)."""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .forms import BLOCK
from .frames import OrEager
from .internals.hooks import compiled_call, has_global_hooks, module_hooks
from .internals.tracer import is_tracing
from .saved import Saved, why_not
from .state import Args, Config, Findings, Kwargs, OwnerState, Plan, SaveOutcome, process


class BlockFrames(Saved):
    """Runs a block class's saved frames: the first call's, and those of up to two later calls that no
    frame serves, such as the first block's, whose input does not require gradients where the layers
    before it are frozen. Each file is keyed on its call's inputs, so a restart that calls as the first
    process did loads them all.

    A call that none serves runs the block's own compiled call (`own`), as without saving, so that Dynamo
    keeps its recompile limit for each block rather than one for the class. Once every try is made, a block
    that none served (another drop-path rate) runs its own call from then on, without checking the saved
    frames' guards on each call."""

    __slots__ = ("own", "unserved")
    own: weakref.WeakKeyDictionary[torch.nn.Module, Callable[..., Any]]
    unserved: weakref.WeakSet[torch.nn.Module]

    def __init__(self, frame: types.FunctionType, state: OwnerState, options: dict[str, Any]) -> None:
        super().__init__(self.run_own, frame, state, options)
        self.own, self.unserved = weakref.WeakKeyDictionary(), weakref.WeakSet()

    def __call__(self, owner: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if owner in self.unserved:
            return self.own[owner](*args, **kwargs)
        return super().__call__(owner, *args, **kwargs)

    def run_own(self, block: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """Runs a call of `block` that no saved frame serves through the block's own compiled call."""
        if not is_tracing() and self.untried(args, kwargs) is None:
            self.unserved.add(block)
        return self.own[block](*args, **kwargs)

    def untried(self, args: Args, kwargs: Kwargs) -> str | None:
        return None if len(self.tried) > 2 else f"call {len(self.tried)}" if self.tried else "first"


def saved_frames(
    block: torch.nn.Module, frame: types.FunctionType, options: dict[str, Any], own: Callable[..., Any]
) -> BlockFrames | None:
    """Returns the saved frames that run `block`'s calls through `frame`, or None where they are not saved.

    `own` is the block's call compiled as without saving. Blocks of one class, parameter shapes and options
    share the frames, so a restart loads one file for them. A block with hooks of its own, or under global
    ones, is not saved: hooks such as FSDP's may run inside the frame and hold state that a file's key does
    not cover."""
    if has_global_hooks() or any(module_hooks(block)):
        return None
    cls = type(block)
    shapes = tuple((name, tuple(p.shape), p.dtype, p.device) for name, p in block.named_parameters())
    kept = process.block_saves.setdefault(cls, {})
    key = (frame.__code__, shapes, repr(sorted(options.items())))
    if key not in kept:
        state = OwnerState(Config(options, direct=False, save=True), Findings(Plan(BLOCK)))
        kept[key] = None if why_not(block, state) else BlockFrames(frame, state, options)
    found = kept[key]
    if found is not None:
        found.own[block] = own
    return found


def outcome(block: torch.nn.Module) -> SaveOutcome | None:
    """Returns what became of the saved frames that run `block`'s calls, or None where none do."""
    stood_in = process.block_frames.get(block)
    call = stood_in[1] if stood_in else compiled_call(block)
    if isinstance(call, OrEager):
        call = call.compiled
    if isinstance(call, functools.partial):
        call = call.func
    return call.state.report.saved if isinstance(call, BlockFrames) else None
