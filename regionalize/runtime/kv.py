"""The stand-ins for a block's layer of a transformers `DynamicCache` or `EncoderDecoderCache`, and the
caches written outside the region."""

import sys

import torch

from .internals.tracer import mark_dynamic
from .nested import contiguous_copy
from .state import process


class LayerKV:
    """One layer's keys and values inside a region, standing in for the cache the block updates: `update`
    returns what transformers' `DynamicLayer.update` returns, the states before and the new ones joined."""

    def __init__(self, keys, values):
        self.keys, self.values, self.updates = keys, values, 0

    def update(self, key_states, value_states, *args, **kwargs):
        self.updates += 1
        if self.keys is None:
            # Kept as copies: the region returns them, and a region's outputs must not alias each other
            # or its inputs (GPT-2's keys and values are views of one projection). Contiguous, as
            # transformers' own update leaves them (joined to an empty tensor) and as every later token's
            # are: the first token's frame then takes the next ones' layout (`kv_growing`).
            self.keys, self.values = contiguous_copy(key_states), contiguous_copy(value_states)
            return key_states, value_states
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values


class Updated:
    """An encoder-decoder cache's `is_updated` flags for one layer, as a block sees them on the call that
    writes its cross-attention keys: read, whatever the key, as the cache's own flag for the layer reads;
    what the block sets is kept, and checked against what it wrote."""

    def __init__(self, written):
        self.written, self.set = written, []

    def get(self, key, default=None):
        return default if self.written is None else self.written

    def __getitem__(self, key):
        if self.written is None:
            raise KeyError(key)
        return self.written

    def __setitem__(self, key, value):
        self.set.append(value)


def encoder_decoder_made(utils):
    """The class of the stand-ins for a block's layer of a transformers `EncoderDecoderCache`
    (`utils.EncoderDecoderCache`'s subclass), each holding stand-ins for its self- and cross-attention
    layers; an instance of that class, as blocks ask (`isinstance`). What it inherits reaches its caches
    through those stand-ins, which have nothing else, so it fails closed (`cross_attention_cache.layers[i]`,
    which a block reads once the keys are written, among them). Made once, `process.encoder_decoder`."""

    class EncoderDecoderKV(utils.EncoderDecoderCache):
        def __init__(self, own, cross, written):
            self.self_attention_cache, self.cross_attention_cache = own, cross
            self.is_updated = Updated(written)

        def get_seq_length(self, layer_idx=0):
            keys = self.self_attention_cache.keys
            return 0 if keys is None or keys.numel() == 0 else keys.shape[-2]

    return EncoderDecoderKV


def layer_idx(block, attribute):
    """The one value of `attribute` (the index the cache update takes) in the modules of `block`, or None."""
    found = {getattr(m, attribute) for m in block.modules() if isinstance(getattr(m, attribute, None), int)}
    return found.pop() if len(found) == 1 else None


def kv_layer(cache, index):
    """The layer of a transformers `DynamicCache` that a region can stand in for, else None."""
    utils = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "DynamicCache", None) or cache.offloading:
        return None
    if len(cache.layers) <= index and cache.layer_class_to_replicate is not utils.DynamicLayer:
        return None
    while len(cache.layers) <= index:  # what `Cache.update` does first
        cache.layers.append(utils.DynamicLayer())
    layer = cache.layers[index]
    sliding = type(layer) is utils.DynamicSlidingWindowLayer and not layer.record_past
    return layer if type(layer) is utils.DynamicLayer or sliding else None


def kv_pair(cache, index):
    """The self- and cross-attention layers of a transformers `EncoderDecoderCache` of two `DynamicCache`s
    that a region can stand in for, else None."""
    utils = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "EncoderDecoderCache", None):
        return None
    if process.encoder_decoder is None or type(cache.is_updated) is not dict:
        return None
    own = kv_layer(cache.self_attention_cache, index)
    cross = kv_layer(cache.cross_attention_cache, index)
    return None if own is None or cross is None else (own, cross)


def kv_past(layer):
    """A cache layer's keys and values, as a region takes them: None before its first update."""
    return (layer.keys, layer.values) if layer.is_initialized else (None, None)


def kv_length(past):
    return 0 if past[0] is None else past[0].shape[-2]


def kv_growing(args, kwargs):
    """Mark the length of the keys and values of a transformers `DynamicCache` among a call's arguments (an
    `EncoderDecoderCache`'s own) dynamic where its layers hold them: they grow by a token a call. Dynamo
    would compile the first token's frame for its length, and the next token's again with the length
    symbolic; marked, the first token's is the one every token shares, one compile fewer in a first
    `generate` (a hint: Dynamo still specializes a length the code needs). So is the last size of a tensor
    argument one longer than such keys: the attention mask, whose length transformers 5.17 specialized
    (the owner traced twice, docs/results/serving). None where no such cache is handed; False where it holds
    nothing yet (the prompt)."""
    utils = sys.modules.get("transformers.cache_utils")  # None without transformers: no cache is found
    found, lengths = None, set()
    for value in (*args, *kwargs.values()):
        if type(value) is getattr(utils, "EncoderDecoderCache", None):
            value = value.self_attention_cache
        if type(value) is not getattr(utils, "DynamicCache", None):
            continue
        found = bool(found)
        for layer in value.layers:
            if type(layer) in (utils.DynamicLayer, utils.DynamicSlidingWindowLayer) and layer.is_initialized:
                for tensor in (layer.keys, layer.values):
                    if isinstance(tensor, torch.Tensor) and tensor.dim() >= 2:
                        mark_dynamic(tensor, tensor.dim() - 2)
                        lengths.add(tensor.shape[-2] + 1)
                        found = True
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() and value.shape[-1] in lengths:
            mark_dynamic(value, value.dim() - 1)
    return found


def kv_init(layer, keys, values):
    """What a layer's `lazy_initialization` sets, less the empty tensors that its `update` joins the first
    keys to and the store does not: tracing those was much of what a prefill traced outside its
    regions."""
    layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
    if layer.is_sliding:
        layer._sliding_window_tensor = layer._sliding_window_tensor.to(keys.device)


def kv_lazy(layer, keys, values):
    layer.lazy_initialization(keys, values)


def kv_store(layer, keys, values, before, init):
    """Store in `layer` what its `update` would have, given the keys and values it returned; `init` sets up
    a layer on its first update."""
    if not layer.is_initialized:
        init(layer, keys, values)
    if layer.is_sliding:  # only the last `sliding_window - 1` tokens are kept
        layer.cumulative_length += keys.shape[-2] - before
        kept = slice(-layer.sliding_window + 1, None)
        keys, values = keys[:, :, kept, :], values[:, :, kept, :]
    layer.keys, layer.values = keys, values


def kv_holds():
    """Do this process's transformers cache layers update as `LayerKV` and `kv_store`
    assume? Checked once, eagerly, on small tensors: caches of a transformers that changed are not stood in
    for (False), and their blocks are traced layer by layer. Otherwise, how the store sets up a layer on its
    first update: as `kv_init` does, where that leaves every attribute of a layer as
    transformers' own update does, else through the layer's `lazy_initialization`."""
    init = next((init for init in (kv_init, kv_lazy) if kv_same(init)), False)
    if init:
        process.encoder_decoder = encoder_decoder_checked()
    return init


def encoder_decoder_checked():
    """The class of the stand-ins for an `EncoderDecoderCache`, where transformers' holds what they assume (a
    dict of flags, and the length of its self-attention cache as its own), else None. Checked once,
    eagerly, as `kv_same` is."""
    utils = sys.modules.get("transformers.cache_utils")
    try:
        cls = encoder_decoder_made(utils)
        real = utils.EncoderDecoderCache(utils.DynamicCache(), utils.DynamicCache())
        real.self_attention_cache.update(*torch.zeros(2, 1, 1, 3, 2).unbind(), 0)
        own = LayerKV(None, None)
        own.update(*torch.zeros(2, 1, 1, 3, 2).unbind())
        mine = cls(own, LayerKV(None, None), None)
        alike = type(real.is_updated) is dict and real.get_seq_length(0) == mine.get_seq_length(0) == 3
    except Exception:  # another transformers
        return None
    return cls if alike else None


def kv_same(init):
    """Do the stand-in and the store, setting up a layer with `init`, leave transformers' cache layers as
    their own `update` does, and return what it returns?"""
    utils = sys.modules.get("transformers.cache_utils")
    try:
        for make in (utils.DynamicLayer, lambda: utils.DynamicSlidingWindowLayer(sliding_window=3)):
            real, mine = make(), make()
            for step in (3, 1, 1):  # a prompt, then tokens past the window
                new = torch.rand(2, 1, 1, step, 2, generator=torch.Generator().manual_seed(step)).unbind()
                past = kv_past(mine)
                returned = LayerKV(*past).update(*new)
                kv_store(mine, *returned, kv_length(past), init)
                if not kv_alike((*real.update(*new), vars(real)), (*returned, vars(mine))):
                    return False
                if real.get_seq_length() != mine.get_seq_length():
                    return False
    except Exception:  # no transformers, or another one
        return False
    return True


def kv_alike(a, b):
    """Are `a` and `b` equal, tensors compared by value, dtype and device, through tuples and dicts?"""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and (a.dtype, a.device, a.shape) == (b.dtype, b.device, b.shape) and torch.equal(a, b)
    if isinstance(a, (tuple, dict)) and type(a) is type(b) and len(a) == len(b):
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(kv_alike(a[k], b[k]) for k in a)
        return all(kv_alike(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def kv_empty(args, kwargs):
    """Does the call hand a transformers `DynamicCache` whose layers hold nothing yet (a prompt's)?"""
    utils = sys.modules.get("transformers.cache_utils")
    dynamic = getattr(utils, "DynamicCache", None)
    return dynamic is not None and any(
        type(value) is dynamic and not any(layer.is_initialized for layer in value.layers)
        for value in (*args, *kwargs.values())
    )
