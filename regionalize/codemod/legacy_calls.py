"""Files that an earlier release rewrote with a vendored copy call its private helpers
(`_regionalize_blocks(block, self)`, frozen in `shared/helpers.py`); the codemod's passes read and write the
public API's calls. Such a file is read as those calls (`to_public`, every line where it was, so that its
sites keep their lines), and once rewritten its loops over blocks become one call each (`collapse`), as
the import form writes them. Both are LibCST transforms over the whole file, run only for a file that
names a helper (`holds`): a rare path, where a parse of the whole file costs nothing that matters.
"""

from __future__ import annotations

import re

import libcst as cst

from regionalize.shared import helpers

_KEEP = "_regionalize_"  # every helper's name starts so: a file without it calls none


def holds(code: str) -> bool:
    """Does `code` name a helper of an earlier release? (A string test: most files do not.)"""
    return _KEEP in code and any(name in code for name in helpers.PUBLIC)


def to_public(code: str) -> str:
    """`code` with each helper read as the public call (`regionalize.compile_region(block, owner=self)`);
    names bound (a definition, a target, an import) stay, for `collisions.py` to find. `code` where it
    does not parse: the codemod's own parse reports it."""
    try:
        return cst.parse_module(code).visit(_ToPublic()).code
    except (cst.ParserSyntaxError, RecursionError):
        return code


def collapse(code: str) -> str:
    """`code` with each loop `for block in ITER: regionalize.compile_region(block, owner=OWNER, ...)` as one
    call, `regionalize.compile_region(*ITER, owner=OWNER, ...)`, where the call says all the loop does on
    one line: no comment or line continuation in the loop, arguments on one line that do not read the
    block."""
    if helpers.COMPILE_REGION not in code:
        return code
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    return module.visit(_Collapse(module)).code


class _ToPublic(cst.CSTTransformer):
    """Helper names read (not bound) become the public calls; `_regionalize_blocks(block, self)`'s owner,
    positional there, becomes the keyword the API takes."""

    def __init__(self) -> None:
        self.bound: set[cst.Name] = set()  # names in places that bind or name, not read

    def _bind(self, *nodes: object) -> None:
        self.bound.update(n for n in nodes if isinstance(n, cst.Name))

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._bind(node.attr)

    def visit_Arg(self, node: cst.Arg) -> None:
        self._bind(node.keyword)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._bind(node.name)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_NameItem(self, node: cst.NameItem) -> None:
        self._bind(node.name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target)

    def visit_MatchAs(self, node: cst.MatchAs) -> None:
        self._bind(node.name)

    def visit_MatchStar(self, node: cst.MatchStar) -> None:
        self._bind(node.name)

    def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
        self._bind(node.rest)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node in self.bound or original_node.value not in helpers.PUBLIC:
            return updated_node
        name = helpers.PUBLIC[original_node.value]
        return cst.Attribute(
            cst.Name(helpers.MODULE), cst.Name(name), lpar=updated_node.lpar, rpar=updated_node.rpar
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        positional = [a for a in updated_node.args if a.keyword is None and a.star != "**"]
        if not (isinstance(func, cst.Name) and func.value == helpers.BLOCKS and len(positional) == 2):
            return updated_node
        owner = positional[1]
        if owner.star or updated_node.args.index(owner) != 1:
            return updated_node
        equal = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
        named = owner.with_changes(keyword=cst.Name(helpers.OWNER), equal=equal)
        return updated_node.with_changes(args=[updated_node.args[0], named, *updated_node.args[2:]])


class _Collapse(cst.CSTTransformer):
    def __init__(self, module: cst.Module) -> None:
        self.code = module.code_for_node

    def leave_For(
        self, original_node: cst.For, updated_node: cst.For
    ) -> cst.BaseStatement | cst.RemovalSentinel:
        text = self._one_call(updated_node)
        if text is None:
            return updated_node
        statement = cst.parse_statement(text)
        return statement.with_changes(leading_lines=updated_node.leading_lines)

    def _one_call(self, loop: cst.For) -> str | None:
        body = loop.body.body
        if not (
            isinstance(loop.target, cst.Name)
            and loop.orelse is None
            and loop.asynchronous is None
            and len(body) == 1
            and isinstance(line := body[0], (cst.SimpleStatementLine, cst.BaseSmallStatement))
        ):
            return None
        small = line.body if isinstance(line, cst.SimpleStatementLine) else [line]
        expr = small[0] if len(small) == 1 else None
        if not (isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call)):
            return None
        call, var = expr.value, loop.target.value
        args = list(call.args)
        if not (
            self.code(call.func) == helpers.COMPILE_REGION
            and len(args) >= 2
            and args[0].keyword is None
            and not args[0].star
            and self.code(args[0].value) == var
            and args[1].keyword is not None
            and args[1].keyword.value == helpers.OWNER
        ):
            return None
        text = self.code(loop.with_changes(leading_lines=[]))
        iterable = self.code(loop.iter.with_changes(lpar=[], rpar=[]))
        rest = [self._argument(a) for a in args[1:]]
        if "#" in text or "\\" in text or "\n" in iterable or any("\n" in r for r in rest):
            return None
        if any(re.search(rf"\b{re.escape(var)}\b", r) for r in rest):
            return None  # an argument that reads the block
        if not isinstance(loop.iter, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
            iterable = f"({iterable})"
        return f"{helpers.COMPILE_REGION}({', '.join([f'*{iterable}', *rest])})\n"

    def _argument(self, arg: cst.Arg) -> str:
        empty = cst.SimpleWhitespace("")
        return self.code(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=empty))
