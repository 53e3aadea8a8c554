"""Defines the public API: what rewritten models call, and `compile_regions` for a built model.

It needs torch alone, so running a rewritten model imports neither libcst nor click. The names are stable:
a release keeps serving the calls that earlier releases wrote, while what the calls do inside may change
(docs/api.md#stability).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from torch import nn

from .bypass import dispatch as compile_direct
from .bypass import guard_filter
from .describe import describe
from .fixes import eager, symbolic_ints
from .kv import layer_idx
from .owner import register_block
from .stand_in import kv_name

__all__ = [
    "compile_direct",
    "compile_region",
    "compile_regions",
    "describe",
    "eager",
    "guard_filter",
    "symbolic_ints",
]

# The codemod's fixes call these public names: `eager` keeps a per-block integer out of the compiled
# region, `symbolic_ints` traces a forward with its modules' integer attributes symbolic, `guard_filter`
# drops guards on the structure of modules, and `compile_direct` calls a block's compiled code without
# its guards (docs/api.md#what-rewrites-call).

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_LAYER_INDEX = "layer_idx"  # the attribute transformers' attention layers index their cache with


def compile_region(
    *blocks: nn.Module,
    owner: nn.Module,
    nested: bool = True,
    cache_index: str | None = None,
    guard_bypass: str | None = None,
    saved: bool | None = None,
    **compile_kwargs: Any,
) -> None:
    """Makes each of `blocks` a nested compile region of `owner`, which is compiled whole at its first call.

    The blocks stay in place (`state_dict` keys, `isinstance` and indexing do not change), and a block that
    owns blocks of its own (a stage) hands them to `owner` instead (`outer.py`). `cache_index` names the
    integer attribute that a block's cache update takes, so that the runtime stands in for the block's cache
    layer; `nested=False` compiles the owner without regions. `guard_bypass` is "filter" or "depyf"
    (docs/form-guard-bypass.md); `saved` turns saved owners on or off, and None reads
    `REGIONALIZE_SAVED_OWNERS` (docs/saved-owners.md). `compile_kwargs` go to `torch.compile`.
    """
    for block in blocks:
        register_block(
            block,
            owner,
            nested=nested,
            cache_index=cache_index,
            guard_bypass=guard_bypass,
            saved=saved,
            **compile_kwargs,
        )


def compile_regions(model: nn.Module, saved: bool | None = None, **compile_kwargs: Any) -> nn.Module:
    """Compiles the repeated blocks of a built `model` regionally, in place, and returns the model.

    Each module that holds a container of blocks of one class is compiled whole, with each block a nested
    region (`compile_region`). Only the innermost level of repeated blocks becomes regions, and where the
    model's classes declare their repeated blocks (diffusers' `_repeated_blocks`), only the declared classes
    do. Blocks that take a transformers cache and hold one `layer_idx` each have their cache layer stood in
    for. `saved` and `compile_kwargs` are as in `compile_region`; docs/api.md gives the full rules.
    """
    for owner, blocks in _repeated_blocks(model):
        kv_param = kv_name(type(blocks[0]).forward)[0]
        indexes = [layer_idx(block, _LAYER_INDEX) for block in blocks]
        indexed = kv_param is not None and None not in indexes and len(set(indexes)) == len(blocks)
        options: dict[str, Any] = {"cache_index": _LAYER_INDEX} if indexed else {}
        if kv_param is not None and not indexed:
            options["nested"] = False
        compile_region(*blocks, owner=owner, saved=saved, **options, **compile_kwargs)
    # A module that holds stages which own blocks takes their blocks, so that each call runs one frame.
    for owner, containers in reversed(_holders(model)):  # innermost first, so a stage of stages is one
        for container in containers:
            for stages in _groups(container):
                if all("_regionalize_owner" in stage.__dict__ for stage in stages):
                    compile_region(*stages, owner=owner, saved=saved, **compile_kwargs)
    return model


def _holders(model: nn.Module) -> list[tuple[nn.Module, list[nn.Module]]]:
    """Returns each module with the containers it holds, outer modules first.

    A container's holder is the owner of its blocks, and a bare `Sequential` model is its own owner."""
    owners: list[tuple[nn.Module, list[nn.Module]]]
    owners = [(m, [c for c in m.children() if isinstance(c, _CONTAINERS)]) for m in model.modules()]
    owners = [(m, held) for m, held in owners if held and not isinstance(m, _CONTAINERS)]
    if isinstance(model, nn.Sequential):
        owners.insert(0, (model, [model]))
    return owners


def _repeated_blocks(model: nn.Module) -> list[tuple[nn.Module, list[nn.Module]]]:
    """Returns each owner with its blocks: the modules of one class in the owner's containers.

    A class counts where it has two or more such modules or is declared, and its modules hold no repeated
    blocks themselves. Where the model declares its blocks, only those of or inside a declared class count."""
    declared = _declared(model)
    within = [m for m in model.modules() if type(m).__name__ in declared]
    inside = {id(m) for d in within for m in d.modules() if m is not d}
    found: list[tuple[nn.Module, list[nn.Module]]] = []
    taken: set[int] = set()  # a module that two containers share is compiled once
    for owner, containers in _holders(model):
        for container in containers:
            for group in _groups(container, declared):
                group = [block for block in group if id(block) not in taken]
                named = bool(group) and type(group[0]).__name__ in declared
                if declared and not named and id(container) not in inside:
                    continue
                if (len(group) >= 2 or named) and not any(_has_repeated(b, declared) for b in group):
                    taken.update(map(id, group))
                    found.append((owner, group))
    return found


def _declared(model: nn.Module) -> set[str]:
    """Returns the class names that the model's classes declare as repeated blocks (`_repeated_blocks`)."""
    return {
        name
        for module in model.modules()
        for name in getattr(type(module), "_repeated_blocks", None) or ()
        if isinstance(name, str)
    }


def _groups(container: nn.Module, declared: Collection[str] = ()) -> list[list[nn.Module]]:
    """Groups the container's modules, through nested containers, by class.

    Only classes with submodules count, and only those with two or more modules or named in `declared`."""
    members: list[nn.Module] = []
    todo = list(container.children())
    while todo:
        module = todo.pop(0)
        if isinstance(module, _CONTAINERS):
            todo[:0] = list(module.children())
        elif next(module.children(), None) is not None:  # a leaf such as nn.Linear is not a block
            members.append(module)
    counts = Counter(type(module) for module in members)
    kinds = [kind for kind in counts if counts[kind] >= 2 or kind.__name__ in declared]
    return [[module for module in members if type(module) is kind] for kind in kinds]


def _has_repeated(module: nn.Module, declared: Collection[str]) -> bool:
    return any(
        _groups(child, declared)
        for child in module.modules()
        if isinstance(child, _CONTAINERS) and child is not module
    )
