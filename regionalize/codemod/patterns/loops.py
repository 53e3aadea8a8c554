"""Pattern family: a loop that appends (or add_module's) one block per iteration, built in the call or bound
to a name just before it (`layer = Block(..)` then `layers.append(layer)`); the block is compiled there."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from regionalize.codemod import prescan
from regionalize.codemod.patterns import emit
from regionalize.codemod.patterns.context import Context, SiteMaker
from regionalize.codemod.patterns.judgement import Judge
from regionalize.codemod.patterns.model import (
    Container,
    Element,
    Scope,
    blocks_of,
    dotted_name,
    labels,
    leaves_of,
    rewrite_code,
    walk,
)
from regionalize.codemod.patterns.triage import triage


class LoopSites:
    def __init__(self, ctx: Context, judge: Judge) -> None:
        self.ctx = ctx
        self.judge = judge

    def visit(self, call: cst.Call) -> None:
        ctx = self.ctx
        if not ctx.loops or not isinstance(call.func, cst.Attribute) or not ctx.statements:
            return
        method = call.func.attr.value
        args = [a for a in call.args if a.keyword is None and not a.star]
        if method == "append" and len(args) == 1:
            receiver = call.func.value
            if not self.holds_modules(receiver):
                return
            pattern = "loop-append"
        elif method == "add_module" and len(args) == 2:
            pattern = "loop-add-module"
        else:
            return
        statement = ctx.statements[-1]
        element = args[-1].value
        if not _is_only_statement(statement, call):
            return
        int_vars = ctx.loop_int_vars()
        if isinstance(element, cst.Name):
            return self.name_site(call, statement, element, pattern, int_vars)
        elements = self.judge.classify(element, int_vars)
        found = Container(pattern, False, elements, [])
        blocks = blocks_of(found)
        if _inner_comprehension(elements):
            return  # an inner container built by a comprehension: reported where it is built
        site = ctx.site_maker(call, pattern, labels(leaves_of(found)))
        # `xs.append(Block(..))` stays as written, and the block it appended is compiled on the next line
        # (`xs[-1].compile()`): one line added, the user's statement untouched.
        last = emit.last_of(call.func.value) if method == "append" and dotted_name(call.func.value) else None
        compiled = last is not None and _compiles_next(ctx, statement, ctx.code(last))
        if triage(ctx, site, call, leaves_of(found), blocks, pattern, compiled=compiled):
            return
        if not isinstance(ctx.blocks[-1], cst.IndentedBlock):
            return site("RGZ106", "skip")
        if last is not None:
            compile_last = emit.compile_element(ctx, last, elements, blocks)
            if compile_last is None:
                return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
            ctx.edits.after.setdefault(statement, []).append(compile_last)
            return site(rewrite_code(blocks), "rewrite")
        self.bound_site(call, statement, args[-1], elements, blocks, site)

    def bound_site(
        self,
        call: cst.Call,
        statement: cst.BaseStatement,
        arg: cst.Arg,
        elements: list[Element],
        blocks: list[Element],
        site: SiteMaker,
    ) -> None:
        """`xs.add_module(name, Block(..))`, or an append whose receiver has no dotted name: the block
        (`arg`) is bound to a fresh name first, compiled, then added by that name."""
        ctx = self.ctx
        element = arg.value
        var = ctx.scopes[-1].fresh("block")
        compile_stmt = emit.compile_element(ctx, cst.Name(var), elements, blocks)
        if compile_stmt is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        if "\n" in ctx.code(element) and not isinstance(element, cst.Call) and not element.lpar:
            # A multi-line `A(..) if c else B(..)` was valid inside the call's parentheses only.
            element = element.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        assign = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(var))], element)])
        appends = isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
        if appends:  # `xs.append(\n    Block(..)\n)` collapses to `xs.append(block)`
            new_call = call.with_changes(
                args=[cst.Arg(cst.Name(var))], whitespace_before_args=cst.SimpleWhitespace("")
            )
        else:
            new_call = call.with_deep_changes(arg, value=cst.Name(var))
        appended = statement.with_changes(body=[cst.Expr(new_call)], leading_lines=[])
        ctx.edits.split[statement] = [
            assign.with_changes(leading_lines=statement.leading_lines),
            compile_stmt,
            appended,
        ]
        site(rewrite_code(blocks), "rewrite")

    def name_site(
        self, call: cst.Call, statement: cst.BaseStatement, name: cst.Name, pattern: str, int_vars: set[str]
    ) -> None:
        """`layer = Block(..)` then `layers.append(layer)` in the same loop body."""
        ctx = self.ctx
        body = ctx.blocks[-1]
        if not isinstance(body, cst.IndentedBlock):
            return
        index = body.body.index(statement) if statement in body.body else -1
        binding = None
        for earlier in reversed(body.body[:index]):
            value = _assigned_value(earlier, name.value)
            if value is not None:
                binding = (earlier, value)
                break
        if binding is None or not isinstance(binding[1], (cst.Call, cst.IfExp)):
            return
        bound_stmt, value = binding
        elements = self.judge.classify(value, int_vars)
        found = Container(pattern, False, elements, [])
        blocks = blocks_of(found)
        if _inner_comprehension(elements):
            return
        leaves = leaves_of(found)
        site = ctx.site_maker(call, pattern, labels(leaves))
        compiled_here = any(_compiles_name(s, name.value) for s in body.body)
        if triage(ctx, site, call, leaves, blocks, pattern, compiled_here):
            return
        compile_stmt = emit.compile_element(ctx, cst.Name(name.value), elements, blocks)
        if compile_stmt is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        ctx.edits.after.setdefault(bound_stmt, []).append(compile_stmt)
        site(rewrite_code(blocks), "rewrite")

    def holds_modules(self, receiver: cst.BaseExpression) -> bool:
        """True if `receiver` is a module container, or a list that ends up in one."""
        ctx = self.ctx
        code = ctx.code(receiver)
        scope = ctx.scopes[-1]
        for value in scope.bindings.get(code, []):
            if isinstance(value, cst.Call) and ctx.container_kind(value):
                return True
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in ctx.facts.container_attrs:
            return True
        return code in _container_arguments(scope, ctx)


def _inner_comprehension(elements: list[Element]) -> bool:
    return any(e.kind == "nested" and not (e.inner and e.inner.literal) for e in elements)


def _container_arguments(scope: Scope, ctx: Context) -> set[str]:
    """Names passed whole to a container: `nn.Sequential(*layers)`, `nn.ModuleList(layers)`."""
    return {
        arg.value.value
        for call in scope.container_calls
        if ctx.container_kind(call)
        for arg in call.args
        if isinstance(arg.value, cst.Name)
    }


def _compiles_name(
    node: cst.CSTNode, var: str, spelled: Callable[[cst.BaseExpression], str | None] = dotted_name
) -> bool:
    """`var.compile(..)`, `_regionalize_dispatch(var, ..)`, or a loop over `var` compiling each item; an
    expression is compared with `var` as `spelled` writes it (`xs[-1]` has no dotted name: its code)."""
    for found in walk(node):
        if isinstance(found, cst.Call):
            func = found.func
            compiles = isinstance(func, cst.Attribute) and func.attr.value == "compile"
            if compiles and spelled(func.value) == var:
                return True
            if (
                dotted_name(func) in prescan.COMPILING_HELPERS
                and found.args
                and spelled(found.args[0].value) == var
            ):
                return True
        if (
            isinstance(found, cst.For)
            and isinstance(found.target, cst.Name)
            and spelled(found.iter) == var
            and _compiles_name(found.body, found.target.value)
        ):
            return True
    return False


def _assigned_value(statement: cst.BaseStatement, name: str) -> cst.BaseExpression | None:
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name) and target.value == name:
            return small.value
    return None


def _compiles_next(ctx: Context, statement: cst.BaseStatement, target: str) -> bool:
    """Does the statement after `statement` compile `target` (`xs[-1]`), as a run before wrote it?"""
    body = ctx.blocks[-1]
    if not isinstance(body, cst.IndentedBlock) or statement not in body.body:
        return False
    following = body.body[body.body.index(statement) + 1 :][:1]
    return any(_compiles_name(s, target, ctx.code) for s in following)


def _is_only_statement(statement: cst.BaseStatement, call: cst.Call) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    )
