"""Lets an owner serve, in its own CUDA graph, the calls that a compile around the model hands over.

transformers' `generate` compiles the model's forward itself when the cache is static
(docs/form-torch-versions.md#torch-versions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .frames import copy_for_class
from .graphs import graph_modes
from .threads import this_call

if TYPE_CHECKING:
    from .state import Args, Kwargs, OwnerState


def is_opaque(state: OwnerState) -> bool:
    """Returns whether the owner runs in CUDA graphs, which makes it opaque to a compile around it."""
    return state.config.kwargs.get("mode") in graph_modes


def handoff(owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> bool:
    """Returns whether a compile around the model that traces this call hands it over to the owner.

    In a CUDA-graph mode it hands over every call; otherwise the owner's form says (`hands_over`)."""
    if not torch.compiler.is_compiling() or this_call.tracing:  # not traced, or traced by the owner itself
        return False
    state: OwnerState | None = owner.__dict__.get("_regionalize_owner")
    if state is None:  # a stage whose blocks an outer owner took (`outer.py`) is traced through
        return False
    return is_opaque(state) or state.report.plan.form.hands_over(state, args, kwargs)


def owned(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps the owner class's `forward` so that a compile around the model can hand its calls over.

    `owner_call` does the same for a compile that calls the module rather than its `forward`."""

    owned = copy_for_class(owned_forward, forward, __forward=forward)
    owned._regionalize_owned = True  # type: ignore[attr-defined]  # a function's attribute
    return owned


def owned_forward(self: torch.nn.Module, *args: Any, __forward: Any = None, **kwargs: Any) -> Any:
    if handoff(self, args, kwargs):
        return outside(self, args, kwargs)
    return __forward(self, *args, **kwargs)


@torch.compiler.disable  # type: ignore[untyped-decorator]  # torch's is untyped
def outside(owner: torch.nn.Module, args: Args, kwargs: Kwargs) -> Any:
    this_call.handed = owner
    try:
        return owner(*args, **kwargs)
    finally:
        this_call.handed = None
