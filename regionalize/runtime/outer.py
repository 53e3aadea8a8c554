"""Lets a module that holds stages, each the owner of its blocks, take their blocks and compile as one owner.

Each call then runs one compiled frame rather than one frame per stage (docs/form-hierarchical.md). The
module takes every stage offered or none: where it cannot, the stages own their blocks again (`refuse`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .internals.hooks import set_compiled_call
from .state import Config, OwnerState


def may_take(owner: torch.nn.Module, inner: OwnerState, config: Config) -> bool:
    """Returns whether `owner`, asked to compile as `config` says, may take the blocks of the stage `inner`.

    It may not once either has run, where the stage has another form or other options, or after a refusal."""
    if owner.__dict__.get("_regionalize_refused") or inner.settled or not inner.report.plan.form.runs_whole:
        return False
    state = owner.__dict__.get("_regionalize_owner")
    if state is not None and (state.settled or not same_options(state.config, config)):
        return False
    return same_options(inner.config, config)


def same_options(one: Config, other: Config) -> bool:
    """Returns whether two owners compile with the same options and guard bypass; saving may differ."""
    return one.kwargs == other.kwargs and one.direct == other.direct


def take(
    owner: torch.nn.Module,
    stage: torch.nn.Module,
    state: OwnerState,
    register: Callable[..., None],
    kwargs: dict[str, Any],
) -> None:
    """Moves `stage`'s state into the owner's `state` and registers each of its blocks with the owner.

    `register` is `register_block`; the stage then runs inside the owner's frame."""
    inner = stage.__dict__.pop("_regionalize_owner")
    owner.__dict__["_regionalize_owner"] = state
    state.inner.append((stage, inner))
    set_compiled_call(stage, None)
    indexed = {id(held): attribute for held, attribute in inner.indexed}
    bypass = "depyf" if state.config.direct else None
    for held in inner.blocks:
        attribute = indexed.get(id(held))
        register(held, owner, id(held) not in indexed or attribute is not None, attribute, bypass, **kwargs)


def refuse(owner: torch.nn.Module, entry: Callable[[torch.nn.Module, None], Callable[..., Any]]) -> None:
    """Stops `owner` from taking stages, and gives the stages it took their blocks back.

    Their calls are then served by `entry(stage, None)`, and an owner left without blocks of its own becomes
    a plain module again."""
    owner.__dict__["_regionalize_refused"] = True
    state = owner.__dict__.get("_regionalize_owner")
    if state is None or not state.inner:
        return
    taken = {id(block) for _, inner in state.inner for block in inner.blocks}
    for stage, inner in state.inner:
        stage.__dict__["_regionalize_owner"] = inner
        set_compiled_call(stage, entry(stage, None))
    state.inner = []
    state.blocks = [block for block in state.blocks if id(block) not in taken]
    state.indexed = [(block, attribute) for block, attribute in state.indexed if id(block) not in taken]
    if not state.blocks:
        del owner.__dict__["_regionalize_owner"]
        set_compiled_call(owner, None)


def has_inner_owners(module: torch.nn.Module) -> bool:
    """Returns whether `module`, offered as a block, holds owners of blocks, which a region would inline."""
    return any("_regionalize_owner" in m.__dict__ for m in module.modules() if m is not module)


def has_mostly_stages(owner: torch.nn.Module, state: OwnerState) -> bool:
    """Returns whether the stages and blocks that `owner` holds have nearly all of its parameters.

    Compiling an owner with much work of its own would start later and run no faster
    (docs/form-hierarchical.md)."""
    held = [stage for stage, _ in state.inner] + state.blocks
    covered = {id(p) for module in held for p in module.parameters()}
    total = list(owner.parameters())
    return sum(p.numel() for p in total if id(p) in covered) >= SHARE * sum(p.numel() for p in total)


SHARE = 0.9  # the share of the owner's parameters below which the stages keep their blocks
