"""Implements what the codemod's fixes call: `eager` (RGZ003) and `symbolic_ints` (RGZ004)."""

import torch

from .frames import globals_of, in_globals
from .internals.tracer import config_patch
from .threads import this_call


def eager(call):
    """regionalize: runs `call`, which takes a per-block integer, outside the compiled region.

    Traced in a block's own frame, the integer would give every block a graph of its own (RGZ003)."""
    # An owner's one frame serves every block, and a cache stand-in takes no integer: both trace the call.
    if this_call.tracing or this_call.standing_in:
        return call()
    return run(call)


@torch.compiler.disable
def run(call):
    return call()


def symbolic_ints(forward):
    """regionalize: traces `forward` with the modules' integer attributes symbolic, so blocks share graphs.

    Blocks that differ only in such an integer, such as a layer index, then share one graph per branch
    outcome rather than one per block. The setting holds only while this function is traced."""
    patch_config = config_patch()
    if patch_config is None:  # each block gets a graph of its own, which is still correct
        return forward
    patch = patch_config(allow_unspec_int_on_nn_module=True)

    def traced(*args, **kwargs):
        with patch:
            return forward(*args, **kwargs)

    # A code object of its own, because Dynamo keeps compiled variants and their limit per code object; in
    # the globals of `forward`, because a compile of the module starts its trace here (`frames.py`).
    traced = in_globals(traced, globals_of(forward) or globals(), forward.__name__)
    traced.__doc__ = forward.__doc__
    traced.__qualname__, traced._regionalize_forward = forward.__qualname__, forward  # its parameters
    return traced
