"""The code written for a site: compile statements in place, wrapped or through the guard bypass, the loops
that compile a container's blocks, and the editor that applies the planned edits.

The calls are the public API's (`regionalize.compile_region(*self.layers, owner=self)`), built as LibCST
nodes from the finder's own nodes and from templates parsed once; the vendored form differs only by the line
that binds `regionalize` (`placement.py`). A loop
over a container's blocks whose body would be one call of their owner's is that call, with the blocks
starred (`_one_call`).

With `--guard-bypass`, a block compiled on its own (the per-block form) is compiled with `filter`'s
`guard_filter_fn` or through `depyf`'s dispatcher (the runtime's helpers); in the hierarchical form the
owner's helper takes `guard_bypass="<mode>"` and applies it to the owner's frame.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from functools import cache

import libcst as cst

from regionalize.codemod import int_edits
from regionalize.codemod.nodes import FastDispatch
from regionalize.codemod.patterns.context import Context
from regionalize.codemod.patterns.model import (
    COMPILED,
    Container,
    Edits,
    Element,
    blocks_of,
    dotted_name,
    holding,
)
from regionalize.shared import helpers
from regionalize.shared.options import CUDA_GRAPH_MODES, Options

_REGION = cst.parse_expression(helpers.COMPILE_REGION)
_DIRECT = cst.parse_expression(helpers.COMPILE_DIRECT)
_TORCH_COMPILE = cst.parse_expression("torch.compile")
_FILTER = cst.ensure_type(
    cst.parse_expression(f'f(options={{"guard_filter_fn": {helpers.public(helpers.GUARD_FILTER)}}})'),
    cst.Call,
).args[0]
_LAST = cst.ensure_type(cst.parse_expression("xs[-1]"), cst.Subscript)
_NO_SPACE = cst.SimpleWhitespace("")


def _keyword(name: str, value: object) -> cst.Arg:
    """`name=value`: a node as it is, a string double-quoted as Black writes it, others as `repr`."""
    if isinstance(value, cst.BaseExpression):
        literal = value
    else:
        literal = cst.SimpleString(json.dumps(value)) if isinstance(value, str) else cst.Name(repr(value))
    return cst.Arg(literal, keyword=cst.Name(name), equal=cst.AssignEqual(_NO_SPACE, _NO_SPACE))


@cache
def compile_kwargs(options: Options) -> tuple[cst.Arg, ...]:
    """`mode="max-autotune", fullgraph=True`: torch.compile's arguments the options ask for."""
    return tuple(_keyword(k, v) for k, v in options.compile_kwargs().items())


def _call(func: cst.BaseExpression, *args: cst.Arg) -> cst.Call:
    return cst.Call(func, list(args))


def last_of(receiver: cst.BaseExpression) -> cst.Subscript:
    """`receiver[-1]`: the block an append just added."""
    return _LAST.with_changes(value=receiver)


def compile_statement(ctx: Context, var: cst.BaseExpression, classes: Sequence[str] = ()) -> cst.Call:
    """The call that compiles the module `var`: its owner's region, or the module on its own."""
    kwargs = compile_kwargs(ctx.options)
    if ctx.owned():
        # A block that updates a cache of its own is traced again for every layer inside a plain region:
        # the runtime stands in for its layer of a transformers cache, found by the attribute the update
        # takes, and otherwise compiles the owner without regions.
        blocks = ctx.facts.cache_blocks
        cached = [blocks[n] for n in (name.rsplit(".", 1)[-1] for name in classes) if n in blocks]
        index = cached[0] if cached and all(cached) and len(set(cached)) == 1 else None
        cache = [_keyword("cache_index", index)] if index else [_keyword("nested", False)] if cached else []
        bypass = ctx.options.guard_bypass
        bypass_arg = [_keyword("guard_bypass", bypass)] if bypass != "none" else []
        saved = ctx.options.saved_owners
        saved_arg = [_keyword("saved", saved)] if saved is not None else []
        owner = _keyword(helpers.OWNER, cst.Name("self"))
        return _call(_REGION, cst.Arg(var), owner, *cache, *bypass_arg, *saved_arg, *kwargs)
    mode = ctx.options.guard_bypass
    if mode == "none":
        # Per-block CUDA graphs overwrite each other's outputs: with no owner, blocks compile without them.
        options = ctx.options
        if options.mode in CUDA_GRAPH_MODES:
            options = dataclasses.replace(options, mode="default")
        return _call(cst.Attribute(var, cst.Name("compile")), *compile_kwargs(options))
    if mode == "filter":
        return _call(cst.Attribute(var, cst.Name("compile")), *kwargs, _FILTER)
    return _call(_DIRECT, cst.Arg(var), *kwargs)


def _wrapped(mode: str, expr: cst.BaseExpression, kwargs: tuple[cst.Arg, ...]) -> cst.Call:
    """`torch.compile(Block(..))`, with the guard bypass where asked, for --style wrap (filter mode only)."""
    if mode == "none":
        return _call(_TORCH_COMPILE, cst.Arg(expr), *kwargs)
    if mode != "filter":
        raise ValueError(f"--guard-bypass {mode} compiles in place: it needs --style inplace")
    return _call(_TORCH_COMPILE, cst.Arg(expr), *kwargs, _FILTER)


def guarded_compile(
    ctx: Context, var: cst.BaseExpression, blocks: list[Element], mixed: bool
) -> cst.BaseStatement | None:
    """The compile statement, behind an isinstance test when other modules share the container."""
    statement = cst.SimpleStatementLine([cst.Expr(compile_statement(ctx, var, [e.label for e in blocks]))])
    if not mixed:
        return statement
    if any(e.call is None or e.func is None or ctx.dotted(e.call.func) == "copy.deepcopy" for e in blocks):
        return None  # no class to test against
    classes = list({e.label: e.func for e in blocks if e.func is not None}.values())
    test = classes[0] if len(classes) == 1 else _tuple(classes)
    check = _call(cst.Name("isinstance"), cst.Arg(var), cst.Arg(test))
    return cst.If(check, cst.IndentedBlock([statement]))


def _tuple(items: list[cst.BaseExpression]) -> cst.Tuple:
    return cst.Tuple([cst.Element(item) for item in items], lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def compile_element(
    ctx: Context, var: cst.BaseExpression, elements: list[Element], blocks: list[Element]
) -> cst.BaseStatement | None:
    """Compile the module held in `var`: one block, or the blocks of a ModuleList written out."""
    if any(e.kind == "nested" for e in elements):
        inner = elements[0].inner
        return compile_loop(ctx, inner, var) if len(elements) == 1 and inner is not None else None
    return guarded_compile(ctx, var, blocks, any(e.kind not in COMPILED for e in elements))


def compile_loop(ctx: Context, found: Container, iterable: cst.BaseExpression) -> cst.BaseStatement | None:
    """`for block in <iterable>: block.compile()`, descending into nested containers."""
    scope = ctx.scopes[-1]
    mixed = any(e.kind not in COMPILED for e in found.repeated + found.single)
    nested = [e for e in found.repeated if e.kind == "nested"]
    plain = isinstance(iterable, cst.Name) and not iterable.lpar
    var = scope.fresh("stage" if nested else "block", avoid=iterable.value if plain else "")  # type: ignore[attr-defined]
    source = _call(cst.Attribute(iterable, cst.Name("values"))) if found.dict_like else iterable
    if nested:
        if mixed and len(nested) != len(found.repeated + found.single):
            return None
        inner = nested[0].inner
        assert inner is not None
        body = compile_loop(ctx, inner, cst.Name(var))
        if body is None:
            return None
        return cst.For(target=cst.Name(var), iter=source, body=cst.IndentedBlock([body]))
    statement = guarded_compile(ctx, cst.Name(var), blocks_of(found), mixed)
    if statement is None:
        return None
    if (one := _one_call(ctx, statement, var, source)) is not None:
        return one
    return cst.For(target=cst.Name(var), iter=source, body=cst.IndentedBlock([statement]))


def _one_call(
    ctx: Context, statement: cst.BaseStatement, var: str, source: cst.BaseExpression
) -> cst.BaseStatement | None:
    """`regionalize.compile_region(*SOURCE, owner=self, ...)` for the loop `for VAR in SOURCE: STATEMENT`
    where the statement is `compile_region(VAR, owner=self, ...)`; None for any other loop, and for one
    that the call would not say as well on one line: a source over lines, or holding `#` or `\\`, or
    arguments that read the block."""
    call = _only_call(statement)
    if call is None or dotted_name(call.func) != helpers.COMPILE_REGION or len(call.args) < 2:
        return None
    first = call.args[0].value
    written = ctx.code(source)
    if not isinstance(first, cst.Name) or first.value != var or any(c in written for c in "\n#\\"):
        return None
    reads = re.compile(rf"\b{re.escape(var)}\b")
    if any("#" in text or "\\" in text or reads.search(text) for text in map(ctx.code, call.args[1:])):
        return None
    if source.lpar:  # a parenthesized source reads as it is inside its parentheses
        source = source.with_changes(lpar=[], rpar=[])
    if not isinstance(source, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        source = source.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    starred = call.with_changes(args=[cst.Arg(source, star="*"), *call.args[1:]])
    return statement.with_changes(body=[cst.Expr(starred)])


def _only_call(statement: cst.BaseStatement) -> cst.Call | None:
    """The call a statement of one expression makes."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            return small.value
    return None


def wrap(ctx: Context, element: Element) -> None:
    """--style wrap: the call that builds the block becomes `torch.compile(Block(..))`."""
    if element.kind == "nested" and element.inner is not None:
        for inner in blocks_of(element.inner):
            wrap(ctx, inner)
    elif element.call is not None:
        ctx.edits.wrap.add(element.call)
        ctx.edits.needs_torch = True


class Editor(FastDispatch, cst.CSTTransformer):
    """Applies the edits planned for `module`, keyed by its nodes; nothing else is touched.

    The walk goes down only into the nodes that hold an edited one: LibCST rebuilds every node it passes,
    and an edit or two in a method is the common case."""

    def __init__(self, edits: Edits, module: cst.Module) -> None:
        self.edits = edits
        fixes = edits.fixes
        edited = {*edits.wrap, *edits.after, *edits.split, *fixes.eager, *fixes.setitem, *fixes.decorate}
        self.path = holding(module, edited)

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self.path and super().on_visit(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node in self.edits.fixes.eager:
            return int_edits.eager(updated_node)
        if original_node not in self.edits.wrap:
            return updated_node
        return _wrapped(self.edits.options.guard_bypass, updated_node, compile_kwargs(self.edits.options))

    def leave_Subscript(
        self, original_node: cst.Subscript, updated_node: cst.Subscript
    ) -> cst.BaseExpression:
        return int_edits.eager(updated_node) if original_node in self.edits.fixes.eager else updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.BaseSmallStatement:
        return int_edits.setitem(updated_node) if original_node in self.edits.fixes.setitem else updated_node

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        newline = self.edits.fixes.decorate.get(original_node)
        return updated_node if newline is None else int_edits.decorated(updated_node, newline)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return updated_node.with_changes(body=self.body(original_node.body, updated_node.body))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self.body(original_node.body, updated_node.body))

    def body(self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list:
        out: list[cst.BaseStatement] = []
        for before, after in zip(original, updated, strict=True):
            out += self.edits.split.get(before, [after])
            out += self.edits.after.get(before, [])
        return out
