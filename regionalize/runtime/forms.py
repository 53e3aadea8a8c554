"""Defines the forms an owner takes, one class each, and the ladder that a failed compile steps down.

An owner's plan holds one form. `owner.py` asks it how to compile the owner's frame, whether a call runs
that frame, what becomes of the outputs, whether the frame is saved, and which form takes over when the
frame fails to compile (docs/design.md#adding-a-runtime-form)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .graphs import keep_outputs
from .internals.compiler import inductor_pieces
from .kv import is_kv_empty
from .pieces import pieces_backend
from .pieces_frame import register_saving
from .static import is_on_graph_device, is_static_handed

if TYPE_CHECKING:
    from .state import Args, Kwargs, OwnerState


@dataclass(frozen=True, slots=True)
class Failure:
    """Describes why the owner's frame failed to compile."""

    why: str  # the error, in a line
    backend: bool  # the trace worked and the backend failed


class OwnerForm:
    """Says how an owner in one form compiles, serves its calls, falls back, saves and names itself.

    The defaults are those of a form that runs per block; the class attributes are what `owner.py` reads."""

    name = ""  # what verify, `describe` and the warnings call the form
    runs_whole = False  # the owner's calls run its one compiled frame
    tracing: bool | str = True  # `this_call.tracing` while the frame runs ("flat": blocks inline)
    keys_first_parameter = False  # a new dtype or device of the first parameter compiles a new frame

    def __repr__(self) -> str:
        return self.name

    def options(self, state: OwnerState) -> dict[str, Any]:
        """Returns the options for `torch.compile` of the owner's frame."""
        return state.config.kwargs

    def why_not_saved(self) -> str | None:
        """Returns why the owner's frame is not saved in this form, or None where it may be."""
        return f"it is compiled {self.name}"

    def per_call_reason(self, state: OwnerState, args: Args, kwargs: Kwargs) -> str | None:
        """Returns why this call runs per block although the form runs whole, or None."""
        return None

    def hands_over(self, state: OwnerState, args: Args, kwargs: Kwargs) -> bool:
        """Returns whether a compile around the model that traces this call hands it to the owner."""
        return False

    def takes_over(self, failure: Failure, state: OwnerState) -> bool:
        """Returns whether this form can follow a form above it in the ladder that failed so."""
        return True

    def reason(self, failure: Failure) -> str:
        """Returns why the owner takes this form after `failure`."""
        return failure.why

    def warning(self, owner: str, reason: str, has_stages: bool) -> str:
        """Returns the warning that the owner named `owner` takes this form as a fallback."""
        instead = "its stages own their blocks" if has_stages else "its blocks are compiled one by one"
        return f"{owner} cannot be compiled whole ({reason}); {instead} instead"

    def finish(self, out: Any, graphs: bool, args: Args, kwargs: Kwargs) -> Any:
        """Returns what the caller gets of the frame's outputs `out`."""
        return out


class Whole(OwnerForm):
    """Compiles the owner whole, each block a nested region that is traced once per class."""

    name = "whole"
    runs_whole = True

    def why_not_saved(self) -> str | None:
        return None

    def takes_over(self, failure: Failure, state: OwnerState) -> bool:
        return False

    def finish(self, out: Any, graphs: bool, args: Args, kwargs: Kwargs) -> Any:
        # A CUDA graph's outputs are overwritten by its next replay.
        return keep_outputs(out, args, kwargs) if graphs else out


class Pieces(OwnerForm):
    """Traces the owner whole with its blocks inline and compiles one piece per distinct block (`pieces.py`).

    It serves blocks that cannot be regions, and a torch that reuses no traced region."""

    name = "whole, in pieces"
    runs_whole = True
    tracing = "flat"
    keys_first_parameter = True

    def options(self, state: OwnerState) -> dict[str, Any]:
        given = state.config.kwargs
        options = dict(given.get("options", {}))
        kwargs = {k: v for k, v in given.items() if k not in ("mode", "options")}
        if "guard_filter_fn" in options:  # Dynamo's option goes to the frame, Inductor's to the pieces
            kwargs["options"] = {"guard_filter_fn": options.pop("guard_filter_fn")}
        classes = {type(block) for block in state.blocks}
        kwargs["backend"] = pieces_backend(classes, state.report, given.get("mode"), options)
        return kwargs

    def why_not_saved(self) -> str | None:
        return None if register_saving() else "this torch cannot save a frame compiled in pieces"

    def per_call_reason(self, state: OwnerState, args: Args, kwargs: Kwargs) -> str | None:
        """Returns "static" for a call that hands over a `StaticCache`, "prompt" for an empty `DynamicCache`.

        Only where a stand-in serves every block's cache (docs/form-torch-versions.md)."""
        if not state.indexed:
            return None
        # A token's call, the most common one, gives None without reading the blocks.
        why = "static" if is_static_handed(args, kwargs) else "prompt" if is_kv_empty(args, kwargs) else None
        served = why and all(type(b.__dict__["_regionalize_layer"]) is int for b, _ in state.indexed)
        return why if served else None

    def hands_over(self, state: OwnerState, args: Args, kwargs: Kwargs) -> bool:
        """Takes a call that brings a `StaticCache` on the GPU, which transformers compiles in CUDA graphs.

        One graph of the owner serves it faster (docs/form-torch-versions.md#torch-versions)."""
        if not state.indexed or not is_static_handed(args, kwargs):
            return False
        tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
        return bool(tensors) and all(is_on_graph_device(x) for x in tensors)

    def takes_over(self, failure: Failure, state: OwnerState) -> bool:
        inductor = state.config.kwargs.get("backend", "inductor") == "inductor"
        return not failure.backend and inductor and inductor_pieces() is not None

    def reason(self, failure: Failure) -> str:
        return f"its blocks cannot be nested regions ({failure.why})"

    def warning(self, owner: str, reason: str, has_stages: bool) -> str:
        return f"{owner}'s {reason.removeprefix('its ')}; it is compiled whole in pieces instead"


class PerBlock(OwnerForm):
    """Compiles each block on its own and runs the owner eagerly, the last fallback (`per_block.py`)."""

    name = "per block"


class Alone(PerBlock):
    """Compiles the owner's one block on its own, since there is nothing to stamp out."""

    name = "alone"


class Block(PerBlock):
    """Compiles one block class's calls with autograd, the frame that `saved_blocks.py` saves."""

    name = "block with autograd"

    def why_not_saved(self) -> str | None:
        return None


WHOLE, PIECES, PER_BLOCK, ALONE, BLOCK = Whole(), Pieces(), PerBlock(), Alone(), Block()
# The forms that a failed compile steps down, in order: each failure moves to the first form below that
# takes it over. The last takes every failure.
LADDER = (WHOLE, PIECES, PER_BLOCK)


def next_form(form: OwnerForm, failure: Failure, state: OwnerState) -> OwnerForm:
    """Returns the form that takes over from `form` after `failure`."""
    below = LADDER[LADDER.index(form) + 1 :] if form in LADDER else LADDER[-1:]
    # The last form stays: another thread's call may have moved the owner to it during this call.
    return next((lower for lower in below if lower.takes_over(failure, state)), LADDER[-1])
