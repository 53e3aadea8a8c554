"""Decides which of an owner's calls one CUDA graph can serve, and copies the outputs a caller keeps."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from .internals.hooks import has_global_hooks, module_hooks
from .internals.tracer import tree_leaves, tree_map
from .static import is_static_graphable

if TYPE_CHECKING:
    from .state import Args, Kwargs

graph_modes = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs
plain = (int, float, bool, str, type(None))  # values a call passes as they are


def keep_outputs(out: Any, args: Args, kwargs: Kwargs) -> Any:
    """Copies a CUDA graph's outputs, which the next replay overwrites, except objects the caller gave."""
    # The caller's static cache is written in place, as the original writes it.
    given = {id(x) for x in tree_leaves((args, kwargs)) if not isinstance(x, torch.Tensor)}
    return tree_map(lambda x: x if id(x) in given else copy_output(x), out)


def copy_output(value: Any) -> Any:
    """Returns a copy of one output: a tensor's clone, a plain value itself, a deep copy of anything else."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value if isinstance(value, plain) else copy.deepcopy(value)


def is_graphable(owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> bool:
    """Returns whether one CUDA graph can serve this call.

    The call must have no hooks and pass only CUDA tensors, plain values and graphable static caches."""
    if any(module_hooks(owner, backward=False)) or has_global_hooks(backward=False):
        return False
    leaves = tree_leaves((args, kwargs))

    def servable(x: object) -> bool:
        return x.is_cuda if isinstance(x, torch.Tensor) else isinstance(x, plain) or is_static_graphable(x)

    return all(map(servable, leaves)) and any(isinstance(x, torch.Tensor) for x in leaves)
