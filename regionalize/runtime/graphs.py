"""What one CUDA graph can serve of an owner's calls, and what a caller keeps of its outputs."""

import copy

import torch

from .internals.hooks import global_hooks, module_hooks
from .internals.tracer import tree_leaves, tree_map
from .static import static_graphable

plain = (int, float, bool, str, type(None))  # values a call passes as they are


def kept(out, args, kwargs):
    """A CUDA graph's outputs `out` as the caller may keep them, not overwritten by the next replay: tensors
    cloned, other objects (a cache the owner created) deep-copied, with the tensors they hold; but not an
    object the caller handed in (its static cache, written in place, as the original writes it)."""
    given = {id(x) for x in tree_leaves((args, kwargs)) if not isinstance(x, torch.Tensor)}
    return tree_map(lambda x: x if id(x) in given else copied(x), out)


def copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value if isinstance(value, plain) else copy.deepcopy(value)


def graphable(owner, args, kwargs):
    """Can one CUDA graph serve this call: no hooks, only CUDA tensors, plain values and static caches that
    a graph can take (`static_graphable`)."""
    if any(module_hooks(owner, backward=False)) or global_hooks(backward=False):
        return False
    leaves = tree_leaves((args, kwargs))

    def servable(x):
        return x.is_cuda if isinstance(x, torch.Tensor) else isinstance(x, plain) or static_graphable(x)

    return all(map(servable, leaves)) and any(isinstance(x, torch.Tensor) for x in leaves)
