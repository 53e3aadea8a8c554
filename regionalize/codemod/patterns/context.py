"""The finder's walk of one piece (`parse_spans.py`): the scopes, loops, suites and statements around the
node at hand, the file's names resolved, and the sites, edits and per-block integers the patterns record."""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst
from libcst.metadata import CodePosition, PositionProvider

from regionalize.codemod import int_fixes, parse_spans, prescan
from regionalize.codemod.declarations import Declaration
from regionalize.codemod.nodes import FastDispatch, split_lines
from regionalize.codemod.patterns.ints import Targets, int_targets, rate_targets
from regionalize.codemod.patterns.model import Edits, Scope, dotted_name
from regionalize.shared.options import Options
from regionalize.shared.sites import CODES, Site

# The end of an RGZ001 site line in the hierarchical form, and where the blocks' cache is not stood in for.
OWNED = "nested regions of their owner, compiled whole"
# Where torch reuses no traced region, the runtime compiles the owner's graph in pieces, each distinct block
# once; with a backend other than Inductor, the blocks one by one.
UNREUSED = {True: " (in pieces on torch 2.11)", False: " (per block on torch 2.11)"}
OWNED_WITHOUT_REGIONS = "their owner compiled whole, without regions (a cache not stood in for)"
STAGES = "the stages' blocks nested regions of this owner, compiled whole"
# An RGZ001 site compiled block by block says why: the form asked for, or no owner to compile whole.
PER_BLOCK_ASKED = {
    "per-block": "per block, as --form per-block asks",
    "wrap": "per block, as --style wrap asks",
}
PER_BLOCK_UNOWNED = "per block: no owner known (not built in a method of a module with a forward of its own)"
SKIP_COMMENT = re.compile(r"#\s*regionalize:\s*skip\b")

SiteMaker = Callable[..., None]  # site(code, action, hint=""): records the site's line


class Traversal(FastDispatch, cst.CSTVisitor):
    """Keeps the scopes, loops, suites and statements around the node at hand as the walk meets them."""

    def __init__(self, module: cst.Module, containers: set[str]) -> None:
        self.module = module
        self.containers = containers  # the names a container class may be spelled with, for the scopes
        self.scopes: list[Scope] = []
        self.loops: list[cst.For | cst.While] = []  # loops of the innermost function only
        self.loop_stack_saved: list[list[cst.For | cst.While]] = []
        self.blocks: list[cst.BaseSuite | cst.Module] = []
        self.statements: list[cst.BaseStatement] = []
        self.class_bodies: set[cst.BaseSuite] = set()

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(Scope(node, node, self.containers))
        self.blocks.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_bodies.add(node.body)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(Scope(node, self.module, self.containers))
        self.loop_stack_saved.append(self.loops)
        self.loops = []

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()
        self.loops = self.loop_stack_saved.pop()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.append(node)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock) -> None:
        self.blocks.pop()

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        self.blocks.append(node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite) -> None:
        self.blocks.pop()

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def leave_For(self, original_node: cst.For) -> None:
        self.loops.pop()

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)

    def leave_While(self, original_node: cst.While) -> None:
        self.loops.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statements.append(node)

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self.statements.pop()

    def loop_int_vars(self) -> set[str]:
        return self._loop_vars(int_targets)

    def loop_rate_vars(self) -> frozenset[str]:
        """The enclosing loops' variables that take a rate (`for r in dpr:`)."""
        return frozenset(self._loop_vars(rate_targets))

    def _loop_vars(self, targets: Targets) -> set[str]:
        names: set[str] = set()
        for loop in self.loops:
            if isinstance(loop, cst.For):
                names |= targets(loop.target, loop.iter)
        return names


class Context(Traversal):
    """The traversal state the patterns read, the file's names resolved, and the sites, edits and per-block
    integers the patterns record; a subclass adds the visits that find the sites."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(
        self,
        module: cst.Module,
        options: Options,
        facts: prescan.FileFacts,
        span: parse_spans.Span,
        text: str,
        edits: Edits,
    ):
        super().__init__(module, facts.container_names())
        self.options = options
        self.facts = facts
        self.span = span
        self.lines = split_lines(text)  # the text parsed: what `module.code` would generate again
        self.sites: list[Site] = []
        self.edits = edits
        self.int_args: list[int_fixes.IntArgs] = []  # blocks built with a per-iteration integer

    # -- name resolution --------------------------------------------------------------------------
    def dotted(self, expr: cst.BaseExpression) -> str | None:
        """`nn.ModuleList` -> `torch.nn.ModuleList` through the file's imports and aliases."""
        name = dotted_name(expr)
        return None if name is None else self.facts.resolve(name)

    def container_kind(self, call: cst.Call) -> str | None:
        name = dotted_name(call.func)
        return None if name is None else self.facts.container_kind(name)

    def is_torch_compile(self, call: cst.Call) -> bool:
        return self.dotted(call.func) in ("torch.compile", "torch.compiler.compile")

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def already_compiled_iterable(self, target: cst.BaseExpression) -> bool:
        compiled = self.facts.compiled_iterables
        if dotted_name(target) in compiled:
            return True
        return isinstance(target, cst.Attribute) and f".{target.attr.value}" in compiled

    # -- sites ------------------------------------------------------------------------------------
    def skip_comment(self, node: cst.CSTNode) -> bool:
        statement = self.statements[-1] if self.statements else node
        start = self.get_metadata(PositionProvider, statement).start.line
        end = self.get_metadata(PositionProvider, node).end.line
        return any(SKIP_COMMENT.search(line) for line in self.lines[start - 1 : end])

    def site_maker(self, node: cst.CSTNode, pattern: str, block: str) -> SiteMaker:
        position = self.get_metadata(PositionProvider, node).start

        def add(code: str, action: str, hint: str = "") -> None:
            reason = "" if action == "rewrite" else CODES[code] + (f"; {hint}" if hint else "")
            if code == "RGZ001":
                reason = (
                    OWNED + UNREUSED[self.options.backend == "inductor"] if self.owned() else self.per_block()
                )
            elif code == "RGZ006":
                reason = STAGES + UNREUSED[self.options.backend == "inductor"]
            self.sites.append(Site(*self.where(position), code, pattern, block, action, reason))

        return add

    def per_block(self) -> str:
        """Why an RGZ001 site is compiled block by block: the form asked for, or no owner known."""
        if self.options.hierarchical:
            return PER_BLOCK_UNOWNED
        return PER_BLOCK_ASKED["per-block" if self.options.form == "per-block" else "wrap"]

    def owned(self) -> bool:
        """Hierarchical: the blocks are built in a method of a class with a forward of its own, which calls
        them and is compiled whole around them. Elsewhere (module level, a function returning the
        container, a holder without forward) no owner is known, and each block is compiled on its own."""
        if not self.options.hierarchical or "self" not in self.scopes[-1].params:
            return False
        start, end = self.function_lines()
        return any(first <= start and end <= last for first, last in self.facts.owners)

    def declaration(self) -> Declaration | None:
        """The declaration of repeated blocks that holds where the piece is, unless the piece is a method
        of a declared class: blocks repeated inside a declared block are a finer level of it."""
        start, end = self.function_lines()
        around = [(first, name) for name, first, last in self.facts.classes if first <= start and end <= last]
        scope = max(around)[1] if around else None
        declared = self.facts.declaration_over(scope)
        if declared is None or (scope is not None and self.facts.declaring(scope)):
            return None
        return declared

    def function_lines(self) -> tuple[int, int]:
        """The file's lines of the function at hand; the piece's at module level. A piece is one method
        but for a file or class that cannot be cut (two statements on a line)."""
        node = self.scopes[-1].node
        if not isinstance(node, cst.FunctionDef):
            return self.span.start, self.span.end
        span = self.get_metadata(PositionProvider, node)
        return self.where(span.start)[0], self.where(span.end)[0]

    def where(self, position: CodePosition) -> tuple[int, int]:
        """Line and 1-based column in the file, from a position in the piece."""
        return position.line + self.span.start - 1, position.column + 1 + len(self.span.indent)
