"""A block's `forward` as nested compile regions that Dynamo traces once and reuses for every block."""

import functools
import inspect
import weakref

import torch

from .frames import _regionalize_in_globals, _regionalize_model_globals, _RegionalizeOrEager
from .internals import _regionalize_compiling, _regionalize_traced, _regionalize_tree_map_only
from .kv import (
    _regionalize_encoder_decoder_kv,
    _regionalize_kv,
    _regionalize_kv_layer,
    _regionalize_kv_length,
    _regionalize_kv_pair,
    _regionalize_kv_past,
    _regionalize_kv_store,
    _RegionalizeLayerKV,
)
from .nested import _regionalize_copy, _regionalize_nested
from .static import (
    _regionalize_static_layer,
    _regionalize_static_made_names,
    _regionalize_static_run,
    _regionalize_static_setup,
)
from .threads import _regionalize_standing_in, _regionalize_tracing

# Process-wide, as what it reads is: set by every owner's set-up, under the lock, to the same value.
_regionalize_reusing = [True]  # `_regionalize_reuses()`, read eagerly as an owner settles: not while traced
# Blocks compiled one by one that update a cache: the block -> its frames (`_regionalize_block_compiled`).
# Kept out of the module's state, which must pickle; a copy runs eagerly, as torch's compiled modules do.
_regionalize_block_frames = weakref.WeakKeyDictionary()


def _regionalize_kv_name(forward):
    """The parameter of a block's `forward` that takes a transformers cache, and its position after `self`."""
    forward = inspect.unwrap(forward)
    names = list(inspect.signature(getattr(forward, "_regionalize_forward", forward)).parameters)
    name = next((n for n in ("past_key_values", "past_key_value", "layer_past") if n in names), None)
    return name, names.index(name) - 1 if name else 0


def _regionalize_plain(value):
    """Is `value` a tensor, a plain value, or a tuple, list or dict of those (nothing that holds state)?"""
    if isinstance(value, (tuple, list)):
        return all(_regionalize_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_regionalize_plain(v) for v in value.values())
    return value is None or isinstance(value, (torch.Tensor, int, float, bool, str))


def _regionalize_region(plain, name, position, copies):
    """`plain` (a block's forward) as a nested region while an owner is traced whole, itself otherwise.
    A cache that its parameter `name` (at `position` after `self`) takes is stood in for. With `copies[0]`
    the region returns copies of all its tensors: the owner's retry where outputs alias in a way that
    `_regionalize_unaliased` does not see."""
    label = f"{plain.__module__}.{plain.__qualname__}".replace(".", "_")
    region = _regionalize_nested(plain, label)

    @functools.wraps(plain)
    def copied(self, *args, **kwargs):
        out = plain(self, *args, **kwargs)
        return _regionalize_tree_map_only(torch.Tensor, _regionalize_copy, out)

    region_copied = _regionalize_nested(copied, f"{label}_copied")

    def plain_region(self, *args, **kwargs):  # a block without a cache to stand in for
        return (region_copied if copies[0] else region)(self, *args, **kwargs)

    def handed(args, kwargs):
        """The slot of the cache among `args` (None: in `kwargs`, or not handed), and the cache."""
        slot = None if name in kwargs or len(args) <= position else position
        return slot, kwargs.get(name) if slot is None else args[slot]

    def flat(self, args, kwargs):
        """The block traced as it is in an owner compiled in pieces. A `DynamicCache` layer that it fills
        first keeps its keys and values contiguous, as transformers' update leaves them in eager: compiled,
        they would keep the projection's transposed strides, and the next token's frame, compiled for
        contiguous ones after it, would be compiled again for the token after."""
        index = self.__dict__.get("_regionalize_layer")
        cache = handed(args, kwargs)[1] if type(index) is int else None
        layer = None if cache is None else _regionalize_kv_layer(cache, index)
        fresh = layer is not None and not layer.is_initialized
        out = plain(self, *args, **kwargs)
        if fresh:
            layer.keys, layer.values = layer.keys.contiguous(), layer.values.contiguous()
        return out

    def run(self, cache, slot, args, kwargs):
        if slot is None:
            kwargs[name] = cache
        else:
            args = (*args[:slot], cache, *args[slot + 1 :])
        return (copied if copies[0] else plain)(self, *args, **kwargs)

    # Checked while tracing, so raised before anything ran: the owner then traces the caches layer by layer.
    def expect(holds, what):
        if not holds:
            raise RuntimeError(f"regionalize: a block {what}")

    def body(self, keys, values, slot, *args, **kwargs):
        cache = _RegionalizeLayerKV(keys, values)
        out = run(self, cache, slot, args, kwargs)
        expect(cache.updates == 1, f"updated its cache {cache.updates} times, not once")
        return cache.keys, cache.values, out

    body.__code__ = body.__code__.replace(co_name=f"{label}_keyed")  # its own frame per class
    keyed = _regionalize_nested(body, f"{label}_keyed", extras=2)

    # An encoder-decoder cache, on the call that writes the layer's cross-attention keys and sets its flag.
    def body_writing(self, keys, values, written, slot, *args, **kwargs):
        own, cross = _RegionalizeLayerKV(keys, values), _RegionalizeLayerKV(None, None)
        cache = _regionalize_encoder_decoder_kv(own, cross, written)
        out = run(self, cache, slot, args, kwargs)
        flags = cache.is_updated.set
        expect(own.updates == 1 and cross.updates == 1, "updated its caches other than as assumed")
        expect(flags and all(flag is True for flag in flags), "did not set its cross-attention flag")
        return own.keys, own.values, cross.keys, cross.values, out

    body_writing.__code__ = body_writing.__code__.replace(co_name=f"{label}_writing")
    writing = _regionalize_nested(body_writing, f"{label}_writing", extras=4)

    # A `StaticCache`'s layer, written in place (`_regionalize_static_run`); on its first update the region
    # sets up a stand-in, and returns what that left, which sets the layer up outside it.
    def body_static(self, spec, slot, *args, _regionalize_state, **kwargs):
        return _regionalize_static_run(spec, _regionalize_state, lambda c: run(self, c, slot, args, kwargs))[
            0
        ]

    def body_static_setup(self, spec, slot, *args, _regionalize_state, **kwargs):
        out, layer = _regionalize_static_run(
            spec, _regionalize_state, lambda c: run(self, c, slot, args, kwargs)
        )
        return (*(getattr(layer, name) for name in _regionalize_static_made_names), out)

    body_static.__code__ = body_static.__code__.replace(co_name=f"{label}_static")
    body_static_setup.__code__ = body_static_setup.__code__.replace(co_name=f"{label}_static_setup")
    static = _regionalize_nested(body_static, f"{label}_static")
    static_setup = _regionalize_nested(body_static_setup, f"{label}_static_setup", extras=3)

    def whole(self, *args, **kwargs):
        return plain(self, *args, **kwargs)

    whole = _regionalize_in_globals(whole, _regionalize_model_globals(plain) or globals(), label)

    def stood_in(self, args, kwargs, regions, uncached, traced):
        """The call of a block that updates a cache, through `regions` (`keyed` or `writing` with its
        layer's keys and values, the cache written here; `static_setup` or `static` with its layer's
        state, written in place) where its layer is stood in for; else through `uncached` where the call
        hands it no cache, and `traced` where the stand-in cannot serve."""
        # Its layer if a region stands in for it; None if none does, and then traced in the owner's frame
        # unless nothing this call hands it can be a cache (BART's encoder layers build the attention
        # class its decoder layers' caches are indexed in); False when that failed to compile.
        index = self.__dict__["_regionalize_layer"]
        if index is None and _regionalize_plain((*args, *kwargs.values())):
            return uncached(self, *args, **kwargs)
        if index is None or index is False:
            return traced(self, *args, **kwargs)
        slot, cache = handed(args, kwargs)
        if cache is None:
            return uncached(self, *args, **kwargs)
        # In the owner's frame on a torch that reuses no region (2.11, in CUDA graphs) a stand-in would be
        # traced for every layer all the same, and cost more than the layers traced as they are
        # (docs/form-caches.md, Static caches).
        served = _regionalize_reusing[0] or not _regionalize_tracing[0]
        static = _regionalize_static_layer(cache, index) if served else None
        pair = None if static else _regionalize_kv_pair(cache, index)
        layer = static[0] if static else _regionalize_kv_layer(cache, index) if pair is None else pair[0]
        written = None if pair is None else cache.is_updated.get(index)
        # Once an encoder-decoder layer's cross-attention keys are written (every token after the prompt),
        # the layer is traced in the owner's frame: a region reading them as inputs, stamped out, decoded
        # far slower than tracing them layer by layer, once (BART, docs/form-caches.md).
        if layer is None or (pair is not None and (written or pair[1].is_initialized)):
            return traced(self, *args, **kwargs)  # a cache of another kind
        given = args, kwargs
        if slot is None:
            kwargs = {**kwargs, name: None}
        else:
            args = (*args[:slot], None, *args[slot + 1 :])
        keyed, writing, static_setup, static_kept = regions
        init, past = _regionalize_kv[0], None if static else _regionalize_kv_past(layer)
        _regionalize_standing_in[0] = not _regionalize_tracing[0]
        try:
            if static:
                region = static_kept if layer.is_initialized else static_setup
                result = region(self, static[1][0], slot, *args, _regionalize_state=static[1][1], **kwargs)
            elif pair is None:
                keys, values, out = keyed(self, *past, slot, *args, **kwargs)
            else:
                keys, values, cross_keys, cross_values, out = writing(
                    self, *past, written, slot, *args, **kwargs
                )
        except Exception as error:
            # A block's own frame (the per-block form) that cannot be compiled with the stand-in has run
            # nothing: the block is compiled as it is from now on. In the owner's frame its retry decides.
            if _regionalize_tracing[0] or not _regionalize_compiling(error):
                raise
            self.__dict__["_regionalize_layer"] = False
            return traced(self, *given[0], **given[1])
        finally:
            _regionalize_standing_in[0] = False
        if static:
            if layer.is_initialized:
                return result
            _regionalize_static_setup(layer, result[:-1])
            return result[-1]
        if pair is not None:
            _regionalize_kv_store(pair[1], cross_keys, cross_values, 0, init)
            cache.is_updated[index] = True
        _regionalize_kv_store(layer, keys, values, _regionalize_kv_length(past), init)
        return out

    @functools.wraps(plain)
    def forward(self, *args, **kwargs):
        if _regionalize_tracing[0] in (False, "flat"):
            # Compiled per block (`_regionalize_block_compiled`), the block runs eagerly and calls its frames.
            frames = None if _regionalize_traced() else _regionalize_block_frames.get(self)
            if frames is None:
                return flat(self, args, kwargs) if _regionalize_tracing[0] else plain(self, *args, **kwargs)
            return stood_in(self, args, kwargs, *frames)
        if "_regionalize_layer" not in self.__dict__:
            return plain_region(self, *args, **kwargs)
        return stood_in(self, args, kwargs, (keyed, writing, static_setup, static), plain_region, plain)

    forward._regionalize_bodies = body, body_writing, body_static_setup, body_static, whole
    return forward


def _regionalize_block_compiled(block, compile_kwargs):
    """Compile `block`, whose cache a stand-in serves, one by one: the block runs eagerly and its cache is
    read and written there, and the rest is one compiled frame per call, shared by the blocks of its
    class, as the region would be. Compiled as it is (`block.compile()`), the block's frame breaks its
    graph around each cache update: two frames a block, each call's entry paid twice. A frame that cannot
    be compiled whole with the stand-in falls back to the block's own code compiled (`stood_in`)."""
    forward = type(block).forward
    *bodies, whole = forward._regionalize_bodies
    full = {**compile_kwargs, "fullgraph": True}
    compiled = torch.compile(whole, **compile_kwargs)
    frame = _RegionalizeOrEager(compiled, forward.__wrapped__, whole.__code__, type(block))
    frames = tuple(torch.compile(body, **full) for body in bodies), frame, frame
    _regionalize_block_frames[block] = frames
