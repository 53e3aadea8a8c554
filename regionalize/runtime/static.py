"""The stand-in for a block's layer of a transformers `StaticCache`: the layer's tensors handed to the region,
which transformers' own `update` writes in place, so one trace serves every layer."""

import sys

import torch

from .internals.tracer import static_marked
from .kv import kv_alike
from .state import process

# What a layer's first update leaves as tensors: the region that sets the layer up returns them.
static_made_names = ("keys", "values", "cumulative_length")


def static_made(utils):
    """The classes of the stand-ins: for the cache, a `StaticCache` (as blocks ask, `isinstance`) whose
    `update` reaches its one layer and which has nothing else, so that a block reading anything more of it
    fails closed; for a layer, a subclass of its class set up from the state a region takes, whose update
    is transformers' own."""

    class StaticKV(utils.StaticCache):
        def __init__(self, layer):
            self.static_layer, self.updates = layer, 0

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.updates += 1
            return self.static_layer.update(key_states, value_states, *args, **kwargs)

    class StaticLayer(utils.StaticLayer):
        def __init__(self, spec, values):
            for item, value in zip(spec.split(","), values, strict=True):
                name, _, kind = item.partition(":")
                if kind == "device":
                    value = torch.device(value)
                elif kind == "dtype":
                    value = getattr(torch, value)
                setattr(self, name, value)

    return StaticKV, {utils.StaticLayer.__qualname__: StaticLayer}


def static_state(layer, names):
    """A layer's attributes `names` as a region takes them: a spec naming its class and them, and their
    values, tensors and plain values as they are, devices and dtypes by name. None where one is of another
    kind. Read by name, not through `vars`, which torch 2.11's Dynamo cannot trace in the owner's frame:
    an attribute a layer holds beyond those its class's layers hold (`names`) is not stood in for, and a
    block whose update reads it fails while it is traced."""
    spec, values = [], []
    for name in names:
        value = getattr(layer, name)
        if isinstance(value, torch.device):
            spec.append(f"{name}:device")
            value = str(value)
        elif isinstance(value, torch.dtype):
            spec.append(f"{name}:dtype")
            value = str(value).removeprefix("torch.")
        elif value is None or isinstance(value, (torch.Tensor, int, float, bool, str)):
            spec.append(name)
        else:
            return None
        values.append(value)
    return ";".join((type(layer).__qualname__, ",".join(spec))), tuple(values)


def static_cache(cache):
    """Is `cache` a transformers `StaticCache`, not offloading, in a process whose stand-ins are checked?"""
    utils = sys.modules.get("transformers.cache_utils")  # None without transformers: no StaticCache
    return (
        type(cache) is getattr(utils, "StaticCache", None) and not cache.offloading and bool(process.static)
    )


def static_class(layer):
    """The class of the stand-ins for `layer`, where a region can stand in for a layer of its class."""
    stand_in = process.static[1].get(type(layer).__qualname__)
    return stand_in if stand_in is not None and stand_in.__base__ is type(layer) else None


def static_layer(cache, index):
    """The layer of a transformers `StaticCache` that a region can stand in for, and its state, else None."""
    if not static_cache(cache) or len(cache.layers) <= index:
        return None
    layer = cache.layers[index]
    stand_in = static_class(layer)
    if stand_in is None:
        return None
    state = static_state(layer, stand_in._regionalize_names[layer.is_initialized])
    return None if state is None else (layer, state)


def static_handed(args, kwargs):
    """Does the call hand a transformers `StaticCache` whose every layer a region can stand in for?"""
    return any(
        static_cache(value) and all(static_class(layer) is not None for layer in value.layers)
        for value in (*args, *kwargs.values())
    )


def on_graph_device(tensor):
    """Is `tensor` where CUDA graphs run: what a static cache's layers and a capture in pieces ask of their
    tensors. Read from its device, which a fake tensor reports too, as Dynamo traces. (The owner routes a
    call by its arguments' `is_cuda`, `graphable`.)"""
    return tensor.device.type == "cuda"


def static_graphable(cache):
    """Can a CUDA graph take `cache`, a call's argument: a transformers `StaticCache` whose layers a region
    stands in for, every one set up, its tensors on the GPU at addresses marked static
    (Dynamo's `mark_static_address`, as transformers' own `lazy_initialization` marks them outside a
    compile). A graph replays the writes into those same tensors, as the original writes them. A layer
    not set up yet (the prompt, where `generate` made the cache) would make its tensors inside the graph,
    where the next replay overwrites them (transformers PR 48199): such a call is not graphed."""
    if not static_cache(cache):
        return False
    if any(static_class(layer) is None or not layer.is_initialized for layer in cache.layers):
        return False
    tensors = (getattr(layer, name) for layer in cache.layers for name in static_made_names)
    return all(on_graph_device(tensor) and static_marked(tensor) for tensor in tensors)


def set_up_static_layer(layer, made):
    """Set up `layer` on its first update, which a region ran on a stand-in: transformers' own
    `lazy_initialization`, then the tensors the stand-in's update left (`made`) copied in."""
    layer.lazy_initialization(made[0], made[1])
    for name, value in zip(static_made_names, made, strict=True):
        getattr(layer, name).copy_(value)


def static_run(spec, values, run):
    """`run(stand_in)`, a stand-in for the cache of a layer whose state is `spec` and `values`, as a region
    runs it: the layer's tensors written in place by transformers' own update; and that stand-in's layer."""
    made, classes = process.static
    name, _, spec = spec.partition(";")
    stand_in = made(classes[name](spec, values))
    out = run(stand_in)
    if stand_in.updates != 1:
        raise RuntimeError(f"regionalize: a block updated its cache {stand_in.updates} times, not once")
    return out, stand_in.static_layer


def static_checked():
    """The stand-ins' classes, where they leave transformers' `StaticCache` as its own update does, else
    False. Checked once, eagerly, on small tensors: a prompt, then tokens, through a region's two ways
    (setting a layer up, then writing it in place)."""
    utils = sys.modules.get("transformers.cache_utils")
    try:
        process.static = made = static_made(utils)
        for made_class in made[1].values():
            base = made_class.__base__
            real, mine = base(max_cache_len=6), base(max_cache_len=6)
            names = {False: tuple(vars(mine))}  # what a layer holds before its first update, and after
            for step in (3, 1, 1):
                new = torch.rand(2, 1, 2, step, 4, generator=torch.Generator().manual_seed(step)).unbind()
                expected = real.update(*new)
                names.setdefault(True, tuple(vars(real)))
                made_class._regionalize_names = names
                fresh = not mine.is_initialized
                state = static_state(mine, names[mine.is_initialized])
                returned, stand_in = static_run(*state, lambda c, new=new: c.update(*new, 0))
                if fresh:
                    set_up_static_layer(mine, [getattr(stand_in, n) for n in static_made_names])
                elif any(getattr(stand_in, n) is not getattr(mine, n) for n in static_made_names):
                    return False
                if not (kv_alike(expected, returned) and kv_alike(vars(real), vars(mine))):
                    return False
    except Exception:  # no transformers, or another one
        return False
    finally:
        process.static = None
    return made
