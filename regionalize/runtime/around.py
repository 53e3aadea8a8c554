"""Lets an owner serve, in its own CUDA graph, the calls that a compile around the model hands over.

transformers' `generate` compiles the model's forward itself when the cache is static
(docs/form-torch-versions.md#torch-versions)."""

import torch

from .frames import installed
from .per_block import graph_modes
from .state import Form
from .static import on_graph_device, static_handed
from .threads import this_call


def is_opaque(state):
    """Returns whether the owner runs in CUDA graphs, which makes it opaque to a compile around it."""
    return state.kwargs.get("mode") in graph_modes


def handoff(owner, args, kwargs):
    """Returns whether a compile around the model that traces this call hands it over to the owner.

    In a CUDA-graph mode it hands over every call. In the default form, where torch reuses no traced region,
    it hands over a call that brings a `StaticCache` on the GPU, since transformers compiles such calls in
    CUDA graphs and one graph of the owner serves them faster (docs/form-torch-versions.md#torch-versions).
    """
    if not torch.compiler.is_compiling() or this_call.tracing:  # not traced, or traced by the owner itself
        return False
    state = owner.__dict__.get("_regionalize_owner")
    if state is None:  # a stage whose blocks an outer owner took (`outer.py`) is traced through
        return False
    if is_opaque(state):
        return True
    if state.plan.form is not Form.PIECES or not state.indexed or not static_handed(args, kwargs):
        return False
    tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
    return bool(tensors) and all(on_graph_device(x) for x in tensors)


def owned(forward):
    """Wraps the owner class's `forward` so that a compile around the model can hand its calls over.

    `owner_call` does the same for a compile that calls the module rather than its `forward`."""

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
