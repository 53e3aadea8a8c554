"""The LibCST codemod: find containers of repeated blocks and compile each block regionally.

Analysis and editing are separate passes. `_Finder` walks each piece once, decides every site (rewrite
or skip, with a reason) and records the edits as plain data keyed by the original nodes; `emit.Editor` then
applies them. Nothing is rewritten unless the finder proved the site, so a skipped site is never touched.
The patterns, the block/leaf judgement and the emitted code live in `regionalize.codemod.patterns`; this
module runs them over a file's pieces, places `int_fixes`' fixes in the pieces that hold them
(`int_edits.py`), and writes each piece with edits through the one editor, its code back in the file's
lines; `placement.py` adds the lines outside its sites.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tokenize
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import libcst as cst

from regionalize.codemod import (
    collisions,
    int_edits,
    int_fixes,
    legacy_calls,
    package,
    parse_spans,
    placement,
    prescan,
    rewrite_check,
)
from regionalize.codemod.declarations import Declaration
from regionalize.codemod.nodes import Positioned, Walked, split_lines
from regionalize.codemod.patterns import emit
from regionalize.codemod.patterns.containers import ContainerSites
from regionalize.codemod.patterns.context import OWNED, OWNED_WITHOUT_REGIONS, SKIP_COMMENT, Context
from regionalize.codemod.patterns.extend import ExtendSites
from regionalize.codemod.patterns.loops import LoopSites
from regionalize.codemod.patterns.model import Edits
from regionalize.shared import helpers
from regionalize.shared.options import Options
from regionalize.shared.sites import CODES, Site

__all__ = ["SKIP_COMMENT", "TRIGGERS", "TransformResult", "might_have_sites", "transform_source"]

# Cheap pre-filter: a file without any of these words has no site, so it is never parsed.
TRIGGERS = ("ModuleList", "Sequential", "ModuleDict", "add_module", "clones")
DEFAULT_OPTIONS = Options()


@dataclass
class TransformResult:
    """Like LibCST's codemod results: status is "success", "skip" (with a reason) or "failure"."""

    status: str
    code: str
    sites: list[Site] = field(default_factory=list)
    reason: str = ""
    # The package's runtime copy the code imports its helpers from, or would but for a file or folder of
    # the package's own in its place (`collisions.Clash.blocked`).
    runtime: Path | None = None

    @property
    def changed(self) -> bool:
        return self.status == "success"


_LONE_CR = re.compile(r"\r(?!\n)")


def might_have_sites(source: str, options: Options = DEFAULT_OPTIONS) -> bool:
    extra = (name.rsplit(".", 1)[-1] for name in options.containers)
    return any(word in source for word in (*TRIGGERS, *extra))


def transform_source(
    source: str, options: Options = DEFAULT_OPTIONS, path: str | None = None
) -> TransformResult:
    """Rewrite `source`; never raises on bad input: a parse error is a "failure" with its reason.

    With the file's `path`, the names it imports from its own package are judged by their definitions.
    A file that calls the private helpers of an earlier release is read as the public calls
    (`legacy_calls.py`).
    """
    if not might_have_sites(source, options):
        return TransformResult("skip", source, reason="no module containers")
    legacy = legacy_calls.holds(source)
    text = legacy_calls.to_public(source) if legacy else source
    result = _transform(text, options, path, _legacy_names(source) if legacy else frozenset())
    if result.status != "success":
        result.code = source
    elif result.code == source:
        result.status, result.reason = "skip", "nothing to rewrite"
    return result


def _legacy_names(source: str) -> frozenset[str]:
    return frozenset(name for name in helpers.PUBLIC if name in source)


def _transform(source: str, options: Options, path: str | None, legacy: frozenset[str]) -> TransformResult:
    """`legacy`: the helper names of an earlier release that the file named, before `source` read them as
    the public calls."""
    if not might_have_sites(source, options):
        return TransformResult("skip", source, reason="no module containers")
    if "\r" in source and _LONE_CR.search(source):  # the `in` test: a memchr, most files have no CR
        # Python reads a lone CR as a line end (classic Mac OS files); the edits and helpers write LF or
        # CRLF, so a rewrite would mix them.
        return TransformResult("failure", source, reason="lone CR line endings: convert them to LF or CRLF")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return TransformResult("failure", source, reason=f"cannot parse: line {exc.lineno}: {exc.msg}")
    except (ValueError, MemoryError, RecursionError) as exc:
        return TransformResult("failure", source, reason=f"cannot parse: {' '.join(str(exc).split())}")
    lines = split_lines(source)
    outside = _packages(options).lookup(path) if path else prescan.nothing
    declared = partial(_packages(options).declared, path) if path else _undeclared
    found = _compile_containers(tree, lines, options, outside, declared)
    if isinstance(found, TransformResult):
        return found
    fixes = int_fixes.plan(tree, found.facts.imports, found.int_args)
    sites = sorted(found.sites + fixes.sites, key=lambda s: (s.line, s.col, s.code))
    if fixes.cache_blocks:
        found = _with_caches(found, fixes.cache_blocks, lines, options)
        sites = [_without_regions(site, fixes.cache_blocks) for site in sites]
    written = _write(found, fixes, tree, lines, options)
    if isinstance(written, TransformResult):
        return written
    code, first_changed = written
    torch_line = found.needs_torch and not found.facts.torch_bound
    code, placed, moved = placement.add_helpers(code, tree, first_changed, torch_line, path, options, legacy)
    runtime = placed.module if placed else None
    if moved is not None:
        sites = sorted([*sites, moved], key=lambda s: (s.line, s.col, s.code))
    if placed and (taken := collisions.clash(tree, source, placed, path)):
        # Nothing is written: a rewrite that called or imported the wrong helper would claim a compile
        # that never runs.
        sites = [_not_placed(site, taken.hint) for site in sites]
        return TransformResult("skip", source, sites, reason=taken.hint, runtime=taken.blocked)
    if code == source:
        return TransformResult("skip", source, sites, reason="nothing to rewrite", runtime=runtime)
    # A bug of ours: refuse to hand out code that fails.
    if (error := rewrite_check.syntax_error(code, source, tree)) is not None:
        return TransformResult("failure", source, sites, reason=f"rewrite does not parse: {error}")
    return TransformResult("success", code, sites, runtime=runtime)


_TAKEN = "RGZ113"


def _not_placed(site: Site, hint: str) -> Site:
    if site.action != "rewrite":
        return site
    return dataclasses.replace(site, code=_TAKEN, action="skip", reason=f"{CODES[_TAKEN]}; {hint}")


def _without_regions(site: Site, cache_blocks: dict[str, str | None]) -> Site:
    """An owner whose blocks update a cache the runtime cannot stand in for is compiled without regions
    (`nested=False`): its site line says so. The sites are the first pass's, made before that was known."""
    names = re.findall(r"\w+", site.block)
    uncached = any(cache_blocks.get(n, "") is None for n in names)
    if site.code == "RGZ001" and site.reason.startswith(OWNED) and uncached:
        return dataclasses.replace(site, reason=OWNED_WITHOUT_REGIONS)
    return site


@dataclass
class _Pass:
    """The containers of one file decided: their sites, and the edits of each piece that has some."""

    facts: prescan.FileFacts
    sites: list[Site]
    int_args: list[int_fixes.IntArgs]
    edits: dict[parse_spans.Span, Edits] = field(default_factory=dict)
    holders: frozenset[str] = frozenset()  # classes of the file holding blocks compiled (or skipped RGZ108)
    regional: frozenset[str] = frozenset()  # those of them that own their blocks as nested regions
    # The pieces and their LibCST trees, for a pass again with the blocks that update caches known, and for
    # the fixes of the per-block integers.
    pieces: list[parse_spans.Span] = field(default_factory=list)
    parsed: dict[parse_spans.Span, Positioned] = field(default_factory=dict)

    @property
    def needs_torch(self) -> bool:
        return any(edits.needs_torch for edits in self.edits.values())


def _undeclared(own: list[Declaration]) -> list[Declaration]:
    return []  # a text with no file: no package to declare blocks for it


def _compile_containers(
    tree: ast.Module,
    lines: list[str],
    options: Options,
    outside: prescan.Lookup,
    declared: Callable[[list[Declaration]], list[Declaration]],
    cache_blocks: dict[str, str | None] | None = None,
) -> _Pass | TransformResult:
    """Only the innermost level of repeated blocks is compiled: a pass decides the sites, and when a
    class of the file turns out to hold compiled blocks, the pass runs again with sites of that class
    skipped, until the set of such classes stays the same (nesting is a few levels deep)."""
    walked = Walked(tree)  # one walk for the facts and the pieces
    facts = prescan.scan(tree, options.containers, outside, walked=walked)
    facts.cache_blocks = cache_blocks or {}
    facts.package_declarations = declared(facts.declarations)  # the file's own read from `tree`
    classes = facts.classes
    # The pieces and their LibCST trees are the same on every pass: only the judgement changes.
    names = facts.container_names() | facts.imported_clone_helpers
    pieces = parse_spans.pieces(tree, lines, names, walked)
    parsed: dict[parse_spans.Span, Positioned] = {}
    for _ in range(_MAX_LEVELS):
        found = _container_pass(pieces, parsed, lines, options, facts)
        if isinstance(found, TransformResult):
            return found
        # A class holds compiled blocks when it compiles some (now or already), or holds a class that does.
        compiled = [s.line for s in found.sites if s.code in _HOLDING]
        holders = _classes_at(classes, compiled)
        # Owners of their blocks as regions, which an outer owner may take (RGZ006): by the form of the
        # sites, or by the loops a rewrite wrote (read back, their sites are RGZ002).
        owning = [s.line for s in found.sites if s.code == "RGZ006" or s.reason.startswith(OWNED)]
        regional = _classes_at(classes, owning + facts.regional_loops) & holders
        # Holders change only the judgement of elements of their class: without such an element among
        # the sites, another pass would decide the same (most files: a model whose layers hold leaves).
        elements = {label.rsplit(".", 1)[-1] for s in found.sites for label in s.block.split(" | ")}
        if not ((holders ^ facts.holders) | (regional ^ facts.regional)) & elements:
            break
        facts.holders, facts.regional = holders, regional
    found.holders, found.regional, found.pieces, found.parsed = holders, regional, pieces, parsed
    return found


def _classes_at(classes: list[tuple[str, int, int]], lines: list[int]) -> frozenset[str]:
    """The classes that hold any of `lines`."""
    return frozenset(name for name, start, end in classes if any(start <= line <= end for line in lines))


def _with_caches(
    found: _Pass, cache_blocks: dict[str, str | None], lines: list[str], options: Options
) -> _Pass:
    """The pieces with edits walked again with the blocks that update caches of their own known, which
    changes only their calls' arguments; the others hold no edit either way."""
    found.facts.cache_blocks = cache_blocks
    again = _container_pass(list(found.edits), found.parsed, lines, options, found.facts)
    assert not isinstance(again, TransformResult)  # the same trees parsed before
    return dataclasses.replace(found, edits=again.edits)


def _write(
    found: _Pass, fixes: int_fixes.Plan, tree: ast.Module, lines: list[str], options: Options
) -> tuple[str, int] | TransformResult:
    """The file with each piece that has edits (the sites', the fixes') written by the editor, and the
    first line of the first such piece (0 when none)."""
    edits = dict(found.edits)
    if fixes and (failed := _place_fixes(found, fixes, tree, lines, options, edits)) is not None:
        return failed
    out = list(lines)
    spans = sorted(edits, key=lambda span: span.start)
    for span in reversed(spans):
        module = found.parsed[span].module
        out[span.start - 1 : span.end] = [span.restore(module.visit(emit.Editor(edits[span], module)).code)]
    return "".join(out), spans[0].start if spans else 0


def _place_fixes(
    found: _Pass,
    fixes: int_fixes.Plan,
    tree: ast.Module,
    lines: list[str],
    options: Options,
    edits: dict[parse_spans.Span, Edits],
) -> TransformResult | None:
    """Add the fixes to `edits`, each in the walked piece that holds it or in a piece of its own (its
    statement, or its method), parsed now. A piece of its own that holds walked pieces (a class cut whole)
    is walked for their edits, which it takes over; a failure to parse is returned."""
    targets: list[parse_spans.Span] = []
    for span in int_edits.fix_spans(fixes, tree, lines):
        outer = next((p for p in found.pieces if p.start <= span.start and span.end <= p.end), span)
        inner = [p for p in edits if span.start <= p.start and p.end <= span.end and p != span]
        if outer is span and inner:
            again = _container_pass([span], found.parsed, lines, options, found.facts)
            if isinstance(again, TransformResult):
                return again
            for piece in inner:
                del edits[piece]
            edits.update(again.edits)
        if outer not in targets:
            targets.append(outer)
    for span in targets:
        wrapper = _parse(span, found.parsed, lines)
        if isinstance(wrapper, TransformResult):
            return wrapper
        inside = [fix for fix in fixes.edits if span.start <= fix.start[0] <= span.end]
        edits.setdefault(span, Edits()).fixes = int_edits.place(inside, wrapper, span, lines)
    return None


_MAX_LEVELS = 6
_HOLDING = ("RGZ001", "RGZ002", "RGZ006", "RGZ108")


def _container_pass(
    pieces: list[parse_spans.Span],
    parsed: dict[parse_spans.Span, Positioned],
    lines: list[str],
    options: Options,
    facts: prescan.FileFacts,
) -> _Pass | TransformResult:
    result = _Pass(facts, [], [])
    for span in pieces:
        wrapper = _parse(span, parsed, lines)
        if isinstance(wrapper, TransformResult):
            return wrapper
        finder = _Finder(wrapper.module, options, facts, span, span.extract(lines))
        wrapper.read(finder)
        result.sites += finder.sites
        result.int_args += finder.int_args
        if finder.edits:
            result.edits[span] = finder.edits
    return result


def _parse(
    span: parse_spans.Span, parsed: dict[parse_spans.Span, Positioned], lines: list[str]
) -> Positioned | TransformResult:
    """The piece's LibCST tree, parsed once: the positions it resolves serve every pass."""
    if span not in parsed:
        try:
            parsed[span] = Positioned(cst.parse_module(span.extract(lines)))
        except cst.ParserSyntaxError as exc:
            line = exc.raw_line + span.start - 1
            return TransformResult(
                "failure", "".join(lines), reason=f"cannot parse: line {line}: {exc.message}"
            )
    return parsed[span]


_PACKAGES: dict[Options, package.Packages] = {}


def _packages(options: Options) -> package.Packages:
    """One reading of each package per process and options, shared by the files of a run."""
    if options not in _PACKAGES:
        _PACKAGES[options] = package.Packages(options.containers, partial(_holders_of, options))
    return _PACKAGES[options]


def _holders_of(options: Options, file: Path) -> Mapping[str, bool]:
    """The classes of another module of the package that hold blocks compiled on their own, as the codemod
    decides them there, each with whether it owns them as nested regions: a class of this file holding
    one of them is an outer level, not compiled, or (RGZ006) the stage of an owner that takes its blocks."""
    try:
        with tokenize.open(file) as text:  # its coding cookie or BOM, as Python would read it
            source = text.read()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, LookupError, RecursionError, MemoryError):
        return {}
    if not might_have_sites(source, options):
        return {}
    packages = _packages(options)
    lines = split_lines(source)
    found = _compile_containers(tree, lines, options, packages.lookup(file), partial(packages.declared, file))
    if isinstance(found, TransformResult):
        return {}
    return {name: name in found.regional for name in found.holders}


class _Finder(Context):
    """One walk of a piece: the context keeps the traversal state, each call goes to the pattern families."""

    def __init__(
        self,
        module: cst.Module,
        options: Options,
        facts: prescan.FileFacts,
        span: parse_spans.Span,
        text: str,
    ) -> None:
        edits = Edits(options=options)
        super().__init__(module, options, facts, span, text, edits)
        self.container_sites = ContainerSites(self)
        self.loop_sites = LoopSites(self, self.container_sites.judge)
        self.extend_sites = ExtendSites(
            self,
            lambda expr: self.container_sites.read.elements(expr, bool(self.loops)),
            self.loop_sites.holds_modules,
        )

    def visit_Call(self, node: cst.Call) -> None:
        if not self.container_sites.visit(node):
            self.loop_sites.visit(node)
            self.extend_sites.visit_call(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.extend_sites.visit_aug_assign(node)
