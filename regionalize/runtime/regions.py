"""Makes a block class's `forward` nested compile regions that Dynamo traces once for every block.

It also compiles blocks of such a class one by one with a stand-in for their cache (`compile_stood_in`)."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .frames import OrEager, copy_for_class, globals_of, in_globals, torch_compile
from .internals.tracer import is_compile_error, is_tracing, tree_map_only
from .kv import LayerKV, kv_layer, kv_length, kv_pair, kv_past, kv_store
from .nested import contiguous_copy, nested
from .state import process
from .static import set_up_static_layer, static_layer, static_made_names, static_run
from .threads import this_call

Args = tuple[Any, ...]  # a call's positional arguments
Kwargs = dict[str, Any]  # a call's keyword arguments
Function = Callable[..., Any]
Regions = tuple[Function, ...]  # the regions that serve a call whose cache is stood in for
Found = tuple[Any, Any, Any, "bool | None"]  # a stand-in's layers and state (`Region.layer`)
Bodies = tuple[tuple[types.FunctionType, ...], types.FunctionType]  # what `Region.bodies` returns


def kv_name(forward: Function) -> tuple[str | None, int]:
    """Returns the parameter of a block's `forward` that takes a transformers cache, and its position."""
    forward = inspect.unwrap(forward)
    names = list(inspect.signature(getattr(forward, "_regionalize_forward", forward)).parameters)
    name = next((n for n in ("past_key_values", "past_key_value", "layer_past") if n in names), None)
    return name, names.index(name) - 1 if name else 0


def is_plain_value(value: object) -> bool:
    """Returns whether `value` is a tensor, a plain value, or a tuple, list or dict of those."""
    if isinstance(value, (tuple, list, dict)):
        return all(map(is_plain_value, value.values() if isinstance(value, dict) else value))
    return value is None or isinstance(value, (torch.Tensor, int, float, bool, str))


def expect(holds: bool, what: str) -> None:
    """Raises where a block breaks what the stand-in assumes; the owner then retries without a stand-in."""
    if not holds:
        raise RuntimeError(f"regionalize: a block {what}")


def body_template(block: nn.Module, *args: Any, __body: Any = None, **kwargs: Any) -> Any:
    """Runs a region's body, or a block's own frame, as a frame of its own (`Region.bodies`)."""
    return __body(block, *args, **kwargs)


def region_forward(self: nn.Module, *args: Any, __region: Any = None, **kwargs: Any) -> Any:
    """Serves as a block class's `forward`: calls its region, or the original for a module no owner set up.

    The region is a default argument, so that nothing installed on the user's class is a closure."""
    if "_regionalize_structure" not in self.__dict__:
        return __region.plain(self, *args, **kwargs)
    return __region.call(self, args, kwargs)


class Region:
    """Runs a block class's `forward` (`plain`) as nested compile regions while an owner is traced whole.

    A cache that the parameter `name` takes is stood in for, and the regions take its layer's tensors
    (`run_keyed`, `run_writing`, `run_static_setup` and `run_static`). With `copies`, the region returns
    copies of all its tensors, which the owner's retry sets where outputs alias in a way that
    `copy_aliased` cannot see."""

    made: Bodies | None

    def __init__(self, plain: Function) -> None:
        self.plain, self.copies, self.made = plain, False, None
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

    def run_copied(self, block: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return tree_map_only(torch.Tensor, contiguous_copy, self.plain(block, *args, **kwargs))

    def handed(self, args: Args, kwargs: Kwargs) -> tuple[int | None, Any]:
        """Returns the cache's slot among `args` (None for `kwargs` or no cache) and the cache."""
        slot = None if self.name in kwargs or len(args) <= self.position else self.position
        return slot, kwargs.get(self.name) if slot is None else args[slot]  # type: ignore[arg-type]  # or None

    def given(self, cache: Any, slot: int | None, args: Args, kwargs: Kwargs) -> tuple[Args, Kwargs]:
        """Returns `args` and `kwargs` with `cache` in place of the cache that the call handed over."""
        if slot is None:
            return args, {**kwargs, self.name: cache}  # type: ignore[dict-item]  # a cache's, named
        return (*args[:slot], cache, *args[slot + 1 :]), kwargs

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

    def run(self, block: nn.Module, cache: Any, slot: int | None, args: Args, kwargs: Kwargs) -> Any:
        """Runs the block's own code with `cache`, a stand-in, where the call handed over its cache."""
        args, kwargs = self.given(cache, slot, args, kwargs)
        return (self.run_copied if self.copies else self.plain)(block, *args, **kwargs)

    def run_keyed(
        self, block: nn.Module, keys: Any, values: Any, slot: int | None, *args: Any, **kwargs: Any
    ) -> Any:
        cache = LayerKV(keys, values)
        out = self.run(block, cache, slot, args, kwargs)
        expect(cache.updates == 1, f"updated its cache {cache.updates} times, not once")
        return cache.keys, cache.values, out

    def run_writing(
        self,
        block: nn.Module,
        keys: Any,
        values: Any,
        written: bool | None,
        slot: int | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Runs the block with an encoder-decoder cache on the call that writes its cross-attention keys."""
        own, cross = LayerKV(keys, values), LayerKV(None, None)
        cache = process.encoder_decoder(own, cross, written)  # type: ignore[misc]  # `make_encoder_decoder_kv`
        out = self.run(block, cache, slot, args, kwargs)
        flags = cache.is_updated.set
        expect(own.updates == 1 and cross.updates == 1, "updated its caches other than as assumed")
        expect(flags and all(flag is True for flag in flags), "did not set its cross-attention flag")
        return own.keys, own.values, cross.keys, cross.values, out

    def run_static(
        self, block: nn.Module, spec: str, slot: int | None, *args: Any, layer_state: Any, **kwargs: Any
    ) -> Any:
        """Runs the block with a `StaticCache`'s layer, which it writes in place (`static_run`)."""
        return static_run(spec, layer_state, lambda cache: self.run(block, cache, slot, args, kwargs))[0]

    def run_static_setup(
        self, block: nn.Module, spec: str, slot: int | None, *args: Any, layer_state: Any, **kwargs: Any
    ) -> Any:
        """Runs the block on a `StaticCache` layer's first update and returns what sets the layer up."""
        out, layer = static_run(spec, layer_state, lambda cache: self.run(block, cache, slot, args, kwargs))
        return (*(getattr(layer, name) for name in static_made_names), out)

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
        found = self.layer(cache, index)
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

    def layer(self, cache: Any, index: int) -> Found | None:
        """Returns what stands in for `cache`'s layer `index`, or None where a region cannot stand in."""
        # In the owner's frame on a torch that reuses no region, a stand-in would be traced for every layer
        # anyway and cost more than the layers traced as they are (docs/form-caches.md#static-caches).
        served = process.reusing or not this_call.tracing
        static = static_layer(cache, index) if served else None
        pair = None if static else kv_pair(cache, index)
        layer = static[0] if static else kv_layer(cache, index) if pair is None else pair[0]
        written = None if pair is None else cache.is_updated.get(index)
        # Once an encoder-decoder layer's cross-attention keys are written, after the prompt, the layer is
        # traced in the owner's frame: a region that took those keys as inputs would decode slower
        # (docs/form-caches.md#encoder-decoder-caches).
        if layer is None or (pair is not None and (written or pair[1].is_initialized)):
            return None  # a cache of another kind, or a layer that a stand-in does not serve
        return static, pair, layer, written

    def run_through(
        self,
        regions: Regions,
        block: nn.Module,
        found: Found,
        cache: Any,
        index: int,
        slot: int | None,
        args: Args,
        kwargs: Kwargs,
    ) -> Any:
        """Runs the call through `regions`, then writes the new keys and values into the cache.

        A `StaticCache`'s layer is written in place by the region instead."""
        static, pair, layer, written = found
        args, kwargs = self.given(None, slot, args, kwargs)
        keyed, writing, static_setup, static_kept = regions
        past = None if static else kv_past(layer)
        this_call.standing_in = not this_call.tracing
        try:
            if static:
                region = static_kept if layer.is_initialized else static_setup
                result = region(block, static[1][0], slot, *args, layer_state=static[1][1], **kwargs)
            elif pair is None:
                keys, values, out = keyed(block, *past, slot, *args, **kwargs)  # type: ignore[misc]
            else:
                keys, values, cross_keys, cross_values, out = writing(
                    block,
                    *past,
                    written,
                    slot,
                    *args,
                    **kwargs,  # type: ignore[misc]
                )
        finally:
            this_call.standing_in = False
        if static:
            if layer.is_initialized:
                return result
            set_up_static_layer(layer, result[:-1])
            return result[-1]
        if pair is not None:
            kv_store(pair[1], cross_keys, cross_values, 0, process.kv_init)  # type: ignore[arg-type]  # checked
            cache.is_updated[index] = True
        kv_store(layer, keys, values, kv_length(past), process.kv_init)  # type: ignore[arg-type]  # checked
        return out

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


def region_of(cls: type) -> Region | None:
    """Returns the region that a block class's `forward` was made into, or None."""
    return cls.__dict__.get("_regionalize_region")


def compile_stood_in(block: nn.Module, compile_kwargs: Kwargs) -> None:
    """Compiles `block`, whose cache a stand-in serves, on its own, as one frame per call.

    The cache is read and written eagerly, outside the frame, which the blocks of the class share;
    `block.compile()` would break the graph around each cache update (docs/form-torch-versions.md)."""
    region: Region = region_of(type(block))  # type: ignore[assignment]  # a class made regions
    bodies, whole = region.bodies()
    frame = OrEager(torch_compile(whole, compile_kwargs), region.plain, whole.__code__, type(block))
    # Kept out of the module's state, which must pickle; a copy runs eagerly, as torch's compiled modules do.
    compiled = tuple(torch_compile(body, compile_kwargs, fullgraph=True) for body in bodies)
    process.block_frames[block] = compiled, frame, frame
