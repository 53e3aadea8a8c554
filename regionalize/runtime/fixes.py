"""What the codemod's fixes call: a cache update kept out of a block's graph (RGZ003), and integer
attributes traced symbolically (RGZ004)."""

import torch

from .frames import globals_of, in_globals
from .internals.tracer import config_patch
from .threads import this_call


def eager(call):
    """regionalize: run `call` outside the compiled region. It takes a per-block integer (a KV cache
    indexed by layer): traced in a block compiled on its own, it would give every block a graph of its
    own. Inside an owner compiled whole there is one frame, so it is traced there, and so it is where a
    block's own frame updates the stand-in for its cache, which takes no integer."""
    if this_call.tracing or this_call.standing_in:
        return call()
    return run(call)


@torch.compiler.disable
def run(call):
    return call()


def symbolic_ints(forward):
    """regionalize: trace `forward` with the integer attributes of modules symbolic, so that blocks that
    differ only in such an integer (a layer index) share graphs: one per outcome of a branch on it, not
    one per block. Eager calls compute the same; the setting holds only while this function is traced."""
    patch_config = config_patch()
    if patch_config is None:  # each block a graph of its own, still right
        return forward
    patch = patch_config(allow_unspec_int_on_nn_module=True)

    def traced(*args, **kwargs):
        with patch:
            return forward(*args, **kwargs)

    # A code object of its own: Dynamo keeps compiled variants, and their limit, per code object. In the
    # globals of `forward`: a compile of the module starts its trace here (`frames.py`).
    traced = in_globals(traced, globals_of(forward) or globals(), forward.__name__)
    traced.__doc__ = forward.__doc__
    traced.__qualname__, traced._regionalize_forward = forward.__qualname__, forward  # its parameters
    return traced
