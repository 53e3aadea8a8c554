"""The code written for a site: compile statements in place, wrapped or through the guard bypass, the loops
that compile a container's blocks, and the editor that applies the planned edits.

The calls are the public API's, built as LibCST nodes (`regionalize.compile_region(*self.layers,
owner=self)`); the vendored form differs only by the line that binds `regionalize` (`placement.py`). A loop
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

import libcst as cst

from regionalize.codemod.nodes import FastDispatch
from regionalize.codemod.patterns.context import Context
from regionalize.codemod.patterns.model import COMPILED, Container, Edits, Element, blocks_of
from regionalize.shared import helpers
from regionalize.shared.options import CUDA_GRAPH_MODES, Options


def kwargs_source(options: Options) -> str:
    """`mode="max-autotune", fullgraph=True`: Python literals, double-quoted as Black writes them."""
    items = options.compile_kwargs().items()
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, str) else repr(v)}" for k, v in items)


def compile_statement(ctx: Context, var: str, classes: Sequence[str] = ()) -> str:
    if ctx.owned():
        # A block that updates a cache of its own is traced again for every layer inside a plain region:
        # the runtime stands in for its layer of a transformers cache, found by the attribute the update
        # takes, and otherwise compiles the owner without regions.
        blocks = ctx.facts.cache_blocks
        cached = [blocks[n] for n in (name.rsplit(".", 1)[-1] for name in classes) if n in blocks]
        index = cached[0] if cached and all(cached) and len(set(cached)) == 1 else None
        cache = f"cache_index={json.dumps(index)}" if index else "nested=False" if cached else ""
        bypass = ctx.options.guard_bypass
        bypass = f"guard_bypass={json.dumps(bypass)}" if bypass != "none" else ""
        saved = ctx.options.saved_owners
        saved = f"saved={saved}" if saved is not None else ""
        parts = (var, f"{helpers.OWNER}=self", cache, bypass, saved, ctx.edits.kwargs)
        return f"{helpers.COMPILE_REGION}({', '.join(p for p in parts if p)})"
    mode = ctx.options.guard_bypass
    if mode == "none":
        # Per-block CUDA graphs overwrite each other's outputs: with no owner, blocks compile without them.
        options = ctx.options
        if options.mode in CUDA_GRAPH_MODES:
            options = dataclasses.replace(options, mode="default")
        return f"{var}.compile({kwargs_source(options)})"
    return _bypass_statement(mode, var, ctx.edits.kwargs)


def _bypass_statement(mode: str, var: str, kwargs_src: str) -> str:
    """One statement that compiles module `var` in place with the guard bypass."""
    if mode == "filter":
        return f"{var}.compile({_join(kwargs_src, _FILTER_OPTION)})"
    return f"{helpers.COMPILE_DIRECT}({_join(var, kwargs_src)})"


def _bypass_expression(mode: str, expr_src: str, kwargs_src: str) -> str:
    """`torch.compile(Block(..))` with the guard bypass, for --style wrap (filter mode only)."""
    if mode != "filter":
        raise ValueError(f"--guard-bypass {mode} compiles in place: it needs --style inplace")
    return f"torch.compile({_join(expr_src, kwargs_src, _FILTER_OPTION)})"


_FILTER_OPTION = f'options={{"guard_filter_fn": {helpers.public(helpers.GUARD_FILTER)}}}'


def _join(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def guarded_compile(ctx: Context, var: str, blocks: list[Element], mixed: bool) -> str | None:
    """The compile statement, behind an isinstance test when other modules share the container."""
    statement = compile_statement(ctx, var, [e.label for e in blocks])
    if not mixed:
        return statement
    if any(e.call is None or ctx.dotted(e.call.func) == "copy.deepcopy" for e in blocks):
        return None  # no class to test against
    names = list(dict.fromkeys(e.label for e in blocks))
    test = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    return f"if isinstance({var}, {test}):\n{ctx.module.default_indent}{statement}"


def compile_element(
    ctx: Context, var: str, elements: list[Element], blocks: list[Element]
) -> cst.BaseStatement | None:
    """Compile the module held in `var`: one block, or the blocks of a ModuleList written out."""
    if any(e.kind == "nested" for e in elements):
        inner = elements[0].inner
        return compile_loop(ctx, inner, var) if len(elements) == 1 and inner is not None else None
    statement = guarded_compile(ctx, var, blocks, any(e.kind not in COMPILED for e in elements))
    return None if statement is None else cst.parse_statement(statement + "\n", ctx.module.config_for_parsing)


def compile_loop(ctx: Context, found: Container, iterable: str) -> cst.BaseStatement | None:
    """`for block in <iterable>: block.compile()`, descending into nested containers."""
    scope = ctx.scopes[-1]
    mixed = any(e.kind not in COMPILED for e in found.repeated + found.single)
    nested = [e for e in found.repeated if e.kind == "nested"]
    var = scope.fresh("stage" if nested else "block", avoid=iterable)
    source = f"{iterable}.values()" if found.dict_like else iterable
    if nested:
        if mixed and len(nested) != len(found.repeated + found.single):
            return None
        inner = nested[0].inner
        assert inner is not None
        body = compile_loop(ctx, inner, var)
        if body is None:
            return None
        return cst.For(
            target=cst.Name(var),
            iter=cst.parse_expression(source),
            body=cst.IndentedBlock([body]),
        )
    statement = guarded_compile(ctx, var, blocks_of(found), mixed)
    if statement is None:
        return None
    if (one := _one_call(statement, var, source)) is not None:
        return cst.parse_statement(one, config=ctx.module.config_for_parsing)
    indent = ctx.module.default_indent
    text = f"for {var} in {source}:\n" + "".join(indent + line + "\n" for line in statement.splitlines())
    return cst.parse_statement(text, config=ctx.module.config_for_parsing)


def _one_call(statement: str, var: str, source: str) -> str | None:
    """`regionalize.compile_region(*SOURCE, owner=self, ...)` for the loop `for VAR in SOURCE: STATEMENT`
    where the statement is `compile_region(VAR, owner=self, ...)`; None for any other loop, and for one
    that the call would not say as well on one line: a source over lines, or holding `#` or `\\`, or
    arguments that read the block."""
    head = f"{helpers.COMPILE_REGION}({var}, "
    if not statement.startswith(head) or "\n" in source or "#" in source or "\\" in source:
        return None
    rest = statement[len(head) :]
    if "#" in rest or "\\" in rest or re.search(rf"\b{re.escape(var)}\b", rest):
        return None
    try:
        iterable = cst.parse_expression(source)
    except cst.ParserSyntaxError:
        return None
    if iterable.lpar:  # a parenthesized source reads as it is inside its parentheses
        source = cst.Module([]).code_for_node(iterable.with_changes(lpar=[], rpar=[]))
    if not isinstance(iterable, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)):
        source = f"({source})"
    return f"{helpers.COMPILE_REGION}(*{source}, {rest}"


def wrap(ctx: Context, element: Element) -> None:
    """--style wrap: the call that builds the block becomes `torch.compile(Block(..))`."""
    if element.kind == "nested" and element.inner is not None:
        for inner in blocks_of(element.inner):
            wrap(ctx, inner)
    elif element.call is not None:
        ctx.edits.wrap.add(element.call)
        ctx.edits.needs_torch = True


class Editor(FastDispatch, cst.CSTTransformer):
    """Applies the edits the finder planned, keyed by the original nodes; nothing else is touched."""

    def __init__(self, edits: Edits) -> None:
        self.edits = edits

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.edits.wrap:
            return updated_node
        options = self.edits.options
        if options.guard_bypass != "none":
            source = _bypass_expression(
                options.guard_bypass, cst.Module([]).code_for_node(updated_node), self.edits.kwargs
            )
            return cst.parse_expression(source)
        kwargs = f", {self.edits.kwargs}" if self.edits.kwargs else ""
        call = cst.parse_expression(f"torch.compile(block{kwargs})")
        assert isinstance(call, cst.Call)
        return call.with_changes(args=[call.args[0].with_changes(value=updated_node), *call.args[1:]])

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
