"""Describes each owner of a model as a record: the form it runs in, why, and what became of its saved
frame. Verify, the benchmarks and users read these records rather than the runtime's state."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from .saved_blocks import outcome


@dataclass(frozen=True, slots=True)
class OwnerReport:
    """Records how the calls so far have run one owner of repeated blocks."""

    owner: str  # the owner's class name
    form: str  # "whole", "whole, in pieces", "per block" or "alone"
    reason: str | None  # why it takes this form, where it is not the default
    fallback: bool  # True where the form it planned failed and this one took over
    pieces: str | None  # in pieces: how many pieces a call runs, and how many were compiled
    static_calls: bool  # calls that hand a StaticCache run per block
    prompt_calls: bool  # a prompt's calls with a DynamicCache run per block
    layer_by_layer: str | None  # why its blocks that update a cache are traced layer by layer
    saved: str | None  # "loaded", "saved" or "not saved: <why>"; None where saving was not asked for
    grad_calls: bool = False  # calls with autograd run per block
    # What became of the saved frame that runs its blocks' calls with autograd, as `saved` says; None where
    # none does
    grad_saved: str | None = None


def describe(model: torch.nn.Module) -> list[OwnerReport]:
    """Returns one record for each owner among `model`'s modules, in the order of `model.modules()`."""
    return [
        report_of(module, state)
        for module in model.modules()
        if (state := module.__dict__.get("_regionalize_owner")) is not None
    ]


def report_of(owner: torch.nn.Module, state: Any) -> OwnerReport:
    """Returns the record of `owner`, read from its state by attribute name.

    A vendored copy of the runtime keeps state classes of its own, and copies of earlier releases keep one
    flat record with a `Form` enum, so the names are read rather than the types checked."""
    config, found = getattr(state, "config", state), getattr(state, "report", None)
    if found is None:  # an earlier release's flat record
        return _flat_report(owner, state)
    form, saved = found.plan.form, found.saved
    return OwnerReport(
        owner=type(owner).__name__,
        form=form.name,
        reason=found.plan.reason,
        fallback=found.plan.fallback,
        pieces=None if found.pieces is None else str(found.pieces),
        static_calls=found.static_calls,
        prompt_calls=found.prompt_calls,
        layer_by_layer=found.layer_by_layer,
        saved=(str(saved) if saved else "not saved: not called whole") if config.save else None,
        grad_calls=getattr(found, "grad_calls", False),  # a vendored copy's record may lack it
        grad_saved=next((str(saved) for block in state.blocks if (saved := outcome(block))), None),
    )


def _flat_report(owner: torch.nn.Module, state: object) -> OwnerReport:
    """Returns the record of an owner whose runtime keeps one flat record, as releases before 0.3 did."""
    plan = state.plan  # type: ignore[attr-defined]
    saved = getattr(state, "saved", None) or "not saved: not called whole"
    form = plan.form.value if isinstance(plan.form, enum.Enum) else plan.form.name
    return OwnerReport(
        owner=type(owner).__name__,
        form=form,
        reason=plan.reason,
        fallback=plan.fallback,
        pieces=state.pieces,  # type: ignore[attr-defined]
        static_calls=state.static,  # type: ignore[attr-defined]
        prompt_calls=state.prompt,  # type: ignore[attr-defined]
        layer_by_layer=state.kv,  # type: ignore[attr-defined]
        saved=saved if getattr(state, "save", False) else None,
    )
