"""regionalize's public API: what rewritten models call, and `compile_regions` for a model whose source you
cannot or will not change. It needs torch alone: running a rewritten model imports neither libcst nor
click.

The names here are stable: a release keeps serving the calls that earlier releases wrote
(tests/frozen/ holds them, run against the current runtime). What they do inside (a whole owner's
compile, pieces, stand-ins for caches, CUDA graphs) is the runtime's (`regionalize/runtime/`) and may
change in any release without a rewrite.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from torch import nn

from .bypass import dispatch as compile_direct
from .bypass import guard_filter
from .fixes import eager, symbolic_ints
from .kv import layer_idx
from .owner import register_block
from .regions import kv_name

__all__ = ["compile_direct", "compile_region", "compile_regions", "eager", "guard_filter", "symbolic_ints"]

# Also public, what the codemod's fixes call: `regionalize.eager(lambda: cache.update(k, v, self.layer_idx))`
# keeps a per-block integer out of the compiled region; `@regionalize.symbolic_ints` traces a forward with
# its modules' integer attributes symbolic; `options={"guard_filter_fn": regionalize.guard_filter}` drops
# guards on the structure of modules; `regionalize.compile_direct(block)` compiles a block in place and
# calls its compiled code without guards for calls seen before.

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
    """Compile each of `blocks` as a nested region of `owner`, which is compiled whole at its first call:
    a block's class is traced once and its compiled code serves every block of the owner. In place:
    `state_dict` keys, `isinstance` and indexing stay as they are. A rewrite passes a container's blocks
    in one call (`compile_region(*self.layers, owner=self)`), or one a call.
    A block that owns blocks of its own (a stage) gives them to `owner` instead of becoming a region:
    all the stages passed or none, given back where `owner` cannot be compiled whole (runtime/outer.py).

    `cache_index` names the integer attribute a block's cache update takes (`"layer_idx"`), so that each
    block's layer of a transformers cache is stood in for; `nested=False` compiles the owner whole without
    regions (blocks that update a cache the runtime cannot stand in for). `guard_bypass` is `"filter"` or
    `"depyf"` (docs/form-guard-bypass.md). `compile_kwargs` are `torch.compile`'s (`mode`,
    `dynamic`, `backend`, `fullgraph`, `options`). Where the owner cannot be compiled whole, its blocks
    are compiled one by one at run time, with one warning.

    Saved owners: the owner's compiled frame is saved under torch's cache directory, and a later process's
    first call loads it instead of tracing (docs/saved-owners.md). `saved=False` turns it off for this
    owner, `saved=True` on; `None` takes `REGIONALIZE_SAVED_OWNERS` (on unless it is `0`).
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
    """Compile the repeated blocks of a built `model` regionally, in place, as a rewrite of its source would,
    and return it: each module holding a `ModuleList`, `Sequential` or `ModuleDict` of blocks of one class
    is compiled whole, each block a nested region (`compile_region`). Only the innermost level of repeated
    blocks is made regions, a block being a module with submodules of its own; where their owners are
    stages of one class in a container, the module holding it owns all their blocks instead. Where the
    model's classes declare their repeated blocks (diffusers' `_repeated_blocks`, what its
    `compile_repeated_blocks()` compiles), only the classes named are blocks, even one to a container,
    and the repeated blocks inside them: a class left out is often built at several widths (a UNet's
    resnets), where a region serves no other block, and compiling it would start later than a full
    compile, as the codemod's RGZ111 says. Blocks whose
    forward takes a transformers cache and that hold one `layer_idx` each have their cache layer stood in
    for; other such blocks are compiled inside their owner without regions. `compile_kwargs` are
    `torch.compile`'s; `saved` is `compile_region`'s.

    For a model whose source you can change, `regionalize --apply` writes the same calls, where a reviewer
    sees them, and also moves per-block integers out of the compiled regions (RGZ003, RGZ004).
    """
    for owner, blocks in _repeated_blocks(model):
        kv_param = kv_name(type(blocks[0]).forward)[0]
        indexes = [layer_idx(block, _LAYER_INDEX) for block in blocks]
        indexed = kv_param is not None and None not in indexes and len(set(indexes)) == len(blocks)
        options: dict[str, Any] = {"cache_index": _LAYER_INDEX} if indexed else {}
        if kv_param is not None and not indexed:
            options["nested"] = False
        compile_region(*blocks, owner=owner, saved=saved, **options, **compile_kwargs)
    # Stages that own blocks, held by one module: it takes their blocks, one frame a call (runtime/outer.py).
    for owner, containers in reversed(_holders(model)):  # the innermost first: a stage of stages is one
        for container in containers:
            for stages in _groups(container):
                if all("_regionalize_owner" in stage.__dict__ for stage in stages):
                    compile_region(*stages, owner=owner, saved=saved, **compile_kwargs)
    return model


def _holders(model: nn.Module) -> list[tuple[nn.Module, list[nn.Module]]]:
    """Each module with the containers it holds, outer modules first. A container is the place of blocks
    and its holder their owner; a bare `Sequential` as the model is its own owner."""
    owners = [(m, [c for c in m.children() if isinstance(c, _CONTAINERS)]) for m in model.modules()]
    owners = [(m, held) for m, held in owners if held and not isinstance(m, _CONTAINERS)]
    if isinstance(model, nn.Sequential):
        owners.insert(0, (model, [model]))
    return owners


def _repeated_blocks(model: nn.Module) -> list[tuple[nn.Module, list[nn.Module]]]:
    """Each owner with its blocks: the modules of one class, two or more or a declared one, in a container
    the owner holds (or in containers of such a container), that hold no repeated blocks themselves; where
    the model declares its blocks, only those in a declared class or of one."""
    declared = _declared(model)
    within = [m for m in model.modules() if type(m).__name__ in declared]
    inside = {id(m) for d in within for m in d.modules() if m is not d}
    found, taken = [], set()  # a module shared by two containers is compiled once
    for owner, containers in _holders(model):
        for container in containers:
            for group in _groups(container, declared):
                group = [block for block in group if id(block) not in taken]
                named = bool(group) and type(group[0]).__name__ in declared
                if declared and not named and id(container) not in inside:
                    continue
                if (len(group) >= 2 or named) and not any(_holds_repeated(b, declared) for b in group):
                    taken.update(map(id, group))
                    found.append((owner, group))
    return found


def _declared(model: nn.Module) -> set[str]:
    """The class names that the model's classes declare as their repeated blocks: diffusers'
    `_repeated_blocks`, empty where no class declares any."""
    return {
        name
        for module in model.modules()
        for name in getattr(type(module), "_repeated_blocks", None) or ()
        if isinstance(name, str)
    }


def _groups(container: nn.Module, declared: Collection[str] = ()) -> list[list[nn.Module]]:
    """The container's modules (those of containers in it too) by class, for classes with submodules, of
    two or more modules or `declared`."""
    members: list[nn.Module] = []
    todo = list(container.children())
    while todo:
        module = todo.pop(0)
        if isinstance(module, _CONTAINERS):
            todo[:0] = list(module.children())
        elif next(module.children(), None) is not None:  # a leaf (nn.Linear) is no block
            members.append(module)
    counts = Counter(type(module) for module in members)
    kinds = [kind for kind in counts if counts[kind] >= 2 or kind.__name__ in declared]
    return [[module for module in members if type(module) is kind] for kind in kinds]


def _holds_repeated(module: nn.Module, declared: Collection[str]) -> bool:
    return any(
        _groups(child, declared)
        for child in module.modules()
        if isinstance(child, _CONTAINERS) and child is not module
    )
