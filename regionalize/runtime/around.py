"""A compile around the model (transformers' `generate` compiles the forward itself where the cache is
static): the owner calls that it serves itself, in CUDA graphs, rather than be traced through."""

import torch

from .frames import installed
from .per_block import graph_modes
from .state import Form
from .static import on_graph_device, static_handed
from .threads import this_call


def is_opaque(state):
    """Is the owner opaque to every compile around the model (`owned`): in CUDA graphs."""
    return state.kwargs.get("mode") in graph_modes


def handoff(owner, args, kwargs):
    """Does a compile around the model, tracing this call, hand it over to the owner, which serves it in
    one CUDA graph (`outside`)? In a CUDA-graph mode every call. In the default form, where
    torch reuses no traced region (the owner in pieces), a call that hands a `StaticCache` on the GPU:
    transformers compiles its forward for such a cache in CUDA graphs (`CompileConfig`'s
    `mode="reduce-overhead"`). Traced through, the owner's calls per block were graphed between the
    blocks' frames, a graph a block a token, far slower than the owner in one graph of its own
    (docs/results/serving/README.md)."""
    if not torch.compiler.is_compiling() or this_call.tracing:  # not traced, or the owner's own trace
        return False
    state = owner.__dict__.get("_regionalize_owner")
    if state is None:  # a stage whose blocks its outer owner took (`outer.py`): traced through
        return False
    if is_opaque(state):
        return True
    if state.plan.form is not Form.PIECES or not state.indexed or not static_handed(args, kwargs):
        return False
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    return bool(tensors) and all(on_graph_device(x) for x in tensors)


def owned(forward):
    """The owner class's `forward` where a compile around the model may hand its calls over
    (`handoff`): for a compile that calls `forward` itself, as `owner_call`
    does for one that calls the module. Traced through, such a compile read the graphs' conditions in its
    trace and split on the runtime's Python (and traced every block on 2.11). Its trace breaks at the
    owner instead, and the call it then makes, opaque to it, serves the owner as the owner's own frame
    does, one graph a call. Other calls of the default form are traced through as the original would be
    (opaque, an owner whose blocks were compiled one by one on 2.11 decoded slower:
    docs/form-torch-versions.md). A compile around it with `fullgraph=True` raises at its graph
    break, as at any."""

    owned = installed(owned_forward, forward, __forward=forward)
    owned._regionalize_owned = True
    return owned


def owned_forward(self, *args, __forward=None, **kwargs):
    if handoff(self, args, kwargs):
        return outside(self, args, kwargs)
    return __forward(self, *args, **kwargs)


@torch.compiler.disable
def outside(owner, args, kwargs):
    this_call.handed = owner
    try:
        return owner(*args, **kwargs)
    finally:
        this_call.handed = None
