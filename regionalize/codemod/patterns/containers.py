"""Pattern family: a container whose elements are built by a comprehension, a generator, a star, a
concatenation or a ModuleDict, bound to a name or returned; a loop after it compiles its blocks.

It also reads the containers met inside an element (nested ones, written-out ModuleLists) for the judge.
"""

from __future__ import annotations

import dataclasses
import re

import libcst as cst

from regionalize.codemod.patterns import emit
from regionalize.codemod.patterns.context import Context
from regionalize.codemod.patterns.ints import comprehension_vars, int_targets, rate_targets
from regionalize.codemod.patterns.judgement import Judge
from regionalize.codemod.patterns.model import (
    COMPILED,
    Container,
    Element,
    blocks_of,
    dotted_name,
    first_label,
    leaves_of,
    rewrite_code,
)
from regionalize.codemod.patterns.triage import triage


class ContainerSites:
    """The sites of container calls: what a call holds, read by `ContainerElements`, and the loop after
    its statement that compiles the blocks."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.read = ContainerElements(ctx)
        self.judge = self.read.judge
        self.consumed: set[cst.Call] = set()  # inner containers already reported with their outer one

    def visit(self, call: cst.Call) -> bool:
        """Report `call` if it builds a container with repeated elements; True if it is a container call."""
        if call in self.consumed:
            return True
        kind = self.ctx.container_kind(call)
        if kind is None:
            return self._clones(call)
        found = self.read.container(call, kind, set())
        if found is not None:
            self.consume_inner(found)
            self.site(call, found)
        return True

    def _clones(self, call: cst.Call) -> bool:
        """`self.layers = _get_clones(layer, n)` with the helper imported (one in this file is rewritten
        inside): a ModuleList of deep copies of its first argument, known by the name
        torch.nn.Transformer gave it or read where the package defines it."""
        name = dotted_name(call.func)
        facts = self.ctx.facts
        if name is None or name in facts.top_level_defs or not call.args:
            return False
        full = facts.resolve(name)
        named = CLONES.match(full.rsplit(".", 1)[-1]) and "." in full
        if not (named or facts.is_clone_helper(full)):
            return False
        element = Element("block", self.ctx.code(call.args[0].value))
        found = Container("clone-helper", False, [element], [])
        if self.ctx.options.style == "wrap":
            # Nothing to wrap but the helper's result, a ModuleList: compiling it would compile nothing.
            site = self.ctx.site_maker(call, found.pattern, element.label)
            site("RGZ104", "skip", "the copies are made inside the helper: use --style inplace")
            return True
        self.site(call, found)
        return True

    def consume_inner(self, found: Container) -> None:
        for element in found.repeated + found.single:
            if element.inner is not None and element.call is not None:
                self.consumed.add(element.call)
                self.consume_inner(element.inner)

    # -- the site ---------------------------------------------------------------------------------
    def site(self, call: cst.Call, found: Container) -> None:
        ctx = self.ctx
        blocks = blocks_of(found)
        statement = ctx.statements[-1] if ctx.statements else None
        target = _bound_target(statement, call) if statement is not None else None
        labels = " | ".join(dict.fromkeys(e.label for e in leaves_of(found) if e.kind in COMPILED))
        site = ctx.site_maker(call, found.pattern, labels or first_label(found))
        compiled = target is not None and ctx.already_compiled_iterable(target)
        few = (
            found.count is not None and found.count <= FEW and all(e.kind != "nested" for e in found.repeated)
        )
        if few and blocks and not compiled:
            # The enclosing block (a decoder layer holding two attentions) is the one worth compiling.
            return site("RGZ109", "skip", f"{found.count} repeat{'s' * (found.count > 1)}")
        if triage(ctx, site, call, leaves_of(found), blocks, found.pattern, compiled):
            return
        if ctx.blocks[-1] in ctx.class_bodies:
            return site("RGZ107", "skip")
        if not isinstance(ctx.blocks[-1], (cst.IndentedBlock, cst.Module)):
            return site("RGZ106", "skip")
        returned = _returned(statement, call)
        if target is None and returned is None:
            return site("RGZ104", "skip", "use --style wrap, or bind the container to a name first")
        name = ctx.scopes[-1].fresh("blocks") if returned is not None else ""
        loop = emit.compile_loop(ctx, found, cst.Name(name) if name else target)
        if loop is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        if returned is not None:
            # `return Container(..)` becomes `blocks = Container(..)`, the loop, then `return blocks`.
            assign = cst.Assign([cst.AssignTarget(cst.Name(name))], call)
            ctx.edits.split[statement] = [
                statement.with_changes(body=[assign]),
                loop,
                cst.SimpleStatementLine([returned.with_changes(value=cst.Name(name))]),
            ]
        else:
            ctx.edits.after.setdefault(statement, []).append(loop)
        site(rewrite_code(blocks), "rewrite")


class ContainerElements:
    """Reads the elements a container is built from: which repeat, which stand once, and the pattern."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.judge = Judge(ctx, self.container, self.literal)

    def literal(self, call: cst.Call, int_vars: set[str]) -> Container:
        """A ModuleList of blocks written out, met where it is built per iteration: each element repeats."""
        return self._each_repeats(
            [(a.value, a.star == "*") for a in call.args if a.keyword is None], int_vars
        )

    def _each_repeats(self, parts: list[tuple[cst.BaseExpression, bool]], int_vars: set[str]) -> Container:
        found = Container("literal", False, [], [], literal=True)
        for expr, starred in parts:
            self.collect(expr, found, int_vars, starred)
        found.repeated, found.single = found.repeated + found.single, []
        return found

    def container(self, call: cst.Call, kind: str, int_vars: set[str]) -> Container | None:
        """The elements of a ModuleList/Sequential/ModuleDict call, or None if nothing is repeated."""
        found = Container("comprehension", kind == "ModuleDict", [], [])
        for arg in call.args:
            if arg.keyword is not None:
                continue
            self.collect(arg.value, found, int_vars, starred=arg.star == "*")
        return found if found.repeated else None

    def elements(self, expr: cst.BaseExpression, per_iteration: bool) -> Container | None:
        """The blocks one expression adds (`xs.extend(..)`, `xs += ..`), None when nothing repeats; a
        list written out repeats when it is added once per iteration of a loop."""
        values = self.ctx.scopes[-1].bindings.get(expr.value, []) if isinstance(expr, cst.Name) else []
        if per_iteration and len(values) == 1 and isinstance(values[0], (cst.List, cst.Tuple)):
            expr = values[0]  # `blocks = [Block(..)]` bound before `xs += blocks` (a second pass)
        if per_iteration and isinstance(expr, (cst.List, cst.Tuple)):
            return self._each_repeats([(expr, False)], self.ctx.loop_int_vars())
        found = Container("comprehension", False, [], [])
        self.collect(expr, found, self.ctx.loop_int_vars(), starred=False)
        return found if found.repeated else None

    def collect(self, expr: cst.BaseExpression, found: Container, int_vars: set[str], starred: bool) -> None:
        classify = self.judge.classify
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            comp_vars = int_vars | comprehension_vars(expr.for_in, int_targets)
            elt = expr.value if isinstance(expr, cst.DictComp) else expr.elt
            elements = classify(elt, comp_vars)
            rates = frozenset(comprehension_vars(expr.for_in, rate_targets))
            found.repeated += [dataclasses.replace(e, rate_vars=rates) for e in elements]
            found.count = _literal_count(expr.for_in)
            found.pattern = {cst.ListComp: "comprehension", cst.GeneratorExp: "generator"}.get(
                type(expr), "dict-comprehension"
            )
            if starred:
                found.pattern = "sequential-star"
        elif (pairs := self._named_pairs(expr)) is not None:
            # `nn.Sequential(OrderedDict([(f"layer{i}", Block(..)) for i in ..]))`: the values repeat.
            pairs_vars = int_vars | comprehension_vars(pairs.for_in, int_targets)
            assert isinstance(pairs.elt, cst.Tuple)
            found.repeated += classify(pairs.elt.elements[1].value, pairs_vars)
            found.pattern = "ordered-dict"
        elif isinstance(expr, cst.Call) and self._is_dict(expr) and len(expr.args) == 1:
            self.collect(expr.args[0].value, found, int_vars, starred)  # `OrderedDict({k: Block(..) ..})`
        elif isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Add):
            self.collect(expr.left, found, int_vars, starred)
            self.collect(expr.right, found, int_vars, starred)
            if found.repeated and found.single:
                found.pattern = "concatenation"
        elif isinstance(expr, (cst.List, cst.Tuple)):
            for element in expr.elements:
                if isinstance(element, cst.StarredElement):
                    self.collect(element.value, found, int_vars, starred=True)
                else:
                    found.single += classify(element.value, int_vars)
        elif isinstance(expr, cst.Name) and (values := self.ctx.scopes[-1].bindings.get(expr.value)):
            before = len(found.repeated)
            if len(values) == 1 and isinstance(values[0], (cst.ListComp, cst.GeneratorExp)):
                self.collect(values[0], found, int_vars, starred)
                if len(found.repeated) > before:
                    found.pattern = "listcomp-variable"
        elif not starred:
            found.single += classify(expr, int_vars)

    def _is_dict(self, call: cst.Call) -> bool:
        return self.ctx.dotted(call.func) in ("collections.OrderedDict", "dict")

    def _named_pairs(self, expr: cst.BaseExpression) -> cst.ListComp | cst.GeneratorExp | None:
        """The comprehension of (name, module) pairs handed to `OrderedDict(..)` or `dict(..)`."""
        if not (isinstance(expr, cst.Call) and self._is_dict(expr) and len(expr.args) == 1):
            return None
        inner = expr.args[0].value
        if isinstance(inner, (cst.ListComp, cst.GeneratorExp)) and isinstance(inner.elt, cst.Tuple):
            return inner if len(inner.elt.elements) == 2 else None
        return None


CLONES = re.compile(r"^_?(get_)?clones$")
FEW = 2  # a comprehension repeated this often or less is not compiled: see RGZ109


def _literal_count(for_in: cst.CompFor) -> int | None:
    """`for _ in range(2)`, `range(1, 3)`, `for i in [0, 1]`: the count; None when not written out."""
    if for_in.inner_for_in is not None or for_in.ifs:
        return None
    it = for_in.iter
    if isinstance(it, (cst.List, cst.Tuple)) and not any(
        isinstance(e, cst.StarredElement) for e in it.elements
    ):
        return len(it.elements)
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "range":
        bounds = [a.value for a in it.args]
        if 1 <= len(bounds) <= 2 and all(isinstance(b, cst.Integer) for b in bounds):
            values = [int(b.value, 0) for b in bounds]  # type: ignore[union-attr]
            return max(0, values[-1] - (values[0] if len(values) == 2 else 0))
    return None


def _bound_target(statement: cst.BaseStatement, call: cst.Call) -> cst.BaseExpression | None:
    """The name or attribute a statement binds `call` to, when the call is the whole value."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and small.value is call:
        target = small.targets[0].target
    elif isinstance(small, cst.AnnAssign) and small.value is call:
        target = small.target
    else:
        return None
    return target if isinstance(target, (cst.Name, cst.Attribute)) else None


def _returned(statement: cst.BaseStatement | None, call: cst.Call) -> cst.Return | None:
    """The `return` statement whose whole value is `call`."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Return) and small.value is call:
            return small
    return None
