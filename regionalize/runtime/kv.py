"""Stands in for a block's layer of a transformers `DynamicCache` or `EncoderDecoderCache` in a region.

The region takes the layer's keys and values as tensors, and the cache is written outside it, so that one
trace serves every layer (docs/form-caches.md)."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .internals.tracer import mark_dynamic, put_mark, take_mark
from .nested import contiguous_copy
from .state import process

Past = tuple[torch.Tensor | None, torch.Tensor | None]  # a layer's keys and values as a region takes them
Init = Callable[[Any, torch.Tensor, torch.Tensor], None]  # sets a layer up on its first update


class LayerKV:
    """Stands in for the cache that a block updates, holding one layer's keys and values inside a region.

    `update` returns what transformers' `DynamicLayer.update` returns: the old and new states joined."""

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None) -> None:
        self.keys, self.values, self.updates = keys, values, 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.updates += 1
        if self.keys is None:
            # Copies, because a region's outputs must not alias each other or its inputs (GPT-2's keys and
            # values are views of one projection). Contiguous, as transformers' own update leaves them, so
            # that the first token's frame has the layout of every later token's (`mark_kv_growing`).
            self.keys, self.values = contiguous_copy(key_states), contiguous_copy(value_states)
            return key_states, value_states
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)  # type: ignore[list-item]  # set with keys
        return self.keys, self.values


class Updated:
    """Stands in for an encoder-decoder cache's `is_updated` flags on the call that writes a layer's keys.

    Any key reads the layer's own flag, and what the block sets is kept for the runtime to check."""

    set: list[object]  # the flags that the block set

    def __init__(self, written: bool | None) -> None:
        self.written, self.set = written, []

    def get(self, key: int, default: object = None) -> object:
        return default if self.written is None else self.written

    def __getitem__(self, key: int) -> bool:
        if self.written is None:
            raise KeyError(key)
        return self.written

    def __setitem__(self, key: int, value: object) -> None:
        self.set.append(value)


def make_encoder_decoder_kv(utils: Any) -> type:
    """Returns the class of the stand-ins for a layer of a transformers `EncoderDecoderCache`.

    It subclasses the cache, so that blocks' `isinstance` checks pass, and holds stand-ins for the self- and
    cross-attention layers. Anything else a block reads of it fails, rather than read the wrong data."""

    class EncoderDecoderKV(utils.EncoderDecoderCache):  # type: ignore[misc]  # found as the runtime runs
        def __init__(self, own: LayerKV, cross: LayerKV, written: bool | None) -> None:
            self.self_attention_cache, self.cross_attention_cache = own, cross
            self.is_updated = Updated(written)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            keys = self.self_attention_cache.keys
            return 0 if keys is None or keys.numel() == 0 else keys.shape[-2]

    return EncoderDecoderKV


def layer_idx(block: nn.Module, attribute: str) -> int | None:
    """Returns the one value of `attribute`, the index a cache update takes, in `block`'s modules, or None."""
    found = {getattr(m, attribute) for m in block.modules() if isinstance(getattr(m, attribute, None), int)}
    return found.pop() if len(found) == 1 else None


def kv_layer(cache: Any, index: int) -> Any:
    """Returns the layer of a transformers `DynamicCache` that a region can stand in for, else None."""
    utils: Any = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "DynamicCache", None) or cache.offloading:
        return None
    if len(cache.layers) <= index and cache.layer_class_to_replicate is not utils.DynamicLayer:
        return None
    while len(cache.layers) <= index:  # as `Cache.update` does first
        cache.layers.append(utils.DynamicLayer())
    layer = cache.layers[index]
    sliding = type(layer) is utils.DynamicSlidingWindowLayer and not layer.record_past
    return layer if type(layer) is utils.DynamicLayer or sliding else None


def kv_pair(cache: Any, index: int) -> tuple[Any, Any] | None:
    """Returns the self- and cross-attention layers of an `EncoderDecoderCache`, for a region to stand in for.

    It returns None for any other cache, or where either layer cannot be stood in for."""
    utils = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "EncoderDecoderCache", None):
        return None
    if process.encoder_decoder is None or type(cache.is_updated) is not dict:
        return None
    own = kv_layer(cache.self_attention_cache, index)
    cross = kv_layer(cache.cross_attention_cache, index)
    return None if own is None or cross is None else (own, cross)


def kv_past(layer: Any) -> Past:
    """Returns a cache layer's keys and values as a region takes them, both None before its first update."""
    return (layer.keys, layer.values) if layer.is_initialized else (None, None)


def kv_length(past: Past) -> int:
    return 0 if past[0] is None else past[0].shape[-2]


def dynamic_caches(values: tuple[Any, ...]) -> list[Any]:
    """Returns the `DynamicCache`s among `values`; of an `EncoderDecoderCache`, its self-attention's."""
    utils: Any = sys.modules.get("transformers.cache_utils")  # None without transformers: no cache is found
    wrapper, dynamic = getattr(utils, "EncoderDecoderCache", None), getattr(utils, "DynamicCache", None)
    caches = (value.self_attention_cache if type(value) is wrapper else value for value in values)
    return [cache for cache in caches if dynamic is not None and type(cache) is dynamic]


def held_layers(caches: list[Any]) -> list[Any]:
    """Returns the layers of `caches` that hold keys."""
    if not caches:  # without transformers imported there are none
        return []
    utils: Any = sys.modules["transformers.cache_utils"]
    kinds = (utils.DynamicLayer, utils.DynamicSlidingWindowLayer)
    return [
        layer for cache in caches for layer in cache.layers if type(layer) in kinds and layer.is_initialized
    ]


def is_one_token(values: tuple[Any, ...]) -> bool:
    """Returns whether a `DynamicCache` among `values` holds one token, as after a prompt of one token."""
    return holds_one_token(dynamic_caches(values))


def holds_one_token(caches: list[Any]) -> bool:
    layer = caches[0].layers[0] if caches and caches[0].layers else None
    return layer is not None and layer.is_initialized and layer.get_seq_length() == 1


class Handed(enum.Enum):
    """What a call hands over of a `DynamicCache`, as `mark_kv_growing` finds it."""

    NONE = "no cache"
    EMPTY = "a cache that holds nothing yet, a prompt's"
    ONE = "a cache that holds one token"
    MARKED = "a cache whose length is now marked dynamic"


def mark_kv_growing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Handed:
    """Marks as dynamic the length of the keys and values of a `DynamicCache` that the call hands over.

    The keys grow by one token per call; marked, the first token's frame serves every later token, one
    compile fewer (docs/form-torch-versions.md#torch-versions). A tensor whose last size is one longer, the
    attention mask, is marked too. A cache that holds one token is left unmarked: Dynamo specializes a
    size of 1, so no later call could use a frame compiled for it (docs/form-caches.md)."""
    caches = dynamic_caches((*args, *kwargs.values()))
    if not caches:
        return Handed.NONE
    held = held_layers(caches)
    if not held:
        return Handed.EMPTY
    if holds_one_token(caches):
        return Handed.ONE
    for tensor, dim in growing_sizes(held, (*args, *kwargs.values())):
        mark_dynamic(tensor, dim)
    return Handed.MARKED


def growing_sizes(held: list[Any], values: tuple[Any, ...]) -> list[tuple[torch.Tensor, int]]:
    """Returns the sizes that grow by a token a call: each of the `held` layers' keys and values at its
    length, and each of `values` whose last size is one longer (the attention mask)."""
    sizes, lengths = [], set()
    for tensor in (t for layer in held for t in (layer.keys, layer.values)):
        if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2:
            sizes.append((tensor, tensor.dim() - 2))
            lengths.add(tensor.shape[-2] + 1)
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[-1] in lengths:
            sizes.append((value, value.dim() - 1))
    return sizes


def take_kv_marks(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], None] | None:
    """Takes off the marks that `mark_kv_growing` set on the call's tensors, and returns what puts them back,
    or None where it took none off.

    A frame that torch saved and loaded guards that its inputs carry none (torch's saved guard state keeps no
    marks), while a frame compiled with them takes a call without them, so only a compile needs them."""
    values = (*args, *kwargs.values())
    held = held_layers(dynamic_caches(values))
    taken = [
        (tensor, mark) for tensor, dim in growing_sizes(held, values) if (mark := take_mark(tensor, dim))
    ]
    if not taken:
        return None

    def put_back() -> None:
        for tensor, mark in taken:
            put_mark(tensor, mark)

    return put_back


def kv_init(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Sets what a layer's `lazy_initialization` sets, except the empty tensors that the store never uses.

    Dynamo would otherwise trace those tensors for every layer of a prompt's call (docs/form-caches.md)."""
    layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
    if layer.is_sliding:
        layer._sliding_window_tensor = layer._sliding_window_tensor.to(keys.device)


def kv_lazy(layer: Any, keys: torch.Tensor, values: torch.Tensor) -> None:
    layer.lazy_initialization(keys, values)


def kv_store(layer: Any, keys: torch.Tensor, values: torch.Tensor, before: int, init: Init) -> None:
    """Stores in `layer` what its `update` would store, given the keys and values that the region returned.

    `init` sets the layer up on its first update."""
    if not layer.is_initialized:
        init(layer, keys, values)
    if layer.is_sliding:  # it keeps only the last `sliding_window - 1` tokens
        layer.cumulative_length += keys.shape[-2] - before
        kept = slice(-layer.sliding_window + 1, None)
        keys, values = keys[:, :, kept, :], values[:, :, kept, :]
    layer.keys, layer.values = keys, values


def check_kv() -> Init | None:
    """Checks once that transformers' cache layers update as `LayerKV` and `kv_store` assume.

    It returns the function that sets a layer up (`kv_init`, else `kv_lazy`), or None where neither fits,
    and checks the `EncoderDecoderCache` stand-ins too."""
    init = next((init for init in (kv_init, kv_lazy) if is_kv_same(init)), None)
    if init is not None:
        process.encoder_decoder = check_encoder_decoder()
    return init


def check_encoder_decoder() -> type | None:
    """Returns the class of the stand-ins for an `EncoderDecoderCache`, or None where the cache differs.

    It checks once, eagerly, that the cache keeps a dict of flags and reads its length as the stand-ins do."""
    utils: Any = sys.modules.get("transformers.cache_utils")
    try:
        cls = make_encoder_decoder_kv(utils)
        real = utils.EncoderDecoderCache(utils.DynamicCache(), utils.DynamicCache())
        real.self_attention_cache.update(*torch.zeros(2, 1, 1, 3, 2).unbind(), 0)
        own = LayerKV(None, None)
        own.update(*torch.zeros(2, 1, 1, 3, 2).unbind())
        mine = cls(own, LayerKV(None, None), None)
        alike = type(real.is_updated) is dict and real.get_seq_length(0) == mine.get_seq_length(0) == 3
    except Exception:  # a transformers whose cache differs
        return None
    return cls if alike else None


def is_kv_same(init: Init) -> bool:
    """Returns whether the stand-in and the store, with `init`, match transformers' own cache `update`.

    They must leave the layer as it does and return what it returns."""
    utils: Any = sys.modules.get("transformers.cache_utils")
    try:
        for make in (utils.DynamicLayer, lambda: utils.DynamicSlidingWindowLayer(sliding_window=3)):
            real, mine = make(), make()
            for step in (3, 1, 1):  # a prompt, then tokens past the sliding window
                new = torch.rand(2, 1, 1, step, 2, generator=torch.Generator().manual_seed(step)).unbind()
                past = kv_past(mine)
                returned = LayerKV(*past).update(*new)
                kv_store(mine, *returned, kv_length(past), init)
                if not is_alike((*real.update(*new), vars(real)), (*returned, vars(mine))):
                    return False
                if real.get_seq_length() != mine.get_seq_length():
                    return False
    except Exception:  # no transformers, or one whose cache differs
        return False
    return True


def is_alike(a: Any, b: Any) -> bool:
    """Compares `a` and `b` through tuples and dicts, and tensors by value, dtype, device and shape."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape) and torch.equal(a, b)
    if isinstance(a, (tuple, dict)) and type(a) is type(b) and len(a) == len(b):
        if isinstance(a, dict):  # and so is `b`, of `a`'s type
            return a.keys() == b.keys() and all(is_alike(a[k], b[k]) for k in a)  # type: ignore[union-attr]
        return all(is_alike(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def is_kv_empty(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Returns whether the call hands over a `DynamicCache` whose layers hold nothing yet (a prompt's)."""
    utils: Any = sys.modules.get("transformers.cache_utils")
    dynamic = getattr(utils, "DynamicCache", None)
    return dynamic is not None and any(
        type(value) is dynamic and not any(layer.is_initialized for layer in value.layers)
        for value in (*args, *kwargs.values())
    )
