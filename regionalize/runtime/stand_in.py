"""Runs a block with a stand-in for its cache's layer, in region bodies that take the layer's tensors.

A cache update is a side effect, so a region that made it would be traced again for every layer
(docs/form-caches.md)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .internals.tracer import tree_map_only
from .kv import LayerKV, kv_layer, kv_length, kv_pair, kv_past, kv_store
from .nested import contiguous_copy
from .state import process
from .static import set_up_static_layer, static_layer, static_made_names, static_run
from .threads import this_call

Args = tuple[Any, ...]  # a call's positional arguments
Kwargs = dict[str, Any]  # a call's keyword arguments
Function = Callable[..., Any]
Regions = tuple[Function, ...]  # the regions that serve a call whose cache is stood in for
Found = tuple[Any, Any, Any, "bool | None"]  # a stand-in's layers and state (`find_layer`)


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


def find_layer(cache: Any, index: int) -> Found | None:
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


class StandIn:
    """The bodies of the regions that run a block class's `forward` (`plain`) with a stand-in for its cache.

    A cache that the parameter `name` takes is stood in for, and the regions take its layer's tensors. With
    `copies`, a body returns copies of all its tensors (`Region`)."""

    plain: Function
    copies: bool
    name: str | None
    position: int

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
                made = writing(block, *past, written, slot, *args, **kwargs)  # type: ignore[misc]
                keys, values, cross_keys, cross_values, out = made
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
