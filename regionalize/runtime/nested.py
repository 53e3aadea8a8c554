"""A function as a nested compile region: its arguments flattened, its outputs packed and unaliased, and
the structures of blocks, which their regions take so that one is never reused for another."""

import torch

from .internals.hooks import base
from .internals.tracer import reuses, tree_leaves, tree_map_only
from .state import process


def nested_region(fn):
    """`fn` as a nested compile region that holds a variant per block where each reads its own integer:
    torch's default of 8 would make the ninth layer an error, and so a fallback. Torch 2.11's function
    takes no limit, and a rewrite that asked for one there failed on its first call: it is asked for only
    where torch takes it."""
    limit = {"max_reuse_entries": 1024} if reuses() else {}
    return torch.compiler.nested_compile_region(fn, **limit)


def nested(fn, label, extras=0):
    """`fn` as a nested compile region, its keyword arguments and tuples passed as positional arguments:
    Dynamo's check that a traced region serves another block is cheap where each argument is a tensor or
    a plain value, and otherwise flattens them with pytree as it traces each block (a second of a 32-layer
    Llama's start). `fn` returns a block's output, after `extras` tensors where it has them; the region
    returns them packed (`pack`) and the call unpacked, a tensor that aliases an input or
    another output copied (`unaliased`). The regions' code is named `label`, so that regions
    of other blocks are not candidates for their reuse."""

    def as_given(self, structure, *args, **kwargs):
        inputs = tree_leaves((args, kwargs))
        return pack(unaliased(inputs, fn(self, *args, **kwargs)), extras)

    as_given.__code__ = as_given.__code__.replace(co_name=f"{label}_as_given")
    general = nested_region(as_given)

    def flat(self, structure, spec, *leaves):
        args, kwargs, at = [], {}, 0
        for item in spec.split(",") if spec else ():
            name, _, count = item.partition(":")
            value = tuple(leaves[at : at + int(count)]) if count else leaves[at]
            at += int(count) if count else 1
            if name == "*":
                args.append(value)
            else:
                kwargs[name] = value
        return pack(unaliased(leaves, fn(self, *args, **kwargs)), extras)

    flat.__code__ = flat.__code__.replace(co_name=label)
    flat_region = nested_region(flat)

    # Traced for every block: kept to a few instructions per argument.
    def call(self, *args, **kwargs):
        structure = self.__dict__.get("_regionalize_structure")
        if structure is None:  # a block no owner set up: its classes, traced
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
        if text.count(",") + text.count(":") + text.count("*") != marks:  # a ** name `spec` cannot hold
            return unpack(general(self, structure, *args, **kwargs), extras)
        return unpack(flat_region(self, structure, text, *leaves), extras)

    return call


def contiguous_copy(tensor):
    """A contiguous copy: with torch.clone's default (preserve_format) of a slice, Inductor computed other
    values than eager in a region of Flux's single blocks (NaN, measured in torch 2.13)."""
    return tensor.clone(memory_format=torch.contiguous_format)


def unaliased(inputs, value):
    """`value`, a region's output, with a copy of each tensor that shares memory with one of `inputs` or
    with another tensor of `value` (contiguous, but an input handed on keeps its strides); the others as
    they are. Dynamo compiles no region whose outputs alias (T5's layers return the position bias they
    are handed, Flux's single blocks two slices of one tensor), and knows as it traces which tensor is a
    view of which (`_base`), so this costs a copy only where one is needed, and nothing to trace again.
    Both slices are copied, not only the second, and an input handed on keeps its strides: the next
    block, handed other strides than the first, would be traced again. Memory shared other than through
    a view still fails the compile, and the owner's retry then copies every output (`copies` of
    `Region.copies`)."""

    given = [base(t) for t in inputs if isinstance(t, torch.Tensor)]
    made = [base(t) for t in tree_leaves(value) if isinstance(t, torch.Tensor)]

    def own(tensor):
        root = base(tensor)
        if any(tensor is other for other in inputs):  # handed on: the next block takes this one's strides
            return tensor.clone()
        if any(root is other for other in given) or sum(root is other for other in made) > 1:
            return contiguous_copy(tensor)
        return tensor

    return tree_map_only(torch.Tensor, own, value)


def name_structures(blocks):
    """Name the structure of each of `blocks`: the classes of its modules, which its regions take as an
    argument; whether a name changed. Dynamo (torch 2.13) reuses a region traced for one block for
    another whose submodule is of another class, where the first reads nothing of it that the second
    lacks (ModernBERT's first layer has an `nn.Identity` where the others have an `nn.LayerNorm`): the
    others would compute the first one's function. Blocks that differ in it differ in an argument, which
    the reuse check compares. Named eagerly: tracing `modules()` for every block is slow."""
    changed = False
    for block in blocks:
        structures = process.structures
        name = structures.setdefault(tuple(type(m) for m in block.modules()), f"structure {len(structures)}")
        changed |= block.__dict__.get("_regionalize_structure") != name
        block.__dict__["_regionalize_structure"] = name
    return changed


def pack(value, extras):
    """What a region returns for `value`, a block's output after `extras` tensors. Dynamo reuses a region
    only if it returns a tensor or a sequence of tensors, so a tensor, or without extras a sequence of
    tensors, is returned as it is (nothing added to a call). Other outputs (a tuple holding None, an
    object) are returned after a marker: a tensor of no elements whose shape says how to rebuild them,
    static where the outputs' are symbolic, so the caller's trace reads it for free. An output that could
    be taken for a marker is always returned after one."""
    front, out = (value[:extras], value[extras]) if extras else ((), value)
    if isinstance(out, torch.Tensor) and not marked(out):
        return (*front, out) if extras else out
    sequence = type(out) in (tuple, list)
    tensors = sequence and all(isinstance(t, torch.Tensor) for t in out)
    if tensors and not extras and not (out and marked(out[0])):
        return out
    items = out if sequence else (out,)
    if all(t is None or isinstance(t, torch.Tensor) for t in items):
        kind, parts = (1 if type(out) is tuple else 2) if sequence else 0, [t for t in items if t is not None]
        codes = [1 if t is not None else 2 for t in items]
    else:  # an object: the region is traced for each block, as Dynamo cannot reuse it
        kind, codes, parts = 3, [], [out]
    device = next((t.device for t in (*front, *parts) if isinstance(t, torch.Tensor)), "cpu")
    marker = torch.empty((0, 82, kind, *codes), dtype=torch.uint8, device=device)
    return (*front, marker, *parts)


def unpack(result, extras):
    """The block's output (after `extras` tensors) that `pack` returned as `result`."""
    if extras:
        front, rest = result[:extras], result[extras:]
        if not marked(rest[0]):
            return (*front, rest[0])
    elif type(result) in (tuple, list) and result and marked(result[0]):
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


def marked(tensor):
    """Is `tensor` a marker of `pack`: no elements, uint8, its shape starting (0, 82)?"""
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() < 3:
        return False
    return tensor.shape[0] == 0 and tensor.shape[1] == 82
