"""Integer loop variables, and the arguments of a block's call that carry one (for `int_fixes`); loop
variables that take a per-block rate, and the arguments that carry one (RGZ202)."""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from regionalize.codemod.nodes import FastDispatch


def int_targets(target: cst.BaseExpression, iterable: cst.BaseExpression) -> set[str]:
    """Loop variables known to be integers: `for i in range(..)`, `for i, x in enumerate(..)`."""
    if not isinstance(iterable, cst.Call) or not isinstance(iterable.func, cst.Name):
        return set()
    if iterable.func.value == "range" and isinstance(target, cst.Name):
        return {target.value}
    if (
        iterable.func.value == "enumerate"
        and isinstance(target, (cst.Tuple, cst.List))
        and target.elements
        and isinstance(target.elements[0].value, cst.Name)
    ):
        return {target.elements[0].value.value}
    return set()


Targets = Callable[[cst.BaseExpression, cst.BaseExpression], set[str]]


def comprehension_vars(for_in: cst.CompFor | None, targets: Targets) -> set[str]:
    """The names `targets` finds in each `for` of a comprehension (`int_targets`, `rate_targets`)."""
    names: set[str] = set()
    while for_in is not None:
        names |= targets(for_in.target, for_in.iter)
        for_in = for_in.inner_for_in
    return names


def rate_targets(target: cst.BaseExpression, iterable: cst.BaseExpression) -> set[str]:
    """Loop variables that take a value from a sequence named as rates: `for r in drop_path_rates`,
    `for dim, rate in zip(dims, dpr)`."""
    pairs = [(target, iterable)]
    if (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Name)
        and iterable.func.value == "zip"
        and isinstance(target, (cst.Tuple, cst.List))
        and len(target.elements) == len(iterable.args)
    ):
        pairs = [(t.value, a.value) for t, a in zip(target.elements, iterable.args, strict=True)]
    return {
        name.value
        for name, values in pairs
        if isinstance(name, cst.Name)
        and isinstance(values, (cst.Name, cst.Attribute, cst.Subscript))
        and _LOOP_RATE.search(cst.Module([]).code_for_node(values).lower())
    }


def int_args(call: cst.Call, int_vars: set[str]) -> tuple[frozenset[int], frozenset[str], tuple[str, ...]]:
    """The arguments that carry an integer loop variable as a value: positions, keywords, and the names.

    Not through an index (`dpr[i]` is a float), a comparison (`is_first=(i == 0)` is a bool, at most two
    graphs) or an f-string.
    """
    positions: set[int] = set()
    keywords: set[str] = set()
    every: set[str] = set()
    for index, arg in enumerate(call.args):
        used: set[str] = set()
        arg.value.visit(_IntUses(int_vars, used))
        if not used:
            continue
        every |= used
        if arg.keyword is not None:
            keywords.add(arg.keyword.value)
        elif not arg.star:
            positions.add(index)
    return frozenset(positions), frozenset(keywords), tuple(sorted(every))


def indexed_args(call: cst.Call, int_vars: set[str], rate_vars: frozenset[str]) -> list[cst.Arg]:
    """The arguments that take a rate by an integer loop variable (`drop_path=dpr[i]`), or a loop variable
    that iterates over rates (`drop_path=r`, `rate_vars`): a per-block float, by its name (the keyword's,
    or the list's). Sizes picked so (`embed_dims[i]`) are left alone: blocks of other shapes share no
    compiled code whatever their floats."""
    found = []
    for arg in call.args:
        rates: set[str] = set()
        arg.value.visit(_IntUses(set(rate_vars), rates))
        if rates:
            found.append(arg)
            continue
        subscripts: list[cst.Subscript] = []
        arg.value.visit(_Subscripts(subscripts))
        for subscript in subscripts:
            used: set[str] = set()
            for element in subscript.slice:
                element.slice.visit(_IntUses(int_vars, used))
            keyword = arg.keyword
            named = keyword.value if keyword is not None else cst.Module([]).code_for_node(subscript.value)
            if used and _RATE.search(named.lower()):
                found.append(arg)
                break
    return found


# What a per-block float is called: stochastic depth (`drop_path`, `dpr`), layer scale (`init_values`,
# `layer_scale_init`, `gamma`), a rate or a probability.
_RATE = re.compile(r"drop|dpr|rate|prob|scale|init_value|gamma")
# A sequence a loop takes per-block floats from: stochastic depth's and layer scale's. Not any `scale` or
# `rate`: `img_size_scaled`, `scale_in_channels` and `dilation_rates` hold sizes, which change shapes.
_LOOP_RATE = re.compile(r"drop|dpr|prob|layer_scale|init_value")


class _Subscripts(FastDispatch, cst.CSTVisitor):
    def __init__(self, found: list[cst.Subscript]) -> None:
        self.found = found

    def visit_Subscript(self, node: cst.Subscript) -> None:
        self.found.append(node)


class _IntUses(FastDispatch, cst.CSTVisitor):
    def __init__(self, int_vars: set[str], used: set[str]) -> None:
        self.int_vars = int_vars
        self.used = used

    def visit_SubscriptElement(self, node: cst.SubscriptElement) -> bool:
        return False

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False

    def visit_Comparison(self, node: cst.Comparison) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.int_vars:
            self.used.add(node.value)
