"""The stand-in for one layer of a transformers `DynamicCache`, and the cache written outside the region."""

import sys

import torch

_regionalize_kv = [None]  # do transformers' cache layers update as the cache-updating regions assume


class _RegionalizeLayerKV:
    """One layer's keys and values inside a region, standing in for the cache the block updates: `update`
    returns what transformers' `DynamicLayer.update` returns, the states before and the new ones joined."""

    def __init__(self, keys, values):
        self.keys, self.values, self.updates = keys, values, 0

    def update(self, key_states, value_states, *args, **kwargs):
        self.updates += 1
        if self.keys is None:
            # Kept as copies: the region returns them, and a region's outputs must not alias each other
            # or its inputs (GPT-2's keys and values are views of one projection).
            self.keys, self.values = key_states.clone(), value_states.clone()
            return key_states, value_states
        key_states = torch.cat([self.keys, key_states], dim=-2)
        value_states = torch.cat([self.values, value_states], dim=-2)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


def _regionalize_layer_idx(block, attribute):
    """The one value of `attribute` (the index the cache update takes) in the modules of `block`, or None."""
    found = {getattr(m, attribute) for m in block.modules() if isinstance(getattr(m, attribute, None), int)}
    return found.pop() if len(found) == 1 else None


def _regionalize_kv_layer(cache, index):
    """The layer of a transformers `DynamicCache` that a region can stand in for, else None."""
    utils = sys.modules.get("transformers.cache_utils")
    if utils is None or type(cache) is not getattr(utils, "DynamicCache", None) or cache.offloading:
        return None
    if len(cache.layers) <= index:
        if cache.layer_class_to_replicate is not utils.DynamicLayer:
            return None
        while len(cache.layers) <= index:  # what `Cache.update` does first
            cache.layers.append(utils.DynamicLayer())
    layer = cache.layers[index]
    sliding = type(layer) is utils.DynamicSlidingWindowLayer and not layer.record_past
    return layer if type(layer) is utils.DynamicLayer or sliding else None


def _regionalize_kv_store(layer, keys, values, before):
    """Store in `layer` what its `update` would have, given the keys and values it returned."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    if layer.is_sliding:  # only the last `sliding_window - 1` tokens are kept
        layer.cumulative_length += keys.shape[-2] - before
        kept = slice(-layer.sliding_window + 1, None)
        keys, values = keys[:, :, kept, :], values[:, :, kept, :]
    layer.keys, layer.values = keys, values


def _regionalize_kv_holds():
    """Do this process's transformers cache layers update as `_RegionalizeLayerKV` and `_regionalize_kv_store`
    assume? Checked once, eagerly, on small tensors: caches of a transformers that changed are not stood in
    for, and their blocks are traced layer by layer."""
    utils = sys.modules.get("transformers.cache_utils")
    try:
        for make in (utils.DynamicLayer, lambda: utils.DynamicSlidingWindowLayer(sliding_window=3)):
            real, mine = make(), make()
            for step in (3, 1, 1):  # a prompt, then tokens past the window
                new = torch.rand(2, 1, 1, step, 2, generator=torch.Generator().manual_seed(step)).unbind()
                past = (mine.keys, mine.values) if mine.is_initialized else (None, None)
                returned = _RegionalizeLayerKV(*past).update(*new)
                _regionalize_kv_store(mine, *returned, 0 if past[0] is None else past[0].shape[-2])
                expected = (*real.update(*new), real.keys, real.values)
                got = (*returned, mine.keys, mine.values)
                if not all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)):
                    return False
                if real.get_seq_length() != mine.get_seq_length():
                    return False
    except Exception:  # no transformers, or another one
        return False
    return True
