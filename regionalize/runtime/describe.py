"""Describes each owner of a model as a record: the form it runs in, why, and what became of its saved
frame. Verify, the benchmarks and users read these records rather than the runtime's state."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def describe(model: torch.nn.Module) -> list[OwnerReport]:
    """Returns one record for each owner among `model`'s modules, in the order of `model.modules()`."""
    return [
        report_of(module, state)
        for module in model.modules()
        if (state := module.__dict__.get("_regionalize_owner")) is not None
    ]


def report_of(owner: torch.nn.Module, state: object) -> OwnerReport:
    """Returns the record of `owner`, read from its state by attribute name, since a vendored copy
    of the runtime keeps a state class and a `Form` enum of its own, with the same names and values."""
    plan = state.plan  # type: ignore[attr-defined]
    saved = getattr(state, "saved", None) or "not saved: not called whole"
    return OwnerReport(
        owner=type(owner).__name__,
        form=plan.form.value,
        reason=plan.reason,
        fallback=plan.fallback,
        pieces=state.pieces,  # type: ignore[attr-defined]
        static_calls=state.static,  # type: ignore[attr-defined]
        prompt_calls=state.prompt,  # type: ignore[attr-defined]
        layer_by_layer=state.kv,  # type: ignore[attr-defined]
        saved=saved if getattr(state, "save", False) else None,
    )
