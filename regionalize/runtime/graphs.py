"""What one CUDA graph can serve of an owner's calls, and what a caller keeps of its outputs."""

import copy

import torch

from .internals import (
    _regionalize_global_hooks,
    _regionalize_module_hooks,
    _regionalize_tree_leaves,
    _regionalize_tree_map,
)
from .static import _regionalize_static_graphable


def _regionalize_kept(out, args, kwargs):
    """A CUDA graph's outputs `out` as the caller may keep them, not overwritten by the next replay: tensors
    cloned, other objects (a cache the owner created) deep-copied, with the tensors they hold; but not an
    object the caller handed in (its static cache, written in place, as the original writes it)."""
    leaves = _regionalize_tree_leaves((args, kwargs))
    given = {id(x) for x in leaves if not isinstance(x, torch.Tensor)}
    return _regionalize_tree_map(lambda x: x if id(x) in given else _regionalize_copied(x), out)


def _regionalize_copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value if isinstance(value, (int, float, bool, str, type(None))) else copy.deepcopy(value)


def _regionalize_graphable(owner, args, kwargs):
    """Can one CUDA graph serve this call: no hooks, only CUDA tensors, plain values and static caches that
    a graph can take (`_regionalize_static_graphable`)."""
    if any(_regionalize_module_hooks(owner, backward=False)) or _regionalize_global_hooks(backward=False):
        return False
    leaves = _regionalize_tree_leaves((args, kwargs))
    plain = (int, float, bool, str, type(None))
    for x in leaves:
        tensor = isinstance(x, torch.Tensor)
        if not (
            isinstance(x, plain)
            or (tensor and x.is_cuda)
            or (not tensor and _regionalize_static_graphable(x))
        ):
            return False
    return any(isinstance(x, torch.Tensor) for x in leaves)
