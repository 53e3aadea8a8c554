"""Picks the form that an owner takes, for its blocks, its options and this torch, and says why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .constants import differing_constants
from .forms import ALONE, PER_BLOCK, PIECES, WHOLE
from .frames import globals_of, why_unimportable
from .internals.compiler import inductor_pieces
from .internals.tracer import has_inlined_module_imports
from .state import Plan, process

if TYPE_CHECKING:
    from .state import OwnerState


def registration_plan(compile_kwargs: dict[str, Any]) -> Plan | None:
    """Returns the fallback that an owner takes as its first block registers, or None where there is none."""
    if not hasattr(torch.compiler, "nested_compile_region"):
        return Plan(PER_BLOCK, "this torch has no nested compile regions", True)
    if compile_kwargs.get("backend") == "eager":  # without AOTAutograd a region's backward raises
        return Plan(PER_BLOCK, "the eager backend cannot differentiate nested regions", True)
    return None


def plan_for(owner: torch.nn.Module, state: OwnerState, graphs: bool, inductor: bool) -> Plan:
    """Returns the owner's plan at its first call: the form that `form_for` picks, or a fallback.

    The fallback is per block, where the form traces the owner whole and Dynamo cannot inline a block's
    code from the owner's frame (`frames.py`)."""
    plan = form_for(state, graphs, inductor)
    if not plan.form.runs_whole:
        return plan
    inlined = {type(module) for module in (*state.blocks, *(stage for stage, _ in state.inner))}
    why = why_unimportable(globals_of(type(owner).forward), inlined)
    if why is None or not has_inlined_module_imports():
        return plan
    return Plan(PER_BLOCK, why, fallback=True)


def form_for(state: OwnerState, graphs: bool, inductor: bool) -> Plan:
    """Returns the owner's form for its blocks and for what this torch offers.

    A single block is compiled alone unless it updates a cache or runs in CUDA graphs. Blocks that differ in
    float constants are compiled in pieces, or per block where Inductor's pieces are missing. On a torch
    that reuses no traced region the owner is compiled in pieces, or, with a backend other than Inductor,
    per block unless it runs in CUDA graphs or holds blocks without regions. Otherwise the owner is
    compiled whole (docs/compile-forms.md)."""
    indexed = state.indexed
    constants = None if indexed else differing_constants(state.blocks)
    if len(state.blocks) == 1 and not indexed and not graphs:
        return Plan(ALONE)
    # Asked only where pieces would serve: the probe imports Inductor's compiler, which a restart that
    # loads its frames otherwise never imports.
    if constants is not None:
        return Plan(PIECES if can_split(inductor) else PER_BLOCK, constants)
    if not process.reusing and can_split(inductor):
        return Plan(PIECES, "this torch does not reuse a traced region")
    if not (process.reusing or graphs) and all(attribute for _, attribute in indexed):
        return Plan(PER_BLOCK, "this torch does not reuse a traced region (torch 2.12 and later do)")
    return Plan(WHOLE)


def can_split(inductor: bool) -> bool:
    """Returns whether the owner's graph can be compiled in pieces: by Inductor, where torch offers that."""
    return inductor and inductor_pieces() is not None
