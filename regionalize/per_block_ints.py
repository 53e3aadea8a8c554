"""Per-block integers in forward: keep every block of a decoder on the same compiled graphs.

A block built with the loop index (`LlamaDecoderLayer(config, layer_idx)`) stores it
(`self.layer_idx = layer_idx`, also in submodules such as its attention) and reads it in forward.
Dynamo specializes on integer attributes of modules, so each block compiles its own graph and past
`recompile_limit` (8) the rest run eager. Measured on transformers decoders generating with a
`DynamicCache`: `past_key_values.update(k, v, self.layer_idx)` recompiles every layer.

Two source-level fixes, planned here from the class definitions in the same file (Python's `ast`; the
edits are insertions at exact positions, so everything else in the file stays byte for byte):

- a call or subscript that hands the integer to something other than the module itself or torch
  (`past_key_values.update(.., self.layer_idx)`, `cache.layers[self.layer_idx]`) runs outside the
  compiled region as `_regionalize_eager(lambda: <the same expression>)`. The lambda keeps the
  expression as written and its evaluation order; since Dynamo never traces its body, it never reads
  the integer, and no setting is needed (RGZ003);
- any other read in traced code (a branch, arithmetic) is made symbolic while that forward is traced:
  `@_regionalize_symbolic_ints`, which wraps it in Dynamo's traceable
  `patch_dynamo_config(allow_unspec_int_on_nn_module=True)` (torch >= 2.8), a setting scoped to the
  tracing of that function; a branch then compiles a graph per outcome, not per block (RGZ004).

What cannot be fixed this way keeps RGZ201, saying why: a class defined in another file, an integer
that indexes an assignment target, a class with no forward of its own to decorate.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from regionalize.report import Site

EAGER = "_regionalize_eager"
EAGER_HELPER = f'''\
@torch.compiler.disable
def {EAGER}(call):
    """regionalize: run `call` outside the compiled region. It takes a per-block integer (a KV cache
    indexed by layer): traced, it would make every block compile a graph of its own."""
    return call()
'''
SYMBOLIC = "_regionalize_symbolic_ints"
# Not `@torch._dynamo.patch_dynamo_config(..)` itself: its wrapper has one code object for every
# function it decorates, and Dynamo counts recompile_limit per code object, so two decorated classes
# share eight compiled variants and run eager past them (measured: 12 layers of two classes fall back).
SYMBOLIC_HELPER = f'''\
def {SYMBOLIC}(forward):
    """regionalize: trace `forward` with the integer attributes of modules symbolic, so that blocks that
    differ only in such an integer (a layer index) share graphs: one per outcome of a branch on it, not
    one per block. Eager calls compute the same; the setting holds only while this function is traced."""
    patch = torch._dynamo.patch_dynamo_config(allow_unspec_int_on_nn_module=True)

    def traced(*args, **kwargs):
        with patch:
            return forward(*args, **kwargs)

    # A code object of its own: Dynamo keeps compiled variants, and their limit, per code object.
    traced.__code__ = traced.__code__.replace(co_name=forward.__name__)
    traced.__name__, traced.__doc__ = forward.__name__, forward.__doc__
    traced.__qualname__ = forward.__qualname__
    return traced
'''
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


@dataclass
class Plan:
    """Edits of the original source (spans replaced, empty spans for insertions), and their sites."""

    edits: list[tuple[Position, Position, str]] = field(default_factory=list)
    decorate: set[int] = field(default_factory=set)  # lines of `def forward` (or its first decorator)
    sites: list[Site] = field(default_factory=list)
    # Classes whose reads are planned, with what could not be fixed: a class reached from several blocks
    # (an attention in encoder and decoder layers) is edited once.
    fixed: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.edits or self.decorate)

    def helpers(self) -> list[str]:
        return [EAGER_HELPER] * bool(self.edits) + [SYMBOLIC_HELPER] * bool(self.decorate)

    def apply(self, lines: list[str]) -> str:
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line.encode("utf-8")))
        edits = list(self.edits)
        for line in self.decorate:
            text = lines[line - 1]
            indent = text[: len(text) - len(text.lstrip())]
            newline = "\r\n" if text.endswith("\r\n") else "\n"
            edits.append(((line, 0), (line, 0), f"{indent}@{SYMBOLIC}{newline}"))
        raw = "".join(lines).encode("utf-8")
        at = lambda position: starts[position[0] - 1] + position[1]  # noqa: E731
        for start, end, text in sorted(edits, key=lambda e: (at(e[0]), at(e[1])), reverse=True):
            raw = raw[: at(start)] + text.encode("utf-8") + raw[at(end) :]  # from the end: offsets hold
        return raw.decode("utf-8")


def plan(tree: ast.Module, source: str, found: list[IntArgs]) -> Plan:
    """What to move out of the compiled region and what to unspecialize, for every call in `found`."""
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    imports = _module_names(tree)
    result = Plan()
    done: dict[tuple[str, frozenset[str]], list[str]] = {}
    for args in found:
        name = args.block.rsplit(".", 1)[-1]
        cls = classes.get(name) if "." not in args.block else None
        if cls is None:
            problems = [f"{args.block} is not defined in this file, so its forward is not fixed from here"]
        else:
            init = _init(cls, classes)
            params = _map_params(init, args.positions, args.keywords)
            if not params:
                problems = [_unfollowed(init, name)]
            else:
                key = (name, frozenset(params))
                if key not in done:
                    done[key] = _fix_class(cls, params, classes, imports, source, result)
                problems = done[key]
        if problems and args.warn:
            reason = (
                f"per-block integer `{', '.join(args.names)}` reaches {args.block}(...), but "
                + "; ".join(dict.fromkeys(problems))
                + ": Dynamo may compile one graph per block, and past recompile_limit (8) the rest run "
                "eager; check with `regionalize verify`"
            )
            result.sites.append(Site(args.line, args.col, "RGZ201", args.pattern, args.block, "warn", reason))
    return result


def _fix_class(
    cls: ast.ClassDef,
    params: set[str],
    classes: dict[str, ast.ClassDef],
    imports: set[str],
    source: str,
    result: Plan,
) -> list[str]:
    """Plan the fixes for `cls` built with per-block `params`, and for the submodules they reach."""
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
        init = _own_method(owner, "__init__") if owner is not current else _init(current, classes)
        attrs: set[str] = set()
        if init is not None:
            for target, value in _self_assignments(init):
                if _uses(value, current_params):
                    attrs.add(target)
            for call, callee, is_super in _calls(init, classes, owner):
                positions, keywords = _passed(call, current_params)
                if not positions and not keywords:
                    continue
                if callee is None:
                    if label := _callee_label(call, imports):
                        problems.append(f"it is passed to {label}, defined in another file")
                elif sub_params := _map_params(_init(callee, classes), positions, keywords):
                    pending.append(
                        (current, callee, sub_params) if is_super else (callee, callee, sub_params)
                    )
        if attrs:
            if current.name not in result.fixed:
                result.fixed[current.name] = _fix_reads(current, attrs, classes, imports, source, result)
            problems += result.fixed[current.name]
    return problems


def _fix_reads(
    cls: ast.ClassDef,
    attrs: set[str],
    classes: dict[str, ast.ClassDef],
    imports: set[str],
    source: str,
    result: Plan,
) -> list[str]:
    """Move the calls that take `self.<attr>` out of the graph; unspecialize what else reads it."""
    problems: list[str] = []
    remaining = False
    for method in _traced_methods(cls, classes):
        parents = _parents(method)
        moved: list[ast.expr] = []
        for node in ast.walk(method):
            if not (_is_self_attr(node, attrs) and isinstance(node.ctx, ast.Load)):
                continue
            if _already_eager(node, parents):
                continue
            carrier = _carrier(node, parents, imports) or _setitem(node, parents, imports)
            if carrier is None:
                store = _stored_into(node, parents)
                if store is not None:
                    problems.append(
                        f"`self.{node.attr}` indexes an assignment at line {store.lineno} whose value is "
                        "computed, which stays in the graph (moving it would change the evaluation order)"
                    )
                else:
                    remaining = True
            elif carrier not in moved:
                moved.append(carrier)
        for carrier in _outermost(moved, parents):
            attr = next(n.attr for n in ast.walk(carrier) if _is_self_attr(n, attrs))
            start, end = (carrier.lineno, carrier.col_offset), (carrier.end_lineno, carrier.end_col_offset)
            if isinstance(carrier, ast.Assign):
                result.edits.append((start, end, _setitem_call(carrier, source)))  # type: ignore[arg-type]
                what = f"{ast.unparse(carrier.targets[0].value)}[..] = .."  # type: ignore[attr-defined]
            else:
                result.edits += [(start, start, f"{EAGER}(lambda: "), (end, end, ")")]  # type: ignore[list-item]
                what = ast.unparse(carrier.func if isinstance(carrier, ast.Call) else carrier.value)
            reason = f"`{what}` takes per-block integer `self.{attr}`"
            result.sites.append(_site(carrier, "RGZ003", cls.name, reason))
    if remaining:
        forward = _method(cls, "forward", classes)
        if forward is None:
            problems.append(f"{cls.name} reads it in traced code but has no forward of its own to decorate")
        elif not any(_is_unspec_decorator(d) for d in forward.decorator_list):
            # The new decorator goes above the others: the outermost, on its own line.
            line = forward.decorator_list[0].lineno if forward.decorator_list else forward.lineno
            result.decorate.add(line)
            names = ", ".join(f"`self.{a}`" for a in sorted(attrs))
            reason = (
                f"{names} read in traced code: a branch on it compiles a graph per outcome, not per block"
            )
            result.sites.append(_site(forward, "RGZ004", cls.name, reason))
    return problems


# -- the class graph --------------------------------------------------------------------------------
def _own_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _bases(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    return [
        classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes and b.id != cls.name
    ]


def _method(cls: ast.ClassDef, name: str, classes: dict[str, ast.ClassDef]) -> ast.FunctionDef | None:
    """`name` as the class resolves it, through the bases defined in the same file."""
    found = _own_method(cls, name)
    if found is not None:
        return found
    for base in _bases(cls, classes):
        if (found := _method(base, name, classes)) is not None:
            return found
    return None


def _init(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> ast.FunctionDef | None:
    return _method(cls, "__init__", classes)


def _traced_methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.FunctionDef]:
    """forward, and the methods it calls on self, transitively: what Dynamo traces of this class."""
    forward = _method(cls, "forward", classes)
    found: list[ast.FunctionDef] = []
    pending = [forward] if forward is not None else []
    while pending:
        method = pending.pop()
        if method in found:
            continue
        found.append(method)
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and _is_self_attr(node.func, None):
                callee = _method(cls, node.func.attr, classes)  # type: ignore[union-attr]
                if callee is not None and callee.name != "__init__":
                    pending.append(callee)
    return found


def _map_params(
    init: ast.FunctionDef | None, positions: frozenset[int], keywords: frozenset[str]
) -> set[str]:
    """The `__init__` parameters that receive the positional indexes and keywords given."""
    if init is None:
        return set()
    every = [*init.args.posonlyargs, *init.args.args][1:]  # without self
    named = {a.arg for a in [*every, *init.args.kwonlyargs]}
    params = {every[i].arg for i in positions if i < len(every)}
    return params | {k for k in keywords if k in named}


def _site(node: ast.expr | ast.stmt, code: str, block: str, reason: str) -> Site:
    return Site(node.lineno, node.col_offset + 1, code, PATTERN, block, "rewrite", reason)


def _unfollowed(init: ast.FunctionDef | None, name: str) -> str:
    if init is None:
        return f"the __init__ of {name} is in another file"
    return f"{name}.__init__ takes it through *args or **kwargs, which are not followed"


def _self_assignments(init: ast.FunctionDef) -> Iterator[tuple[str, ast.expr]]:
    for node in ast.walk(init):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if _is_self_attr(target, None):
                yield target.attr, value  # type: ignore[attr-defined]


def _calls(
    init: ast.FunctionDef, classes: dict[str, ast.ClassDef], owner: ast.ClassDef
) -> Iterator[tuple[ast.Call, ast.ClassDef | None, bool]]:
    """Every call in `__init__`, with the class it builds when that class is in the file, and whether
    it is `super().__init__(..)`, which runs the first base's __init__ on the same instance."""
    for node in ast.walk(init):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in classes:
            yield node, classes[func.id], False
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
        ):
            bases = _bases(owner, classes)
            yield node, (bases[0] if bases else None), True
        else:
            yield node, None, False


def _passed(call: ast.Call, params: set[str]) -> tuple[frozenset[int], frozenset[str]]:
    positions = frozenset(
        i for i, arg in enumerate(call.args) if not isinstance(arg, ast.Starred) and _uses(arg, params)
    )
    keywords = frozenset(k.arg for k in call.keywords if k.arg is not None and _uses(k.value, params))
    return positions, keywords


def _callee_label(call: ast.Call, imports: set[str]) -> str | None:
    """The class a call builds, when it looks like one defined elsewhere (not torch's own layers)."""
    name = _dotted(call.func)
    if name is None or name.split(".")[0] in ("torch", "nn", "F"):
        return None
    last = name.rsplit(".", 1)[-1]
    return name if last[:1].isupper() and (name.split(".")[0] in imports or "." not in name) else None


# -- reads of the integer -----------------------------------------------------------------------------
def _uses(expr: ast.expr, names: set[str]) -> bool:
    """Does the value of `expr` carry one of `names`? Not through an index (`dpr[i]` is a float), a
    comparison (`i == 0` is a bool, at most two graphs) or a string."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, (ast.Subscript, ast.Compare, ast.JoinedStr, ast.Lambda)):
        return isinstance(expr, ast.Subscript) and _uses(expr.value, names)
    return any(_uses(child, names) for child in ast.iter_child_nodes(expr) if isinstance(child, ast.expr))


def _is_self_attr(node: ast.AST, attrs: set[str] | None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attrs is None or node.attr in attrs)
    )


def _parents(root: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def _ancestors(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> Iterator[ast.AST]:
    while node in parents:
        node = parents[node]
        yield node


def _carrier(read: ast.AST, parents: dict[ast.AST, ast.AST], imports: set[str]) -> ast.expr | None:
    """The innermost call or subscript that hands `read` to an object other than self or a module.

    `past_key_values.update(k, v, self.layer_idx)` -> that call; `cache.layers[self.layer_idx]` -> that
    subscript; `torch.roll(x, self.shift)`, `self.proj(..)` or a plain `if self.layer_idx == 0` -> None.
    """
    child = read
    for node in _ancestors(read, parents):
        if isinstance(node, (ast.stmt, ast.Lambda, ast.comprehension)):
            return None
        if (isinstance(node, ast.Call) and child is not node.func) or (
            isinstance(node, ast.Subscript) and child is node.slice
        ):
            root = _root_name(node.func if isinstance(node, ast.Call) else node.value)
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                return None
            if root is not None and root != "self" and root not in imports and _movable(node):
                return node
        child = node
    return None


def _movable(node: ast.expr) -> bool:
    """Can `node` become the body of a lambda with the same meaning?"""
    for inner in ast.walk(node):
        if isinstance(inner, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)):
            return False
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "super":
            return False  # zero-argument super() needs the method's frame
    return True


def _setitem(read: ast.AST, parents: dict[ast.AST, ast.AST], imports: set[str]) -> ast.Assign | None:
    """`cache.is_updated[self.layer_idx] = True`: an assignment that can become a `__setitem__` call.

    Only with a constant or a name as the value: Python evaluates the value before the target, the call
    after it, so anything that could have a side effect keeps its place (and its RGZ201).
    """
    target = parents.get(read)
    while target is not None and not isinstance(target, ast.Subscript):
        if isinstance(target, ast.stmt):
            return None
        target = parents.get(target)
    statement = parents.get(target) if target is not None else None
    if (
        not isinstance(statement, ast.Assign)
        or statement.targets != [target]
        or not isinstance(target.ctx, ast.Store)
        or isinstance(target.slice, ast.Slice)
        or not isinstance(statement.value, (ast.Constant, ast.Name))
    ):
        return None
    root = _root_name(target.value)
    return statement if root is not None and root != "self" and root not in imports else None


def _setitem_call(statement: ast.Assign, source: str) -> str:
    target = statement.targets[0]
    assert isinstance(target, ast.Subscript)
    key = _source(target.slice, source)
    key = f"({key})" if isinstance(target.slice, ast.Tuple) and not key.startswith("(") else key
    value = _source(statement.value, source)
    return f"{EAGER}(lambda: {_source(target.value, source)}.__setitem__({key}, {value}))"


def _source(node: ast.AST, source: str) -> str:
    segment = ast.get_source_segment(source, node)
    assert segment is not None
    return segment


def _stored_into(read: ast.AST, parents: dict[ast.AST, ast.AST]) -> ast.AST | None:
    for node in _ancestors(read, parents):
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
            return node
        if isinstance(node, ast.stmt):
            return None
    return None


def _already_eager(read: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside `_regionalize_eager(lambda: ..)`, as an earlier run wrote it."""
    for node in _ancestors(read, parents):
        if isinstance(node, ast.Lambda):
            call = parents.get(node)
            return isinstance(call, ast.Call) and _dotted(call.func) == EAGER
    return False


def _outermost(nodes: list[ast.expr], parents: dict[ast.AST, ast.AST]) -> list[ast.expr]:
    """Drop carriers inside other carriers: the outer lambda already takes them out."""
    chosen = set(nodes)
    return [n for n in nodes if not any(a in chosen for a in _ancestors(n, parents))]


def _is_unspec_decorator(node: ast.expr) -> bool:
    return _dotted(node) == SYMBOLIC or "allow_unspec_int_on_nn_module" in ast.unparse(node)


def _root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def _dotted(expr: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return ".".join([expr.id, *reversed(parts)])


def _module_names(tree: ast.Module) -> set[str]:
    """Names bound at module level: imports, functions, classes. A call on them is not a cache's."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names
