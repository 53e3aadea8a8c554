"""Finds blocks of one class that hold different float constants, such as stochastic-depth rates.

A float that differs between blocks stops a traced region from serving them all
(docs/form-hierarchical.md#blocks-that-differ-in-float-constants)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def differing_constants(blocks: Sequence[nn.Module], most: int = 2) -> str | None:
    """Returns why `blocks` should not be regions, or None: they hold more than `most` sets of float values.

    Dynamo guards on each module's float, so the owner would trace a region for each set of values; the
    plan compiles its graph in pieces instead, or each block on its own with a backend other than Inductor
    (docs/form-hierarchical.md#blocks-that-differ-in-float-constants). Integers are not counted, because
    they are layer indexes, which the cache stand-ins and the codemod's fixes handle."""
    for cls in dict.fromkeys(map(type, blocks)):  # each class of blocks, in the blocks' order
        sets: set[tuple[tuple[str, float], ...]] = set()
        differing: dict[str, set[float]] = {}
        for block in [block for block in blocks if type(block) is cls]:
            floats = tuple(
                (f"{name}.{attribute}".lstrip("."), value)
                for name, module in block.named_modules()
                for attribute, value in vars(module).items()
                if type(value) is float
            )
            sets.add(floats)
            for key, value in floats:
                differing.setdefault(key, set()).add(value)
        if len(sets) > most:
            names = [key for key, values in differing.items() if len(values) > 1]
            if names:
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                return (
                    f"its blocks differ in float attributes ({shown}; {len(sets)} sets of values), which "
                    "Dynamo would trace a region for each of"
                )
    return None
