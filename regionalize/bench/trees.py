"""Trees of values as models take and return them: tensors in tuples, lists, dicts, dataclasses and plain
objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

SCALARS = (bool, int, float, complex, str, bytes, type(None))
_MAX_DEPTH = 32  # outputs are trees; anything deeper is a cycle through some object's attributes


def leaves(obj: Any, path: str = "output", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs of a nested output: tensors, tuples/lists, mappings, dataclasses, plain objects.

    Hugging Face's ModelOutput is both a dataclass and an OrderedDict; as a mapping it yields only the
    fields that are set, which is what its users see.
    """
    if isinstance(obj, (torch.Tensor, *SCALARS)) or depth > _MAX_DEPTH:
        yield path, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            name = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key!r}]"
            yield from leaves(value, name, depth + 1)
    elif isinstance(obj, (tuple, list)):
        for index, value in enumerate(obj):
            yield from leaves(value, f"{path}[{index}]", depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name), f"{path}.{f.name}", depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        # Cache objects and the like: compare their public state.
        for key, value in sorted(vars(obj).items()):
            if not key.startswith("_"):
                yield from leaves(value, f"{path}.{key}", depth + 1)
    else:
        yield path, obj


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Returns `obj` with `fn` applied to each tensor in its tuples, lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(x, fn) for x in obj)
    if isinstance(obj, list):
        return [map_tensors(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def to_device(obj: Any, device: str) -> Any:
    """Returns `obj` with each tensor moved to `device`."""
    return map_tensors(obj, lambda tensor: tensor.to(device))


def clone_inputs(obj: Any) -> Any:
    """Fresh copies for every call, so a model that writes into its inputs cannot skew the next one."""
    return map_tensors(obj, lambda tensor: tensor.detach().clone())
