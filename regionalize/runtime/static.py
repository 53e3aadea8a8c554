"""Stands in for a block's layer of a transformers `StaticCache` inside a region.

The region takes the layer's tensors, which transformers' own `update` writes in place, so that one trace
serves every layer (docs/form-caches.md#static-caches)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from .internals.tracer import is_static_marked
from .kv import is_alike
from .state import process

# The tensors that a layer's first update leaves, which the region that sets the layer up returns.
static_made_names = ("keys", "values", "cumulative_length")

T = TypeVar("T")
StandIns = tuple[type, dict[str, type]]  # the cache's stand-in class, and its layers' by class name


def make_static_kv(utils: Any) -> StandIns:
    """Returns the classes of the stand-ins for a `StaticCache` and for each kind of its layers.

    The cache's stand-in subclasses `StaticCache` and holds one layer, so that a block that reads anything
    else of it fails. A layer's stand-in is set up from the state that a region takes."""

    class StaticKV(utils.StaticCache):  # type: ignore[misc]  # found as the runtime runs
        def __init__(self, layer: Any) -> None:
            self.static_layer, self.updates = layer, 0

        def update(
            self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: Any, **kwargs: Any
        ) -> Any:
            self.updates += 1
            return self.static_layer.update(key_states, value_states, *args, **kwargs)

    class StaticLayer(utils.StaticLayer):  # type: ignore[misc]  # found as the runtime runs
        def __init__(self, spec: str, values: tuple[Any, ...]) -> None:
            for item, value in zip(spec.split(","), values, strict=True):
                name, _, kind = item.partition(":")
                if kind == "device":
                    value = torch.device(value)
                elif kind == "dtype":
                    value = getattr(torch, value)
                setattr(self, name, value)

    return StaticKV, {utils.StaticLayer.__qualname__: StaticLayer}


def static_state(layer: Any, names: Iterable[str]) -> tuple[str, tuple[Any, ...]] | None:
    """Returns a layer's attributes `names` as a region takes them: a spec and their values, or None.

    Tensors and plain values are kept as they are and devices and dtypes by name; any other value gives None.
    Attributes are read by name rather than through `vars`, which torch 2.11's Dynamo cannot trace."""
    spec: list[str]
    values: list[Any]
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


def is_static_cache(cache: Any) -> bool:
    """Returns whether `cache` is a `StaticCache` that does not offload, and the stand-ins are checked."""
    utils: Any = sys.modules.get("transformers.cache_utils")  # None without transformers
    return (
        type(cache) is getattr(utils, "StaticCache", None)
        and not cache.offloading
        and process.static_stand_ins is not None
    )


def static_class(layer: Any) -> type | None:
    """Returns the class of the stand-ins for `layer`, or None where a region cannot stand in for it."""
    stand_in = process.static_stand_ins[1].get(type(layer).__qualname__)  # type: ignore[index]  # checked: not None
    return stand_in if stand_in is not None and stand_in.__base__ is type(layer) else None


def static_layer(cache: Any, index: int) -> tuple[Any, tuple[str, tuple[Any, ...]]] | None:
    """Returns the layer of a `StaticCache` that a region can stand in for, with its state, else None."""
    if not is_static_cache(cache) or len(cache.layers) <= index:
        return None
    layer = cache.layers[index]
    stand_in = static_class(layer)
    if stand_in is None:
        return None
    state = static_state(layer, stand_in._regionalize_names[layer.is_initialized])  # type: ignore[attr-defined]
    return None if state is None else (layer, state)


def is_static_handed(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Returns whether the call hands over a `StaticCache` whose every layer a region can stand in for."""
    return any(
        is_static_cache(value) and all(static_class(layer) is not None for layer in value.layers)
        for value in (*args, *kwargs.values())
    )


def is_on_graph_device(tensor: torch.Tensor) -> bool:
    """Returns whether `tensor` is on a CUDA device; a fake tensor reports its device too."""
    return tensor.device.type == "cuda"


def is_static_graphable(cache: Any) -> bool:
    """Returns whether a CUDA graph can take `cache`, a `StaticCache` that the call hands over.

    Every layer must have a stand-in and be set up, with its tensors on the GPU at addresses marked static,
    where a replay writes them as the original does. A layer set up inside a graph would make its tensors
    there, where the next replay overwrites them (transformers PR 48199)."""
    if not is_static_cache(cache):
        return False
    if any(static_class(layer) is None or not layer.is_initialized for layer in cache.layers):
        return False
    tensors = (getattr(layer, name) for layer in cache.layers for name in static_made_names)
    return all(is_on_graph_device(tensor) and is_static_marked(tensor) for tensor in tensors)


def set_up_static_layer(layer: Any, made: Sequence[torch.Tensor]) -> None:
    """Sets `layer` up after its first update ran on a stand-in, and copies in the tensors `made`."""
    layer.lazy_initialization(made[0], made[1])
    for name, value in zip(static_made_names, made, strict=True):
        getattr(layer, name).copy_(value)


def static_run(spec: str, values: tuple[Any, ...], run: Callable[[Any], T]) -> tuple[T, Any]:
    """Returns `run(stand_in)` and the stand-in's layer, for a layer whose state is `spec` and `values`.

    The stand-in's layer updates with transformers' own code, which writes the layer's tensors in place."""
    made: type
    classes: dict[str, type]
    made, classes = process.static_stand_ins  # type: ignore[misc]  # the stand-ins, checked (`check_static`)
    name, _, spec = spec.partition(";")
    stand_in = made(classes[name](spec, values))
    out = run(stand_in)
    if stand_in.updates != 1:
        raise RuntimeError(f"regionalize: a block updated its cache {stand_in.updates} times, not once")
    return out, stand_in.static_layer


def check_static() -> StandIns | None:
    """Returns the stand-ins' classes where they leave a `StaticCache` as its own update does, else None.

    It checks once, eagerly, on small tensors: a prompt sets a layer up, and then tokens write it in place."""
    utils: Any = sys.modules.get("transformers.cache_utils")
    try:
        process.static_stand_ins = made = make_static_kv(utils)
        for made_class in made[1].values():
            base: Any = made_class.__base__
            real, mine = base(max_cache_len=6), base(max_cache_len=6)
            names = {False: tuple(vars(mine))}  # what a layer holds before its first update, and then after
            for step in (3, 1, 1):
                new = torch.rand(2, 1, 2, step, 4, generator=torch.Generator().manual_seed(step)).unbind()
                expected = real.update(*new)
                names.setdefault(True, tuple(vars(real)))
                made_class._regionalize_names = names  # type: ignore[attr-defined]  # the class's own
                fresh = not mine.is_initialized
                state = static_state(mine, names[mine.is_initialized])
                # A state of None raises TypeError here, and the stand-ins are refused.
                returned, stand_in = static_run(*state, lambda c, new=new: c.update(*new, 0))  # type: ignore[misc,call-arg]
                if fresh:
                    set_up_static_layer(mine, [getattr(stand_in, n) for n in static_made_names])
                elif any(getattr(stand_in, n) is not getattr(mine, n) for n in static_made_names):
                    return None
                if not (is_alike(expected, returned) and is_alike(vars(real), vars(mine))):
                    return None
    except Exception:  # no transformers, or one whose cache differs
        return None
    finally:
        process.static_stand_ins = None
    return made
