"""The classes of one file, read with Python's `ast`: what `__init__` builds, with which arguments, and
which methods Dynamo traces. Only classes defined in the file are followed; bases and submodules
imported from elsewhere are not visible here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from regionalize.codemod.nodes import walk
from regionalize.codemod.prescan import dotted_name


def own_method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def base_classes(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    return [
        classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes and b.id != cls.name
    ]


def find_method(cls: ast.ClassDef, name: str, classes: dict[str, ast.ClassDef]) -> ast.FunctionDef | None:
    """`name` as the class resolves it, through the bases defined in the same file."""
    found = own_method(cls, name)
    if found is not None:
        return found
    for base in base_classes(cls, classes):
        if (found := find_method(base, name, classes)) is not None:
            return found
    return None


def init_of(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> ast.FunctionDef | None:
    return find_method(cls, "__init__", classes)


def traced_methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.FunctionDef]:
    """forward, and the methods it calls on self, transitively: what Dynamo traces of this class."""
    forward = find_method(cls, "forward", classes)
    found: list[ast.FunctionDef] = []
    pending = [forward] if forward is not None else []
    while pending:
        method = pending.pop()
        if method in found:
            continue
        found.append(method)
        for node in walk(method):
            if isinstance(node, ast.Call) and is_self_attr(node.func, None):
                callee = find_method(cls, node.func.attr, classes)  # type: ignore[union-attr]
                if callee is not None and callee.name != "__init__":
                    pending.append(callee)
    return found


def map_params(init: ast.FunctionDef | None, positions: frozenset[int], keywords: frozenset[str]) -> set[str]:
    """The `__init__` parameters that receive the positional indexes and keywords given."""
    if init is None:
        return set()
    every = [*init.args.posonlyargs, *init.args.args][1:]  # without self
    named = {a.arg for a in [*every, *init.args.kwonlyargs]}
    params = {every[i].arg for i in positions if i < len(every)}
    return params | {k for k in keywords if k in named}


def receiver(
    cls: ast.ClassDef, classes: dict[str, ast.ClassDef], positions: frozenset[int], keywords: frozenset[str]
) -> tuple[ast.ClassDef, set[str]]:
    """The class whose own `__init__` receives the arguments at `positions` and `keywords` of a call
    building `cls`, and the parameters they land in. An `__init__(self, *args, **kwargs)` that hands
    them on to `super().__init__(*args, **kwargs)` (a flash-attention subclass) is seen through."""
    current, seen = cls, {cls.name}
    while True:
        init = own_method(current, "__init__")
        if init is not None:
            params = map_params(init, positions, keywords)
            if params or not _hands_on(init):
                return current, params
        bases = base_classes(current, classes)
        if not bases or bases[0].name in seen:
            return current, set()
        current = bases[0]
        seen.add(current.name)


def _hands_on(init: ast.FunctionDef) -> bool:
    """Does `init` pass its `*args` (and `**kwargs`) on to `super().__init__` unchanged?"""
    star = init.args.vararg and init.args.vararg.arg
    for node in walk(init):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            return any(
                isinstance(a, ast.Starred) and isinstance(a.value, ast.Name) and a.value.id == star
                for a in node.args
            )
    return False


def self_assignments(init: ast.FunctionDef) -> Iterator[tuple[str, ast.expr]]:
    for node in walk(init):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if is_self_attr(target, None):
                yield target.attr, value  # type: ignore[attr-defined]


def class_tables(tree: ast.Module, classes: dict[str, ast.ClassDef]) -> dict[str, list[ast.ClassDef]]:
    """Module-level dicts whose values are all classes of the file, by name: the classes one of them
    may build (`FALCON_ATTENTION_CLASSES[config._attn_implementation](config, layer_idx)`)."""
    tables: dict[str, list[ast.ClassDef]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and node.value.values):
            continue
        values = node.value.values
        if all(isinstance(v, ast.Name) and v.id in classes for v in values):
            built = [classes[v.id] for v in values]  # type: ignore[union-attr]
            unique = list({id(c): c for c in built}.values())
            tables.update((t.id, unique) for t in node.targets if isinstance(t, ast.Name))
    return tables


def calls(
    init: ast.FunctionDef,
    classes: dict[str, ast.ClassDef],
    owner: ast.ClassDef,
    tables: dict[str, list[ast.ClassDef]],
) -> Iterator[tuple[ast.Call, ast.ClassDef | None, bool]]:
    """Every call in `__init__`, with the class it builds when that class is in the file, and whether
    it is `super().__init__(..)`, which runs the first base's __init__ on the same instance. A call of
    an entry of one of `tables` (`class_tables`) comes once for each class the table holds."""
    for node in walk(init):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in classes:
            yield node, classes[func.id], False
        elif isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name) and func.value.id in tables:
            for built in tables[func.value.id]:
                yield node, built, False
        elif (
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
        ):
            bases = base_classes(owner, classes)
            yield node, (bases[0] if bases else None), True
        else:
            yield node, None, False


def passed(call: ast.Call, params: set[str]) -> tuple[frozenset[int], frozenset[str]]:
    positions = frozenset(
        i for i, arg in enumerate(call.args) if not isinstance(arg, ast.Starred) and uses(arg, params)
    )
    keywords = frozenset(k.arg for k in call.keywords if k.arg is not None and uses(k.value, params))
    return positions, keywords


def callee_label(call: ast.Call, imports: dict[str, str]) -> str | None:
    """The class a call builds, when it looks like one defined elsewhere and not in torch.

    `imports` maps the file's imported names to what they import (`nn` -> `torch.nn`).
    """
    name = dotted_name(call.func)
    if name is None:
        return None
    root, last = name.split(".")[0], name.rsplit(".", 1)[-1]
    if imports.get(root, root).split(".")[0] == "torch":
        return None
    return name if last[:1].isupper() and (root in imports or "." not in name) else None


def uses(expr: ast.expr, names: set[str]) -> bool:
    """Does the value of `expr` carry one of `names`? Not through an index (`dpr[i]` is a float), a
    comparison (`i == 0` is a bool, at most two graphs) or a string."""
    if isinstance(expr, ast.Name):
        return expr.id in names
    if isinstance(expr, (ast.Subscript, ast.Compare, ast.JoinedStr, ast.Lambda)):
        return isinstance(expr, ast.Subscript) and uses(expr.value, names)
    return any(uses(child, names) for child in ast.iter_child_nodes(expr) if isinstance(child, ast.expr))


def is_self_attr(node: ast.AST, attrs: set[str] | None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attrs is None or node.attr in attrs)
    )


def root_name(expr: ast.expr) -> str | None:
    while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
        expr = expr.func if isinstance(expr, ast.Call) else expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def module_names(tree: ast.Module) -> set[str]:
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
