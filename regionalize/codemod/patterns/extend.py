"""Pattern family: blocks added to a container in one statement, `xs.extend([Block(..) for ..])` or
`xs += [Block(..) for ..]`; they are bound to a name, compiled, then added (the name when it is one)."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from regionalize.codemod.patterns import emit
from regionalize.codemod.patterns.context import Context
from regionalize.codemod.patterns.model import Container, blocks_of, first_label, leaves_of, rewrite_code
from regionalize.codemod.patterns.triage import triage

# expression -> the repeated elements it adds, None when nothing repeats: the container patterns'
# reader, passed in from above (patterns do not import each other).
ReadElements = Callable[[cst.BaseExpression], Container | None]
HoldsModules = Callable[[cst.BaseExpression], bool]


class ExtendSites:
    def __init__(self, ctx: Context, read: ReadElements, holds_modules: HoldsModules) -> None:
        self.ctx = ctx
        self.read = read
        self.holds_modules = holds_modules

    def visit_call(self, call: cst.Call) -> None:
        args = call.args
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "extend") or len(args) != 1:
            return
        if args[0].keyword is not None or args[0].star:
            return
        statement = self._only_statement(lambda small: isinstance(small, cst.Expr) and small.value is call)
        if statement is not None:
            self._site(statement, call, call.func.value, args[0].value, "extend")

    def visit_aug_assign(self, node: cst.AugAssign) -> None:
        if isinstance(node.operator, cst.AddAssign):
            statement = self._only_statement(lambda small: small is node)
            if statement is not None:
                self._site(statement, node, node.target, node.value, "augmented-add")

    def _only_statement(
        self, test: Callable[[cst.BaseSmallStatement], bool]
    ) -> cst.SimpleStatementLine | None:
        statement = self.ctx.statements[-1] if self.ctx.statements else None
        if (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and test(statement.body[0])
        ):
            return statement
        return None

    def _site(
        self,
        statement: cst.SimpleStatementLine,
        node: cst.CSTNode,
        receiver: cst.BaseExpression,
        added: cst.BaseExpression,
        pattern: str,
    ) -> None:
        ctx = self.ctx
        if not self.holds_modules(receiver):
            return
        found = self.read(added)
        if found is None:
            return
        found.pattern = pattern
        blocks = blocks_of(found)
        site = ctx.site_maker(
            node, pattern, " | ".join(dict.fromkeys(e.label for e in blocks)) or first_label(found)
        )
        compiled = isinstance(added, cst.Name) and ctx.already_compiled_iterable(added)
        if triage(ctx, site, statement, leaves_of(found), blocks, pattern, compiled):
            return
        if not isinstance(ctx.blocks[-1], (cst.IndentedBlock, cst.Module)):
            return site("RGZ106", "skip")
        if isinstance(added, cst.Name):  # `xs.extend(layers)`: compile them just before
            loop = emit.compile_loop(ctx, found, cst.Name(added.value))
            new_statements = [statement]
        else:
            name = ctx.scopes[-1].fresh("blocks")
            # Its own name per site: a second pass must find the one list each name is bound to.
            ctx.scopes[-1].names.add(name)
            loop = emit.compile_loop(ctx, found, cst.Name(name))
            value = added
            if isinstance(added, cst.GeneratorExp):  # the loop would exhaust a generator
                value = cst.ListComp(elt=added.elt, for_in=added.for_in)
            bind = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])
            new_statements = [bind, statement.deep_replace(added, cst.Name(name))]
        if loop is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        # The loop goes right before the statement that adds the blocks.
        new_statements.insert(-1, loop)
        first, *rest = [s.with_changes(leading_lines=[]) for s in new_statements]
        ctx.edits.split[statement] = [first.with_changes(leading_lines=statement.leading_lines), *rest]
        site(rewrite_code(blocks), "rewrite")
