"""Wraps a function as a nested compile region, with flat arguments and packed, unaliased outputs.

It also names the structures of blocks, which their regions take so that no region is reused for a block
of another structure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from .internals.hooks import base
from .internals.tracer import has_region_reuse, tree_leaves, tree_map_only
from .state import process


def nested_region(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Returns `fn` as a nested compile region that keeps a variant for each of up to 1024 blocks."""
    # torch's default of 8 would fail the ninth block that reads its own integer; torch 2.11 takes no limit.
    limit: dict[str, Any] = {"max_reuse_entries": 1024} if has_region_reuse() else {}
    return torch.compiler.nested_compile_region(fn, **limit)  # type: ignore[no-any-return]  # untyped in torch


def nested(fn: Callable[..., Any], label: str, extras: int = 0) -> Callable[..., Any]:
    """Returns a call of `fn` as a nested compile region whose arguments are passed flat.

    Keyword arguments and tuples become positional arguments, since Dynamo's check that a traced region
    serves another block is cheap only for tensors and plain values (docs/form-caches.md). `fn` returns a
    block's output after `extras` tensors; the region returns them packed (`pack`) and unaliased
    (`copy_aliased`), and the call unpacks them. The regions' code is named `label`, so that regions of other
    blocks are never candidates for reuse."""

    def as_given(self: nn.Module, structure: str, *args: Any, **kwargs: Any) -> Any:
        inputs = tree_leaves((args, kwargs))
        return pack(copy_aliased(inputs, fn(self, *args, **kwargs)), extras)

    as_given.__code__ = as_given.__code__.replace(co_name=f"{label}_as_given")
    general = nested_region(as_given)

    def flat(self: nn.Module, structure: str, spec: str, *leaves: Any) -> Any:
        args: list[Any]
        kwargs: dict[str, Any]
        args, kwargs, at = [], {}, 0
        for item in spec.split(",") if spec else ():
            name, _, count = item.partition(":")
            value = tuple(leaves[at : at + int(count)]) if count else leaves[at]
            at += int(count) if count else 1
            if name == "*":
                args.append(value)
            else:
                kwargs[name] = value
        return pack(copy_aliased(leaves, fn(self, *args, **kwargs)), extras)

    flat.__code__ = flat.__code__.replace(co_name=label)
    flat_region = nested_region(flat)

    # Dynamo traces this for every block, so it is kept to a few instructions per argument.
    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        structure = self.__dict__.get("_regionalize_structure")
        if structure is None:  # a block that no owner set up: its classes are traced
            structure = ",".join(f"{type(m).__module__}.{type(m).__qualname__}" for m in self.modules())
        leaves, spec, marks = [*args], ["*"] * len(args), 2 * len(args) - 1
        for name, value in kwargs.items():
            if type(value) is tuple:  # not a namedtuple, which `flat` would not rebuild
                spec.append(f"{name}:{len(value)}")
                leaves += value
                marks += 2
            else:
                spec.append(name)
                leaves.append(value)
                marks += 1
        text = ",".join(spec)
        if text.count(",") + text.count(":") + text.count("*") != marks:  # a keyword `spec` cannot hold
            return unpack(general(self, structure, *args, **kwargs), extras)
        return unpack(flat_region(self, structure, text, *leaves), extras)

    return call


def contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    """Returns a contiguous copy of `tensor` (docs/design.md#contiguous-copies-of-region-outputs)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def copy_aliased(inputs: Sequence[Any], value: Any) -> Any:
    """Copies each tensor of a region's output `value` that shares memory with an input or another output.

    Dynamo compiles no region whose outputs alias (docs/form-hierarchical.md). A copied input keeps its
    strides, so that the next block is not traced again for other strides; the other copies are
    contiguous."""

    given = [base(t) for t in inputs if isinstance(t, torch.Tensor)]
    made = [base(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor)]

    def own(tensor):  # type: ignore[no-untyped-def]  # made as Dynamo traces: annotations cost a dict
        root = base(tensor)
        if any(tensor is other for other in inputs):  # an input handed on keeps its strides
            return tensor.clone()
        if any(root is other for other in given) or sum(root is other for other in made) > 1:
            return contiguous_copy(tensor)
        return tensor

    return tree_map_only(torch.Tensor, own, value)


def name_structures(blocks: Iterable[nn.Module]) -> bool:
    """Names the structure (its modules' classes) of each of `blocks`; returns whether a name changed.

    Regions take the name as an argument, so a region is never reused for a block whose submodules are of
    other classes, which some torch versions would do (docs/form-hierarchical.md). The names are made
    eagerly, because tracing `modules()` for every block is slow."""
    changed = False
    for block in blocks:
        structures = process.structures
        name = structures.setdefault(tuple(type(m) for m in block.modules()), f"structure {len(structures)}")
        changed |= block.__dict__.get("_regionalize_structure") != name
        block.__dict__["_regionalize_structure"] = name
    return changed


def pack(value: Any, extras: int) -> Any:
    """Returns what a region returns for `value`, a block's output after `extras` tensors.

    Dynamo reuses only regions that return tensors, so a tensor or a sequence of tensors is returned as it
    is, and any other output after a marker: an empty tensor whose static shape says how to rebuild it
    (docs/form-hierarchical.md). An output that could be taken for a marker always gets one."""
    front, out = (value[:extras], value[extras]) if extras else ((), value)
    if isinstance(out, torch.Tensor) and not is_marker(out):
        return (*front, out) if extras else out
    sequence = type(out) in (tuple, list)
    tensors = sequence and all(isinstance(t, torch.Tensor) for t in out)
    if tensors and not extras and not (out and is_marker(out[0])):
        return out
    items = out if sequence else (out,)
    if all(t is None or isinstance(t, torch.Tensor) for t in items):
        kind, parts = (1 if type(out) is tuple else 2) if sequence else 0, [t for t in items if t is not None]
        codes = [1 if t is not None else 2 for t in items]
    else:  # an object, for which Dynamo traces the region again for each block
        kind, codes, parts = 3, [], [out]
    device = next((t.device for t in (*front, *parts) if isinstance(t, torch.Tensor)), "cpu")
    marker = torch.empty((0, 82, kind, *codes), dtype=torch.uint8, device=device)
    return (*front, marker, *parts)


def unpack(result: Any, extras: int) -> Any:
    """Returns the block's output, after `extras` tensors, that `pack` returned as `result`."""
    if extras:
        front, rest = result[:extras], result[extras:]
        if not is_marker(rest[0]):
            return (*front, rest[0])
    elif type(result) in (tuple, list) and result and is_marker(result[0]):
        front, rest = (), result
    else:
        return result
    kind, codes, parts = rest[0].shape[2], rest[0].shape[3:], list(rest[1:])
    if kind == 3:
        out = parts[0]
    else:
        items = [parts.pop(0) if code == 1 else None for code in codes]
        out = items[0] if kind == 0 else tuple(items) if kind == 1 else items
    return (*front, out) if extras else out


def is_marker(tensor: object) -> bool:
    """Returns whether `tensor` is a marker of `pack`: an empty uint8 tensor whose shape starts (0, 82)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() < 3:
        return False
    return tensor.shape[0] == 0 and tensor.shape[1] == 82
