"""Per-block integers in forward: keep every block of a decoder on the same compiled graphs.

A block built with the loop index (`LlamaDecoderLayer(config, layer_idx)`) stores it
(`self.layer_idx = layer_idx`, also in submodules such as its attention) and reads it in forward.
Dynamo specializes on integer attributes of modules, so each block compiles its own graph and past
`recompile_limit` (8) the rest run eager. Measured on transformers decoders generating with a
`DynamicCache`: `past_key_values.update(k, v, self.layer_idx)` recompiles every layer.

Two source-level fixes, planned here from the class definitions in the same file (Python's `ast`), each
at the position of the node it edits; `int_edits.py` writes them as LibCST edits of those nodes in the
piece that holds them, so everything else in the file stays byte for byte:

- a call or subscript that hands the integer to something other than the module itself or torch
  (`past_key_values.update(.., self.layer_idx)`, `cache.layers[self.layer_idx]`) runs outside the
  compiled region as `regionalize.eager(lambda: <the same expression>)`. The lambda keeps the
  expression as written and its evaluation order; since Dynamo never traces its body, it never reads
  the integer, and no setting is needed (RGZ003);
- any other read in traced code (a branch, arithmetic) is made symbolic while that forward is traced:
  `@regionalize.symbolic_ints`, which wraps it in Dynamo's traceable
  `patch_dynamo_config(allow_unspec_int_on_nn_module=True)` (torch >= 2.8), a setting scoped to the
  tracing of that function; a branch then compiles a graph per outcome, not per block (RGZ004).

What cannot be fixed this way keeps RGZ201, saying why: a class defined in another file, an integer
that indexes an assignment target, a class with no forward of its own to decorate.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from regionalize.codemod import cache_stand_in, class_graph, int_reads, prescan
from regionalize.codemod.nodes import walk
from regionalize.shared import helpers
from regionalize.shared.sites import Site

# The public API's calls the fixes write (regionalize/runtime/api.py).
EAGER = helpers.public(helpers.EAGER)
SYMBOLIC = helpers.public(helpers.SYMBOLIC_INTS)
PATTERN = "per-block-int"


@dataclass(frozen=True)
class IntArgs:
    """A block constructor call that receives a per-block integer, as the container finder met it."""

    block: str  # the class as called: "LlamaDecoderLayer", "layers.Block"
    positions: frozenset[int]  # indexes of the positional arguments carrying it
    keywords: frozenset[str]
    names: tuple[str, ...]  # the loop variables, for messages
    line: int
    col: int
    pattern: str
    warn: bool = True  # RGZ201 when the file cannot fix it (not for blocks the user compiled already)


Position = tuple[int, int]  # line (1-based), column in UTF-8 bytes: what `ast` gives


@dataclass(frozen=True)
class Fix:
    """One planned edit, at the position of the node it edits, which `int_edits.py` finds in the piece's
    LibCST tree: "eager" runs the call or subscript at `start`..`end` outside the compiled region,
    "setitem" makes the assignment there a `__setitem__` call run the same way, "decorate" puts the
    decorator above the method whose `def` is at `start`; `end` is then on the method's first line (its
    first decorator's, or the `def`'s)."""

    kind: str
    start: Position
    end: Position
    # The innermost statement that holds the edit, from its start to its end: the least a piece can be.
    statement: tuple[Position, Position] | None = None


@dataclass
class Plan:
    """The edits, and their sites."""

    edits: list[Fix] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    # Classes whose reads are planned, with what could not be fixed: a class reached from several blocks
    # (an attention in encoder and decoder layers) is edited once.
    fixed: dict[str, list[str]] = field(default_factory=dict)
    moved: set[str] = field(default_factory=set)  # classes with a call (a cache's update) moved out
    # Per class with a moved call, the attributes those calls take directly as an argument (`self.layer_idx`
    # in `past_key_values.update(k, v, self.layer_idx)`, or as a subscript's key); None for one that takes
    # it inside an expression.
    indexes: dict[str, set[str | None]] = field(default_factory=dict)
    # Block classes whose integer reaches a moved call: each block updates a cache of its own, a side
    # effect that a nested compile region cannot stamp out as it is. Each maps to the attribute its cache
    # is indexed by when every such call takes that attribute as an argument, which lets the runtime stand
    # in for the block's layer of a transformers cache (`_regionalize_blocks(cache_index=..)`), else None.
    cache_blocks: dict[str, str | None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.edits)


@dataclass(frozen=True)
class _File:
    """What every step reads of the file."""

    classes: dict[str, ast.ClassDef]
    names: set[str]  # bound at module level (imports, functions, classes): a call on them is not a cache's
    imports: dict[str, str]  # imported name -> what it imports
    tables: dict[str, list[ast.ClassDef]]  # module-level dicts of classes (class_graph.class_tables)

    @classmethod
    def read(cls, tree: ast.Module, imports: dict[str, str]) -> _File:
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
        tables = class_graph.class_tables(tree, classes)
        return cls(classes, class_graph.module_names(tree), imports, tables)


def plan(tree: ast.Module, imports: dict[str, str], found: list[IntArgs]) -> Plan:
    """What to move out of the compiled region and what to unspecialize, for every call in `found`.

    `imports` is prescan's map of the file's imported names, already read for the containers.
    """
    file = _File.read(tree, imports)
    classes = file.classes
    result = Plan()
    done: dict[tuple[str, frozenset[str]], tuple[list[str], set[str]]] = {}
    for args in found:
        name = args.block.rsplit(".", 1)[-1]
        cls = classes.get(name) if "." not in args.block else None
        if cls is None:
            problems = [f"{args.block} is not defined in this file, so its forward is not fixed from here"]
        else:
            init = class_graph.init_of(cls, classes)
            params = class_graph.map_params(init, args.positions, args.keywords)
            if not params:
                problems = [_unfollowed(init, name)]
            else:
                key = (name, frozenset(params))
                if key not in done:
                    done[key] = _fix_class(cls, params, file, result)
                problems, reached = done[key]
                if reached & result.moved:
                    indexes = set().union(*(result.indexes[c] for c in reached & result.moved))
                    only = indexes.pop() if len(indexes) == 1 else None
                    result.cache_blocks[name] = only if result.cache_blocks.get(name, only) == only else None
        if problems and args.warn:
            reason = (
                f"per-block integer `{', '.join(args.names)}` reaches {args.block}(...), but "
                + "; ".join(dict.fromkeys(problems))
                + ": Dynamo may compile one graph per block, and past recompile_limit (8) the rest run "
                "eager; check with `regionalize verify`"
            )
            result.sites.append(Site(args.line, args.col, "RGZ201", args.pattern, args.block, "warn", reason))
    return result


def _fix_class(cls: ast.ClassDef, params: set[str], file: _File, result: Plan) -> tuple[list[str], set[str]]:
    """Plan the fixes for `cls` built with per-block `params`, and for the submodules they reach; the
    problems left, and the classes reached."""
    classes = file.classes
    problems: list[str] = []
    seen: set[tuple[str, str, frozenset[str]]] = set()
    # (the class built, the class whose __init__ runs: itself, or a base through super().__init__, params)
    pending = [(cls, cls, params)]
    while pending:
        current, owner, current_params = pending.pop()
        key = (current.name, owner.name, frozenset(current_params))
        if key in seen:
            continue
        seen.add(key)
        init = (
            class_graph.own_method(owner, "__init__")
            if owner is not current
            else class_graph.init_of(current, classes)
        )
        attrs: set[str] = set()
        if init is not None:
            for target, value in class_graph.self_assignments(init):
                if class_graph.uses(value, current_params):
                    attrs.add(target)
            for call, callee, is_super in class_graph.calls(init, classes, owner, file.tables):
                positions, keywords = class_graph.passed(call, current_params)
                if not positions and not keywords:
                    continue
                if callee is None:
                    if label := class_graph.callee_label(call, file.imports):
                        problems.append(f"it is passed to {label}, defined in another file")
                else:
                    receiver, sub_params = class_graph.receiver(callee, classes, positions, keywords)
                    if sub_params:
                        pending.append((current if is_super else callee, receiver, sub_params))
        if attrs:
            if current.name not in result.fixed:
                result.fixed[current.name] = _fix_reads(current, attrs, file, result)
            problems += result.fixed[current.name]
    return problems, {name for name, _, _ in seen}


def _fix_reads(cls: ast.ClassDef, attrs: set[str], file: _File, result: Plan) -> list[str]:
    """Move the calls that take `self.<attr>` out of the graph; unspecialize what else reads it."""
    problems: list[str] = []
    remaining = False
    for method in class_graph.traced_methods(cls, file.classes):
        parents = int_reads.parents_of(method)
        moved, left = _read_carriers(cls, method, attrs, file, result, parents, problems)
        remaining |= left
        if moved:
            result.moved.add(cls.name)
        for carrier in int_reads.outermost(moved, parents):
            _move_out(cls, carrier, attrs, result, parents)
    if remaining:
        problems += _decorate_forward(cls, attrs, file, result)
    return problems


def _read_carriers(
    cls: ast.ClassDef,
    method: ast.FunctionDef,
    attrs: set[str],
    file: _File,
    result: Plan,
    parents: dict[ast.AST, ast.AST],
    problems: list[str],
) -> tuple[list[ast.expr], bool]:
    """The calls and assignments of `method` that hand `self.<attr>` on, each once, and whether a read
    stays in traced code; records the indexes the moved calls take, and what cannot be moved."""
    asked = cache_stand_in.type_checked(method)
    moved: list[ast.expr] = []
    remaining = False
    for node in walk(method):
        if not (class_graph.is_self_attr(node, attrs) and isinstance(node.ctx, ast.Load)):
            continue
        if _already_eager(node, parents):
            result.moved.add(cls.name)  # moved by an earlier pass
            result.indexes.setdefault(cls.name, set()).add(
                cache_stand_in.index_of(node, parents, None, asked)
            )
            continue
        carrier = int_reads.carrier_of(node, parents, file.names) or int_reads.setitem_of(
            node, parents, file.names
        )
        if carrier is None:
            store = int_reads.stored_into(node, parents)
            if store is not None:
                problems.append(
                    f"`self.{node.attr}` indexes an assignment at line {store.lineno} whose value is "
                    "computed, which stays in the graph (moving it would change the evaluation order)"
                )
            else:
                remaining = True
            continue
        if carrier not in moved:
            moved.append(carrier)
        result.indexes.setdefault(cls.name, set()).add(cache_stand_in.index_of(node, parents, carrier, asked))
    return moved, remaining


def _move_out(
    cls: ast.ClassDef, carrier: ast.expr, attrs: set[str], result: Plan, parents: dict[ast.AST, ast.AST]
) -> None:
    """Plan the edit that runs `carrier` outside the compiled region, and its site (RGZ003)."""
    attr = next(n.attr for n in walk(carrier) if class_graph.is_self_attr(n, attrs))
    start, end = (carrier.lineno, carrier.col_offset), (carrier.end_lineno, carrier.end_col_offset)
    held = carrier if isinstance(carrier, ast.stmt) else next(int_reads.statements_above(carrier, parents))
    statement = ((held.lineno, held.col_offset), (held.end_lineno, held.end_col_offset))
    if isinstance(carrier, ast.Assign):
        result.edits.append(Fix("setitem", start, end, statement))  # type: ignore[arg-type]
        what = f"{ast.unparse(carrier.targets[0].value)}[..] = .."  # type: ignore[attr-defined]
    else:
        result.edits.append(Fix("eager", start, end, statement))  # type: ignore[arg-type]
        what = ast.unparse(carrier.func if isinstance(carrier, ast.Call) else carrier.value)
    reason = f"`{what}` takes per-block integer `self.{attr}`"
    result.sites.append(_site(carrier, "RGZ003", cls.name, reason))


def _decorate_forward(cls: ast.ClassDef, attrs: set[str], file: _File, result: Plan) -> list[str]:
    """Plan `@regionalize.symbolic_ints` on the class's forward and its site (RGZ004); the problem when
    the class has no forward of its own."""
    forward = class_graph.find_method(cls, "forward", file.classes)
    if forward is None:
        return [f"{cls.name} reads it in traced code but has no forward of its own to decorate"]
    if not any(_is_unspec_decorator(d) for d in forward.decorator_list):
        # The new decorator goes above the others: the outermost, on its own line.
        line = forward.decorator_list[0].lineno if forward.decorator_list else forward.lineno
        result.edits.append(Fix("decorate", (forward.lineno, forward.col_offset), (line, 0)))
        names = ", ".join(f"`self.{a}`" for a in sorted(attrs))
        reason = f"{names} read in traced code: a branch on it compiles a graph per outcome, not per block"
        result.sites.append(_site(forward, "RGZ004", cls.name, reason))
    return []


def _site(node: ast.expr | ast.stmt, code: str, block: str, reason: str) -> Site:
    return Site(node.lineno, node.col_offset + 1, code, PATTERN, block, "rewrite", reason)


def _unfollowed(init: ast.FunctionDef | None, name: str) -> str:
    if init is None:
        return f"the __init__ of {name} is in another file"
    return f"{name}.__init__ takes it through *args or **kwargs, which are not followed"


def _already_eager(read: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside `regionalize.eager(lambda: ..)`, as an earlier run wrote it."""
    for node in int_reads.ancestors(read, parents):
        if isinstance(node, ast.Lambda):
            call = parents.get(node)
            return isinstance(call, ast.Call) and prescan.dotted_name(call.func) == EAGER
    return False


def _is_unspec_decorator(node: ast.expr) -> bool:
    return prescan.dotted_name(node) == SYMBOLIC or "allow_unspec_int_on_nn_module" in ast.unparse(node)
