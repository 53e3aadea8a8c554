"""The LibCST codemod: find containers of repeated blocks and compile each block regionally.

Analysis and editing are separate passes. `_Finder` walks the module once, decides every site (rewrite
or skip, with a reason) and records the edits as plain data keyed by the original nodes; `_Editor` then
applies them. Nothing is rewritten unless the finder proved the site, so a skipped site is never touched.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodePosition, MetadataWrapper, PositionProvider

from regionalize import guard_bypass, per_block_ints, prescan
from regionalize.options import Options
from regionalize.report import CODES, Site

# torch.nn classes that are themselves repeated blocks; every other torch.nn class is a leaf layer.
TORCH_COMPOSITES = {
    "Transformer",
    "TransformerEncoder",
    "TransformerDecoder",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
}
# Class names from other libraries (timm's DropPath, Llama's RMSNorm, ...) that name single layers.
LEAF_NAME = re.compile(
    r"(Linear|Conv[123]d|Conv|ConvTranspose[123]d|Norm|Norm[123]d|Dropout|Dropout[123]d|DropPath|Identity"
    r"|Embedding|ReLU|GELU|SiLU|Sigmoid|Tanh|Softmax|Activation|Pool|Pool[123]d|Upsample|Flatten)$"
)
# Lower-case callables: parameters holding a class, and factory functions, judged by their names.
LEAF_PARAMETER = re.compile(r"norm|act|drop|pool|conv|linear|embed|proj|zero", re.IGNORECASE)
BLOCK_FACTORY = re.compile(r"block|layer|stage", re.IGNORECASE)
SKIP_COMMENT = re.compile(r"#\s*regionalize:\s*skip\b")
# Cheap pre-filter: a file without any of these words has no site, so it is never parsed.
TRIGGERS = ("ModuleList", "Sequential", "ModuleDict", "add_module")
DEFAULT_OPTIONS = Options()


@dataclass
class TransformResult:
    """Like LibCST's codemod results: status is "success", "skip" (with a reason) or "failure"."""

    status: str
    code: str
    sites: list[Site] = field(default_factory=list)
    reason: str = ""

    @property
    def changed(self) -> bool:
        return self.status == "success"


def might_have_sites(source: str) -> bool:
    return any(word in source for word in TRIGGERS)


def transform_source(source: str, options: Options = DEFAULT_OPTIONS) -> TransformResult:
    """Rewrite `source`; never raises on bad input: a parse error is a "failure" with its reason."""
    if not might_have_sites(source):
        return TransformResult("skip", source, reason="no module containers")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return TransformResult("failure", source, reason=f"cannot parse: line {exc.lineno}: {exc.msg}")
    except (ValueError, MemoryError, RecursionError) as exc:
        return TransformResult("failure", source, reason=f"cannot parse: {_one_line(exc)}")
    lines = source.splitlines(keepends=True)
    found = _compile_containers(tree, lines, options)
    if isinstance(found, TransformResult):
        return found
    fixes = per_block_ints.plan(tree, source, found.int_args)
    sites = sorted(found.sites + fixes.sites, key=lambda s: (s.line, s.col, s.code))
    helpers = [found.helper] if found.helper else []
    if fixes:
        # The forwards get their insertions first; the containers are then compiled in that text (the
        # same decisions: a forward holds no container site), and the sites keep the original lines.
        lines = fixes.apply(lines).splitlines(keepends=True)
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError as exc:  # a bug of ours, as below
            return TransformResult("failure", source, sites, reason=f"rewrite does not parse: {exc.msg}")
        found = _compile_containers(tree, lines, options)
        assert not isinstance(found, TransformResult)
        helpers += fixes.helpers()
    if not found.changed and not fixes:
        return TransformResult("skip", source, sites, reason="nothing to rewrite")
    code = _add_helpers(found.lines, tree, found, helpers, found.needs_torch or bool(fixes))
    try:
        ast.parse(code)
    except SyntaxError as exc:  # a bug of ours: refuse to hand out code that does not parse
        return TransformResult("failure", source, sites, reason=f"rewrite does not parse: {exc.msg}")
    return TransformResult("success", code, sites)


@dataclass
class _Pass:
    """The containers of one file compiled: its lines with every rewritten region replaced."""

    lines: list[str]
    facts: prescan.FileFacts
    sites: list[Site]
    int_args: list[per_block_ints.IntArgs]
    first_region: int  # first line of the first rewritten region; 0 when none was
    needs_torch: bool = False
    helper: str | None = None

    @property
    def changed(self) -> bool:
        return self.first_region > 0


def _compile_containers(tree: ast.Module, lines: list[str], options: Options) -> _Pass | TransformResult:
    facts = prescan.scan(tree)
    result = _Pass(list(lines), facts, [], [], 0)
    replaced: list[tuple[prescan.Region, str]] = []
    for region in prescan.regions(tree, lines):
        try:
            module = cst.parse_module(region.extract(lines))
        except cst.ParserSyntaxError as exc:
            line = exc.raw_line + region.start - 1
            return TransformResult(
                "failure", "".join(lines), reason=f"cannot parse: line {line}: {exc.message}"
            )
        finder = _Finder(module, options, facts, region)
        MetadataWrapper(module, unsafe_skip_copy=True).visit(finder)
        result.sites += finder.sites
        result.int_args += finder.int_args
        if finder.edits:
            replaced.append((region, region.restore(module.visit(_Editor(finder.edits)).code)))
            result.needs_torch |= finder.edits.needs_torch
            result.helper = result.helper or finder.edits.helper
    for region, text in reversed(replaced):
        result.lines[region.start - 1 : region.end] = [text]
    result.first_region = replaced[0][0].start if replaced else 0
    return result


def _add_helpers(lines: list[str], tree: ast.Module, found: _Pass, helpers: list[str], torch: bool) -> str:
    """Module-level helpers after the imports, and `import torch` where isort would put it."""
    facts = found.facts
    lines = list(lines)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    torch_at, helper_at = prescan.insert_lines(tree)
    if found.changed and helper_at > found.first_region - 1:  # a rewritten region above the imports: rare
        torch_at = helper_at = 0
    for helper in reversed(helpers):
        if _helper_name(helper) not in facts.top_level_defs:
            lines[helper_at:helper_at] = [newline, newline, helper.replace("\n", newline)]
    if torch and not facts.torch_bound:
        lines[torch_at:torch_at] = [f"import torch{newline}"]
    return "".join(lines)


def _helper_name(helper: str) -> str:
    match = re.search(r"^def (\w+)", helper, re.M)
    return match.group(1) if match else ""


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


_SiteMaker = Callable[..., None]  # site(code, action, hint=""): records the site's line


@dataclass
class _Edits:
    wrap: set[cst.Call] = field(default_factory=set)  # element calls to wrap in torch.compile(...)
    after: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    split: dict[cst.BaseStatement, list[cst.BaseStatement]] = field(default_factory=dict)
    needs_torch: bool = False
    helper: str | None = None  # module-level source the guard bypass needs
    kwargs: str = ""
    options: Options = field(default_factory=Options)

    def __bool__(self) -> bool:
        return bool(self.wrap or self.after or self.split)


@dataclass
class _Element:
    kind: str  # "block", "compiled", "leaf", "other", "excluded" or "nested"
    label: str
    call: cst.Call | None = None
    inner: _Container | None = None  # the inner container of a "nested" element
    int_vars: frozenset[str] = frozenset()  # integer loop variables in scope where it is built


@dataclass
class _Container:
    pattern: str
    dict_like: bool
    repeated: list[_Element]  # elements built once per iteration
    single: list[_Element]  # elements that stand once, beside the repeated ones
    literal: bool = False  # `nn.ModuleList([Attention(..), FeedForward(..)])` built once per iteration


class _Scope:
    """What the finder knows about one function body (or the module body)."""

    def __init__(self, node: cst.CSTNode, module: cst.Module) -> None:
        self.bindings: dict[str, list[cst.BaseExpression]] = {}
        self.names: set[str] = set()
        self.container_calls: list[cst.Call] = []  # calls spelled like a container, resolved later
        self.params: set[str] = set()
        if isinstance(node, cst.FunctionDef):
            parameters = node.params
            every = [*parameters.posonly_params, *parameters.params, *parameters.kwonly_params]
            self.params = {p.name.value for p in every}
        node.visit(_ScopeCollector(self, module))

    def fresh(self, base: str, avoid: str = "") -> str:
        """A name the function does not use (nor `avoid`), so the inserted loop shadows nothing."""
        name, n = base, 1
        while name in self.names or name == avoid:
            n += 1
            name = f"{base}{n}"
        return name


class _ScopeCollector(cst.CSTVisitor):
    def __init__(self, scope: _Scope, module: cst.Module) -> None:
        self.scope = scope
        self.module = module

    def visit_Name(self, node: cst.Name) -> None:
        self.scope.names.add(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        if name in prescan.CONTAINERS:
            self.scope.container_calls.append(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        self.scope.bindings.setdefault(self.module.code_for_node(target), []).append(value)


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(
        self, module: cst.Module, options: Options, facts: prescan.FileFacts, region: prescan.Region
    ):
        self.module = module
        self.options = options
        self.facts = facts
        self.region = region
        self.lines = module.code.splitlines()
        self.sites: list[Site] = []
        self.edits = _Edits(kwargs=_kwargs_source(options), options=options)
        self.scopes: list[_Scope] = []
        self.loops: list[cst.For | cst.While] = []  # loops of the innermost function only
        self.loop_stack_saved: list[list[cst.For | cst.While]] = []
        self.blocks: list[cst.BaseSuite | cst.Module] = []
        self.statements: list[cst.BaseStatement] = []
        self.class_bodies: set[cst.BaseSuite] = set()
        self.consumed: set[cst.Call] = set()  # inner containers already reported with their outer one
        self.int_args: list[per_block_ints.IntArgs] = []  # blocks built with a per-iteration integer

    # -- traversal bookkeeping -------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(_Scope(node, node))
        self.blocks.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_bodies.add(node.body)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(_Scope(node, self.module))
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

    # -- name resolution --------------------------------------------------------------------------
    def dotted(self, expr: cst.BaseExpression) -> str | None:
        """`nn.ModuleList` -> `torch.nn.ModuleList` through the file's imports and aliases."""
        name = _dotted(expr)
        return None if name is None else self.facts.resolve(name)

    def container_kind(self, call: cst.Call) -> str | None:
        dotted = self.dotted(call.func)
        if dotted is None or not dotted.startswith("torch.nn."):
            return None
        last = dotted.rsplit(".", 1)[-1]
        return last if last in prescan.CONTAINERS else None

    def is_torch_compile(self, call: cst.Call) -> bool:
        return self.dotted(call.func) in ("torch.compile", "torch.compiler.compile")

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # -- classification ---------------------------------------------------------------------------
    def classify(self, expr: cst.BaseExpression, int_vars: set[str]) -> list[_Element]:
        if isinstance(expr, cst.IfExp):
            return self.classify(expr.body, int_vars) + self.classify(expr.orelse, int_vars)
        if not isinstance(expr, cst.Call):
            return [_Element("other", self.code(expr))]
        label = self.code(expr.func)
        element = self._classify_call(expr, label, int_vars)
        element.int_vars = frozenset(int_vars)
        return [element]

    def _classify_call(self, expr: cst.Call, label: str, int_vars: set[str]) -> _Element:
        if self.is_torch_compile(expr):
            inner = expr.args[0].value if expr.args else None
            return _Element("compiled", self.code(inner.func) if isinstance(inner, cst.Call) else label, expr)
        if (kind := self.container_kind(expr)) is not None:
            inner = self.container(expr, kind, int_vars)
            if inner is not None:
                return _Element("nested", label, expr, inner)
            # `nn.Sequential(conv, norm, act)` built per iteration is a composite block; a ModuleList
            # or ModuleDict is never called, so compiling it would compile nothing.
            layers = [a.value for a in expr.args if a.keyword is None and not a.star]
            if kind == "ModuleList":
                literal = self.literal(expr, int_vars)
                if _blocks(literal):
                    return _Element("nested", label, expr, literal)
                leaves = literal.repeated
                return _Element(
                    "leaf" if leaves and all(e.kind == "leaf" for e in leaves) else "other", label, expr
                )
            if kind == "Sequential" and len(layers) == 1:
                return (
                    self._classify_call(layers[0], label, int_vars)
                    if isinstance(layers[0], cst.Call)
                    else (_Element("other", label, expr))
                )
            if kind == "Sequential" and layers:
                parts = [e for layer in layers for e in self.classify(layer, int_vars)]
                return _Element("leaf" if all(e.kind == "leaf" for e in parts) else "block", label, expr)
            return _Element("other", label, expr)
        dotted = self.dotted(expr.func) or label
        last = dotted.rsplit(".", 1)[-1]
        if isinstance(expr.func, cst.Name) and last in self.scopes[-1].params:
            # `block(..)`, `block_fn(..)`, `layer_cls(..)`: a class handed in, as in ResNet's _make_layer.
            return _Element("leaf" if LEAF_PARAMETER.search(last) else "block", label, expr)
        if dotted == "copy.deepcopy":  # `_get_clones(module, N)` in torch.nn.Transformer and its copies
            return _Element("block", label, expr)
        if last in self.options.never:
            return _Element("excluded", label, expr)
        if last in self.options.always:
            return _Element("block", label, expr)
        if dotted.startswith("torch.nn."):
            return _Element("block" if last in TORCH_COMPOSITES else "leaf", label, expr)
        if dotted.startswith("torch."):
            return _Element("other", label, expr)
        if not last.lstrip("_")[:1].isupper():
            # A factory named for what it builds (`get_down_block`, `make_layer`) builds a block.
            factory = BLOCK_FACTORY.search(last) and not LEAF_PARAMETER.search(last)
            return _Element("block" if factory else "other", label, expr)
        return _Element("leaf" if LEAF_NAME.search(last.lstrip("_")) else "block", label, expr)

    def literal(self, call: cst.Call, int_vars: set[str]) -> _Container:
        """A ModuleList of blocks written out, met where it is built per iteration: each element repeats."""
        found = _Container("literal", False, [], [], literal=True)
        for arg in call.args:
            if arg.keyword is None:
                self.collect(arg.value, found, int_vars, starred=arg.star == "*")
        found.repeated, found.single = found.repeated + found.single, []
        return found

    def container(self, call: cst.Call, kind: str, int_vars: set[str]) -> _Container | None:
        """The elements of a ModuleList/Sequential/ModuleDict call, or None if nothing is repeated."""
        found = _Container("comprehension", kind == "ModuleDict", [], [])
        for arg in call.args:
            if arg.keyword is not None:
                continue
            self.collect(arg.value, found, int_vars, starred=arg.star == "*")
        return found if found.repeated else None

    def collect(self, expr: cst.BaseExpression, found: _Container, int_vars: set[str], starred: bool) -> None:
        if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            comp_vars = int_vars | _comprehension_int_vars(expr.for_in)
            elt = expr.value if isinstance(expr, cst.DictComp) else expr.elt
            found.repeated += self.classify(elt, comp_vars)
            found.pattern = {cst.ListComp: "comprehension", cst.GeneratorExp: "generator"}.get(
                type(expr), "dict-comprehension"
            )
            if starred:
                found.pattern = "sequential-star"
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
                    found.single += self.classify(element.value, int_vars)
        elif isinstance(expr, cst.Name) and (values := self.scopes[-1].bindings.get(expr.value)):
            before = len(found.repeated)
            if len(values) == 1 and isinstance(values[0], (cst.ListComp, cst.GeneratorExp)):
                self.collect(values[0], found, int_vars, starred)
                if len(found.repeated) > before:
                    found.pattern = "listcomp-variable"
        elif not starred:
            found.single += self.classify(expr, int_vars)

    # -- sites: containers ------------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if node in self.consumed:
            return
        kind = self.container_kind(node)
        if kind is not None:
            found = self.container(node, kind, set())
            if found is not None:
                self.consume_inner(found)
                self.container_site(node, found)
            return
        self.loop_site(node)

    def consume_inner(self, found: _Container) -> None:
        for element in found.repeated + found.single:
            if element.inner is not None and element.call is not None:
                self.consumed.add(element.call)
                self.consume_inner(element.inner)

    def container_site(self, call: cst.Call, found: _Container) -> None:
        blocks = _blocks(found)
        statement = self.statements[-1] if self.statements else None
        target = _bound_target(statement, call) if statement is not None else None
        labels = " | ".join(dict.fromkeys(e.label for e in _leaves(found) if e.kind == "block"))
        site = self.site_maker(call, found.pattern, labels or _first_label(found))
        compiled = target is not None and self.already_compiled_iterable(target)
        if self.triage(site, call, _leaves(found), blocks, found.pattern, compiled):
            return
        if self.blocks[-1] in self.class_bodies:
            return site("RGZ107", "skip")
        if not isinstance(self.blocks[-1], (cst.IndentedBlock, cst.Module)):
            return site("RGZ106", "skip")
        returned = _returned(statement, call)
        if target is None and returned is None:
            return site("RGZ104", "skip", "use --style wrap, or bind the container to a name first")
        name = self.scopes[-1].fresh("blocks") if returned is not None else ""
        loop = self.compile_loop(found, name or self.code(target))
        if loop is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        if returned is not None:
            # `return Container(..)` becomes `blocks = Container(..)`, the loop, then `return blocks`.
            assign = cst.Assign([cst.AssignTarget(cst.Name(name))], call)
            self.edits.split[statement] = [
                statement.with_changes(body=[assign]),
                loop,
                cst.SimpleStatementLine([returned.with_changes(value=cst.Name(name))]),
            ]
        else:
            self.edits.after.setdefault(statement, []).append(loop)
        site("RGZ001", "rewrite")

    def triage(
        self,
        site: _SiteMaker,
        call: cst.Call,
        leaves: list[_Element],
        blocks: list[_Element],
        pattern: str,
        compiled: bool,
    ) -> bool:
        """The decisions every pattern shares; True when the site is settled (reported, or wrapped)."""
        if compiled or any(e.kind == "compiled" for e in leaves):
            site("RGZ002", "skip")
            self.record_int_args(leaves, pattern, warn=False)
        elif self.skip_comment(call):
            site("RGZ101", "skip")
        elif not blocks:
            site(*_why_not(leaves))
        else:
            self.record_int_args(blocks, pattern, warn=True)
            if self.options.style != "wrap":
                return False
            for element in blocks:
                self.wrap(element)
            site("RGZ001", "rewrite")
        return True

    def compile_loop(self, found: _Container, iterable: str) -> cst.BaseStatement | None:
        """`for block in <iterable>: block.compile()`, descending into nested containers."""
        scope = self.scopes[-1]
        mixed = any(e.kind != "block" for e in found.repeated + found.single)
        nested = [e for e in found.repeated if e.kind == "nested"]
        var = scope.fresh("stage" if nested else "block", avoid=iterable)
        source = f"{iterable}.values()" if found.dict_like else iterable
        if nested:
            if mixed and len(nested) != len(found.repeated + found.single):
                return None
            inner = nested[0].inner
            assert inner is not None
            body = self.compile_loop(inner, var)
            if body is None:
                return None
            return cst.For(
                target=cst.Name(var),
                iter=cst.parse_expression(source),
                body=cst.IndentedBlock([body]),
            )
        statement = self.guarded_compile(var, _blocks(found), mixed)
        if statement is None:
            return None
        text = f"for {var} in {source}:\n" + _indent(statement, self.module.default_indent)
        return cst.parse_statement(text, config=self.module.config_for_parsing)

    # -- sites: loops that append or add_module one block per iteration ----------------------------
    def loop_site(self, call: cst.Call) -> None:
        if not self.loops or not isinstance(call.func, cst.Attribute) or not self.statements:
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
        statement = self.statements[-1]
        element = args[-1].value
        if not _is_only_statement(statement, call):
            return
        int_vars = self.loop_int_vars()
        if isinstance(element, cst.Name):
            return self.loop_name_site(call, statement, element, pattern, int_vars)
        elements = self.classify(element, int_vars)
        found = _Container(pattern, False, elements, [])
        blocks = _blocks(found)
        if any(e.kind == "nested" and not (e.inner and e.inner.literal) for e in elements):
            return  # an inner container built by a comprehension: reported where it is built
        site = self.site_maker(call, pattern, _labels(_leaves(found)))
        if self.triage(site, call, _leaves(found), blocks, pattern, compiled=False):
            return
        if not isinstance(self.blocks[-1], cst.IndentedBlock):
            return site("RGZ106", "skip")
        var = self.scopes[-1].fresh("block")
        compile_stmt = self.compile_element(var, elements, blocks)
        if compile_stmt is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        if "\n" in self.code(element) and not isinstance(element, cst.Call) and not element.lpar:
            # A multi-line `A(..) if c else B(..)` was valid inside the call's parentheses only.
            element = element.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        assign = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(var))], element)])
        if method == "append":  # `xs.append(\n    Block(..)\n)` collapses to `xs.append(block)`
            new_call = call.with_changes(
                args=[cst.Arg(cst.Name(var))], whitespace_before_args=cst.SimpleWhitespace("")
            )
        else:
            new_call = call.with_deep_changes(args[-1], value=cst.Name(var))
        appended = statement.with_changes(body=[cst.Expr(new_call)], leading_lines=[])
        self.edits.split[statement] = [
            assign.with_changes(leading_lines=statement.leading_lines),
            compile_stmt,
            appended,
        ]
        site("RGZ001", "rewrite")

    def loop_name_site(
        self, call: cst.Call, statement: cst.BaseStatement, name: cst.Name, pattern: str, int_vars: set[str]
    ) -> None:
        """`layer = Block(..)` then `layers.append(layer)` in the same loop body."""
        body = self.blocks[-1]
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
        elements = self.classify(value, int_vars)
        blocks = _blocks(_Container(pattern, False, elements, []))
        if any(e.kind == "nested" and not (e.inner and e.inner.literal) for e in elements):
            return
        leaves = _leaves(_Container(pattern, False, elements, []))
        site = self.site_maker(call, pattern, _labels(leaves))
        compiled_here = any(_compiles_name(s, name.value) for s in body.body)
        if self.triage(site, call, leaves, blocks, pattern, compiled_here):
            return
        compile_stmt = self.compile_element(name.value, elements, blocks)
        if compile_stmt is None:
            return site("RGZ104", "skip", "blocks cannot be told apart from the other elements")
        self.edits.after.setdefault(bound_stmt, []).append(compile_stmt)
        site("RGZ001", "rewrite")

    def holds_modules(self, receiver: cst.BaseExpression) -> bool:
        """True if `receiver` is a module container, or a list that ends up in one."""
        code = self.code(receiver)
        scope = self.scopes[-1]
        for value in scope.bindings.get(code, []):
            if isinstance(value, cst.Call) and self.container_kind(value):
                return True
        if isinstance(receiver, cst.Attribute) and receiver.attr.value in self.facts.container_attrs:
            return True
        return code in _container_arguments(scope, self)

    def loop_int_vars(self) -> set[str]:
        names: set[str] = set()
        for loop in self.loops:
            if isinstance(loop, cst.For):
                names |= _int_targets(loop.target, loop.iter)
        return names

    # -- shared helpers ---------------------------------------------------------------------------
    def compile_statement(self, var: str) -> str:
        mode = self.options.guard_bypass
        if mode == "none":
            return f"{var}.compile({self.edits.kwargs})"
        self.use_bypass(mode)
        return guard_bypass.inplace_statement(mode, var, self.edits.kwargs)

    def compile_element(
        self, var: str, elements: list[_Element], blocks: list[_Element]
    ) -> cst.BaseStatement | None:
        """Compile the module held in `var`: one block, or the blocks of a ModuleList written out."""
        if any(e.kind == "nested" for e in elements):
            inner = elements[0].inner
            return self.compile_loop(inner, var) if len(elements) == 1 and inner is not None else None
        statement = self.guarded_compile(var, blocks, any(e.kind != "block" for e in elements))
        return (
            None
            if statement is None
            else cst.parse_statement(statement + "\n", self.module.config_for_parsing)
        )

    def guarded_compile(self, var: str, blocks: list[_Element], mixed: bool) -> str | None:
        """The compile statement, behind an isinstance test when other modules share the container."""
        statement = self.compile_statement(var)
        if not mixed:
            return statement
        if any(e.call is None or self.dotted(e.call.func) == "copy.deepcopy" for e in blocks):
            return None  # no class to test against
        names = list(dict.fromkeys(e.label for e in blocks))
        test = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
        return f"if isinstance({var}, {test}):\n{self.module.default_indent}{statement}"

    def wrap(self, element: _Element) -> None:
        if element.kind == "nested" and element.inner is not None:
            for inner in _blocks(element.inner):
                self.wrap(inner)
        elif element.call is not None:
            self.edits.wrap.add(element.call)
            self.edits.needs_torch = True
            if self.options.guard_bypass != "none":
                self.use_bypass(self.options.guard_bypass)

    def use_bypass(self, mode: str) -> None:
        self.edits.helper = guard_bypass.helper_source(mode)

    def already_compiled_iterable(self, target: cst.BaseExpression) -> bool:
        compiled = self.facts.compiled_iterables
        if _dotted(target) in compiled:
            return True
        return isinstance(target, cst.Attribute) and f".{target.attr.value}" in compiled

    def skip_comment(self, node: cst.CSTNode) -> bool:
        statement = self.statements[-1] if self.statements else node
        start = self.get_metadata(PositionProvider, statement).start.line
        end = self.get_metadata(PositionProvider, node).end.line
        return any(SKIP_COMMENT.search(line) for line in self.lines[start - 1 : end])

    def site_maker(self, node: cst.CSTNode, pattern: str, block: str) -> _SiteMaker:
        position = self.get_metadata(PositionProvider, node).start

        def add(code: str, action: str, hint: str = "") -> None:
            reason = "" if action == "rewrite" else _reason(code, hint)
            self.sites.append(Site(*self.where(position), code, pattern, block, action, reason))

        return add

    def where(self, position: CodePosition) -> tuple[int, int]:
        """Line and 1-based column in the file, from a position in the region."""
        return position.line + self.region.start - 1, position.column + 1 + len(self.region.indent)

    def record_int_args(self, blocks: list[_Element], pattern: str, warn: bool) -> None:
        """Note the blocks that receive a per-iteration integer, for per_block_ints to follow."""
        for element in blocks:
            if element.kind == "nested" and element.inner is not None:
                self.record_int_args(_blocks(element.inner), pattern, warn)
                continue
            call = element.call
            if call is not None and element.kind == "compiled" and call.args:
                call = call.args[0].value  # torch.compile(Block(..))
            if not isinstance(call, cst.Call):
                continue
            positions, keywords, names = _int_args(call, self.loop_int_vars() | element.int_vars)
            if names:
                position = self.get_metadata(PositionProvider, call).start
                block = _dotted(call.func) or element.label
                self.int_args.append(
                    per_block_ints.IntArgs(
                        block, positions, keywords, names, *self.where(position), pattern, warn
                    )
                )


class _Editor(cst.CSTTransformer):
    def __init__(self, edits: _Edits) -> None:
        self.edits = edits

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if original_node not in self.edits.wrap:
            return updated_node
        options = self.edits.options
        if options.guard_bypass != "none":
            source = guard_bypass.wrap_expression(
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


# -- pure helpers -----------------------------------------------------------------------------------
def _kwargs_source(options: Options) -> str:
    """`mode="max-autotune", fullgraph=True`: Python literals, double-quoted as Black writes them."""
    items = options.compile_kwargs().items()
    return ", ".join(f"{k}={json.dumps(v) if isinstance(v, str) else repr(v)}" for k, v in items)


def _indent(text: str, indent: str) -> str:
    return "".join(indent + line + "\n" for line in text.splitlines())


def _reason(code: str, hint: str) -> str:
    return CODES[code] + (f"; {hint}" if hint else "")


def _dotted(expr: cst.BaseExpression) -> str | None:
    """`nn.ModuleList` -> "nn.ModuleList"; None for anything but a chain of names."""
    parts: list[str] = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if not isinstance(expr, cst.Name):
        return None
    parts.append(expr.value)
    return ".".join(reversed(parts))


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _walk(child)


def _container_arguments(scope: _Scope, finder: _Finder) -> set[str]:
    """Names passed whole to a container: `nn.Sequential(*layers)`, `nn.ModuleList(layers)`."""
    return {
        arg.value.value
        for call in scope.container_calls
        if finder.container_kind(call)
        for arg in call.args
        if isinstance(arg.value, cst.Name)
    }


def _compiles_name(node: cst.CSTNode, var: str) -> bool:
    """`var.compile(..)`, `_regionalize_dispatch(var, ..)`, or a loop over `var` compiling each item."""
    for found in _walk(node):
        if isinstance(found, cst.Call):
            func = found.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "compile"
                and _dotted(func.value) == var
            ):
                return True
            if _dotted(func) in prescan.BYPASS_HELPERS and found.args and _dotted(found.args[0].value) == var:
                return True
        if (
            isinstance(found, cst.For)
            and isinstance(found.target, cst.Name)
            and _dotted(found.iter) == var
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


def _is_only_statement(statement: cst.BaseStatement, call: cst.Call) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and statement.body[0].value is call
    )


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


def _leaves(found: _Container) -> list[_Element]:
    out: list[_Element] = []
    for element in found.repeated:
        out += _leaves(element.inner) if element.kind == "nested" and element.inner else [element]
    return out


def _blocks(found: _Container) -> list[_Element]:
    """Repeated elements worth compiling: blocks, and inner containers whose elements are blocks."""
    return [
        e
        for e in found.repeated
        if e.kind == "block" or (e.kind == "nested" and e.inner is not None and _blocks(e.inner))
    ]


def _labels(elements: list[_Element]) -> str:
    return " | ".join(dict.fromkeys(e.label for e in elements))


def _first_label(found: _Container) -> str:
    leaves = _leaves(found)
    return leaves[0].label if leaves else ""


def _why_not(elements: list[_Element]) -> tuple[str, str, str]:
    kinds = {e.kind for e in elements}
    if "excluded" in kinds:
        return ("RGZ105", "skip", "")
    if "leaf" in kinds:
        return ("RGZ102", "skip", "")
    return ("RGZ103", "skip", "")


def _int_targets(target: cst.BaseExpression, iterable: cst.BaseExpression) -> set[str]:
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


def _comprehension_int_vars(for_in: cst.CompFor | None) -> set[str]:
    names: set[str] = set()
    while for_in is not None:
        names |= _int_targets(for_in.target, for_in.iter)
        for_in = for_in.inner_for_in
    return names


def _int_args(call: cst.Call, int_vars: set[str]) -> tuple[frozenset[int], frozenset[str], tuple[str, ...]]:
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


class _IntUses(cst.CSTVisitor):
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
