"""Makes a block class's `forward` nested compile regions that Dynamo traces once for every block.

It also compiles blocks of such a class one by one with a stand-in for their cache (`compile_stood_in`)."""

from __future__ import annotations

import functools
import types
from typing import Any

from torch import nn

from .frames import OrEager, copy_for_class, globals_of, in_globals, torch_compile
from .internals.tracer import is_compile_error, is_tracing
from .kv import kv_layer
from .nested import nested
from .saved_blocks import saved_frames
from .stand_in import Args, Function, Kwargs, Regions, StandIn, find_layer, is_plain_value, kv_name
from .state import process
from .threads import this_call

Bodies = tuple[tuple[types.FunctionType, ...], types.FunctionType]  # what `Region.bodies` returns


def body_template(block: nn.Module, *args: Any, __body: Any = None, **kwargs: Any) -> Any:
    """Runs a region's body, or a block's own frame, as a frame of its own (`Region.bodies`)."""
    return __body(block, *args, **kwargs)


def region_forward(self: nn.Module, *args: Any, __region: Any = None, **kwargs: Any) -> Any:
    """Serves as a block class's `forward`: calls its region, or the original for a module no owner set up.

    The region is a default argument, so that nothing installed on the user's class is a closure."""
    if "_regionalize_structure" not in self.__dict__:
        return __region.plain(self, *args, **kwargs)
    return __region.call(self, args, kwargs)


class Region(StandIn):
    """Runs a block class's `forward` (`plain`) as nested compile regions while an owner is traced whole.

    Where the call hands over a cache, the regions are `StandIn`'s bodies. With `copies`, a region returns
    copies of all its tensors, which the owner's retry sets where outputs alias in a way that
    `copy_aliased` cannot see."""

    made: Bodies | None

    def __init__(self, plain: Function) -> None:
        self.plain, self.copies, self.made = plain, False, None
        self.grad_frame: types.FunctionType | None = None  # the block's own frame as `saved_body` makes it
        self.name, self.position = kv_name(plain)
        self.label = label = f"{plain.__module__}.{plain.__qualname__}".replace(".", "_")
        self.region = nested(plain, label)
        self.region_copied = nested(self.run_copied, f"{label}_copied")
        self.regions = (
            nested(self.run_keyed, f"{label}_keyed", extras=2),
            nested(self.run_writing, f"{label}_writing", extras=4),
            nested(self.run_static_setup, f"{label}_static_setup", extras=3),
            nested(self.run_static, f"{label}_static"),
        )
        self.forward = copy_for_class(region_forward, plain, __region=self)
        stand_in_for(plain, self.forward)

    def call(self, block: nn.Module, args: Args, kwargs: Kwargs) -> Any:
        """Serves a call of a block that an owner set up."""
        if this_call.tracing in (False, "flat"):
            # A block compiled on its own (`compile_stood_in`) runs eagerly and calls its frames.
            frames = None if is_tracing() else process.block_frames.get(block)
            if frames is None:
                if this_call.tracing:
                    return self.run_flat(block, args, kwargs)
                return self.plain(block, *args, **kwargs)
            return self.run_stood_in(block, args, kwargs, *frames)
        if "_regionalize_layer" not in block.__dict__:
            return self.run_uncached(block, *args, **kwargs)
        return self.run_stood_in(block, args, kwargs, self.regions, self.run_uncached, self.plain)

    def run_uncached(self, block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """Runs, as a region, a block's call that has no cache to stand in for."""
        return (self.region_copied if self.copies else self.region)(block, *args, **kwargs)

    def run_flat(self, block: nn.Module, args: Args, kwargs: Kwargs) -> Any:
        """Runs the block as it is, for an owner compiled in pieces.

        A `DynamicCache` layer that the block fills first gets contiguous keys and values, as in eager, so
        that the tokens' frame is not compiled again for other strides (docs/form-torch-versions.md)."""
        index = block.__dict__.get("_regionalize_layer")
        cache = self.handed(args, kwargs)[1] if type(index) is int else None
        layer = None if cache is None else kv_layer(cache, index)  # type: ignore[arg-type]  # an int
        fresh = layer is not None and not layer.is_initialized
        out = self.plain(block, *args, **kwargs)
        if fresh:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()  # type: ignore[union-attr]
        return out

    def run_stood_in(
        self,
        block: nn.Module,
        args: Args,
        kwargs: Kwargs,
        regions: Regions,
        uncached: Function,
        as_is: Function,
    ) -> Any:
        """Serves the call of a block that updates a cache, through `regions` where a stand-in serves it.

        A call that hands over no cache goes through `uncached`, and one that the stand-in cannot serve
        through `as_is`."""
        # The layer index where a region stands in for the cache; None where none does, and the block is
        # then traced in the owner's frame unless nothing that the call hands over can be a cache (BART's
        # encoder layers share a class with the decoder's); False where the stand-in failed to compile.
        index = block.__dict__["_regionalize_layer"]
        if index is None and is_plain_value((*args, *kwargs.values())):
            return uncached(block, *args, **kwargs)
        if index is None or index is False:
            return as_is(block, *args, **kwargs)
        slot, cache = self.handed(args, kwargs)
        if cache is None:
            return uncached(block, *args, **kwargs)
        found = find_layer(cache, index)
        if found is None:
            return as_is(block, *args, **kwargs)
        try:
            return self.run_through(regions, block, found, cache, index, slot, args, kwargs)
        except Exception as error:
            # A block's own frame that cannot be compiled with the stand-in has run nothing, so the block is
            # compiled as it is from now on. In the owner's frame, the owner's retry decides.
            if this_call.tracing or not is_compile_error(error):
                raise
            block.__dict__["_regionalize_layer"] = False
            return as_is(block, *args, **kwargs)

    def bodies(self) -> Bodies:
        """Returns the regions' bodies and the block's own frame, which `compile_stood_in` compiles.

        Each has code of its own, because Dynamo keeps compiled code and its limits per code object. They
        are made once, so that the blocks of the class share their frames."""
        if self.made is None:
            names = ("keyed", "writing", "static_setup", "static")
            bodies = tuple(
                in_globals(body_template, globals(), f"{self.label}_{n}", __body=getattr(self, f"run_{n}"))
                for n in names
            )
            model_globals = globals_of(self.plain) or globals()
            whole = in_globals(body_template, model_globals, self.label, __body=self.plain)
            self.made = bodies, whole
        return self.made

    def saved_body(self) -> types.FunctionType:
        """Returns the block's own frame as `saved_blocks.py` saves it.

        It calls the block class's `forward` as the class holds it (`self.forward`), which a saved frame
        refers to by its module and name, where the original `forward` is no longer found by them."""
        if self.grad_frame is None:
            model_globals = globals_of(self.plain) or globals()
            self.grad_frame = in_globals(
                body_template, model_globals, f"{self.label}_grad", __body=self.forward
            )
        return self.grad_frame


def stand_in_for(plain: Function, installed: Function) -> None:
    """Points each cell of `plain`'s closure that holds `plain` itself at `installed`, the `forward` that
    takes its place on the class.

    transformers wraps a layer class's `forward` so that the layer checkpoints its activations only where
    the wrapper is still the class's `forward` (`GradientCheckpointingLayer`); without this, a layer whose
    `forward` is a region would never checkpoint."""
    for cell in getattr(plain, "__closure__", None) or ():
        try:
            holds_plain = cell.cell_contents is plain
        except ValueError:  # an empty cell
            continue
        if holds_plain:
            cell.cell_contents = installed


def region_of(cls: type) -> Region | None:
    """Returns the region that a block class's `forward` was made into, or None."""
    return cls.__dict__.get("_regionalize_region")


def compile_stood_in(block: nn.Module, compile_kwargs: Kwargs, save: bool = False) -> None:
    """Compiles `block`, whose cache a stand-in serves, on its own, as one frame per call.

    The cache is read and written eagerly, outside the frame, which the blocks of the class share;
    `block.compile()` would break the graph around each cache update (docs/form-torch-versions.md). The
    frame of a call without a cache is saved where `save` asks and it can be (`saved_blocks.py`)."""
    region: Region = region_of(type(block))  # type: ignore[assignment]  # a class made regions
    bodies, whole = region.bodies()
    whole_compiled = torch_compile(whole, compile_kwargs)
    own = functools.partial(whole_compiled, block)
    saved = saved_frames(block, region.saved_body(), compile_kwargs, own) if save else None
    code = (saved.frame if saved else whole).__code__
    frame = OrEager(saved or whole_compiled, region.plain, code, type(block))
    # Kept out of the module's state, which must pickle; a copy runs eagerly, as torch's compiled modules do.
    compiled = tuple(torch_compile(body, compile_kwargs, fullgraph=True) for body in bodies)
    process.block_frames[block] = compiled, frame, frame
