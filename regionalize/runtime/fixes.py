"""Implements what the codemod's fixes call: `eager` (RGZ003) and `symbolic_ints` (RGZ004)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

from .frames import globals_of, in_globals
from .internals.tracer import config_patch
from .threads import this_call

T = TypeVar("T")
Fn = TypeVar("Fn", bound=Callable[..., Any])


def eager(call: Callable[[], T]) -> T:
    """regionalize: runs `call`, which takes a per-block integer, outside the compiled region.

    Traced in a block's own frame, the integer would give every block a graph of its own (RGZ003)."""
    # An owner's one frame serves every block, and a cache stand-in takes no integer: both trace the call.
    if this_call.tracing or this_call.standing_in:
        return call()
    return run(call)  # type: ignore[no-any-return]  # `run` is untyped, as torch's decorator makes it


@torch.compiler.disable  # type: ignore[untyped-decorator]  # torch's is untyped
def run(call: Callable[[], T]) -> T:
    return call()


def symbolic_ints(forward: Fn) -> Fn:
    """regionalize: traces `forward` with the modules' integer attributes symbolic, so blocks share graphs.

    Blocks that differ only in such an integer, such as a layer index, then share one graph per branch
    outcome rather than one per block. The setting holds only while this function is traced."""
    patch_config = config_patch()
    if patch_config is None:  # each block gets a graph of its own, which is still correct
        return forward
    patch = patch_config(allow_unspec_int_on_nn_module=True)

    def traced(*args: Any, **kwargs: Any) -> Any:
        with patch:
            return forward(*args, **kwargs)

    # A code object of its own, because Dynamo keeps compiled variants and their limit per code object; in
    # the globals of `forward`, because a compile of the module starts its trace here (`frames.py`).
    traced = in_globals(traced, globals_of(forward) or globals(), forward.__name__)
    traced.__doc__ = forward.__doc__
    traced.__qualname__ = forward.__qualname__
    traced._regionalize_forward = forward  # type: ignore[attr-defined]  # for its parameters
    return cast(Fn, traced)
